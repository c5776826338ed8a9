// The optimizer updates of a training step (SGD with momentum or Nesterov, Adam, AdamW), and
// the StepWriter they are written with.
#include "training/step_writer.h"

namespace onnax::training {

const Carried& StepWriter::carry(const std::string& base, const Facts& facts, Carried::Init init, bool written,
                                 double value) {
  Carried c;
  c.input = names_.fresh(base);
  if (written) c.output = names_.fresh(c.input + "_new");
  c.facts = facts;
  c.init = init;
  c.value = value;
  carried_.push_back(std::move(c));
  return carried_.back();
}

std::string StepWriter::op(std::string_view type, const Names& inputs, AttrList attrs, std::string out,
                           std::string_view hint) {
  auto* n = g_.add_node();
  n->set_op_type(std::string(type));
  for (const auto& i : inputs) n->add_input(i);
  if (out.empty()) out = names_.fresh(hint.empty() ? lowercase(type) : std::string(hint));
  n->add_output(out);
  for (auto& a : attrs) *n->add_attribute() = std::move(a);
  return out;
}

std::string StepWriter::constant(int32_t dtype, double value) {
  auto [it, added] = constants_.try_emplace({dtype, value});
  if (!added) return it->second;
  it->second = op("Constant", {}, {value_attr(dtype, value, true)}, {}, "constant");
  return it->second;
}

std::string StepWriter::i64s(const std::vector<int64_t>& values) {
  onnx::AttributeProto a;
  a.set_name("value");
  a.set_type(onnx::AttributeProto::TENSOR);
  onnx::TensorProto* t = a.mutable_t();
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) t->add_int64_data(v);
  return op("Constant", {}, {a}, {}, "axes");
}

std::vector<ParamState> declare_optimizer_state(StepWriter& w, const OptimizerOptions& o,
                                                const std::vector<Param>& params) {
  std::vector<ParamState> state(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    if (o.kind == OptimizerOptions::Kind::kSgd) {
      if (o.momentum != 0.0) state[i].push_back(w.carry(p.name + "_velocity", p.facts));
    } else {
      state[i].push_back(w.carry(p.name + "_m", p.facts));
      state[i].push_back(w.carry(p.name + "_v", p.facts));
    }
  }
  return state;
}

namespace {

// Per dtype, the scalars every parameter of that dtype shares: the learning rate and Adam's
// bias corrections 1 - beta^t.
// Per dtype, the scalars every parameter of that dtype shares: the learning rate, and for Adam
// the bias corrections folded into two scalars (see write_updates) and AdamW's decay factor.
struct Shared {
  std::string lr, adam_step, adam_epsilon, keep;
};

Shared shared_scalars(StepWriter& w, const OptimizerOptions& o, int32_t dtype, const std::string& t,
                      const std::string& lr) {
  Shared s;
  s.lr = dtype == onnx::TensorProto::FLOAT ? lr : w.op("Cast", {lr}, {attr_i("to", dtype)}, {}, "learning_rate");
  if (o.kind == OptimizerOptions::Kind::kSgd) return s;
  const std::string tf = w.op("Cast", {t}, {attr_i("to", dtype)}, {}, "step_count");
  const std::string one = w.constant(dtype, 1.0);
  const std::string c1 = w.op("Sub", {one, w.op("Pow", {w.constant(dtype, o.beta1), tf})}, {}, {}, "bias_correction1");
  const std::string c2 = w.op("Sub", {one, w.op("Pow", {w.constant(dtype, o.beta2), tf})}, {}, {}, "bias_correction2");
  const std::string root_c2 = w.op("Sqrt", {c2}, {}, {}, "bias_correction2_sqrt");
  s.adam_step = w.op("Div", {w.op("Mul", {s.lr, root_c2}), c1}, {}, {}, "adam_step_size");
  s.adam_epsilon = w.op("Mul", {w.constant(dtype, o.epsilon), root_c2}, {}, {}, "adam_epsilon");
  if (o.kind == OptimizerOptions::Kind::kAdamW && o.weight_decay != 0.0)
    s.keep = w.op("Sub", {one, w.op("Mul", {s.lr, w.constant(dtype, o.weight_decay)})}, {}, {}, "decay_factor");
  return s;
}

}  // namespace

void write_updates(StepWriter& w, const OptimizerOptions& o, const std::vector<Param>& params,
                   const std::vector<ParamState>& state, const std::vector<std::string>& p_new, const std::string& t,
                   const std::string& lr) {
  using Kind = OptimizerOptions::Kind;
  std::map<int32_t, Shared> shared;
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    const int32_t dt = p.facts.dtype;
    auto it = shared.find(dt);
    if (it == shared.end()) it = shared.emplace(dt, shared_scalars(w, o, dt, t, lr)).first;
    const Shared& s = it->second;
    auto c = [&](double v) { return w.constant(dt, v); };
    auto op = [&](std::string_view type, const Names& in, std::string_view hint) {
      return w.op(type, in, {}, {}, p.name + "_" + std::string(hint));
    };
    const bool decay = o.weight_decay != 0.0 && p.decay;
    std::string g = p.grad;
    if (decay && o.kind != Kind::kAdamW) g = op("Add", {g, op("Mul", {p.name, c(o.weight_decay)}, "decay")}, "l2");
    if (o.kind == Kind::kSgd) {
      std::string direction = g;
      if (o.momentum != 0.0) {
        const Carried& v = state[i][0];
        const std::string velocity = w.op("Add", {w.op("Mul", {v.input, c(o.momentum)}), g}, {}, v.output);
        direction =
            o.nesterov ? op("Add", {g, op("Mul", {velocity, c(o.momentum)}, "lookahead")}, "nesterov") : velocity;
      }
      w.op("Sub", {p.name, op("Mul", {direction, s.lr}, "update")}, {}, p_new[i]);
      continue;
    }
    // Adam: lr m^ / (sqrt(v^) + eps) with m^ = m / c1, v^ = v / c2 (c = 1 - beta^t) is
    // (lr sqrt(c2) / c1) m / (sqrt(v) + eps sqrt(c2)): the corrections are scalars, not passes
    // over the moments. AdamW's decay lr wd p folds into p (1 - lr wd).
    const Carried& m = state[i][0];
    const Carried& v = state[i][1];
    const std::string m_new =
        w.op("Add", {w.op("Mul", {m.input, c(o.beta1)}), w.op("Mul", {g, c(1.0 - o.beta1)})}, {}, m.output);
    const std::string g2 = op("Mul", {g, g}, "grad_squared");
    const std::string v_new =
        w.op("Add", {w.op("Mul", {v.input, c(o.beta2)}), w.op("Mul", {g2, c(1.0 - o.beta2)})}, {}, v.output);
    const std::string denominator = op("Add", {op("Sqrt", {v_new}, "rms"), s.adam_epsilon}, "denominator");
    const std::string update = op("Mul", {op("Div", {m_new, denominator}, "adam"), s.adam_step}, "update");
    const std::string kept = decay && o.kind == Kind::kAdamW ? op("Mul", {p.name, s.keep}, "decayed") : p.name;
    w.op("Sub", {kept, update}, {}, p_new[i]);
  }
}

}  // namespace onnax::training
