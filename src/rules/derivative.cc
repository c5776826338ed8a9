#include "rules/derivative.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "diagnostics/error.h"

namespace onnax {

namespace {
const onnx::AttributeProto* find_attr(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}
}  // namespace

int64_t JvpCtx::rank(int i) const {
  int64_t r = b.rank(xs[i]);
  if (r < 0)
    unsupported("the rank of input " + std::to_string(i) + " '" + node.input(i) + "' is unknown and this rule needs it",
                "declare the shape of '" + node.input(i) + "' (value_info) so its rank is known");
  return r;
}
const onnx::AttributeProto* JvpCtx::attr(const std::string& name) const {
  return find_attr(node, name);
}
int64_t JvpCtx::attr_i(const std::string& name, int64_t fallback) const {
  const auto* a = attr(name);
  return a ? a->i() : fallback;
}
float JvpCtx::attr_f(const std::string& name, float fallback) const {
  const auto* a = attr(name);
  return a ? a->f() : fallback;
}
std::vector<int64_t> JvpCtx::attr_ints(const std::string& name) const {
  const auto* a = attr(name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
}

V JvpCtx::like_out(V t, int k) const {
  if (!t.valid()) return t;
  if (same_static_shape(b.facts(t), b.facts(ys[k]))) return t;
  return b.expand(t, b.shape_value(ys[k]));
}

const Facts& facts_or_twin(const Builder& b, V v) {
  const Facts& f = b.facts(v);
  return f.rank() >= 0 || !b.witness(v).valid() ? f : b.facts(b.witness(v));
}

V JvpCtx::term(V t, int k) const {
  const V y = k < static_cast<int>(ys.size()) ? ys[static_cast<size_t>(k)] : V{};
  if (!t.valid() || !y.valid()) return t;
  b.set_witness(t, y);
  if (b.facts(t).rank() < 0 && b.facts(y).rank() >= 0) b.set_facts(t, b.facts(y));
  return t;
}

void JvpCtx::unsupported(const std::string& what, const std::string& fix) const {
  diag::fail(Error::Kind::kUnsupported,
             "jvp: cannot differentiate " + diag::op_at(node, opset) + ": " + what + ". Fix: " + fix);
}

const onnx::AttributeProto* TransposeCtx::attr(const std::string& name) const {
  return find_attr(node, name);
}
int64_t TransposeCtx::attr_i(const std::string& name, int64_t fallback) const {
  const auto* a = attr(name);
  return a ? a->i() : fallback;
}
std::vector<int64_t> TransposeCtx::attr_ints(const std::string& name) const {
  const auto* a = attr(name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
}
int64_t TransposeCtx::rank(V v) const {
  int64_t r = b.rank(v);
  if (r < 0) unsupported("a rank needed to transpose it is unknown");
  return r;
}
void TransposeCtx::unsupported(const std::string& what) const {
  unsupported(what, "declare static shapes for the values around it (value_info), or use jvp (forward mode)");
}
void TransposeCtx::unsupported(const std::string& what, const std::string& fix) const {
  const std::string domain = node.domain().empty() ? "ai.onnx" : node.domain();
  diag::fail(Error::Kind::kUnsupported, "vjp: cannot transpose the linear " + domain + "::" + node.op_type() +
                                            " (opset " + std::to_string(opset) + ") emitted for the tangent '" +
                                            std::string(origin) + "': " + what + ". Fix: " + fix);
}

namespace {

// The length of a run-time shape `s` (the rank it describes), as an int64 scalar. Spelled
// Shape+Squeeze, not Size: ONNX Runtime 1.31's data propagation takes Size of a shape whose
// values it knows for the product of those values, and then rejects shapes built from it.
V length_of(Builder& b, V s) {
  return b.op1("Squeeze", {b.op1("Shape", {s}), b.i64s({0})});
}

// Sums `ct` over its leading axes beyond `rank` (a run-time int64 scalar): the broadcast
// operand's missing leading dims, when ranks are known only at run time.
V sum_leading(Builder& b, V ct, V rank) {
  V extra = b.op1("Sub", {length_of(b, b.op1("Shape", {ct})), rank});
  V lead = b.op1("Range", {b.i64(0), extra, b.i64(1)});
  return b.op1("ReduceSum", {ct, lead}, {Attr::i("keepdims", 0), Attr::i("noop_with_empty_axes", 1)});
}

// numpy broadcasting of two run-time shapes (1-D int64) of ranks r1 and r2 (-1: unknown).
V broadcast_shapes(Builder& b, V s1, int64_t r1, V s2, int64_t r2) {
  if (r1 >= 0 && r2 >= 0) {
    // Known ranks: pad the shorter with ones (a constant), then a dim of 1 takes the other's.
    auto pad = [&](V s, int64_t r) {
      const int64_t missing = std::max(r1, r2) - r;
      return missing == 0 ? s : b.concat({b.i64s(std::vector<int64_t>(static_cast<size_t>(missing), 1)), s}, 0);
    };
    const V p1 = pad(s1, r1), p2 = pad(s2, r2);
    return b.op1("Where", {b.op1("Equal", {p1, b.i64(1)}), p2, p1});
  }
  V n1 = length_of(b, s1), n2 = length_of(b, s2);
  V n = b.op1("Max", {n1, n2});
  auto padded = [&](V s, V len) {
    V missing = b.op1("Reshape", {b.op1("Sub", {n, len}), b.i64s({1})});
    return b.op1("Concat", {b.op1("Expand", {b.i64s({1}), missing}), s}, {Attr::i("axis", 0)});
  };
  V p1 = padded(s1, n1), p2 = padded(s2, n2);
  return b.op1("Where", {b.op1("Equal", {p1, b.i64(1)}), p2, p1});
}

}  // namespace

namespace {
V computed_shape(Builder& b, V t, int depth);
}  // namespace

V runtime_shape(Builder& b, V t, int depth) {
  if (!t.valid()) return V{};
  if (const V known = b.known_shape(t); known.valid()) return known;
  const V shape = computed_shape(b, t, depth);
  if (shape.valid()) b.remember_shape(t, shape);
  return shape;
}

namespace {

V computed_shape(Builder& b, V t, int depth) {
  if (const V w = b.witness(t); w.valid()) return b.shape_value(w);
  if (!b.tangent(t)) return b.shape_value(t);
  const Builder::TapeNode* tn = b.tape_node_of(t);
  if (tn == nullptr || depth > 16 || tn->outputs.empty() || tn->outputs[0].id != t.id) return V{};
  // Ops whose output has the (broadcast) shape of their inputs.
  static constexpr std::string_view kSameShape[] = {"Neg", "Identity", "Cast", "CastLike"};
  static constexpr std::string_view kBroadcasting[] = {"Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Where"};
  const std::string_view type = tn->node->op_type();
  const bool same = std::find(std::begin(kSameShape), std::end(kSameShape), type) != std::end(kSameShape);
  if (same) return runtime_shape(b, tn->inputs[0], depth + 1);
  auto rank_of = [&](V v) { return facts_or_twin(b, v).rank(); };
  auto slice = [&](V s, int64_t from, int64_t to) { return b.op1("Slice", {s, b.i64s({from}), b.i64s({to})}); };
  if (type == "MatMul" && tn->inputs.size() == 2) {
    // Batch dims broadcast, then [rows of a, columns of b] (ranks >= 2 known: 1-D operands drop
    // their dim).
    const V x = tn->inputs[0], y = tn->inputs[1];
    const int64_t rx = rank_of(x), ry = rank_of(y);
    if (rx < 2 || ry < 2) return V{};
    const V sx = runtime_shape(b, x, depth + 1), sy = runtime_shape(b, y, depth + 1);
    if (!sx.valid() || !sy.valid()) return V{};
    const V batch = broadcast_shapes(b, slice(sx, 0, -2), rx - 2, slice(sy, 0, -2), ry - 2);
    return b.concat({batch, slice(sx, -2, -1), slice(sy, -1, std::numeric_limits<int64_t>::max())}, 0);
  }
  if (type == "Expand" && tn->inputs.size() == 2) {
    // The input broadcast against the requested shape (a primal int64 vector).
    const V x = tn->inputs[0], shape = tn->inputs[1];
    const Facts& sf = b.facts(shape);
    const int64_t rx = rank_of(x);
    const int64_t rs = sf.rank() == 1 && sf.dims[0].known() ? sf.dims[0].value() : -1;
    const V sx = runtime_shape(b, x, depth + 1);
    if (!sx.valid() || b.tangent(shape)) return V{};
    return broadcast_shapes(b, sx, rx, shape, rs);
  }
  if ((type == "ReduceSum" || type == "ReduceMean") && !tn->inputs.empty()) {
    // Reduced axes (constant) become 1 with keepdims, disappear without.
    const V x = tn->inputs[0];
    const int64_t rx = rank_of(x);
    const V axes_in = tn->inputs.size() > 1 ? tn->inputs[1] : V{};
    const std::vector<int64_t>* axes = axes_in.valid() ? b.known_i64(axes_in) : nullptr;
    bool keepdims = true, noop_with_empty = false;
    for (const auto& a : tn->node->attribute()) {
      if (a.name() == "keepdims") keepdims = a.i() != 0;
      if (a.name() == "noop_with_empty_axes") noop_with_empty = a.i() != 0;
    }
    if (axes_in.valid() && axes == nullptr && !b.tangent(axes_in)) {
      // Axes known only at run time: which positions they hit, from the input's run-time shape.
      const V sx = runtime_shape(b, x, depth + 1);
      if (!sx.valid()) return V{};
      const V r = length_of(b, sx);
      const V ax = b.reshape(axes_in, b.i64s({1, -1}));
      const V normalized = b.op1("Where", {b.op1("Less", {ax, b.i64(0)}), b.op1("Add", {ax, r}), ax});
      const V positions = b.unsqueeze(b.op1("Range", {b.i64(0), r, b.i64(1)}), {1});  // (r, 1)
      const V hits =
          b.op1("ReduceSum",
                {b.op1("Cast", {b.op1("Equal", {positions, normalized})}, {Attr::i("to", onnx::TensorProto::INT64)}),
                 b.i64s({1})},
                {Attr::i("keepdims", 0)});
      V reduced = b.op1("Greater", {hits, b.i64(0)});
      // (No axes: every axis, unless noop_with_empty_axes.)
      if (!noop_with_empty) reduced = b.op1("Or", {reduced, b.op1("Equal", {b.op1("Size", {axes_in}), b.i64(0)})});
      return keepdims ? b.op1("Where", {reduced, b.i64(1), sx})
                      : b.op1("Compress", {sx, b.op1("Not", {reduced})}, {Attr::i("axis", 0)});
    }
    if (rx < 0 || axes == nullptr || axes->empty()) return V{};
    std::vector<int64_t> reduced(static_cast<size_t>(rx), 0), kept;
    for (int64_t a : *axes) reduced[static_cast<size_t>(a < 0 ? a + rx : a)] = 1;
    const V sx = runtime_shape(b, x, depth + 1);
    if (!sx.valid()) return V{};
    if (keepdims) {
      std::vector<int64_t> ones(static_cast<size_t>(rx), 1);
      return b.op1("Where",
                   {b.op1("Cast", {b.i64s(reduced)}, {Attr::i("to", onnx::TensorProto::BOOL)}), b.i64s(ones), sx});
    }
    for (int64_t a = 0; a < rx; ++a)
      if (!reduced[static_cast<size_t>(a)]) kept.push_back(a);
    return b.op1("Gather", {sx, b.i64s(kept)}, {Attr::i("axis", 0)});
  }
  if (std::find(std::begin(kBroadcasting), std::end(kBroadcasting), type) == std::end(kBroadcasting)) return V{};
  V shape;
  int64_t rank = -1;
  for (V in : tn->inputs) {
    if (!in.valid()) continue;
    const V s = runtime_shape(b, in, depth + 1);
    if (!s.valid()) return V{};
    const int64_t r = rank_of(in);
    if (!shape.valid()) {
      shape = s, rank = r;
      continue;
    }
    shape = broadcast_shapes(b, shape, rank, s, r);
    rank = rank >= 0 && r >= 0 ? std::max(rank, r) : -1;
  }
  return shape;
}

}  // namespace

void bind_tangent(Builder& b, V tangent, V primal) {
  if (!b.witness(tangent).valid()) b.set_witness(tangent, primal);
  if (b.facts(primal).has_shape && !b.tangent(primal)) b.set_facts(tangent, b.facts(primal));
}

V unbroadcast(Builder& b, V ct, V target, V witness) {
  if (!ct.valid()) return ct;
  const Facts& cf = b.facts(ct);
  const Facts& tf = b.facts(target);
  if (same_static_shape(cf, tf)) return ct;
  // The target's run-time shape: its primal twin's, else from the tape nodes that made it.
  auto target_shape = [&] { return witness.valid() ? b.shape_value(witness) : runtime_shape(b, target); };
  if (!tf.has_shape) {
    const V shape = target_shape();
    if (!shape.valid())
      diag::fail(Error::Kind::kUnsupported,
                 "vjp: cannot sum a broadcast cotangent back to its operand's shape because their ranks are unknown. "
                 "Fix: declare the shapes of the model's inputs and intermediate values (value_info)");
    // Everything at run time: sum the extra leading axes, then every axis where the operand has
    // size 1 (a no-op where the cotangent has size 1 too).
    const V rank = length_of(b, shape);
    V out = sum_leading(b, ct, rank);
    V ones = b.op1("Equal", {shape, b.i64(1)});
    V idx = b.op1("Range", {b.i64(0), rank, b.i64(1)});
    V axes = b.op1("Compress", {idx, ones}, {Attr::i("axis", 0)});
    V res = b.op1("ReduceSum", {out, axes}, {Attr::i("keepdims", 1), Attr::i("noop_with_empty_axes", 1)});
    b.set_facts(res, Facts{tf.dtype ? tf.dtype : cf.dtype, false, {}});
    return res;
  }
  const int64_t r = tf.rank();
  V out = ct;
  Facts reduced = cf;
  // Leading axes the cotangent has and the target lacks (summed away).
  std::vector<int64_t> lead;
  if (!cf.has_shape) {
    // The cotangent's rank is known only at run time; the target's is r.
    out = sum_leading(b, ct, b.i64(r));
    reduced = Facts::of(cf.dtype ? cf.dtype : tf.dtype, Dims(static_cast<size_t>(r), Dim{}));
    b.set_facts(out, reduced);
  } else if (cf.rank() > r) {
    for (int64_t i = 0; i < cf.rank() - r; ++i) lead.push_back(i);
    reduced.dims.erase(reduced.dims.begin(), reduced.dims.begin() + (cf.rank() - r));
  }
  std::vector<int64_t> axes;
  bool ambiguous = false;
  for (int64_t i = 0; i < r; ++i) {
    const Dim& td = tf.dims[i];
    const Dim* cd = static_cast<int64_t>(reduced.dims.size()) == r ? &reduced.dims[i] : nullptr;
    const bool cd_one = cd && cd->known() && cd->value() == 1;
    if (td.known()) {
      if (td.value() == 1 && !cd_one) axes.push_back(i);
    } else if (!(cd && cd->same_as(td)) && !cd_one) {
      // An unknown or symbolic target dim could be a broadcast 1 at run time.
      ambiguous = true;
    }
  }
  const V shape = ambiguous ? target_shape() : V{};
  if (!shape.valid() && !lead.empty()) {
    // One ReduceSum over the leading and the broadcast axes together: summing the leading
    // axes on their own is a separate pass over the whole cotangent, and ONNX Runtime's
    // ReduceSum over a leading axis of size 1 (batch 1) is a slow copy, 20x a ReduceSum of
    // every axis at once on a ResNet activation.
    bool lead_ones = true;
    for (int64_t i : lead) lead_ones = lead_ones && cf.dims[i].known() && cf.dims[i].value() == 1;
    if (axes.empty() && lead_ones) return b.squeeze(ct, lead);  // nothing to sum
    std::vector<int64_t> all = lead;
    for (int64_t a : axes) all.push_back(a + static_cast<int64_t>(lead.size()));
    if (axes.empty()) return b.op1_known("ReduceSum", {ct, b.i64s(all)}, {Attr::i("keepdims", 0)}, reduced);
    Facts kept = cf;
    for (int64_t a : all) kept.dims[a] = Dim::of(1);
    return b.squeeze(b.op1_known("ReduceSum", {ct, b.i64s(all)}, {Attr::i("keepdims", 1)}, kept), lead);
  }
  if (!lead.empty()) out = b.op1_known("ReduceSum", {out, b.i64s(lead)}, {Attr::i("keepdims", 0)}, reduced);
  if (shape.valid()) {
    // Sum over every axis where the operand has size 1 (a no-op where ct has size 1 too).
    V ones = b.op1("Equal", {shape, b.i64(1)});
    V idx = b.op1("Range", {b.i64(0), b.i64(r), b.i64(1)});
    V sum_axes = b.op1("Compress", {idx, ones}, {Attr::i("axis", 0)});
    V res = b.op1_known("ReduceSum", {out, sum_axes}, {Attr::i("keepdims", 1), Attr::i("noop_with_empty_axes", 1)}, tf);
    // ONNX's inference cannot type a ReduceSum over run-time axes; record the shape so later
    // transforms of the result (vmap of a gradient) still know its rank.
    b.declare(res);
    return res;
  }
  // (Still ambiguous here: unknown dims with no run-time shape are taken as not broadcast.)
  if (axes.empty()) return out;
  return b.op1_known("ReduceSum", {out, b.i64s(axes)}, {Attr::i("keepdims", 1)}, tf);
}

JvpRule expr_jvp(std::function<Expr(JvpCtx&)> tangent) {
  return [tangent = std::move(tangent)](JvpCtx& c) -> Vs { return {c.emit(tangent(c))}; };
}

Vs linear_in_first_jvp(JvpCtx& c) {
  if (!c.t(0).valid()) return Vs(c.ys.size());
  Vs ins = c.xs;
  ins[0] = c.t(0);
  Vs out = c.same_op_all(ins);
  out.resize(c.ys.size());
  return out;
}

V tangent_shape(TransposeCtx& c, V t) {
  if (const V shape = runtime_shape(c.b, t); shape.valid()) return shape;
  const auto dims = static_dims(c.b.facts(t));
  if (!dims) c.unsupported("the shape of its tangent input is not known statically and has no primal twin");
  return c.b.i64s(*dims);
}

Vs selection_transpose(TransposeCtx& c, int i, bool each_once) {
  auto& b = c.b;
  V shape = tangent_shape(c, c.in(i));
  V size = b.op1("ReduceProd", {shape}, {Attr::i("keepdims", 1)});
  V iota = b.op1("Range", {b.i64(0), b.op1("Squeeze", {size, b.i64s({0})}), b.i64(1)});
  V positions_in = b.reshape(iota, shape);
  Vs ins = c.ins;
  ins[i] = positions_in;
  V positions = b.clone(c.node, ins)[0];
  const int32_t dt = b.facts(c.ct()).dtype;
  V zeros = b.expand(b.scalar(0.0, dt), size);
  V flat_pos = b.reshape(positions, b.i64s({-1}));
  V flat_ct = b.reshape(c.ct(), b.i64s({-1}));
  V summed = each_once ? b.op1("ScatterElements", {zeros, flat_pos, flat_ct}, {Attr::i("axis", 0)})
                       : b.op1("ScatterElements", {zeros, flat_pos, flat_ct},
                               {Attr::i("axis", 0), Attr::s("reduction", "add")});
  Vs out(c.ins.size());
  out[i] = b.reshape(summed, shape);
  return out;
}

bool differentiable_dtype(int32_t dt) {
  return dt == onnx::TensorProto::FLOAT || dt == onnx::TensorProto::DOUBLE;
}

}  // namespace onnax
