// Derivatives of the recurrent ops (RNN, GRU, LSTM) by expansion. ONNX defines no function
// body for them, so the op is written out here as the spec's equations: the input projection
// X W^T for all steps at once, then a Loop over time of MatMul/Add/activation nodes carrying
// the hidden (and cell) state. Directions, layouts, sequence_lens, initial states, peepholes,
// clip, linear_before_reset, input_forget and the activation lists are covered. The expansion
// is differentiated by its nodes' own rules (the Loop by the control-flow rules), so reverse
// mode, higher orders and vmap of derivatives come with it. The op's own outputs stay as they
// were: the expansion only feeds the tangents.
#include <onnx/onnx_pb.h>

#include <cctype>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "rules/batching.h"
#include "rules/derivative.h"
#include "rules/expansion_writer.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

struct Activation {
  std::string name;  // lowercase
  float alpha = 0;
  float beta = 0;
};

// The op's activation functions, `per_direction` for each direction, with their alpha/beta.
// As in ONNX Runtime, activation_alpha/beta are consumed in order by the functions that take
// them; a list for one direction serves both of a bidirectional op.
std::vector<Activation> activations(const JvpCtx& c, size_t per_direction, size_t directions,
                                    const std::vector<std::string>& defaults) {
  std::vector<std::string> names;
  if (const auto* a = c.attr("activations"))
    for (const auto& s : a->strings()) names.push_back(lowercase(s));
  if (names.empty())
    for (const auto& d : defaults) names.push_back(lowercase(d));
  if (names.size() == per_direction && directions == 2) {
    const std::vector<std::string> one = names;
    names.insert(names.end(), one.begin(), one.end());
  }
  if (names.size() != per_direction * directions)
    c.unsupported("activations lists " + std::to_string(names.size()) + " functions; expected " +
                      std::to_string(per_direction) + " per direction (" + std::to_string(directions) +
                      " direction(s))",
                  "give one function per gate activation and direction, as the ONNX spec lists them");
  const std::vector<float> alphas = [&] {
    std::vector<float> v;
    if (const auto* a = c.attr("activation_alpha")) v.assign(a->floats().begin(), a->floats().end());
    return v;
  }();
  const std::vector<float> betas = [&] {
    std::vector<float> v;
    if (const auto* a = c.attr("activation_beta")) v.assign(a->floats().begin(), a->floats().end());
    return v;
  }();
  size_t next_alpha = 0, next_beta = 0;
  std::vector<Activation> out;
  for (const auto& n : names) {
    Activation act{n};
    float default_alpha = 0, default_beta = 0;
    bool takes_alpha = true, takes_beta = false;
    if (n == "leakyrelu") {
      default_alpha = 0.01f;
    } else if (n == "thresholdedrelu" || n == "elu") {
      default_alpha = 1.0f;
    } else if (n == "hardsigmoid") {
      default_alpha = 0.2f, default_beta = 0.5f, takes_beta = true;
    } else if (n == "affine") {
      default_alpha = 1.0f, takes_beta = true;
    } else if (n == "scaledtanh") {
      default_alpha = 1.0f, default_beta = 1.0f, takes_beta = true;
    } else if (n == "relu" || n == "tanh" || n == "sigmoid" || n == "softsign" || n == "softplus") {
      takes_alpha = false;
    } else {
      c.unsupported("activation '" + n + "' is not one the ONNX spec lists",
                    "use Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, "
                    "Softsign or Softplus");
    }
    act.alpha = takes_alpha && next_alpha < alphas.size() ? alphas[next_alpha++] : default_alpha;
    act.beta = takes_beta && next_beta < betas.size() ? betas[next_beta++] : default_beta;
    out.push_back(act);
  }
  return out;
}

std::string activate(ExpansionWriter& w, const Activation& a, const std::string& x) {
  if (a.name == "relu") return w.op("Relu", {x});
  if (a.name == "tanh") return w.op("Tanh", {x});
  if (a.name == "sigmoid") return w.op("Sigmoid", {x});
  if (a.name == "softsign") return w.op("Softsign", {x});
  if (a.name == "softplus") return w.op("Softplus", {x});
  if (a.name == "leakyrelu") return w.op("LeakyRelu", {x}, {attr_f("alpha", a.alpha)});
  if (a.name == "thresholdedrelu") return w.op("ThresholdedRelu", {x}, {attr_f("alpha", a.alpha)});
  if (a.name == "elu") return w.op("Elu", {x}, {attr_f("alpha", a.alpha)});
  if (a.name == "hardsigmoid") return w.op("HardSigmoid", {x}, {attr_f("alpha", a.alpha), attr_f("beta", a.beta)});
  if (a.name == "affine") return w.op("Add", {w.op("Mul", {x, w.scalar(a.alpha)}), w.scalar(a.beta)});
  // scaledtanh
  return w.op("Mul", {w.op("Tanh", {w.op("Mul", {x, w.scalar(a.beta)})}), w.scalar(a.alpha)});
}

enum class Cell { kRnn, kGru, kLstm };

// What one direction's step needs besides the state.
struct StepInputs {
  std::string x;    // this step's input projection with biases, [batch, gates * hidden]
  std::string rt;   // R^T, [hidden, gates * hidden] (GRU: the z and r gates' only)
  std::string rh;   // GRU: Rh^T, [hidden, hidden]
  std::string rbh;  // GRU with linear_before_reset: Rbh, [hidden]
  std::string p;    // LSTM peepholes [3 * hidden] (empty: none)
  std::string h;    // previous hidden state [batch, hidden]
  std::string c;    // LSTM: previous cell state
};

struct Options {
  Cell cell;
  std::vector<Activation> acts;  // this direction's
  bool clip = false;
  float clip_value = 0;
  bool linear_before_reset = false;
  bool input_forget = false;
};

// One time step: the new hidden (and cell) state. Clip bounds the inputs of the gate
// activations, as ONNX Runtime applies it.
std::pair<std::string, std::string> step(ExpansionWriter& w, const Options& o, const StepInputs& in) {
  auto clipped = [&](const std::string& x) {
    return o.clip ? w.op("Clip", {x, w.scalar(-o.clip_value), w.scalar(o.clip_value)}) : x;
  };
  auto act = [&](size_t k, const std::string& x) { return activate(w, o.acts[k], clipped(x)); };
  if (o.cell == Cell::kRnn) {
    const std::string pre = w.op("Add", {in.x, w.op("MatMul", {in.h, in.rt})});
    return {act(0, pre), {}};
  }
  if (o.cell == Cell::kGru) {
    const Names xs = w.op_n("Split", {in.x}, 3, {attr_i("axis", -1), attr_i("num_outputs", 3)});
    const Names hzr =
        w.op_n("Split", {w.op("MatMul", {in.h, in.rt})}, 2, {attr_i("axis", -1), attr_i("num_outputs", 2)});
    const std::string z = act(0, w.op("Add", {xs[0], hzr[0]}));
    const std::string r = act(0, w.op("Add", {xs[1], hzr[1]}));
    std::string hpart;
    if (o.linear_before_reset)
      hpart = w.op("Mul", {r, w.op("Add", {w.op("MatMul", {in.h, in.rh}), in.rbh})});
    else
      hpart = w.op("MatMul", {w.op("Mul", {r, in.h}), in.rh});
    const std::string hh = act(1, w.op("Add", {xs[2], hpart}));
    // H = (1 - z) * hh + z * H_prev = hh + z * (H_prev - hh)
    return {w.op("Add", {hh, w.op("Mul", {z, w.op("Sub", {in.h, hh})})}), {}};
  }
  // LSTM: gates in the order i, o, f, c.
  const std::string pre = w.op("Add", {in.x, w.op("MatMul", {in.h, in.rt})});
  const Names g = w.op_n("Split", {pre}, 4, {attr_i("axis", -1), attr_i("num_outputs", 4)});
  Names p;
  if (!in.p.empty()) p = w.op_n("Split", {in.p}, 3, {attr_i("axis", -1), attr_i("num_outputs", 3)});
  auto peep = [&](const std::string& x, size_t k, const std::string& state) {
    return p.empty() ? x : w.op("Add", {x, w.op("Mul", {p[k], state})});
  };
  const std::string i = act(0, peep(g[0], 0, in.c));
  const std::string f = o.input_forget ? w.op("Sub", {w.scalar(1.0), i}) : act(0, peep(g[2], 2, in.c));
  const std::string cc = act(1, g[3]);
  const std::string c = w.op("Add", {w.op("Mul", {f, in.c}), w.op("Mul", {i, cc})});
  const std::string og = act(0, peep(g[1], 1, c));
  return {w.op("Mul", {og, activate(w, o.acts[2], c)}), c};
}

onnx::ValueInfoProto typed(const std::string& name, int32_t dtype, int rank) {
  onnx::ValueInfoProto vi;
  vi.set_name(name);
  write_type(Facts::of(dtype, Dims(static_cast<size_t>(rank), Dim{})), vi.mutable_type());
  return vi;
}

// Reverses the time axis (0) of `x`: within each sequence's length when `lens` is given.
std::string reverse_time(ExpansionWriter& w, const std::string& x, const std::string& lens) {
  if (!lens.empty()) return w.op("ReverseSequence", {x, lens}, {attr_i("batch_axis", 1), attr_i("time_axis", 0)});
  return w.op("Slice", {x, w.i64s({-1}), w.i64s({std::numeric_limits<int64_t>::min()}), w.i64s({0}), w.i64s({-1})});
}

Vs recurrent_jvp(JvpCtx& c) {
  const int source_index = c.b.node_count() - 1;  // (the op itself, when the transform copied it)
  const std::string& type = c.node.op_type();
  const Cell cell = type == "RNN" ? Cell::kRnn : type == "GRU" ? Cell::kGru : Cell::kLstm;
  const size_t per_direction = cell == Cell::kRnn ? 1 : cell == Cell::kGru ? 2 : 3;
  const std::vector<std::string> defaults = cell == Cell::kRnn   ? std::vector<std::string>{"Tanh"}
                                            : cell == Cell::kGru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                                 : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  std::string direction = "forward";
  if (const auto* a = c.attr("direction")) direction = a->s();
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    c.unsupported("direction is '" + direction + "'", "use forward, reverse or bidirectional");
  const size_t directions = direction == "bidirectional" ? 2 : 1;
  const bool batch_first = c.attr_i("layout", 0) != 0;
  const int32_t dtype = c.dtype(0);
  Options opt{cell,
              {},
              c.attr("clip") != nullptr,
              c.attr_f("clip", 0),
              c.attr_i("linear_before_reset", 0) != 0,
              c.attr_i("input_forget", 0) != 0};
  const std::vector<Activation> acts = activations(c, per_direction, directions, defaults);

  auto input = [&](int i) { return i < c.node.input_size() ? c.node.input(i) : std::string(); };
  onnx::GraphProto g;
  ExpansionWriter w(c.b, g, c.node.output_size() > 0 && !c.node.output(0).empty() ? c.node.output(0) : type, dtype);

  // Time-major X [T, batch, input]; initial states [directions, batch, hidden].
  std::string x = input(0);
  std::string h0 = input(5);
  std::string c0 = cell == Cell::kLstm ? input(6) : std::string();
  const std::string peepholes = cell == Cell::kLstm ? input(7) : std::string();
  if (batch_first) {
    x = w.op("Transpose", {x}, {attr_ints("perm", {1, 0, 2})});
    if (!h0.empty()) h0 = w.op("Transpose", {h0}, {attr_ints("perm", {1, 0, 2})});
    if (!c0.empty()) c0 = w.op("Transpose", {c0}, {attr_ints("perm", {1, 0, 2})});
  }
  const std::string x_shape = w.op("Shape", {x});
  const std::string trips = w.op("Gather", {x_shape, w.i64(0)}, {attr_i("axis", 0)});
  std::string lens;
  if (!input(4).empty()) lens = w.op("Cast", {input(4)}, {attr_i("to", onnx::TensorProto::INT64)});
  const int64_t hidden_attr = c.attr_i("hidden_size", 0);
  const std::string hidden =
      hidden_attr > 0 ? w.i64s({hidden_attr}) : w.op("Slice", {w.op("Shape", {input(2)}), w.i64s({2}), w.i64s({3})});
  const std::string state_shape =
      w.op("Concat", {w.op("Slice", {x_shape, w.i64s({1}), w.i64s({2})}), hidden}, {attr_i("axis", 0)});
  const std::string zero = w.scalar(0.0);
  const std::string keep_going = w.flag(true);

  Names ys, hs, cs;
  for (size_t d = 0; d < directions; ++d) {
    const bool reverse = direction == "reverse" || d == 1;
    Options o = opt;
    o.acts.assign(acts.begin() + static_cast<std::ptrdiff_t>(d * per_direction),
                  acts.begin() + static_cast<std::ptrdiff_t>((d + 1) * per_direction));
    const std::string di = w.i64(static_cast<int64_t>(d));
    auto pick = [&](const std::string& t) { return w.op("Gather", {t, di}, {attr_i("axis", 0)}); };
    std::string xw = w.op("MatMul", {x, w.op("Transpose", {pick(input(1))})});
    std::string rt = w.op("Transpose", {pick(input(2))}), rh;
    if (cell == Cell::kGru) {
      const Names zrh = w.op_n("Split", {rt}, 3, {attr_i("axis", 1), attr_i("num_outputs", 3)});
      rt = w.op("Concat", {zrh[0], zrh[1]}, {attr_i("axis", 1)});
      rh = zrh[2];
    }
    std::string rbh;
    if (!input(3).empty()) {
      const Names wr = w.op_n("Split", {pick(input(3))}, 2, {attr_i("axis", 0), attr_i("num_outputs", 2)});
      std::string rb = wr[1];
      if (cell == Cell::kGru && opt.linear_before_reset) {
        // Rbh stays inside r * (H Rh^T + Rbh); the other recurrence biases add to the input.
        const Names zrh = w.op_n("Split", {rb}, 3, {attr_i("axis", 0), attr_i("num_outputs", 3)});
        rbh = zrh[2];
        rb = w.op("Concat", {zrh[0], zrh[1], w.op("Mul", {zrh[2], zero})}, {attr_i("axis", 0)});
      }
      xw = w.op("Add", {xw, w.op("Add", {wr[0], rb})});
    }
    if (cell == Cell::kGru && opt.linear_before_reset && rbh.empty()) rbh = w.op("Expand", {zero, hidden});
    if (reverse) xw = reverse_time(w, xw, lens);
    const std::string h_init = h0.empty() ? w.op("Expand", {zero, state_shape}) : pick(h0);
    std::string c_init;
    if (cell == Cell::kLstm) c_init = c0.empty() ? w.op("Expand", {zero, state_shape}) : pick(c0);
    const std::string p = peepholes.empty() ? std::string() : pick(peepholes);

    // The Loop body: the state; the values it only reads come from the enclosing graph by name
    // (the expansion's clone renames those reads with them), so no loop passes them along.
    onnx::GraphProto body;
    body.set_name(w.fresh("step"));
    ExpansionWriter bw(c.b, body, w.fresh("step"), dtype);
    const std::string it = bw.fresh("t"), cond = bw.fresh("cond");
    *body.add_input() = typed(it, onnx::TensorProto::INT64, 0);
    *body.add_input() = typed(cond, onnx::TensorProto::BOOL, 0);
    // (An explicit true condition: the ONNX reference evaluator runs no iteration without one.)
    Names loop_in{trips, keep_going}, carried_in;
    auto carry = [&](const std::string& outer, int32_t dt, int rank) {
      const std::string inner = bw.fresh("in");
      *body.add_input() = typed(inner, dt, rank);
      loop_in.push_back(outer);
      carried_in.push_back(inner);
      return inner;
    };
    StepInputs si;
    si.h = carry(h_init, dtype, 2);
    if (cell == Cell::kLstm) si.c = carry(c_init, dtype, 2);
    si.rt = rt;
    si.rh = rh;
    si.rbh = rbh;
    si.p = p;
    const std::string& lens_in = lens;
    si.x = bw.op("Gather", {xw, it}, {attr_i("axis", 0)});
    auto [h_new, c_new] = step(bw, o, si);
    std::string y_t = h_new;
    if (!lens.empty()) {
      // Past a sequence's length the state holds and the output is zero.
      const std::string live = bw.op("Unsqueeze", {bw.op("Less", {it, lens_in}), bw.i64s({1})});
      y_t = bw.op("Where", {live, h_new, bw.scalar(0.0)});
      h_new = bw.op("Where", {live, h_new, si.h});
      if (cell == Cell::kLstm) c_new = bw.op("Where", {live, c_new, si.c});
    }
    const std::string cond_out = bw.op("Identity", {cond});
    *body.add_output() = typed(cond_out, onnx::TensorProto::BOOL, 0);
    *body.add_output() = typed(bw.op("Identity", {h_new}), dtype, 2);
    if (cell == Cell::kLstm) *body.add_output() = typed(bw.op("Identity", {c_new}), dtype, 2);
    *body.add_output() = typed(bw.op("Identity", {y_t}), dtype, 2);

    const int loop_outputs = static_cast<int>(carried_in.size()) + 1;
    const Names outs = w.op_n("Loop", loop_in, loop_outputs, {Attr::graph("body", std::move(body)).proto});
    std::string y = outs.back();
    if (reverse) y = reverse_time(w, y, lens);
    ys.push_back(w.op("Unsqueeze", {y, w.i64s({1})}));
    hs.push_back(w.op("Unsqueeze", {outs[0], w.i64s({0})}));
    if (cell == Cell::kLstm) cs.push_back(w.op("Unsqueeze", {outs[1], w.i64s({0})}));
  }

  // The op's outputs, under its own output names (the expansion maps them to tangents).
  auto finish = [&](const Names& parts, int64_t axis, const std::vector<int64_t>& batch_first_perm, int k) {
    if (k >= c.node.output_size() || c.node.output(k).empty()) return;
    std::string v = parts.size() == 1 ? parts[0] : w.op("Concat", parts, {attr_i("axis", axis)});
    if (batch_first) v = w.op("Transpose", {v}, {attr_ints("perm", batch_first_perm)});
    w.op("Identity", {v}, {}, c.node.output(k));
  };
  finish(ys, 1, {2, 0, 1, 3}, 0);
  finish(hs, 0, {1, 0, 2}, 1);
  if (cell == Cell::kLstm) finish(cs, 0, {1, 0, 2}, 2);
  Vs primal;
  const Vs tangents = expansion_jvp(c, g, nullptr, &primal);
  // The expansion's loop runs anyway (forward mode's JVP loop computes it; reverse mode's
  // stacking loop takes its place), so its values of the op's outputs replace the op's: the
  // fused op is not run besides. (Nothing changes unless the op is the node adopted just before
  // this rule ran.)
  Vs inputs;
  for (int i = 0; i < c.node.input_size(); ++i) inputs.push_back(c.has(i) ? c.x(i) : V{});
  c.b.take_over_outputs(source_index, inputs, c.ys, primal);
  return tangents;
}

// ------------------------------------------------------------------------------------------
// vmap: with shared weights, the vmap batch merges into the op's batch axis (axis 1 of X and
// of the states time-major, axis 0 batch-first), so one op runs the whole batch.

// x (Bv, ..., with the op's batch axis at per-example position `axis`) -> the same axis holding
// Bv * batch (Bv moved next to it, then merged).
// (`rank`: the per-example rank of x.)
V merge_into(Builder& b, V x, int64_t axis, int64_t rank) {
  if (axis > 0) {
    std::vector<int64_t> perm;
    for (int64_t a = 1; a <= axis; ++a) perm.push_back(a);
    perm.push_back(0);
    for (int64_t a = axis + 1; a <= rank; ++a) perm.push_back(a);
    x = b.transpose(x, perm);
  }
  // (..., Bv, batch, rest...) -> (..., Bv * batch, rest...)
  std::vector<int64_t> shape(static_cast<size_t>(axis), 0);
  shape.push_back(-1);
  V rest = b.shape_of(x, axis + 2);
  return b.reshape(x, b.concat({b.i64s(shape), rest}, 0));
}

// y (per-example rank `rank`) with the merged batch at `axis` -> (Bv, ..., batch, ...).
V split_from(Builder& b, V y, int64_t axis, int64_t rank, V batch_v, V batch) {
  V shape = b.concat({b.shape_of(y, 0, axis), batch_v, batch, b.shape_of(y, axis + 1)}, 0);
  V split = b.reshape(y, shape);
  const int32_t dtype = b.facts(y).dtype;
  b.set_facts(split, Facts::of(dtype, Dims(static_cast<size_t>(rank + 1), Dim{})));
  if (axis == 0) return split;
  std::vector<int64_t> perm{axis};
  for (int64_t a = 0; a < axis; ++a) perm.push_back(a);
  for (int64_t a = axis + 1; a <= rank; ++a) perm.push_back(a);
  return b.transpose(split, perm);
}

BatchResult recurrent_rule(BatchCtx& c) {
  // Inputs: X, W, R, B, sequence_lens, initial_h (, initial_c, P). Weights batched: per example.
  for (int i : {1, 2, 3, 7})
    if (c.has(i) && c.batched[static_cast<size_t>(i)]) return scan_fallback(c);
  const bool batch_first = c.attr_i("layout", 0) != 0;
  const int64_t x_axis = batch_first ? 0 : 1;      // the op's batch axis in X and Y (per example)
  const int64_t state_axis = batch_first ? 0 : 1;  // and in the states
  auto& b = c.b;
  const V x = c.materialize(0);
  const V batch = b.shape_of(x, 1 + x_axis, 2 + x_axis);
  Vs ins = c.in;
  ins[0] = merge_into(b, x, x_axis, 3);
  if (c.has(4)) ins[4] = b.reshape(c.materialize(4), b.i64s({-1}));
  for (int i : {5, 6})
    if (c.has(i)) ins[static_cast<size_t>(i)] = merge_into(b, c.materialize(i), state_axis, 3);
  Vs outs = b.clone(c.node, ins);
  const V batch_v = c.batch_size();
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].valid()) {
      // Y: (T, D, batch, H) or (batch, T, D, H); Y_h, Y_c: (D, batch, H) or (batch, D, H).
      const int64_t axis = k == 0 ? (batch_first ? 0 : 2) : state_axis;
      outs[k] = split_from(b, outs[k], axis, k == 0 ? 4 : 3, batch_v, batch);
    }
  return all_batched(outs);
}

// ReverseSequence: batch_axis and time_axis must be 0 and 1, so the vmap batch merges into
// the op's batch axis (the lengths with it).
BatchResult reverse_sequence_rule(BatchCtx& c) {
  auto& b = c.b;
  const int64_t batch_axis = c.attr_i("batch_axis", 1);
  const int64_t rank = c.rank(0);
  const V x = c.materialize(0);
  const V batch = b.shape_of(x, 1 + batch_axis, 2 + batch_axis);
  Vs ins = {merge_into(b, x, batch_axis, rank), b.reshape(c.materialize(1), b.i64s({-1}))};
  V y = b.clone(c.node, ins)[0];
  return all_batched({split_from(b, y, batch_axis, rank, c.batch_size(), batch)});
}

}  // namespace

void register_recurrent(OpTable& table) {
  for (const char* op : {"RNN", "GRU", "LSTM"}) table.op(op).batch(recurrent_rule, 14);
  table.op("ReverseSequence").batch(reverse_sequence_rule, 10);
  for (const char* op : {"RNN", "GRU", "LSTM"}) table.op(op).jvp(recurrent_jvp);
}

}  // namespace onnax
