// train_step: a loss model's gradient (grad, or vmap of grad for DP-SGD) and the optimizer
// update in one pure-functional ONNX graph; initial_state: the first values of what it carries.
#include <onnax/training.h>

#include <algorithm>
#include <set>

#include "diagnostics/error.h"
#include "ir/graph_edit.h"
#include "notice.h"
#include "rules/derivative.h"
#include "training/outer_products.h"
#include "training/step_writer.h"
#include "training/training_parts.h"
#include "transforms/lower_opset.h"
#include "transforms/prepare.h"
#include "transforms/provenance.h"
#include "transforms/tidy.h"

namespace onnax {
namespace {

using training::Carried;
using training::Param;
using training::StepWriter;

const std::string kMode = "train-step";
constexpr const char* kStateKey = "onnax.train_state";

void check_options(const TrainStepOptions& o) {
  const OptimizerOptions& opt = o.optimizer;
  auto bad = [](const std::string& what, double v, const std::string& expected) {
    diag::fail(Error::Kind::kSelection,
               kMode + ": " + what + " is " + std::to_string(v) + "; expected " + expected + ". Fix: pass " + expected);
  };
  if (!(opt.learning_rate >= 0.0)) bad("the learning rate", opt.learning_rate, "a value >= 0");
  if (!(opt.momentum >= 0.0)) bad("momentum", opt.momentum, "a value >= 0");
  if (opt.nesterov && opt.momentum == 0.0)
    diag::fail(Error::Kind::kSelection, kMode +
                                            ": Nesterov's variant needs momentum > 0. Fix: pass a momentum "
                                            "(e.g. 0.9), or drop nesterov");
  using Kind = OptimizerOptions::Kind;
  const OptimizerOptions defaults;
  if (opt.kind != Kind::kSgd && (opt.momentum != 0.0 || opt.nesterov))
    diag::fail(Error::Kind::kSelection, kMode +
                                            ": momentum and Nesterov's variant belong to SGD; Adam and AdamW "
                                            "keep their own moments (beta1, beta2). Fix: drop them, or choose "
                                            "the sgd optimizer");
  if (opt.kind == Kind::kSgd &&
      (opt.beta1 != defaults.beta1 || opt.beta2 != defaults.beta2 || opt.epsilon != defaults.epsilon))
    diag::fail(Error::Kind::kSelection, kMode +
                                            ": beta1, beta2 and epsilon belong to Adam and AdamW, not SGD. "
                                            "Fix: drop them, or choose the adam or adamw optimizer");
  if (!(opt.beta1 >= 0.0 && opt.beta1 < 1.0)) bad("beta1", opt.beta1, "a value in [0, 1)");
  if (!(opt.beta2 >= 0.0 && opt.beta2 < 1.0)) bad("beta2", opt.beta2, "a value in [0, 1)");
  if (!(opt.epsilon > 0.0)) bad("epsilon", opt.epsilon, "a value > 0");
  if (!(opt.weight_decay >= 0.0)) bad("weight decay", opt.weight_decay, "a value >= 0");
  if (!(opt.clip_norm >= 0.0)) bad("the clipping norm", opt.clip_norm, "a value >= 0 (0: no clipping)");
  if (o.dp_sgd) {
    if (!(o.dp_sgd->clip_norm > 0.0)) bad("the DP-SGD clipping norm", o.dp_sgd->clip_norm, "a value > 0");
    if (!(o.dp_sgd->noise_multiplier >= 0.0))
      bad("the DP-SGD noise multiplier", o.dp_sgd->noise_multiplier, "a value >= 0");
    if (o.form != TrainStepOptions::Form::kStep)
      diag::fail(Error::Kind::kUnsupported, kMode +
                                                ": DP-SGD with gradient accumulation is not supported (the "
                                                "noise must be added once per logical batch). Fix: use the "
                                                "single-step form with DP-SGD");
    if (opt.clip_norm != 0.0)
      diag::fail(Error::Kind::kSelection, kMode +
                                              ": DP-SGD clips every example's gradient; a global clipping "
                                              "norm on top of it is not supported. Fix: drop the global "
                                              "clip norm");
  }
}

Facts tensor_facts(const onnx::TensorProto& t) {
  Facts f = Facts::of(t.data_type(), {});
  for (int64_t d : t.dims()) f.dims.push_back(Dim::of(d));
  return f;
}

std::vector<Param> chosen_params(const onnx::ModelProto& model, const TrainStepOptions& o) {
  const std::vector<std::string> names = select_params(model, o.params);
  std::vector<training::Matcher> no_decay;
  for (const auto& e : o.optimizer.no_decay) {
    no_decay.emplace_back(e, kMode, "no-decay");
    if (std::none_of(names.begin(), names.end(), [&](const std::string& n) { return no_decay.back().matches(n); }))
      diag::fail(Error::Kind::kSelection, kMode + ": no-decay entry '" + e +
                                              "' matches none of the trained parameters " + training::listed(names) +
                                              " (globs and re: match whole names, case-sensitively). Fix: "
                                              "name parameters that are trained, or drop the entry");
  }
  std::vector<Param> params;
  for (const auto& t : model.graph().initializer()) {
    if (std::find(names.begin(), names.end(), t.name()) == names.end()) continue;
    Param p;
    p.name = t.name();
    p.facts = tensor_facts(t);
    for (const auto& m : no_decay) p.decay = p.decay && !m.matches(p.name);
    params.push_back(std::move(p));
  }
  return params;
}

// The loss: the named output, or the only rank-0 float output grad picked (declared in its
// result's outputs, which list the loss model's outputs first).
std::string loss_output(const onnx::GraphProto& g, size_t model_outputs, const std::optional<std::string>& loss) {
  if (loss) return *loss;
  for (size_t i = 0; i < model_outputs; ++i) {
    const auto& t = g.output(static_cast<int>(i)).type().tensor_type();
    if (t.has_shape() && t.shape().dim_size() == 0 && differentiable_dtype(t.elem_type()))
      return g.output(static_cast<int>(i)).name();
  }
  return g.output(0).name();
}

// The loss output a step needs, checked on the declared outputs before grad runs (whose own
// diagnostics speak of grad's arguments): named and rank-0, or the only rank-0 float output.
void check_loss_output(const onnx::ModelProto& m, const std::optional<std::string>& loss) {
  std::vector<std::string> scalars, outputs;
  const onnx::ValueInfoProto* named = nullptr;
  for (const auto& o : m.graph().output()) {
    outputs.push_back(o.name());
    const auto& t = o.type().tensor_type();
    if (t.has_shape() && t.shape().dim_size() == 0 && differentiable_dtype(t.elem_type())) scalars.push_back(o.name());
    if (loss && o.name() == *loss) named = &o;
  }
  const std::string add_one = "attach a loss first (onnax loss MODEL -o LOSS.onnx --kind KIND; Python add_loss)";
  if (loss && !named)
    diag::fail(Error::Kind::kSelection, kMode + ": the loss '" + *loss +
                                            "' is not an output of the model; outputs: " + training::listed(outputs) +
                                            ". Fix: name the loss output with --loss / "
                                            "loss=, or " +
                                            add_one);
  if (named) {
    const auto& t = named->type().tensor_type();
    if (t.has_shape() && t.shape().dim_size() != 0)
      diag::fail(Error::Kind::kSelection, kMode + ": output '" + *loss + "' has rank " +
                                              std::to_string(t.shape().dim_size()) +
                                              "; a training step minimizes a rank-0 loss. Fix: " + add_one);
    return;
  }
  if (scalars.empty() && std::all_of(m.graph().output().begin(), m.graph().output().end(),
                                     [](const onnx::ValueInfoProto& o) { return o.type().tensor_type().has_shape(); }))
    diag::fail(Error::Kind::kSelection, kMode + ": the model has no rank-0 float output to minimize (outputs: " +
                                            training::listed(outputs) + "). Fix: " + add_one);
  if (scalars.size() > 1)
    diag::fail(Error::Kind::kSelection, kMode + ": the model has several rank-0 float outputs " +
                                            training::listed(scalars) + ". Fix: name the loss with --loss / loss=");
}

// vmap(grad) of the loss model, each example evaluated as a batch of one: every runtime input
// x [N, ...] of the step is unsqueezed to [N, 1, ...] for the vmapped graph, which maps over
// axis 0. Returns the vmapped model; its runtime inputs are the loss model's.
onnx::ModelProto per_example_gradients(const onnx::ModelProto& loss_model, const std::vector<std::string>& params,
                                       const std::optional<std::string>& loss, NameScope& scope,
                                       std::string& loss_name) {
  std::vector<std::string> declared;  // the runtime inputs split into examples
  std::set<std::string> inits;
  for (const auto& t : loss_model.graph().initializer()) inits.insert(t.name());
  for (const auto& vi : loss_model.graph().input()) {
    if (inits.count(vi.name())) continue;
    const auto& shape = vi.type().tensor_type().shape();
    if (!vi.type().tensor_type().has_shape())
      diag::fail(Error::Kind::kUnsupported,
                 kMode + ": DP-SGD splits the runtime inputs into examples along axis 0, but input '" + vi.name() +
                     "' declares no shape. Fix: declare the inputs' shapes with a leading batch dimension");
    if (shape.dim_size() == 0) continue;  // a scalar (a flag such as jax2onnx's `deterministic`) is shared
    if (shape.dim(0).has_dim_value() && shape.dim(0).dim_value() != 1)
      diag::fail(Error::Kind::kUnsupported,
                 kMode + ": DP-SGD evaluates the loss model on one example at a time, but input '" + vi.name() +
                     "' has a fixed batch size of " + std::to_string(shape.dim(0).dim_value()) +
                     " on axis 0. Fix: export the model with a symbolic (dynamic) batch dimension");
    declared.push_back(vi.name());
  }
  onnx::ModelProto gradient = grad(loss_model, params, loss);
  loss_name = loss_output(gradient.graph(), static_cast<size_t>(loss_model.graph().output_size()), loss);
  VmapOptions per_example;
  per_example.in_axes_form = VmapOptions::InAxesForm::kByName;  // (inputs not named are shared)
  for (const auto& name : declared) per_example.in_axes_by_name[name] = 0;
  onnx::ModelProto v = vmap(gradient, per_example);
  onnx::GraphProto& g = *v.mutable_graph();
  collect_names(g, scope);
  // The vmapped graph reads x_example [B, 1, ...] (an example as a batch of one); the step's
  // input x [B, ...] feeds it, declared with vmap's batch dim in place of the model's.
  std::vector<onnx::NodeProto> feeds;
  for (const auto& name : declared) {
    const std::string example = scope.fresh(name + "_example");
    training::rename_everywhere(g, name, example);
    for (auto& in : *g.mutable_input())
      if (in.name() == example) {
        in.set_name(name);
        auto* dims = in.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim();
        if (dims->size() >= 2) dims->DeleteSubrange(1, 1);
      }
    const std::string axis_name = scope.fresh(example + "_axis");
    onnx::NodeProto n;
    n.set_op_type("Unsqueeze");
    n.add_input(name);
    n.add_input(axis_name);
    n.add_output(example);
    onnx::NodeProto axis;
    axis.set_op_type("Constant");
    axis.add_output(axis_name);
    auto* a = axis.add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(onnx::TensorProto::INT64);
    a->mutable_t()->add_dims(1);
    a->mutable_t()->add_int64_data(1);
    feeds.push_back(std::move(axis));
    feeds.push_back(std::move(n));
  }
  // (First: the vmapped nodes read them.)
  google::protobuf::RepeatedPtrField<onnx::NodeProto> ordered;
  for (auto& n : feeds) *ordered.Add() = std::move(n);
  for (auto& n : *g.mutable_node()) *ordered.Add() = std::move(n);
  g.mutable_node()->Swap(&ordered);
  return v;
}

// Gives every value of `g` whose name the step claimed (reserved in `claimed` before `g`'s own
// names were added to `scope`) a fresh name, so the claimed names are the step's alone.
void free_claimed_names(onnx::GraphProto& g, const std::vector<std::string>& claimed, NameScope& scope) {
  NameScope used;
  collect_names(g, used);
  for (const auto& name : claimed)
    if (used.contains(name)) training::rename_everywhere(g, name, scope.fresh(name + "_internal"));
}

std::string state_json(const std::vector<Carried>& carried) {
  std::vector<std::string> items;
  for (const auto& c : carried) {
    const char* init = c.init == Carried::Init::kParam ? "param" : c.init == Carried::Init::kValue ? "value" : "zeros";
    char value[32];
    std::snprintf(value, sizeof value, "%.17g", c.value);
    items.push_back("{\"input\": " + provenance::quote(c.input) +
                    ", \"output\": " + (c.output.empty() ? std::string("null") : provenance::quote(c.output)) +
                    ", \"init\": " + provenance::quote(init) +
                    (c.init == Carried::Init::kValue ? ", \"value\": " + provenance::quote(value) : std::string()) +
                    "}");
  }
  return provenance::list(items);
}

std::string optimizer_json(const TrainStepOptions& o) {
  const OptimizerOptions& opt = o.optimizer;
  const char* kind = opt.kind == OptimizerOptions::Kind::kSgd    ? "sgd"
                     : opt.kind == OptimizerOptions::Kind::kAdam ? "adam"
                                                                 : "adamw";
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  std::string s = "{\"optimizer\": " + provenance::quote(kind) + ", \"learning_rate\": " + num(opt.learning_rate);
  if (opt.kind == OptimizerOptions::Kind::kSgd)
    s += ", \"momentum\": " + num(opt.momentum) + ", \"nesterov\": " + (opt.nesterov ? "true" : "false");
  else
    s += ", \"beta1\": " + num(opt.beta1) + ", \"beta2\": " + num(opt.beta2) + ", \"epsilon\": " + num(opt.epsilon);
  s += ", \"weight_decay\": " + num(opt.weight_decay) + ", \"clip_norm\": " + num(opt.clip_norm);
  if (o.dp_sgd)
    s += ", \"dp_sgd\": {\"clip_norm\": " + num(o.dp_sgd->clip_norm) +
         ", \"noise_multiplier\": " + num(o.dp_sgd->noise_multiplier) +
         (o.dp_sgd->noise_seed ? ", \"noise_seed\": " + std::to_string(*o.dp_sgd->noise_seed) : std::string()) + "}";
  const char* form = o.form == TrainStepOptions::Form::kStep         ? "step"
                     : o.form == TrainStepOptions::Form::kAccumulate ? "accumulate"
                                                                     : "apply";
  return s + ", \"form\": " + provenance::quote(form) + "}";
}

// Squared L2 norms of the gradients, summed over the parameters in `dtype`: per example
// (over every axis but 0) when `per_example`, else whole.
std::string as_dtype(StepWriter& sw, const std::string& v, int32_t from, int32_t to) {
  return from == to ? v : sw.op("Cast", {v}, {attr_i("to", to)});
}

// The sum of the parameters' squared gradient norms (per example: [B]); `given[i]`, when set,
// is parameter i's, computed otherwise.
std::string squared_norm(StepWriter& sw, const std::vector<Param>& params, bool per_example, int32_t dtype,
                         const std::vector<std::string>& given = {}) {
  std::vector<std::string> squares;
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    if (i < given.size() && !given[i].empty()) {
      squares.push_back(as_dtype(sw, given[i], p.facts.dtype, dtype));
      continue;
    }
    const int64_t first = per_example ? 1 : 0, rank = static_cast<int64_t>(p.facts.dims.size()) + first;
    std::vector<int64_t> axes;
    for (int64_t a = first; a < rank; ++a) axes.push_back(a);
    std::string sq = axes.empty() ? sw.op("Mul", {p.grad, p.grad}, {}, {}, p.name + "_grad_sq_norm")
                                  : sw.op("ReduceSumSquare", {p.grad, sw.i64s(axes)}, {attr_i("keepdims", 0)}, {},
                                          p.name + "_grad_sq_norm");
    if (p.facts.dtype != dtype) sq = sw.op("Cast", {sq}, {attr_i("to", dtype)});
    squares.push_back(sq);
  }
  return squares.size() == 1 ? squares[0] : sw.op("Sum", squares, {}, {}, "grad_sq_norm");
}

// C / max(norm, C): 1 within the bound, C / norm beyond it (no division by a zero norm).
std::string clip_factor(StepWriter& sw, const std::string& norm, double c, int32_t dtype) {
  return sw.op("Div", {sw.constant(dtype, c), sw.op("Max", {norm, sw.constant(dtype, c)})}, {}, {}, "clip_factor");
}

// Global-norm clipping: every gradient scaled by C / max(norm, C); the norm goes to `norm`.
void clip_global_norm(StepWriter& sw, double c, std::vector<Param>& params, const std::string& norm, int32_t dtype) {
  sw.op("Sqrt", {squared_norm(sw, params, false, dtype)}, {}, norm);
  const std::string factor = clip_factor(sw, norm, c, dtype);
  for (auto& p : params)
    p.grad = sw.op("Mul", {p.grad, as_dtype(sw, factor, dtype, p.facts.dtype)}, {}, {}, p.name + "_clipped");
}

// DP-SGD from per-example gradients [B, *p]: every example's norm (to `norms`), clipped to C,
// summed, noised, averaged; the per-example losses (renamed) averaged into `loss`. The clipped
// sum is one product factors[B] x gradients[B, n] per parameter: the per-example gradients,
// the largest tensors of the step, are read twice (norm, sum) and never rewritten. Parameters
// with an outer-product form (`forms`, training/outer_products.h) skip their per-example
// gradients altogether.
void private_gradients(StepWriter& sw, const DpSgdOptions& dp, std::vector<Param>& params,
                       std::vector<std::optional<training::OuterProduct>>& forms, const std::vector<std::string>& noise,
                       const std::string& loss, const std::string& norms, int32_t dtype) {
  onnx::GraphProto& g = sw.graph();
  const std::string per_example_loss = sw.fresh(loss + "_per_example");
  training::rename_everywhere(g, loss, per_example_loss);
  std::vector<std::string> squares(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    if (forms[i]) squares[i] = training::outer_product_squared_norm(sw, *forms[i], params[i].name);
  sw.op("Sqrt", {squared_norm(sw, params, true, dtype, squares)}, {}, norms);
  const double c = dp.clip_norm;
  const std::string factor = clip_factor(sw, norms, c, dtype);
  const std::string batch = sw.op(
      "Squeeze",
      {sw.op("Cast", {sw.op("Shape", {per_example_loss}, {attr_i("start", 0), attr_i("end", 1)}, {}, "batch_size")},
             {attr_i("to", dtype)}, {}, "batch_size"),
       sw.i64s({0})},
      {}, {}, "batch_size");
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = params[i];
    const int32_t dt = p.facts.dtype;
    const std::string f = as_dtype(sw, factor, dtype, dt);
    std::string summed;
    if (forms[i]) {
      summed = training::outer_product_weighted_sum(sw, *forms[i], f, p.name);
    } else if (p.facts.dims.empty()) {
      summed = sw.op("ReduceSum", {sw.op("Mul", {p.grad, f}), sw.i64s({0})}, {attr_i("keepdims", 0)}, {},
                     p.name + "_clipped_sum");
    } else {
      std::vector<int64_t> dims;
      for (const Dim& d : p.facts.dims) dims.push_back(d.value());
      const bool flat = dims.size() == 1;
      const std::string rows =
          flat ? p.grad : sw.op("Reshape", {p.grad, sw.i64s({0, -1})}, {}, {}, p.name + "_per_example_rows");
      summed = sw.op("MatMul", {f, rows}, {}, {}, p.name + "_clipped_sum");
      if (!flat) summed = sw.op("Reshape", {summed, sw.i64s(dims)}, {}, {}, p.name + "_clipped_sum");
    }
    std::string noised = summed;
    if (dp.noise_multiplier > 0.0) {
      const std::string normal =
          dp.noise_seed ? sw.op("RandomNormalLike", {summed},
                                {attr_i("dtype", dt),
                                 attr_f("seed", static_cast<float>(*dp.noise_seed + static_cast<int64_t>(i)))},
                                {}, p.name + "_normal")
                        : noise[i];
      const std::string scaled =
          sw.op("Mul", {normal, sw.constant(dt, dp.noise_multiplier * c)}, {}, {}, p.name + "_noise");
      noised = sw.op("Add", {summed, scaled}, {}, {}, p.name + "_noised");
    }
    p.grad = sw.op("Div", {noised, as_dtype(sw, batch, dtype, dt)}, {}, {}, p.name + "_private_grad");
  }
  sw.op("ReduceMean", {per_example_loss}, {attr_i("keepdims", 0)}, loss);
}

}  // namespace

namespace {

// The step of a loss model at opset 18 or newer (train_step upgrades older ones first: the
// gradient and the optimizer are written in opset-18 forms, the result lowered at the end).
onnx::ModelProto step_of(const onnx::ModelProto& loss_model, const TrainStepOptions& o) {
  using Form = TrainStepOptions::Form;
  check_options(o);
  std::vector<Param> params = chosen_params(loss_model, o);
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);

  // Every name the step adds is chosen fresh against the loss model's names, in one order for
  // every form, so the accumulate and apply steps agree on their accumulators' names.
  NameScope scope;
  collect_names(loss_model.graph(), scope);
  onnx::ModelProto result;
  onnx::GraphProto scratch;
  StepWriter w(scratch, scope);
  std::vector<Carried> accumulators;
  std::string accumulated;
  const bool accumulating = o.form != Form::kStep;
  const bool updating = o.form != Form::kAccumulate;
  if (accumulating) {
    for (const auto& p : params) accumulators.push_back(w.carry(p.name + "_grad_sum", p.facts));
    accumulated = w.carry("accumulated", Facts::of(onnx::TensorProto::INT64, {})).input;
  }
  std::vector<training::ParamState> state;
  std::string step, step_new, lr;
  std::vector<std::string> claimed;
  if (updating) {
    state = training::declare_optimizer_state(w, o.optimizer, params);
    const Carried& s = w.carry("step", Facts::of(onnx::TensorProto::INT64, {}));
    step = s.input;
    step_new = s.output;
    // Fed, not written: a schedule feeds other values. (A plain input: ONNX Runtime warns about
    // an input with a default initializer in every session it opens.)
    lr = w.carry("learning_rate", Facts::of(onnx::TensorProto::FLOAT, {}), Carried::Init::kValue, false,
                 o.optimizer.learning_rate)
             .input;
  }
  std::vector<std::string> noise;  // the noise inputs (none when the graph draws the noise)
  // (Noise multiplier 0: no noise at all, so no inputs for it.)
  if (o.dp_sgd && !o.dp_sgd->noise_seed && o.dp_sgd->noise_multiplier > 0.0)
    for (const auto& p : params) noise.push_back(w.fresh(p.name + "_noise"));
  std::vector<std::string> p_new;
  for (const auto& p : params) p_new.push_back(updating ? w.fresh(p.name + "_new") : std::string());
  std::string grad_norm, example_norms;
  // (Clipping applies to the gradient a step updates with: an accumulation step's is clipped
  // by the apply step, as the mean of the accumulated gradients.)
  if (o.optimizer.clip_norm > 0.0 && o.form != Form::kAccumulate) grad_norm = w.fresh("grad_norm");
  if (o.dp_sgd) example_norms = w.fresh("per_example_grad_norm");
  for (const auto& c : w.carried()) {
    claimed.push_back(c.input);
    if (!c.output.empty()) claimed.push_back(c.output);
  }
  for (const auto* list : {&noise, &p_new})
    for (const auto& n : *list)
      if (!n.empty()) claimed.push_back(n);
  for (const auto& n : {grad_norm, example_norms})
    if (!n.empty()) claimed.push_back(n);

  if (o.form != Form::kApply) check_loss_output(loss_model, o.loss);
  // The gradient graph, with the loss model's outputs first, then one gradient per parameter.
  const size_t model_outputs = static_cast<size_t>(loss_model.graph().output_size());
  std::string loss;
  if (o.form == Form::kApply) {
    result.set_ir_version(std::max<int64_t>(loss_model.ir_version(), 8));
    auto* opset = result.add_opset_import();
    opset->set_version(std::max<int64_t>(default_opset(loss_model), kMinOpset));
    result.mutable_graph()->set_name(loss_model.graph().name() + "_apply");
  } else if (o.dp_sgd) {
    result = per_example_gradients(loss_model, names, o.loss, scope, loss);
    if (o.dp_sgd->noise_seed && default_opset(result) >= 22)
      notice(kMode + ": the noise is drawn by RandomNormalLike at opset " + std::to_string(default_opset(result)) +
             ", which ONNX Runtime 1.31 does not implement (it stops at opset 21). Fix: for ONNX Runtime, feed the "
             "noise as <param>_noise inputs (drop the noise seed)");
  } else {
    result = grad(loss_model, names, o.loss);
  }
  onnx::GraphProto& g = *result.mutable_graph();
  free_claimed_names(g, claimed, scope);
  collect_names(g, scope);
  if (o.form != Form::kApply) {
    if (loss.empty()) loss = loss_output(g, model_outputs, o.loss);
    for (size_t i = 0; i < params.size(); ++i) params[i].grad = g.output(static_cast<int>(model_outputs + i)).name();
  }
  std::vector<onnx::ValueInfoProto> primal_outputs(
      g.output().begin(), g.output().begin() + static_cast<int>(o.form == Form::kApply ? 0 : model_outputs));
  g.clear_output();
  // Parameters leave the initializers: the step reads them as inputs.
  {
    std::set<std::string> lifted(names.begin(), names.end());
    auto* inits = g.mutable_initializer();
    int kept = 0;
    for (int i = 0; i < inits->size(); ++i) {
      if (lifted.count(inits->Get(i).name())) continue;
      if (kept != i) inits->SwapElements(kept, i);
      ++kept;
    }
    inits->DeleteSubrange(kept, inits->size() - kept);
  }

  // The step's nodes go to the graph itself from here on.
  StepWriter sw(g, scope);
  const int32_t loss_dtype = params.front().facts.dtype;
  const std::string accumulated_new = accumulating ? w.carried()[params.size()].output : std::string();
  if (o.form == Form::kApply)  // the mean of the accumulated gradients
    for (size_t i = 0; i < params.size(); ++i) {
      Param& p = params[i];
      const std::string count = sw.op("Cast", {accumulated}, {attr_i("to", p.facts.dtype)}, {}, "accumulated_count");
      p.grad = sw.op("Div", {accumulators[i].input, count}, {}, {}, p.name + "_mean_grad");
    }
  onnx::TypeProto example_norms_type;
  if (o.dp_sgd) {
    // The loss becomes the mean of the per-example losses; the model's other outputs, per
    // example [B, 1, ...], lose the batch-of-one axis.
    std::vector<onnx::ValueInfoProto> outputs;
    for (auto& vi : primal_outputs) {
      auto* dims = vi.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim();
      if (vi.name() == loss) {
        example_norms_type = vi.type();
        example_norms_type.mutable_tensor_type()->set_elem_type(loss_dtype);
        dims->Clear();
        outputs.insert(outputs.begin(), vi);
        continue;
      }
      if (dims->size() < 2) continue;  // (an output without a batch axis has no per-example form)
      const std::string per_example = sw.fresh(vi.name() + "_per_example");
      training::rename_everywhere(g, vi.name(), per_example);
      sw.op("Squeeze", {per_example, sw.i64s({1})}, {}, vi.name());
      dims->DeleteSubrange(1, 1);
      outputs.push_back(vi);
    }
    std::vector<std::optional<training::OuterProduct>> forms = training::outer_product_forms(result, params);
    private_gradients(sw, *o.dp_sgd, params, forms, noise, loss, example_norms, loss_dtype);
    primal_outputs = std::move(outputs);
  } else if (!grad_norm.empty()) {
    clip_global_norm(sw, o.optimizer.clip_norm, params, grad_norm, loss_dtype);
  }
  if (o.form == Form::kAccumulate) {
    for (size_t i = 0; i < params.size(); ++i)
      sw.op("Add", {accumulators[i].input, params[i].grad}, {}, accumulators[i].output);
    sw.op("Add", {accumulated, sw.constant(onnx::TensorProto::INT64, 1)}, {}, accumulated_new);
  }
  if (o.form == Form::kApply) {
    // The accumulators and their count restart at zero.
    for (size_t i = 0; i < params.size(); ++i) {
      const Param& p = params[i];
      std::vector<int64_t> dims;
      for (const Dim& d : p.facts.dims) dims.push_back(d.value());
      sw.op("ConstantOfShape", {sw.i64s(dims)}, {value_attr(p.facts.dtype, 0.0, false)}, accumulators[i].output);
    }
    sw.op("Identity", {sw.constant(onnx::TensorProto::INT64, 0)}, {}, accumulated_new);
  }
  if (updating) {
    const std::string t = sw.op("Add", {step, sw.constant(onnx::TensorProto::INT64, 1)}, {}, step_new);
    training::write_updates(sw, o.optimizer, params, state, p_new, t, lr);
    if (o.form == Form::kApply) {
      // With nothing accumulated there is nothing to apply: everything keeps its value (the
      // mean of no gradients would be 0 / 0).
      const std::string any =
          sw.op("Greater", {accumulated, sw.constant(onnx::TensorProto::INT64, 0)}, {}, {}, "accumulated_any");
      std::vector<std::pair<std::string, std::string>> updated{{step, step_new}};
      for (size_t i = 0; i < params.size(); ++i) {
        updated.emplace_back(params[i].name, p_new[i]);
        for (const Carried& slot : state[i]) updated.emplace_back(slot.input, slot.output);
      }
      for (const auto& [before, after] : updated) {
        const std::string candidate = sw.fresh(after + "_candidate");
        training::rename_everywhere(g, after, candidate);
        sw.op("Where", {any, candidate, before}, {}, after);
      }
    }
  }

  // Inputs: the model's runtime inputs, the parameters, what is carried, the noise, the rate.
  for (const auto& p : params) training::add_input(g, p.name, p.facts);
  std::vector<Carried> carried;
  for (const auto& p : params) {
    Carried c;
    c.input = p.name;
    c.output = updating ? p_new[&p - params.data()] : std::string();
    c.facts = p.facts;
    c.init = Carried::Init::kParam;
    carried.push_back(std::move(c));
  }
  for (const auto& c : w.carried()) {
    training::add_input(g, c.input, c.facts);
    carried.push_back(c);
  }
  for (size_t i = 0; i < noise.size(); ++i) training::add_input(g, noise[i], params[i].facts);
  // Outputs: the loss model's (DP-SGD: the mean loss), the norms, then what is carried.
  for (auto& vi : primal_outputs) *g.add_output() = std::move(vi);
  if (!grad_norm.empty()) training::add_output(g, grad_norm, Facts::of(loss_dtype, {}));
  if (!example_norms.empty()) {
    onnx::ValueInfoProto* vi = g.add_output();
    vi->set_name(example_norms);
    *vi->mutable_type() = example_norms_type;  // the per-example losses' [B]
  }
  for (const auto& c : carried)
    if (!c.output.empty()) training::add_output(g, c.output, c.facts);

  if (o.dp_sgd) prune(g);  // (the per-example gradients that outer products replaced)
  tidy(result);
  training::erase_metadata(result, provenance::kDerivativeOutputsKey);
  training::erase_metadata(result, provenance::kTransformsKey);
  std::vector<std::string> quoted;
  for (const auto& n : names) quoted.push_back(provenance::quote(n));
  std::string record = optimizer_json(o);
  record.insert(record.size() - 1, ", \"params\": " + provenance::list(quoted) +
                                       (loss.empty() ? std::string() : ", \"loss\": " + provenance::quote(loss)));
  training::set_metadata(result, "onnax.train_step", record);
  training::set_metadata(result, kStateKey, state_json(carried));
  return result;
}

}  // namespace

onnx::ModelProto train_step(const onnx::ModelProto& loss_model, const TrainStepOptions& o) {
  const int64_t declared = default_opset(loss_model);
  const int64_t source = declared < 0 ? kMinOpset : declared;
  if (source >= kMinOpset) return step_of(loss_model, o);
  onnx::ModelProto upgraded = loss_model;
  convert_opset_in_place(upgraded, kMinOpset);
  notice(kMode + ": upgraded the model from ai.onnx opset " + std::to_string(source) + " to " +
         std::to_string(kMinOpset) + " with the ONNX version converter to transform it (the result returns to " +
         std::to_string(source) + " where every node has a form there)");
  onnx::ModelProto result = step_of(upgraded, o);
  return_to_source_opset(result, source, kMode);
  return result;
}

}  // namespace onnax
