// Gather/Scatter family.
#include <limits>
#include <vector>

#include "rules/batching.h"
#include "rules/derivative.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

// Moves axis `from` of a tensor of rank `rank` to position `to`.
std::vector<int64_t> move_perm(int64_t from, int64_t to, int64_t rank) {
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i)
    if (i != from) perm.push_back(i);
  perm.insert(perm.begin() + to, from);
  return perm;
}

BatchResult gather_rule(BatchCtx& c) {
  const int64_t r = c.rank(0);
  int64_t axis = c.attr_i("axis", 0);
  if (axis < 0) axis += r;
  if (c.batched[0] && !c.batched[1]) return all_batched(c.b.clone(c.node, c.in, {Attr::i("axis", axis + 1)}));
  return all_batched({gather_per_example(c.b, c.in[0], c.batched[0], r, c.in[1], c.batched[1], c.rank(1), axis)});
}

// Element-indexed ops: every operand shares the element grid, so all are batched alike and
// the axis shifts.
BatchResult elements_rule(BatchCtx& c) {
  Vs ins;
  for (int i = 0; i < c.num_inputs(); ++i) ins.push_back(c.materialize(i));
  return all_batched(c.b.clone(c.node, ins, {Attr::i("axis", shift_axis(c.attr_i("axis", 0)))}));
}

BatchResult gathernd_rule(BatchCtx& c) {
  V data = c.materialize(0), idx = c.materialize(1);
  return all_batched(c.b.clone(c.node, {data, idx}, {Attr::i("batch_dims", c.attr_i("batch_dims", 0) + 1)}));
}

// ScatterND: index tuples address the leading dims of data; prefix every tuple with the
// example's batch index so each example scatters into its own slice.
BatchResult scatternd_rule(BatchCtx& c) {
  V data = c.materialize(0), idx = c.materialize(1), upd = c.materialize(2);
  const int64_t ri = c.rank(1);  // per-example rank of indices, >= 1
  V bsz = c.batch_size();
  V range = c.b.op1("Range", {c.b.i64(0), c.b.op1("Squeeze", {bsz, c.b.i64s({0})}), c.b.i64(1)});
  // (B,) -> (B, 1, ..., 1) with ri ones, then expanded to idx.shape[:-1] + [1].
  std::vector<int64_t> axes;
  for (int64_t k = 1; k <= ri; ++k) axes.push_back(k);
  V col = c.b.unsqueeze(range, axes);
  V target = c.b.concat({c.b.shape_of(idx, 0, ri), c.b.i64s({1})}, 0);
  col = c.b.expand(col, target);
  V idx64 = idx;
  if (c.dtype(1) != onnx::TensorProto::INT64) idx64 = c.b.op1("Cast", {idx}, {Attr::i("to", onnx::TensorProto::INT64)});
  V full = c.b.op1("Concat", {col, idx64}, {Attr::i("axis", -1)});
  return all_batched(c.b.clone(c.node, {data, full, upd}));
}

}  // namespace

V gather_per_example(Builder& b, V data, bool data_batched, int64_t data_rank, V index, bool index_batched,
                     int64_t index_rank, int64_t axis) {
  const int64_t r = data_rank;
  if (!index_batched) return b.op1("Gather", {data, index}, {Attr::i("axis", data_batched ? axis + 1 : axis)});
  if (!data_batched) {
    // Output dims: data[:axis] + index(B, ...) + data[axis+1:]; move B to the front.
    const V y = b.op1("Gather", {data, index}, {Attr::i("axis", axis)});
    if (axis == 0) return y;
    const int64_t out_rank = r - 1 + index_rank + 1;
    return b.transpose(y, move_perm(axis, 0, out_rank));
  }
  // Both batched: GatherND with batch_dims=1 on data whose gathered axis sits right after
  // the batch axis.
  if (axis != 0) data = b.transpose(data, move_perm(axis + 1, 1, r + 1));
  V idx = b.unsqueeze(index, {-1});
  if (b.facts(index).dtype != onnx::TensorProto::INT64)
    idx = b.op1("Cast", {idx}, {Attr::i("to", onnx::TensorProto::INT64)});
  const V y = b.op1("GatherND", {data, idx}, {Attr::i("batch_dims", 1)});
  if (axis == 0) return y;
  // y: (B, idx..., data dims except axis, in moved order: d[:axis] then d[axis+1:]).
  std::vector<int64_t> perm{0};
  for (int64_t k = 0; k < axis; ++k) perm.push_back(1 + index_rank + k);
  for (int64_t k = 0; k < index_rank; ++k) perm.push_back(1 + k);
  for (int64_t k = axis; k < r - 1; ++k) perm.push_back(1 + index_rank + k);
  return b.transpose(y, perm);
}

}  // namespace onnax

// ---------------------------------------------------------------------------------------
// Derivatives: gathers are linear in the data; scatters are linear in data and updates.
namespace onnax {
namespace {

using D = JvpCtx;

Vs gather_jvp(D& c) {
  if (!c.t(0).valid()) return {V{}};
  Vs ins = c.xs;
  ins[0] = c.t(0);
  return {c.same_op(ins)};
}

// The scatter `c.node` with reduction `reduction` of `updates` into `data`.
V scatter_with(D& c, V data, V updates, const std::string& reduction) {
  return c.b.clone(c.node, {data, c.x(1), updates}, {Attr::s("reduction", reduction)})[0];
}

// reduction mul: y = x * P with P the product of the updates landing on each position, so
// dy = dx * P + y * sum(du / u) over those updates (exact away from zero updates).
// reduction max/min: y is x or one of the updates landing there; the tangent is that of the
// winners, ties shared evenly as JAX's max does.
Vs scatter_reduce_jvp(D& c) {
  auto& b = c.b;
  const std::string red = c.attr("reduction")->s();
  if (red != "mul" && red != "max" && red != "min")
    c.unsupported("reduction '" + red + "' is not differentiable here", "use reduction none, add, mul, max or min");
  if (!c.t(0).valid() && !c.t(2).valid()) return {V{}};
  const int32_t dt = b.facts(c.y()).dtype;
  V zero_data = b.expand(b.scalar(0.0, dt), b.shape_of(c.x(0)));
  const bool elements = c.node.op_type() == "ScatterElements";
  Attrs gather_attrs;
  if (elements) gather_attrs.push_back(Attr::i("axis", c.attr_i("axis", 0)));
  const char* gather_op = elements ? "GatherElements" : "GatherND";
  if (red == "mul") {
    V t;
    if (c.t(0).valid()) {
      V ones = b.expand(b.scalar(1.0, dt), b.shape_of(c.x(0)));
      t = b.op1("Mul", {c.t(0), scatter_with(c, ones, c.x(2), "mul")});
    }
    if (c.t(2).valid()) {
      V ratio = b.op1("Div", {c.t(2), c.x(2)});
      b.set_witness(ratio, c.x(2));
      V sums = scatter_with(c, zero_data, ratio, "add");
      b.set_witness(sums, c.x(0));
      t = b.add(t, b.op1("Mul", {c.y(), sums}));
    }
    return {t};
  }
  auto cast = [&](V m) { return b.op1("Cast", {m}, {Attr::i("to", dt)}); };
  V wins_x = cast(b.op1("Equal", {c.x(0), c.y()}));
  V wins_u = cast(b.op1("Equal", {c.x(2), b.op1(gather_op, {c.y(), c.x(1)}, gather_attrs)}));
  V count = b.op1("Add", {wins_x, scatter_with(c, zero_data, wins_u, "add")});
  V t;
  if (c.t(0).valid()) t = b.op1("Mul", {c.t(0), wins_x});
  if (c.t(2).valid()) {
    V picked = b.op1("Mul", {c.t(2), wins_u});
    b.set_witness(picked, c.x(2));
    V sums = scatter_with(c, zero_data, picked, "add");
    b.set_witness(sums, c.x(0));
    t = b.add(t, sums);
  }
  return {b.op1("Div", {t, count})};
}

// ScatterElements/ScatterND without reduction: out = data with updates written at indices.
Vs scatter_jvp(D& c) {
  if (!c.attr("reduction") || c.attr("reduction")->s() == "none") {
    if (!c.t(0).valid() && !c.t(2).valid()) return {V{}};
    auto zeros = [&](int i) { return c.b.expand(c.b.scalar(0.0, c.b.facts(c.y()).dtype), c.b.shape_of(c.x(i))); };
    V td = c.t(0).valid() ? c.t(0) : zeros(0);
    V tu = c.t(2).valid() ? c.t(2) : zeros(2);
    return {c.same_op({td, c.x(1), tu})};
  }
  if (c.attr("reduction")->s() == "add") {
    V td = c.t(0), tu = c.t(2);
    if (!td.valid() && !tu.valid()) return {V{}};
    if (!td.valid()) td = c.b.expand(c.b.scalar(0.0, c.b.facts(c.y()).dtype), c.b.shape_of(c.x(0)));
    if (!tu.valid()) tu = c.b.expand(c.b.scalar(0.0, c.b.facts(c.y()).dtype), c.b.shape_of(c.x(2)));
    return {c.same_op({td, c.x(1), tu})};
  }
  return scatter_reduce_jvp(c);
}

// Transpose of a scatter linear in data and updates: the data's cotangent is the output's
// with the written positions cleared (reduction none) or kept (add); the updates' cotangent
// gathers the output's at the indices.
Vs scatter_transpose(TransposeCtx& c, const char* gather_op) {
  auto& b = c.b;
  const bool add = c.attr("reduction") && c.attr("reduction")->s() == "add";
  Vs out(3);
  Attrs gather_attrs;
  if (std::string(gather_op) == "GatherElements") gather_attrs.push_back(Attr::i("axis", c.attr_i("axis", 0)));
  if (c.linear(0)) {
    if (add) {
      out[0] = c.ct();
    } else {
      // Write zeros at the scattered positions: scatter a zero-filled copy of the updates.
      V upd_zero =
          b.op1("Mul", {b.op1(gather_op, {c.ct(), c.in(1)}, gather_attrs), b.scalar(0.0, b.facts(c.ct()).dtype)});
      out[0] = b.clone(c.node, {c.ct(), c.in(1), upd_zero})[0];
    }
  }
  if (c.linear(2)) out[2] = b.op1(gather_op, {c.ct(), c.in(1)}, gather_attrs);
  return out;
}

// Unique's values are the input's elements at their first occurrences (output 1), so their
// tangent selects the input tangent there (along `axis`, or over the flattened input).
// Moving duplicates apart changes the output's length: the derivative is that of the
// selection, as for a tie-free input.
Vs unique_jvp(D& c) {
  Vs out(c.ys.size());
  if (!c.t(0).valid()) return out;
  auto& b = c.b;
  V first = c.ys.size() > 1 && c.ys[1].valid() ? c.ys[1] : b.clone(c.node, {c.x(0)}, {}, {}, 2)[1];
  if (c.attr("axis")) {
    out[0] = b.op1("Gather", {c.t(0), first}, {Attr::i("axis", c.attr_i("axis", 0))});
  } else {
    V flat = b.reshape(c.t(0), b.i64s({-1}));
    b.set_witness(flat, b.reshape(c.x(0), b.i64s({-1})));
    out[0] = b.op1("Gather", {flat, first}, {Attr::i("axis", 0)});
  }
  return out;
}

// GatherND's transpose: a ScatterND adding the cotangent at the gathered positions, the batch
// dims folded into one leading coordinate. (selection_transpose would first gather from an index
// tensor the size of the data.) Needs the ranks and the index tuple's length statically.
Vs gathernd_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(1)) c.unsupported("the indices are a tangent", "differentiate with respect to the data only");
  const V data = c.in(0), idx = c.in(1);
  const int64_t batch = c.attr_i("batch_dims", 0);
  const Facts& df = facts_or_twin(b, data);
  const Facts& xf = b.facts(idx);
  const int64_t r_idx = xf.rank();
  if (df.rank() < 0 || r_idx < 1 || !xf.dims.back().known()) return selection_transpose(c, 0);
  const int64_t k = xf.dims.back().value();
  const V shape = tangent_shape(c, data);
  // Negative indices count from the end of their axis.
  const V dims = b.op1("Slice", {shape, b.i64s({batch}), b.i64s({batch + k})});
  const V coords = b.op1("Where", {b.op1("Less", {idx, b.i64(0)}), b.op1("Add", {idx, dims}), idx});
  const V zero = b.scalar(0.0, b.facts(c.ct()).dtype);
  const Attrs add{Attr::s("reduction", "add")};
  Vs out(c.ins.size());
  if (batch == 0) {
    out[0] = b.op1("ScatterND", {b.expand(zero, shape), coords, c.ct()}, add);
    return out;
  }
  // Batch coordinate of every index tuple: the flat position over the batch dims.
  const V lead = b.op1("Slice", {shape, b.i64s({0}), b.i64s({batch})});
  const V examples = b.op1("ReduceProd", {lead}, {Attr::i("keepdims", 1)});
  V iota = b.op1("Range", {b.i64(0), b.op1("Squeeze", {examples, b.i64s({0})}), b.i64(1)});
  iota = b.reshape(iota, b.concat({lead, b.i64s(std::vector<int64_t>(static_cast<size_t>(r_idx - 1 - batch), 1))}, 0));
  const V per_tuple = b.unsqueeze(b.expand(iota, b.shape_of(idx, 0, r_idx - 1)), {-1});
  const V flat_shape =
      b.concat({examples, b.op1("Slice", {shape, b.i64s({batch}), b.i64s({std::numeric_limits<int64_t>::max()})})}, 0);
  const V summed =
      b.op1("ScatterND", {b.expand(zero, flat_shape), b.concat({per_tuple, coords}, r_idx - 1), c.ct()}, add);
  out[0] = b.reshape(summed, shape);
  return out;
}

}  // namespace

void register_index(OpTable& table) {
  table.op("Gather").batch(gather_rule, 13);
  table.op("GatherElements").batch(elements_rule, 13);
  table.op("GatherND").batch(gathernd_rule, 13).transpose(gathernd_transpose);
  table.op("Unique").jvp(unique_jvp);
  for (const char* op : {"Gather", "GatherElements", "GatherND"}) table.op(op).jvp(gather_jvp);
  for (const char* op : {"Gather", "GatherElements"})
    table.op(op).transpose([](TransposeCtx& c) { return selection_transpose(c, 0); });
  table.op("ScatterElements").batch(elements_rule, 16).jvp(scatter_jvp).transpose([](TransposeCtx& c) {
    return scatter_transpose(c, "GatherElements");
  });
  table.op("ScatterND").batch(scatternd_rule, 16).jvp(scatter_jvp).transpose([](TransposeCtx& c) {
    return scatter_transpose(c, "GatherND");
  });
}

}  // namespace onnax
