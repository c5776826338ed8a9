#include "cli/cli.h"

#include <google/protobuf/arena.h>
#include <onnax/limits.h>
#include <onnax/onnax.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <new>
#include <optional>

#include "cli/args.h"
#include "cli/check_command.h"
#include "cli/sequence_commands.h"
#include "cli/training_commands.h"
#include "io/model_io.h"
#include "rules/user_rules.h"
#include "transforms/prepare.h"

namespace onnax::cli {
namespace {

constexpr const char* kUsage = R"(usage: onnax <command> [options]

JAX-style transformations of ONNX models. Each command reads a model and writes a new one;
the input file is never modified.

commands:
  vmap IN.onnx -o OUT.onnx [--in-axes AXES] [--out-axes AXES] [--axis-name NAME]
      Map the model over a new batch axis.
      --in-axes    one entry per runtime graph input, comma-separated: an int (negative
                   allowed) or 'none' (shared input); a single entry applies to all inputs;
                   or by name: 'x=0,w=none' (unnamed inputs are shared; an initializer
                   given an axis becomes a batched input: an ensemble). Default: 0.
      --out-axes   an int for all outputs or one per output, comma-separated; none: an output the
                   same for every example stays unbatched. Default: 0.
      --axis-name  dim_param of the new batch dimension. Default: 'batch' (made unique).
  grad IN.onnx -o OUT.onnx [--inputs weight,bias] [--params SPEC] [--output loss]
      Gradient of a rank-0 output (default: the only one) with respect to the named inputs
      or initializers (default: every float32/float64 runtime input). Appends <name>_grad.
  jvp IN.onnx -o OUT.onnx [--inputs x] [--params SPEC] [--outputs y]
      Forward mode: appends <input>_tangent inputs and <output>_tangent outputs.
  vjp IN.onnx -o OUT.onnx [--inputs w] [--params SPEC] [--outputs loss]
      Reverse mode: appends <output>_cotangent inputs and <input>_cotangent outputs.
  jacobian IN.onnx -o OUT.onnx [--inputs x] [--params SPEC] [--outputs y] [--mode rev|fwd]
      Appends one output <y>_jacobian_<x> of shape y.shape + x.shape per selected output and
      input (JAX's layout). --mode rev (default, jax.jacrev: cost grows with the outputs'
      size) or fwd (jax.jacfwd: grows with the inputs' size); the same numbers.
  hessian IN.onnx -o OUT.onnx [--inputs x] [--params SPEC] [--output loss]
      Hessian of one output (default: the only float one): appends its Jacobians
      <y>_jacobian_<a>, then <y>_hessian_<a>_<b> of shape y.shape + a.shape + b.shape.
  linearize IN.onnx -o PRIMAL.onnx --linear LINEAR.onnx [--inputs x] [--params SPEC] [--outputs y]
      jax.linearize: jvp split in two. PRIMAL computes the outputs, then the residuals (the
      primal values the derivative reads); LINEAR maps the residuals and <input>_tangent to
      <output>_tangent, linearly: run PRIMAL once, LINEAR for every tangent.
  loss IN.onnx -o OUT.onnx --kind KIND [--output NAME] [--reduction mean|sum] ...
      Appends a label input and a rank-0 loss as the first output. KIND: mse, l1, huber,
      softmax_cross_entropy / binary_cross_entropy_with_logits (the output holds logits),
      cross_entropy / binary_cross_entropy (probabilities), nll (log-probabilities).
      --output NAME          the model output the loss reads (default: the only float one)
      --probabilities        (softmax_)cross_entropy: labels are probabilities, not int64
                             class indices (which must lie in [0, C))
      --label-smoothing S    (softmax_)cross_entropy: target (1 - S) t + S / C
      --class-axis A         classification losses: the class axis (default -1)
      --ignore-index I       labels equal to I contribute nothing and are not counted
      --delta D              huber's threshold (default 1)
      --example-weights      adds an input of per-example weights (axis 0)
      --loss-only            drop the model's own outputs (the loss is the only output)
      --label-name, --weight-name, --loss-name NAME   (defaults: label, example_weight, loss)
  train-step LOSS.onnx -o STEP.onnx [--params SPEC] [--optimizer adamw] [--lr 1e-3] ...
      One training step as a pure ONNX graph: runtime inputs, parameters, optimizer state,
      step, learning_rate (first value: --lr) in; loss, <param>_new, new state, step_new out
      (metadata_props['onnax.train_state'] pairs each fed-back input with its output).
      --params SPEC          see parameter options (default: all)
      --loss NAME            the rank-0 loss output (default: the only one)
      --optimizer sgd|adam|adamw  (default adamw); --lr, --momentum M, --nesterov, --beta1,
                             --beta2, --eps, --weight-decay W, --no-decay SPEC (exempt params)
      --clip-norm C          clip the gradient's global L2 norm to C; outputs grad_norm
      --dp-clip C --noise-multiplier S  DP-SGD: clip each example's gradient to norm C, add
                             N(0, (S C)^2) noise from <param>_noise inputs, average; outputs
                             per_example_grad_norm; --noise-seed N draws the noise in the
                             graph (RandomNormalLike) instead of reading <param>_noise
      --accumulate           only add the gradient into <param>_grad_sum accumulators
      --apply                only the update, from the accumulators' mean
      --init INIT.onnx       also write a model without inputs whose outputs are the first
                             step's fed-back inputs (stored parameters, zero state)
  scan STEP.onnx -o SEQ.onnx [--state h,c | h=h_next,...] [--constants w] [--length T] [--truncate K]
      The full-sequence model of a one-timestep model step(x_t, *state) -> (out, *new_state):
      run(x_seq, *state) -> (out_seq, *final_state) as one Loop over a new first (time) axis.
      Names are kept; weights stay initializers.
      --state        the state inputs, in order (default: every input after the first), each
                     optionally with the output of its next value ('h=h_next'; default: the
                     last outputs, in order); 'none': no state
      --constants    inputs that are the same at every step (default: the other inputs are
                     sequences)
      --length       the number of steps (default: symbolic, read from the first sequence)
      --length-name  dim_param of a symbolic time axis (default: 'time')
      --truncate K   truncated BPTT: derivatives flow through the last K steps only
  step SEQ.onnx -o STEP.onnx
      The one timestep inside a full-sequence model (one top-level Loop or Scan over time, as
      spyx's export and `onnax scan` write): x_t for x_seq, the state in, its next value out.
  signature MODEL.onnx [--state ...] [--constants ...] [-o SIG.json] [--zeros STATE0.npz]
      The flat layout of a step or sequence model as JSON: input and output names in call
      order, shapes (symbolic dims by name), dtypes, the state and the outputs holding its
      next (or final) value, the sequence length. --state and --constants read a step as scan
      does. --zeros [--dim batch=2] (Python command only) writes zero initial states (.npz).
  check MODEL.onnx [--symbolic INPUT:AXIS[,AXIS]]... [--embedded WEIGHT[,WEIGHT]]
      The ONNX checker (onnx::checker::check_model, full_check) and strict shape inference,
      as a report; exit 1 if anything fails.
      --symbolic   fail if these axes of a graph input/output are fixed numbers instead of
                   symbolic dim_params (repeat for several inputs)
      --embedded   fail if these weights are graph inputs instead of initializers
  validate SOURCE.onnx GENERATED.onnx [...]
  bench MODEL.onnx [--transforms vmap,grad,...] [...]
  init-state LOSS.onnx STEP.onnx -o STATE.npz
  apply-params MODEL.onnx PARAMS.npz -o TRAINED.onnx
      Implemented in the Python command (.venv/bin/onnax, python -m onnax): they use NumPy
      and ONNX Runtime. The standalone build/onnax points there (exit 2).
  version         print the onnax version

parameter options (grad, jvp, vjp, jacobian, hessian, linearize: selected after --inputs;
train-step):
  --params SPEC            float initializers of rank >= 1: 'all', names, globs
                           ('layers.*.weight'), 're:REGEX' (globs and re: match whole
                           names), '@FILE' (one entry per line)
  --exclude SPEC           remove these from the selection (frozen parameters)
  --min-size N             only initializers with at least N elements
  --constants-as-params N  first turn float Constant nodes of >= N elements (weights some
                           exporters write as Constants, e.g. inside functions) into
                           initializers
  --stop-gradient NAMES    treat these values as constants: their derivative is cut
  --surrogate SPEC         differentiate spikes (Cast/Where of a comparison, Sign) by a
                           surrogate: superspike[:k=25] (fast_sigmoid), arctan[:k=2],
                           triangular[:k=2], boxcar[:width=2,height=0.5], tanh[:k=1],
                           straight_through; VALUE=SPEC for one spike (repeatable)

common options (vmap, grad, jvp, vjp, jacobian, hessian, linearize, loss, train-step; scan,
step: -o and --external-data):
  -o PATH                where to write the result (required; vmap also takes --output)
  --external-data        write tensors to PATH.data (automatic above 2 GB)
  --rules FILE           rules for operators onnax lacks, or replacing its own, from an ONNX
                         model's functions: D::Op defines operator D::Op, D::Op.jvp is its JVP,
                         onnax.node::NAME.jvp the JVP of node NAME (as onnax.register_rule)
  --max-seconds S        stop the transform (exit 4, nothing written) once it has run S
                         seconds: a bound for services running onnax on models they did not write
  --max-output-mb N      refuse (exit 4, nothing written) a result over N MB, tensors included
  --target-opset N       write the result at ai.onnx opset N (vmap and the derivatives; default:
                         the model's own when it is older than 18 and every node has a form
                         there, else 18 with a notice); exit 1 naming the first node that has
                         no form at N
  -h, --help             show this help
)";

// The usage of one command: its entry in kUsage (from its line to the next command's) and the
// common options; the whole usage for a command it does not list.
std::string command_help(const std::string& cmd) {
  const std::string usage = kUsage;
  const size_t start = usage.find("\n  " + cmd + " ");
  if (start == std::string::npos) return usage;
  size_t end = start + 1;
  // Command lines are indented by two spaces, their options by more.
  while ((end = usage.find('\n', end)) != std::string::npos && end + 3 < usage.size() &&
         !(usage[end + 1] == ' ' && usage[end + 2] == ' ' && usage[end + 3] != ' '))
    ++end;
  std::string help = "usage: onnax" + usage.substr(start + 2, end - start - 1);
  if (cmd == "grad" || cmd == "jvp" || cmd == "vjp" || cmd == "jacobian" || cmd == "hessian" || cmd == "linearize" ||
      cmd == "train-step") {
    const size_t from = usage.find("\nparameter options");
    help += usage.substr(from, usage.find("\ncommon options") - from);
  }
  const size_t common = usage.find("\ncommon options");
  if (common != std::string::npos) help += usage.substr(common);
  return help;
}

int64_t parse_target_opset(const std::string& s) {
  const int64_t v = parse_int(s, "--target-opset");
  if (v < kMinConvertibleOpset || v > kMaxOpset)
    throw UsageError{"--target-opset " + s + " is outside the supported " + std::to_string(kMinConvertibleOpset) + "-" +
                     std::to_string(kMaxOpset)};
  return v;
}

Axis parse_axis(const std::string& s, const std::string& option) {
  std::string lower;
  for (char ch : s) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  if (lower == "none" || lower == "null") return std::nullopt;
  return parse_int(s, option);
}

// Loads `in`, applies `fn`, writes `out` (never over the input).
int transform_file(const std::string& mode, const std::string& in, const std::string& out, bool external,
                   std::optional<int64_t> target_opset,
                   const std::function<void(onnx::ModelProto&)>& transform_in_place) {
  if (in.empty()) throw UsageError{mode + " needs an input model"};
  if (out.empty()) throw UsageError{mode + " needs -o OUT.onnx"};
  std::error_code ec;
  if (std::filesystem::equivalent(in, out, ec))
    throw UsageError{"-o '" + out +
                     "' is the input file; onnax never overwrites its input. Choose another output path"};
  // The model and its result on one arena: no node is allocated or freed one by one.
  google::protobuf::Arena arena(model_arena_options());
  onnx::ModelProto& model = *google::protobuf::Arena::CreateMessage<onnx::ModelProto>(&arena);
  std::vector<std::string> data_files;
  load_model_into(in, model, &data_files);
  check_output_paths_usage(in, data_files, out);
  transform_in_place(model);
  if (target_opset) convert_opset_in_place(model, *target_opset);
  save_model(model, out, external);
  std::cerr << "onnax: wrote " << out << "\n";
  return 0;
}

int cmd_vmap(const std::vector<std::string>& args) {
  std::string in, out;
  bool external = false;
  std::optional<int64_t> target_opset;
  VmapOptions opt;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UsageError{a + " needs a value"};
      return args[++i];
    };
    if (a == "-o" || a == "--output")
      out = value();
    else if (a == "--in-axes") {
      std::string v = value();
      if (v.empty()) throw UsageError{"--in-axes needs a value such as 0, '0,none' or 'x=0'"};
      // A repeated --in-axes replaces the earlier one.
      opt.in_axes_form = VmapOptions::InAxesForm::kAll;
      opt.in_axes.clear();
      opt.in_axes_by_name.clear();
      for (const auto& item : split(v, ',')) {
        auto eq = item.find('=');
        if (eq != std::string::npos) {
          opt.in_axes_form = VmapOptions::InAxesForm::kByName;
          const std::string name = item.substr(0, eq);
          if (opt.in_axes_by_name.count(name)) throw UsageError{"--in-axes: input '" + name + "' is named twice"};
          opt.in_axes_by_name[name] = parse_axis(item.substr(eq + 1), "--in-axes");
        } else {
          opt.in_axes.push_back(parse_axis(item, "--in-axes"));
        }
      }
      if (opt.in_axes_form == VmapOptions::InAxesForm::kByName && !opt.in_axes.empty())
        throw UsageError{"--in-axes: mix of positional and name=axis entries; use one form"};
      if (opt.in_axes_form != VmapOptions::InAxesForm::kByName) {
        // A single entry applies to every input; a list must name each input's axis.
        if (opt.in_axes.size() == 1)
          opt.in_axis = opt.in_axes[0];
        else
          opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
      }
    } else if (a == "--out-axes") {
      std::string v = value();
      if (v.empty()) throw UsageError{"--out-axes needs a value such as 0 or '0,1'"};
      opt.out_axes.clear();  // a repeated --out-axes replaces the earlier one
      for (const auto& item : split(v, ',')) opt.out_axes.push_back(parse_axis(item, "--out-axes"));
    } else if (a == "--axis-name")
      opt.axis_name = value();
    else if (a == "--external-data")
      external = true;
    else if (a == "--target-opset")
      target_opset = parse_target_opset(value());
    else if (!a.empty() && a[0] == '-')
      throw UsageError{"unknown option '" + a + "'"};
    else if (in.empty())
      in = a;
    else
      throw UsageError{"unexpected argument '" + a + "'"};
  }
  return transform_file("vmap", in, out, external, target_opset, [&](onnx::ModelProto& m) { vmap_in_place(m, opt); });
}

// jvp / vjp / grad / jacobian / hessian / linearize: selections by graph name.
int cmd_derivative(const std::string& mode, const std::vector<std::string>& args) {
  std::string in, out, linear_out;
  bool external = false;
  std::optional<int64_t> target_opset;
  std::optional<std::vector<std::string>> inputs, outputs;
  ParamArgs params;
  bool forward = false;  // jacobian: jacfwd instead of jacrev
  const bool one_output = mode == "grad" || mode == "hessian";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UsageError{a + " needs a value"};
      return args[++i];
    };
    auto names = [&]() {
      std::string v = value();
      if (v.empty()) throw UsageError{a + " needs comma-separated graph names"};
      return split(v, ',');
    };
    if (a == "-o")
      out = value();
    else if (a == "--inputs")
      inputs = names();
    else if (a == "--outputs" && !one_output)
      outputs = names();
    else if (a == "--output" && one_output)
      outputs = std::vector<std::string>{value()};
    else if (a == "--mode" && mode == "jacobian") {
      const std::string v = value();
      if (v != "rev" && v != "fwd") throw UsageError{"--mode is '" + v + "'; expected rev or fwd"};
      forward = v == "fwd";
    } else if (a == "--linear" && mode == "linearize")
      linear_out = value();
    else if (a == "--external-data")
      external = true;
    else if (a == "--target-opset")
      target_opset = parse_target_opset(value());
    else if (take_param_option(args, i, params))
      continue;
    else if (!a.empty() && a[0] == '-')
      throw UsageError{"unknown option '" + a + "' for " + mode};
    else if (in.empty())
      in = a;
    else
      throw UsageError{"unexpected argument '" + a + "'"};
  }
  std::optional<onnx::ModelProto> linear;  // linearize's second part
  if (mode == "linearize") {
    if (linear_out.empty()) throw UsageError{"linearize needs --linear LINEAR.onnx (where the linear part goes)"};
    if (!in.empty()) check_output_paths_usage(in, {}, linear_out);
    const auto canonical = [](const std::string& p) { return std::filesystem::weakly_canonical(p); };
    if (!out.empty() && canonical(out) == canonical(linear_out))
      throw UsageError{"--linear names the same file as -o; give the two parts different paths"};
  }
  const int code = transform_file(mode, in, out, external, target_opset, [&](onnx::ModelProto& m) {
    const std::vector<std::string> chosen = selected_params(m, params);
    if (!chosen.empty()) {
      if (!inputs) inputs.emplace();
      inputs->insert(inputs->end(), chosen.begin(), chosen.end());
    }
    if (mode == "linearize") {
      Linearized parts = linearize(m, Selection{inputs, outputs});
      m = std::move(parts.primal);
      linear = std::move(parts.linear);
      return;
    }
    if (mode == "jvp") return jvp_in_place(m, Selection{inputs, outputs});
    if (mode == "vjp") return vjp_in_place(m, Selection{inputs, outputs});
    const std::optional<std::string> output = outputs ? std::optional<std::string>((*outputs)[0]) : std::nullopt;
    if (mode == "jacobian") {
      m = forward ? jacfwd(m, Selection{inputs, outputs}) : jacrev(m, Selection{inputs, outputs});
      return;
    }
    if (mode == "hessian") {
      m = hessian(m, inputs, output);
      return;
    }
    grad_in_place(m, inputs, output);
  });
  if (linear) {
    if (target_opset) convert_opset_in_place(*linear, *target_opset);
    save_model(*linear, linear_out, external);
    std::cerr << "onnax: wrote " << linear_out << "\n";
  }
  return code;
}

}  // namespace

// --max-seconds and --max-output-mb (any transform command): taken out of `args` before the
// command reads its own options.
Limits take_limit_options(std::vector<std::string>& args) {
  Limits limits;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a != "--max-seconds" && a != "--max-output-mb") {
      rest.push_back(a);
      continue;
    }
    if (i + 1 >= args.size()) throw UsageError{a + " needs a value"};
    const double v = parse_double(args[++i], a);
    if (v <= 0) throw UsageError{a + " must be positive, got " + args[i]};
    if (a == "--max-seconds") {
      limits.max_seconds = v;
    } else {
      // (At least one byte: a tiny bound is a bound, not none; a huge one is no bound.)
      const double bytes = std::ceil(v * 1024 * 1024);
      limits.max_output_bytes = bytes >= 1.8e19 ? 0 : static_cast<uint64_t>(bytes);
    }
  }
  args.swap(rest);
  return limits;
}

// --rules FILE (any transform command, repeatable): the rules the file's functions define
// (rules/user_rules.h: rules_of_model), registered for this command only.
class CommandRules {
 public:
  explicit CommandRules(std::vector<std::string>& args) : previous_(user_rules()) {
    std::vector<std::string> rest;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] != "--rules") {
        rest.push_back(args[i]);
        continue;
      }
      if (i + 1 >= args.size()) throw UsageError{"--rules needs a file (an ONNX model whose functions are rules)"};
      const std::string& path = args[++i];
      for (const UserRule& r : rules_of_model(load_model(path), path)) {
        register_rule(r);
        registered_ = true;
      }
    }
    args.swap(rest);
  }
  ~CommandRules() {
    if (registered_) restore_rules(previous_);
  }
  CommandRules(const CommandRules&) = delete;
  CommandRules& operator=(const CommandRules&) = delete;

 private:
  std::shared_ptr<const UserRules> previous_;
  bool registered_ = false;
};

int run(const std::vector<std::string>& args) {
  try {
    if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
      std::cout << kUsage << std::flush;
      return args.empty() ? 2 : 0;
    }
    const std::string& cmd = args[0];
    std::vector<std::string> rest(args.begin() + 1, args.end());
    for (const auto& a : rest)
      if (a == "-h" || a == "--help") {
        std::cout << command_help(cmd) << std::flush;
        return 0;
      }
    const bool python_command = cmd == "validate" || cmd == "bench" || cmd == "init-state" || cmd == "apply-params";
    const LimitsScope limits(python_command ? Limits{} : take_limit_options(rest));
    std::vector<std::string> no_args;
    const CommandRules rules(python_command ? no_args : rest);
    if (cmd == "vmap") return cmd_vmap(rest);
    if (cmd == "jvp" || cmd == "vjp" || cmd == "grad" || cmd == "jacobian" || cmd == "hessian" || cmd == "linearize")
      return cmd_derivative(cmd, rest);
    if (cmd == "check") return cmd_check(rest);
    if (cmd == "loss") return cmd_loss(rest);
    if (cmd == "train-step") return cmd_train_step(rest);
    if (cmd == "scan") return cmd_scan(rest);
    if (cmd == "step") return cmd_step(rest);
    if (cmd == "signature") return cmd_signature(rest);
    if (python_command)
      throw UsageError{"'" + cmd +
                       "' uses NumPy (and ONNX Runtime), so it lives in the Python command. Fix: run "
                       "`.venv/bin/onnax " +
                       cmd + " ...` (or `python -m onnax " + cmd + " ...`) from an environment with onnax installed"};
    if (cmd == "version" || cmd == "--version") {
      std::cout << "onnax " << version() << "\n";
      return 0;
    }
    throw UsageError{"unknown command '" + cmd + "'"};
  } catch (const UsageError& e) {
    std::cerr << "onnax: " << e.message << "\n(run `onnax --help` for usage)\n";
    return 2;
  } catch (const Error& e) {
    // (Interrupted by Ctrl-C in the Python command: it says so itself.)
    if (e.kind() == Error::Kind::kLimit && std::string_view(e.what()).find("was interrupted") != std::string_view::npos)
      return 4;
    std::cerr << "onnax: error: " << e.what() << "\n";
    return e.kind() == Error::Kind::kLimit ? 4 : 1;  // (a service tells a bound from a bad model)
  } catch (const std::bad_alloc&) {
    std::cerr << "onnax: error: out of memory while transforming the model. Fix: check the model's declared sizes "
                 "(a dimension of billions of elements?), or run with more memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "onnax: internal error: " << e.what() << "\nPlease report this with the model that caused it.\n";
    return 3;
  }
}

}  // namespace onnax::cli
