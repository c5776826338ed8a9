// Shape-manipulating operators.
#include <algorithm>
#include <climits>
#include <limits>

#include "diagnostics/error.h"
#include "rules/batching.h"
#include "rules/derivative.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

// A per-example shape/repeats vector with one leading entry for the batch axis.
V prepend(BatchCtx& c, V lead, int i) {
  return c.b.concat({lead, c.in[i]}, 0);
}

BatchResult reshape_rule(BatchCtx& c) {
  require_shared(c, 1, "shape");
  // 0 in the shape copies the input dim at the same index; one more leading entry keeps that
  // correspondence. With allowzero=1, 0 means an empty dim, so the batch size is spelled out.
  V lead = c.attr_i("allowzero", 0) ? c.batch_size() : c.b.i64s({0});
  return all_batched(c.b.clone(c.node, {c.in[0], prepend(c, lead, 1)}));
}

BatchResult transpose_rule(BatchCtx& c) {
  std::vector<int64_t> perm = c.attr_ints("perm");
  if (perm.empty())
    for (int64_t k = c.rank(0) - 1; k >= 0; --k) perm.push_back(k);
  std::vector<int64_t> p{0};
  for (int64_t a : perm) p.push_back(a < 0 ? a + static_cast<int64_t>(perm.size()) + 1 : a + 1);
  return all_batched(c.b.clone(c.node, {c.in[0]}, {Attr::ints("perm", p)}));
}

// Squeeze/Unsqueeze with axes as an input (opset 13+).
BatchResult squeeze_rule(BatchCtx& c) {
  require_shared(c, 1, "axes");
  if (!c.has(1)) {
    // Without axes Squeeze drops every size-1 dim, which could include the batch axis.
    const Facts* f = c.facts[0];
    std::vector<int64_t> ones;
    if (f && f->has_shape)
      for (int64_t k = 0; k < f->rank(); ++k) {
        if (!f->dims[k].known())
          c.unsupported("Squeeze without axes on " + c.describe_input(0) + ": dim " + std::to_string(k) +
                            " is not statically known, so which dims are 1 is unknown",
                        "give Squeeze an explicit axes input");
        if (f->dims[k].value() == 1) ones.push_back(k + 1);
      }
    else
      c.rank(0);  // fails with the unknown-rank diagnostic
    return all_batched(c.b.clone(c.node, {c.in[0], c.b.i64s(ones)}));
  }
  return all_batched(c.b.clone(c.node, {c.in[0], c.shifted_axes(1)}));
}

BatchResult flatten_rule(BatchCtx& c) {
  const int64_t r = c.rank(0);
  int64_t axis = c.attr_i("axis", 1);
  if (axis < 0) axis += r;
  // (B, d0..dr-1) -> Flatten at axis+1 gives (B*P, Q); reshape back to (B, P, Q).
  V flat = c.b.clone(c.node, {c.in[0]}, {Attr::i("axis", axis + 1)})[0];
  V q = axis == r ? c.b.i64s({1}) : c.b.shape_of(flat, 1, 2);
  // Reshape's 0 would copy B*P and -1 is ambiguous for an empty batch, so B and P are
  // spelled out.
  V p = c.b.op1("ReduceProd", {c.b.shape_of(c.in[0], 1, axis + 1)}, {Attr::i("keepdims", 1)});
  return all_batched({c.b.reshape(flat, c.b.concat({c.batch_size(), p, q}, 0))});
}

BatchResult expand_rule(BatchCtx& c) {
  require_shared(c, 1, "shape");
  const Facts* sf = c.facts[1];
  if (!sf || !sf->has_shape || sf->rank() != 1 || !sf->dims[0].known())
    c.unsupported("the length of the shape input is not statically known", "declare the shape input's length");
  const int64_t len = sf->dims[0].value();
  V x = c.pad_rank(0, len);
  return all_batched(c.b.clone(c.node, {x, prepend(c, c.b.i64s({1}), 1)}));
}

BatchResult concat_rule(BatchCtx& c) {
  Vs ins;
  for (int i = 0; i < c.num_inputs(); ++i) ins.push_back(c.materialize(i));
  return all_batched(c.b.clone(c.node, ins, {Attr::i("axis", shift_axis(c.attr_i("axis", 0)))}));
}

BatchResult split_rule(BatchCtx& c) {
  require_shared(c, 1, "split");
  return all_batched(c.b.clone(c.node, c.in, {Attr::i("axis", shift_axis(c.attr_i("axis", 0)))}));
}

BatchResult tile_rule(BatchCtx& c) {
  require_shared(c, 1, "repeats");
  return all_batched(c.b.clone(c.node, {c.in[0], prepend(c, c.b.i64s({1}), 1)}));
}

BatchResult pad_rule(BatchCtx& c) {
  require_shared(c, 1, "pads");
  require_shared(c, 2, "constant_value");
  Vs ins = c.in;
  ins.resize(4);
  if (c.has(3)) {
    ins[3] = c.shifted_axes(3);
  } else {
    std::vector<int64_t> axes;
    for (int64_t k = 1; k <= c.rank(0); ++k) axes.push_back(k);
    ins[3] = c.b.i64s(axes);
  }
  while (!ins.empty() && !ins.back().valid()) ins.pop_back();
  return all_batched(c.b.clone(c.node, ins));
}

// Shape of a batched value is the same for every example: the result is not batched.
BatchResult shape_rule(BatchCtx& c) {
  // Shape clamps start/end into [0, rank]; normalise against the per-example rank first so
  // a far-negative start never reaches the batch axis.
  const int64_t r = c.rank(0);
  auto norm = [&](int64_t a) { return std::clamp(a < 0 ? a + r : a, int64_t{0}, r); };
  const int64_t start = norm(c.attr_i("start", 0));
  const int64_t end = c.attr("end") ? norm(c.attr("end")->i()) : r;
  BatchResult out;
  out.out = {c.b.shape_of(c.in[0], start + 1, end + 1)};
  out.batched = {false};
  return out;
}

BatchResult size_rule(BatchCtx& c) {
  V s = c.b.shape_of(c.in[0], 1);
  BatchResult r;
  r.out = {c.b.op1("ReduceProd", {s}, {Attr::i("keepdims", 0)})};
  r.batched = {false};
  return r;
}

BatchResult shared_only_rule(BatchCtx& c) {
  for (int i = 0; i < c.num_inputs(); ++i) require_shared(c, i, "shape/size argument");
  return {};
}

// Compress with a shared condition selects the same positions in every example.
BatchResult compress_rule(BatchCtx& c) {
  if (c.batched[1]) refuse_ragged(c);  // per-example conditions select different counts
  if (!c.attr("axis")) {
    V flat = c.b.reshape(c.in[0], c.b.concat({c.batch_size(), c.b.i64s({-1})}, 0));
    return all_batched(c.b.clone(c.node, {flat, c.in[1]}, {Attr::i("axis", 1)}));
  }
  return all_batched(c.b.clone(c.node, c.in, {Attr::i("axis", shift_axis(c.attr_i("axis", 0)))}));
}

// Trilu keeps x[..., i, j] where j - i >= k (upper) or j - i <= k (lower). A per-example k
// selects with a mask built from each example's k; zeros come from Trilu itself with a k that
// keeps nothing, so every element type (bool and string included) gets its own zero.
BatchResult trilu_rule(BatchCtx& c) {
  if (!c.has(1) || !c.batched[1]) return all_batched(c.b.clone(c.node, c.in));
  auto& b = c.b;
  const int64_t r = c.rank(0);  // per-example rank (>= 2)
  const bool upper = c.attr_i("upper", 1) != 0;
  const V x = c.materialize(0);
  auto length = [&](int64_t axis) { return b.op1("Squeeze", {b.shape_of(x, axis, axis + 1), b.i64s({0})}); };
  const V rows = b.op1("Range", {b.i64(0), length(r - 1), b.i64(1)});
  const V cols = b.op1("Range", {b.i64(0), length(r), b.i64(1)});
  const V offset = b.op1("Sub", {b.unsqueeze(cols, {0}), b.unsqueeze(rows, {1})});  // j - i: [n, m]
  std::vector<int64_t> trailing;
  for (int64_t a = 1; a <= r; ++a) trailing.push_back(a);
  const V k = b.unsqueeze(b.op1("Cast", {b.reshape(c.in[1], b.i64s({-1}))}, {Attr::i("to", onnx::TensorProto::INT64)}),
                          trailing);  // [B, 1, ..., 1]
  const V keep = b.op1(upper ? "GreaterOrEqual" : "LessOrEqual", {offset, k});
  const int64_t none = upper ? std::numeric_limits<int64_t>::max() / 2 : std::numeric_limits<int64_t>::min() / 2;
  const V zeros = b.clone(c.node, {x, b.i64(none)})[0];
  return all_batched({b.op1("Where", {keep, x, zeros})});
}

BatchResult onehot_rule(BatchCtx& c) {
  require_shared(c, 1, "depth");
  const int64_t axis = c.attr_i("axis", -1);
  if (!c.batched[2]) return all_batched(c.b.clone(c.node, c.in, {Attr::i("axis", shift_axis(axis))}));
  // Per-example [off, on] values: build a 0/1 mask, then select each example's values.
  V idx = c.in[0];
  V mask =
      c.b.clone(c.node, {idx, c.in[1], c.b.i64s({0, 1})}, {Attr::i("axis", c.batched[0] ? shift_axis(axis) : axis)})[0];
  const int64_t out_rank = c.rank(0) + 1;
  auto pick = [&](int64_t k) {
    V v = c.b.op1("Gather", {c.in[2], c.b.i64(k)}, {Attr::i("axis", 1)});  // (B,)
    std::vector<int64_t> axes;
    for (int64_t a = 1; a <= out_rank; ++a) axes.push_back(a);
    return c.b.unsqueeze(v, axes);
  };
  V on = c.b.op1("Cast", {mask}, {Attr::i("to", onnx::TensorProto::BOOL)});
  return all_batched({c.b.op1("Where", {on, pick(1), pick(0)})});
}

}  // namespace

}  // namespace onnax

// ---------------------------------------------------------------------------------------
// Derivatives: shape ops are linear in their data input.
namespace onnax {
namespace {

using D = JvpCtx;

// Transposes that restore the input's shape from a reshaped cotangent.
Vs reshape_back(TransposeCtx& c) {
  Vs out(c.ins.size());
  // The shape is exact (it may contain 0 for empty dims), so 0 must not mean "copy".
  const V shape = tangent_shape(c, c.in(0));
  out[0] = c.b.reshape(c.ct(), shape, true);
  return out;
}

Vs transpose_transpose(TransposeCtx& c) {
  std::vector<int64_t> perm = c.attr_ints("perm");
  if (perm.empty())
    for (int64_t k = c.rank(c.ct()) - 1; k >= 0; --k) perm.push_back(k);
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return {c.b.transpose(c.ct(), inverse)};
}

Vs concat_jvp(D& c) {
  bool any = false;
  for (V t : c.ts) any = any || t.valid();
  if (!any) return {V{}};
  Vs ins;
  for (size_t i = 0; i < c.xs.size(); ++i)
    ins.push_back(c.t(i).valid() ? c.t(i) : c.b.expand(c.b.scalar(0.0, c.b.facts(c.y()).dtype), c.b.shape_of(c.x(i))));
  return {c.same_op(ins)};
}

Vs concat_transpose(TransposeCtx& c) {
  auto& b = c.b;
  const int64_t axis = c.attr_i("axis", 0);
  Vs sizes;
  for (V in : c.ins) {
    V w = b.tangent(in) ? b.witness(in) : in;
    if (!w.valid()) c.unsupported("an input's shape is unknown at run time");
    sizes.push_back(b.op1("Gather", {b.shape_of(w), b.i64s({axis})}, {Attr::i("axis", 0)}));
  }
  V split = b.concat(sizes, 0);
  Vs parts = b.op("Split", {c.ct(), split}, {Attr::i("axis", axis)}, static_cast<int>(c.ins.size()));
  Vs out(c.ins.size());
  for (size_t i = 0; i < c.ins.size(); ++i) {
    // ONNX cannot infer Split's outputs from run-time sizes; each part has its input's shape.
    V w = b.tangent(c.in(i)) ? b.witness(c.in(i)) : c.in(i);
    if (w.valid() && b.facts(w).has_shape) {
      b.set_facts(parts[i], b.facts(w));
      b.declare(parts[i]);
    }
    if (c.linear(i)) out[i] = parts[i];
  }
  return out;
}

Vs split_transpose(TransposeCtx& c) {
  auto& b = c.b;
  const int64_t axis = c.attr_i("axis", 0);
  int32_t dtype = 0;
  for (V ct : c.cts)
    if (ct.valid()) dtype = b.facts(ct).dtype;
  Vs parts;
  for (size_t k = 0; k < c.cts.size(); ++k) {
    if (c.cts[k].valid()) {
      parts.push_back(c.cts[k]);
      continue;
    }
    V shape = tangent_shape(c, c.outs[k]);
    parts.push_back(b.expand(b.scalar(0.0, dtype), shape));
  }
  Vs out(c.ins.size());
  out[0] = b.op1("Concat", parts, {Attr::i("axis", axis)});
  return out;
}

// Pad is linear in (data, constant_value) jointly: padded positions carry the value.
Vs pad_jvp(D& c) {
  if (!c.t(0).valid() && !c.t(2).valid()) return {V{}};
  const int32_t dt = c.b.facts(c.y()).dtype;
  V td = c.t(0).valid() ? c.t(0) : c.b.expand(c.b.scalar(0.0, dt), c.b.shape_of(c.x(0)));
  Vs ins{td, c.x(1), c.t(2).valid() ? c.t(2) : V{}};
  if (c.has(3)) ins.push_back(c.x(3));
  while (!ins.empty() && !ins.back().valid()) ins.pop_back();
  return {c.same_op(ins)};
}

Vs pad_transpose(TransposeCtx& c) {
  auto& b = c.b;
  const auto* mode = c.attr("mode");
  if (mode && mode->s() != "constant") {
    if (c.linear(2)) c.unsupported("the padding value is a tangent in a non-constant mode");
    return selection_transpose(c, 0);
  }
  // The transpose crops what was padded and re-inserts zeros where the forward pass cropped
  // (negative pads): a Pad by max(-pads, 0), then a Slice by max(pads, 0). Never a negative
  // Pad, which not every backend runs (the reference evaluator rejects one).
  const std::vector<int64_t>* known = b.known_i64(c.in(1));
  bool nonneg = known != nullptr;
  if (known)
    for (int64_t p : *known) nonneg = nonneg && p >= 0;
  V ct = c.ct();
  V pos = c.in(1);
  if (!nonneg) {
    Vs ins{ct, b.op1("Max", {b.op1("Neg", {c.in(1)}), b.i64(0)})};
    if (c.in(3).valid()) {
      ins.push_back(V{});
      ins.push_back(c.in(3));
    }
    ct = b.clone(c.node, ins, {}, {}, 1)[0];
    pos = b.op1("Max", {c.in(1), b.i64(0)});
  }
  V shape = b.shape_of(ct);
  V axes = c.in(3).valid() ? c.in(3) : b.op1("Range", {b.i64(0), b.op1("Size", {shape}), b.i64(1)});
  V half = b.op1("Div", {b.op1("Size", {pos}), b.i64(2)});
  V half1 = b.unsqueeze(half, {0});
  V begins = b.op1("Slice", {pos, b.i64s({0}), half1});
  V ends = b.op1("Slice", {pos, half1, b.i64s({INT64_MAX})});
  V limits = b.op1("Sub", {b.op1("Gather", {shape, axes}, {Attr::i("axis", 0)}), ends});
  V cropped = b.op1("Slice", {ct, begins, limits, axes});
  Vs out(c.ins.size());
  if (c.linear(0)) out[0] = cropped;
  if (c.linear(2)) {
    // The value's cotangent sums the cotangent over the padded positions.
    V all = b.op1("ReduceSum", {c.ct()}, {Attr::i("keepdims", 0)});
    V inner = b.op1("ReduceSum", {cropped}, {Attr::i("keepdims", 0)});
    out[2] = b.op1("Sub", {all, inner});
  }
  return out;
}

// DCR mode's inverse is SpaceToDepth. CRD(x) is DCR of x with its channels, read as [C, b*b],
// transposed to [b*b, C]; so its transpose is SpaceToDepth, then that channel transpose undone
// (channels last, so every reshape copies or infers its other dims).
Vs depth_to_space_transpose(TransposeCtx& c) {
  auto& b = c.b;
  const int64_t block = c.attr_i("blocksize", 1);
  const onnx::AttributeProto* mode = c.attr("mode");
  V z = b.op1("SpaceToDepth", {c.ct()}, {Attr::i("blocksize", block)});
  if (!mode || mode->s() != "CRD") return {z};
  V last = b.op1("Transpose", {z}, {Attr::ints("perm", {0, 2, 3, 1})});
  V split = b.op1("Reshape", {last, b.i64s({0, 0, 0, block * block, -1})});
  V swapped = b.op1("Transpose", {split}, {Attr::ints("perm", {0, 1, 2, 4, 3})});
  V merged = b.op1("Reshape", {swapped, b.i64s({0, 0, 0, -1})});
  return {b.op1("Transpose", {merged}, {Attr::ints("perm", {0, 3, 1, 2})})};
}

}  // namespace

void register_shape(OpTable& table) {
  table.op("Reshape").batch(reshape_rule, 14);
  table.op("Transpose").batch(transpose_rule, 13).transpose(transpose_transpose);
  table.op("Squeeze").batch(squeeze_rule, 13);
  table.op("Unsqueeze").batch(squeeze_rule, 13);
  table.op("Flatten").batch(flatten_rule, 13);
  table.op("Expand").batch(expand_rule, 13).transpose([](TransposeCtx& c) -> Vs {
    return {unbroadcast_to(c.b, c.ct(), c.in(0)), V{}};
  });
  table.op("Split").batch(split_rule, 13).transpose(split_transpose);
  table.op("Tile").batch(tile_rule, 13).transpose([](TransposeCtx& c) { return selection_transpose(c, 0); });
  table.op("Shape").batch(shape_rule, 15);
  table.op("Size").batch(size_rule, 13);
  table.op("ConstantOfShape").batch(shared_only_rule, 9);
  table.op("Trilu").batch(trilu_rule, 14).transpose([](TransposeCtx& c) -> Vs {
    Vs ins = c.ins;
    ins[0] = c.ct();
    Vs out(c.ins.size());
    out[0] = c.b.clone(c.node, ins)[0];
    return out;
  });
  table.op("Compress").batch(compress_rule, 11);
  for (const char* op : {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Slice", "Tile", "Split",
                         "Trilu", "DepthToSpace", "SpaceToDepth", "Compress"})
    table.op(op).jvp(linear_in_first_jvp);
  table.op("Pad").batch(pad_rule, 18).jvp(pad_jvp).transpose(pad_transpose);
  table.op("Concat").batch(concat_rule, 13).jvp(concat_jvp).transpose(concat_transpose);
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) table.op(op).transpose(reshape_back);
  for (const char* op : {"Slice", "Compress"})
    table.op(op).transpose([](TransposeCtx& c) { return selection_transpose(c, 0, /*each_once=*/true); });
  // DepthToSpace and SpaceToDepth permute elements: each transposes to its inverse, in the
  // data's own dtype (a gather of positions would run them on int64 indices, which ONNX
  // Runtime has no kernel for).
  table.op("SpaceToDepth").transpose([](TransposeCtx& c) -> Vs {
    // (Its mode, an attribute since opset 28, names the DepthToSpace it inverts.)
    const onnx::AttributeProto* mode = c.attr("mode");
    return {c.b.op1("DepthToSpace", {c.ct()},
                    {Attr::i("blocksize", c.attr_i("blocksize", 1)), Attr::s("mode", mode ? mode->s() : "DCR")})};
  });
  table.op("DepthToSpace").transpose(depth_to_space_transpose);
  for (const char* op : {"Shape", "Size", "ConstantOfShape", "Range", "NonZero", "EyeLike"}) table.op(op).zero();
  table.op("OneHot").batch(onehot_rule, 11).jvp([](D& c) -> Vs {
    // Linear in values = [off, on]: off + (on - off) * onehot(indices).
    if (!c.t(2).valid()) return {V{}};
    auto& b = c.b;
    const int32_t dt = b.facts(c.x(2)).dtype;
    V unit = b.op1("Cast", {b.i64s({0, 1})}, {Attr::i("to", dt)});
    V mask = c.same_op({c.x(0), c.x(1), unit});
    V off = b.op1("Gather", {c.t(2), b.i64(0)}, {Attr::i("axis", 0)});
    V on = b.op1("Gather", {c.t(2), b.i64(1)}, {Attr::i("axis", 0)});
    return {c.like_out(b.op1("Add", {off, b.op1("Mul", {b.op1("Sub", {on, off}), mask})}))};
  });
}

}  // namespace onnax
