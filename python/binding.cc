// The Python extension: models cross the boundary as serialized bytes, so the extension's
// private copies of protobuf and ONNX never meet the Python `onnx` package's.
#include <onnax/limits.h>
#include <onnax/onnax.h>
#include <onnax/training.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <exception>
#include <mutex>
#include <optional>

#include "check/model_check.h"
#include "cli/cli.h"
#include "rules/op_table.h"
#include "transforms/prepare.h"

namespace py = pybind11;

namespace {

// Notices become UserWarnings attributed to the caller's code: the first frame outside the
// onnax package (the transforms reach the core through a helper or two).
void notice_to_python(const std::string& message) {
  py::gil_scoped_acquire gil;
  static const std::string package = [] {
    const std::string init = py::module_::import("onnax").attr("__file__").cast<std::string>();
    return init.substr(0, init.find_last_of("/\\") + 1);
  }();
  int level = 1;  // 1: the innermost Python frame, which called into the core
  py::object frame = py::module_::import("sys").attr("_getframe")(0);
  while (!frame.is_none() && frame.attr("f_code").attr("co_filename").cast<std::string>().rfind(package, 0) == 0) {
    frame = frame.attr("f_back");
    ++level;
  }
  py::module_::import("warnings")
      .attr("warn")(py::str("onnax: " + message), py::module_::import("builtins").attr("UserWarning"), level);
}

// The bounds onnax.limits sets for the transforms this Python thread calls (Python sets them
// from its context before each call).
thread_local onnax::Limits python_limits;

// Ctrl-C while a transform runs: the signal is counted (every running transform stops at its
// next check) and passed on to the handler installed before (Python's, which raises
// KeyboardInterrupt once the call returns). Installed while at least one transform runs.
std::atomic<uint64_t> sigints{0};
struct sigaction sigint_before;
std::mutex sigint_mutex;
int transforms_running = 0;

extern "C" void on_sigint(int sig, siginfo_t* info, void* context) {
  if (!(sigint_before.sa_flags & SA_SIGINFO) && sigint_before.sa_handler == SIG_IGN) return;
  sigints.fetch_add(1, std::memory_order_relaxed);
  if (sigint_before.sa_flags & SA_SIGINFO) {
    if (sigint_before.sa_sigaction) sigint_before.sa_sigaction(sig, info, context);
  } else if (sigint_before.sa_handler == SIG_DFL) {
    sigaction(SIGINT, &sigint_before, nullptr);
    raise(SIGINT);
  } else {
    sigint_before.sa_handler(sig);
  }
}

class SigintWatch {
 public:
  SigintWatch() {
    const std::lock_guard<std::mutex> lock(sigint_mutex);
    if (transforms_running++ > 0) return;
    struct sigaction mine {};
    mine.sa_sigaction = on_sigint;
    mine.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&mine.sa_mask);
    sigaction(SIGINT, &mine, &sigint_before);
  }
  ~SigintWatch() {
    const std::lock_guard<std::mutex> lock(sigint_mutex);
    if (--transforms_running == 0) sigaction(SIGINT, &sigint_before, nullptr);
  }
  SigintWatch(const SigintWatch&) = delete;
  SigintWatch& operator=(const SigintWatch&) = delete;
};

// Runs `work` (which returns serialized bytes or an exit code) with the GIL released, so other
// Python threads run meanwhile, under python_limits, stopping at Ctrl-C: a KeyboardInterrupt is
// raised when it returns (whatever it returned). The model's bytes are copied out of Python
// first.
template <typename Work>
auto interruptible(Work&& work) -> decltype(work()) {
  onnax::Limits limits = python_limits;
  limits.interrupts = &sigints;
  std::optional<decltype(work())> result;
  std::exception_ptr failure;
  {
    py::gil_scoped_release release;
    const SigintWatch watch;
    try {
      const onnax::LimitsScope scope(limits);
      result.emplace(work());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  if (failure) std::rethrow_exception(failure);
  return std::move(*result);
}

template <typename Work>
py::bytes without_gil(Work&& work) {
  return py::bytes(interruptible(std::forward<Work>(work)));
}

// in_axes arrives as exactly one of: an int/None for every input (`all`), a list (one per
// input) or a dict by name.
onnax::VmapOptions vmap_options(const py::object& all, const py::object& per_input, const py::object& by_name,
                                const std::vector<onnax::Axis>& out_axes, const std::string& axis_name) {
  onnax::VmapOptions opt;
  if (!per_input.is_none()) {
    opt.in_axes_form = onnax::VmapOptions::InAxesForm::kPerInput;
    opt.in_axes = per_input.cast<std::vector<onnax::Axis>>();
  } else if (!by_name.is_none()) {
    opt.in_axes_form = onnax::VmapOptions::InAxesForm::kByName;
    opt.in_axes_by_name = by_name.cast<std::map<std::string, onnax::Axis>>();
  } else {
    opt.in_axis = all.cast<onnax::Axis>();
  }
  opt.out_axes = out_axes;
  opt.axis_name = axis_name;
  return opt;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "onnax C++ core";
  static py::exception<onnax::Error> error(m, "OnnaxError", PyExc_ValueError);
  // A bound onnax.limits set (time, size, Ctrl-C): a service tells it from a bad model.
  static py::exception<onnax::Error> limit_error(m, "LimitError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const onnax::Error& e) {
      py::set_error(e.kind() == onnax::Error::Kind::kLimit ? limit_error : error, e.what());
    }
  });
  onnax::set_notice_sink(notice_to_python);

  m.def(
      "vmap",
      [](const py::bytes& model, const py::object& in_axis, const py::object& in_axes,
         const py::object& in_axes_by_name, const std::vector<onnax::Axis>& out_axes, const std::string& axis_name) {
        onnax::VmapOptions opt = vmap_options(in_axis, in_axes, in_axes_by_name, out_axes, axis_name);
        const std::string data(model);
        return without_gil([&] { return onnax::vmap_serialized(data, opt); });
      },
      py::arg("model"), py::arg("in_axis"), py::arg("in_axes"), py::arg("in_axes_by_name"), py::arg("out_axes"),
      py::arg("axis_name"),
      "vmap on a serialized ModelProto; returns the serialized result. Exactly one of in_axes (list) and "
      "in_axes_by_name (dict) may be given; otherwise in_axis (int or None) applies to every input.");

  using Names = std::optional<std::vector<std::string>>;
  m.def(
      "jvp",
      [](const py::bytes& model, const Names& inputs, const Names& outputs) {
        const std::string data(model);
        return without_gil([&] { return onnax::jvp_serialized(data, onnax::Selection{inputs, outputs}); });
      },
      py::arg("model"), py::arg("inputs"), py::arg("outputs"));
  m.def(
      "vjp",
      [](const py::bytes& model, const Names& inputs, const Names& outputs) {
        const std::string data(model);
        return without_gil([&] { return onnax::vjp_serialized(data, onnax::Selection{inputs, outputs}); });
      },
      py::arg("model"), py::arg("inputs"), py::arg("outputs"));
  m.def(
      "grad",
      [](const py::bytes& model, const Names& inputs, const std::optional<std::string>& output) {
        const std::string data(model);
        return without_gil([&] { return onnax::grad_serialized(data, inputs, output); });
      },
      py::arg("model"), py::arg("inputs"), py::arg("output"));
  m.def(
      "jacobian",
      [](const py::bytes& model, const Names& inputs, const Names& outputs, bool forward) {
        const std::string data(model);
        return without_gil([&] {
          const onnx::ModelProto source = onnax::parse_model(data);
          const onnax::Selection selection{inputs, outputs};
          return (forward ? onnax::jacfwd(source, selection) : onnax::jacrev(source, selection)).SerializeAsString();
        });
      },
      py::arg("model"), py::arg("inputs"), py::arg("outputs"), py::arg("forward"));
  m.def(
      "linearize",
      [](const py::bytes& model, const Names& inputs, const Names& outputs, bool primal) {
        const std::string data(model);
        return without_gil([&] {
          return onnax::linearize_serialized(data, onnax::Selection{inputs, outputs}, primal);
        });
      },
      py::arg("model"), py::arg("inputs"), py::arg("outputs"), py::arg("primal"),
      "One part of linearize (the primal model when primal, else the linear one), serialized.");
  m.def(
      "scan",
      [](const py::bytes& model, const std::optional<std::vector<std::string>>& state,
         const std::map<std::string, std::string>& next_state, const std::vector<std::string>& constants,
         const std::optional<int64_t> length, const std::string& length_name, const std::optional<int64_t> truncate) {
        const std::string data(model);
        onnax::ScanOptions options;
        options.roles = {state, next_state, constants};
        options.length = length;
        options.length_name = length_name;
        options.truncate = truncate;
        return without_gil([&] { return onnax::scan(onnax::parse_model(data), options).SerializeAsString(); });
      },
      py::arg("model"), py::arg("state"), py::arg("next_state"), py::arg("constants"), py::arg("length"),
      py::arg("length_name"), py::arg("truncate"));
  m.def(
      "with_surrogates",
      [](const py::bytes& model, const std::vector<std::string>& specs) {
        const std::string data(model);
        std::vector<onnax::Surrogate> surrogates;
        for (const auto& s : specs) surrogates.push_back(onnax::parse_surrogate(s));
        return without_gil(
            [&] { return onnax::with_surrogates(onnax::parse_model(data), surrogates).SerializeAsString(); });
      },
      py::arg("model"), py::arg("specs"));
  m.def(
      "step",
      [](const py::bytes& model) {
        const std::string data(model);
        return without_gil([&] { return onnax::step(onnax::parse_model(data)).SerializeAsString(); });
      },
      py::arg("model"));
  m.def(
      "signature_json",
      [](const py::bytes& model, const std::optional<std::vector<std::string>>& state,
         const std::map<std::string, std::string>& next_state, const std::vector<std::string>& constants) {
        const std::string data(model);
        const onnax::StepRoles roles{state, next_state, constants};
        std::string json;
        {
          py::gil_scoped_release release;
          json = onnax::signature_json(onnax::signature(onnax::parse_model(data), roles));
        }
        return json;
      },
      py::arg("model"), py::arg("state"), py::arg("next_state"), py::arg("constants"));
  m.def(
      "hessian",
      [](const py::bytes& model, const Names& inputs, const std::optional<std::string>& output) {
        const std::string data(model);
        return without_gil(
            [&] { return onnax::hessian(onnax::parse_model(data), inputs, output).SerializeAsString(); });
      },
      py::arg("model"), py::arg("inputs"), py::arg("output"));

  m.def(
      "register_rule",
      [](const std::string& domain, const std::string& op, const std::string& node,
         const std::optional<py::bytes>& body, const std::optional<py::bytes>& jvp,
         const std::optional<py::bytes>& vjp) {
        onnax::UserRule rule{domain, op, node, std::nullopt, std::nullopt, std::nullopt};
        auto parse = [](const py::bytes& data, const char* what) {
          onnx::FunctionProto f;
          if (!f.ParseFromString(std::string(data)))
            throw onnax::Error(onnax::Error::Kind::kInvalidModel,
                               std::string("register_rule: the ") + what +
                                   " is not a serialized FunctionProto. Fix: pass an onnx.FunctionProto");
          return f;
        };
        if (body) rule.body = parse(*body, "body");
        if (jvp) rule.jvp = parse(*jvp, "jvp");
        if (vjp) rule.vjp = parse(*vjp, "vjp");
        onnax::register_rule(rule);
      },
      py::arg("domain"), py::arg("op"), py::arg("node"), py::arg("body"), py::arg("jvp"), py::arg("vjp"));
  m.def("clear_rules", &onnax::clear_rules);

  m.def(
      "stop_gradient",
      [](const py::bytes& model, const std::vector<std::string>& values) {
        return py::bytes(onnax::stop_gradient(onnax::parse_model(std::string(model)), values).SerializeAsString());
      },
      py::arg("model"), py::arg("values"));

  m.def(
      "convert_opset",
      [](const py::bytes& model, int64_t target) {
        const std::string data(model);
        return without_gil([&] {
          onnx::ModelProto converted = onnax::parse_model(data);
          onnax::convert_opset_in_place(converted, target);
          return converted.SerializeAsString();
        });
      },
      py::arg("model"), py::arg("target"));

  // Training: losses, parameter selection, training steps (onnax/training.h).
  m.def(
      "add_loss",
      [](const py::bytes& model, const std::string& kind, const std::string& output, const std::string& reduction,
         bool probabilities, double label_smoothing, int64_t class_axis, std::optional<int64_t> ignore_index,
         double huber_delta, bool example_weights, const std::string& label_name, const std::string& weight_name,
         const std::string& loss_name, bool keep_outputs) {
        onnax::LossOptions o;
        auto k = onnax::loss_kind_from_name(kind);
        if (!k) {
          std::string known;
          for (const auto& n : onnax::loss_kind_names()) known += (known.empty() ? "" : ", ") + n;
          throw py::value_error("kind must be one of " + known + ", got '" + kind + "'");
        }
        if (reduction != "mean" && reduction != "sum")
          throw py::value_error("reduction must be 'mean' or 'sum', got '" + reduction + "'");
        o.kind = *k;
        o.output = output;
        o.reduction = reduction == "mean" ? onnax::Reduction::kMean : onnax::Reduction::kSum;
        o.probability_labels = probabilities;
        o.label_smoothing = label_smoothing;
        o.class_axis = class_axis;
        o.ignore_index = ignore_index;
        o.huber_delta = huber_delta;
        o.example_weights = example_weights;
        o.label_name = label_name;
        o.weight_name = weight_name;
        o.loss_name = loss_name;
        o.keep_outputs = keep_outputs;
        onnx::ModelProto result = onnax::add_loss(onnax::parse_model(std::string(model)), o);
        return py::bytes(result.SerializeAsString());
      },
      py::arg("model"), py::arg("kind"), py::arg("output"), py::arg("reduction"), py::arg("probabilities"),
      py::arg("label_smoothing"), py::arg("class_axis"), py::arg("ignore_index"), py::arg("huber_delta"),
      py::arg("example_weights"), py::arg("label_name"), py::arg("weight_name"), py::arg("loss_name"),
      py::arg("keep_outputs"));
  m.def(
      "select_params",
      [](const py::bytes& model, const std::vector<std::string>& include, const std::vector<std::string>& exclude,
         int64_t min_size) {
        return onnax::select_params(onnax::parse_model(std::string(model)),
                                    onnax::ParamSpec{include, exclude, min_size});
      },
      py::arg("model"), py::arg("include"), py::arg("exclude"), py::arg("min_size"));
  m.def(
      "constants_to_initializers",
      [](const py::bytes& model, int64_t min_size) {
        return py::bytes(
            onnax::constants_to_initializers(onnax::parse_model(std::string(model)), min_size).SerializeAsString());
      },
      py::arg("model"), py::arg("min_size"));
  m.def(
      "train_step",
      [](const py::bytes& model, const std::vector<std::string>& include, const std::vector<std::string>& exclude,
         int64_t min_size, const std::optional<std::string>& loss, const std::string& optimizer, double learning_rate,
         double momentum, bool nesterov, double beta1, double beta2, double epsilon, double weight_decay,
         const std::vector<std::string>& no_decay, double clip_norm, std::optional<double> dp_clip_norm,
         std::optional<double> noise_multiplier, std::optional<int64_t> noise_seed, const std::string& form) {
        onnax::TrainStepOptions o;
        o.params = onnax::ParamSpec{include, exclude, min_size};
        o.loss = loss;
        auto& op = o.optimizer;
        if (optimizer == "sgd")
          op.kind = onnax::OptimizerOptions::Kind::kSgd;
        else if (optimizer == "adam")
          op.kind = onnax::OptimizerOptions::Kind::kAdam;
        else if (optimizer == "adamw")
          op.kind = onnax::OptimizerOptions::Kind::kAdamW;
        else
          throw py::value_error("optimizer must be 'sgd', 'adam' or 'adamw', got '" + optimizer + "'");
        op.learning_rate = learning_rate;
        op.momentum = momentum;
        op.nesterov = nesterov;
        op.beta1 = beta1;
        op.beta2 = beta2;
        op.epsilon = epsilon;
        op.weight_decay = weight_decay;
        op.no_decay = no_decay;
        op.clip_norm = clip_norm;
        if (dp_clip_norm.has_value() != noise_multiplier.has_value())
          throw py::value_error("DP-SGD needs both dp_clip_norm and noise_multiplier (noise_multiplier=0 for none)");
        if (noise_seed && !dp_clip_norm)
          throw py::value_error("noise_seed applies to DP-SGD: pass dp_clip_norm and noise_multiplier too");
        if (dp_clip_norm) o.dp_sgd = onnax::DpSgdOptions{*dp_clip_norm, *noise_multiplier, noise_seed};
        if (form == "step")
          o.form = onnax::TrainStepOptions::Form::kStep;
        else if (form == "accumulate")
          o.form = onnax::TrainStepOptions::Form::kAccumulate;
        else if (form == "apply")
          o.form = onnax::TrainStepOptions::Form::kApply;
        else
          throw py::value_error("form must be 'step', 'accumulate' or 'apply', got '" + form + "'");
        const std::string data(model);
        return without_gil([&] { return onnax::train_step(onnax::parse_model(data), o).SerializeAsString(); });
      },
      py::arg("model"), py::arg("include"), py::arg("exclude"), py::arg("min_size"), py::arg("loss"),
      py::arg("optimizer"), py::arg("learning_rate"), py::arg("momentum"), py::arg("nesterov"), py::arg("beta1"),
      py::arg("beta2"), py::arg("epsilon"), py::arg("weight_decay"), py::arg("no_decay"), py::arg("clip_norm"),
      py::arg("dp_clip_norm"), py::arg("noise_multiplier"), py::arg("noise_seed"), py::arg("form"));

  m.def(
      "cli_main",
      [](const std::vector<std::string>& args) { return interruptible([&] { return onnax::cli::run(args); }); },
      py::arg("args"), "Runs the onnax command line (without the program name); returns the exit code.");

  m.def(
      "set_limits",
      [](double max_seconds, uint64_t max_output_bytes) {
        const onnax::Limits previous = python_limits;
        python_limits.max_seconds = max_seconds;
        python_limits.max_output_bytes = max_output_bytes;
        return py::make_tuple(previous.max_seconds, previous.max_output_bytes);
      },
      py::arg("max_seconds"), py::arg("max_output_bytes"),
      "Bounds for the transforms this thread calls (0: none); returns the previous ones.");

  // The checks behind `onnax check`, for onnax.testing: each returns "" or a list of problems.
  m.def(
      "checker", [](const py::bytes& model) { return onnax::check::checker(onnax::parse_model(std::string(model))); },
      py::arg("model"), "onnx::checker::check_model structure checks; '' when the model passes.");
  m.def(
      "strict_shape_inference",
      [](const py::bytes& model) {
        return onnax::check::strict_shape_inference(onnax::parse_model(std::string(model)));
      },
      py::arg("model"), "Strict ONNX shape inference (check_type, strict mode); '' when it passes.");
  m.def(
      "symbolic_lengths",
      [](const py::bytes& model, const std::map<std::string, std::vector<int64_t>>& axes) {
        return onnax::check::symbolic_lengths(onnax::parse_model(std::string(model)), axes);
      },
      py::arg("model"), py::arg("axes"), "Problems with axes that should be symbolic (empty when none).");
  m.def(
      "embedded_weights",
      [](const py::bytes& model, const std::vector<std::string>& names) {
        return onnax::check::embedded_weights(onnax::parse_model(std::string(model)), names);
      },
      py::arg("model"), py::arg("names"), "Problems with weights that should be initializers (empty when none).");

  m.def("version", &onnax::version);
  m.def(
      "op_table",
      []() {
        py::list rows;
        for (const onnax::OpRules* r : onnax::OpTable::instance().entries()) {
          py::dict row;
          std::vector<int> since;
          for (const auto& [s, rule] : r->batch_rules) since.push_back(s);
          row["domain"] = r->domain;
          row["op"] = r->op;
          row["batch_since"] = since;
          row["batch_refused"] = r->batch_refused;
          row["jvp"] = static_cast<bool>(r->jvp_rule);
          row["jvp_from_body"] = r->jvp_from_body;
          row["transpose"] = static_cast<bool>(r->transpose_rule);
          row["zero"] = r->zero_derivative;
          rows.append(row);
        }
        return rows;
      },
      "One row per operator in the op table: its batching rules' since-versions and which "
      "derivative rules it has (for docs/ops.md and the rule tests).");
  m.def(
      "opset_range", []() { return std::make_tuple(onnax::kMinConvertibleOpset, onnax::kMinOpset, onnax::kMaxOpset); },
      "(oldest convertible, oldest transformed as is, newest) default-domain opsets: models below "
      "the second are converted to it first.");

  // Benchmark probes: C++-only timings, free of Python boundary costs.
  m.def(
      "parse_serialize_seconds",
      [](const py::bytes& model) {
        std::string bytes(model);
        auto t0 = std::chrono::steady_clock::now();
        onnx::ModelProto m2 = onnax::parse_model(bytes);
        std::string out;
        m2.SerializeToString(&out);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      py::arg("model"), "Seconds to parse and re-serialize the model in C++ (the I/O floor).");
  m.def(
      "vmap_seconds",
      [](const py::bytes& model, const py::object& in_axis) {
        onnx::ModelProto source = onnax::parse_model(std::string(model));
        onnax::VmapOptions opt = vmap_options(in_axis, py::none(), py::none(), {}, "");
        auto t0 = std::chrono::steady_clock::now();
        onnx::ModelProto out = onnax::vmap(std::move(source), opt);  // as the vmap binding does
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      py::arg("model"), py::arg("in_axis") = 0, "Seconds of the C++ vmap transform alone (parsed input).");
  m.def(
      "grad_seconds",
      [](const py::bytes& model, const std::optional<std::vector<std::string>>& inputs,
         const std::optional<std::string>& output) {
        onnx::ModelProto source = onnax::parse_model(std::string(model));
        auto t0 = std::chrono::steady_clock::now();
        onnx::ModelProto out = onnax::grad(std::move(source), inputs, output);  // as the grad binding does
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      py::arg("model"), py::arg("inputs") = py::none(), py::arg("output") = py::none(),
      "Seconds of the C++ grad transform alone (parsed input).");
  m.def(
      "grad_serialized_seconds",
      [](const py::bytes& model, const std::optional<std::vector<std::string>>& inputs,
         const std::optional<std::string>& output) {
        const std::string bytes(model);
        auto t0 = std::chrono::steady_clock::now();
        const std::string out = onnax::grad_serialized(bytes, inputs, output);  // as the grad binding does
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      py::arg("model"), py::arg("inputs") = py::none(), py::arg("output") = py::none(),
      "Seconds of C++ grad from serialized model to serialized result (parse, transform, serialize, free).");
}
