// Reductions and axis-wise ops: the batch axis stays in front, per-example axes shift by one.
#include "rules/batching.h"

namespace onnax {
namespace {

std::vector<int64_t> all_axes_after_batch(int64_t rank) {
  std::vector<int64_t> axes;
  for (int64_t a = 1; a <= rank; ++a) axes.push_back(a);
  return axes;
}

// Reduce* with axes as an input (ReduceSum since 13, all others since 18).
BatchResult reduce_input_axes_rule(BatchCtx& c) {
  std::vector<V> ins = c.in;
  const bool noop_empty = c.attr_i("noop_with_empty_axes", 0) != 0;
  const auto* k = c.has(1) ? c.known_i64(1) : nullptr;
  bool axes_empty = !c.has(1) || (k && k->empty());
  if (axes_empty) {
    if (noop_empty) return all_batched(c.b.clone(c.node, ins));
    ins.resize(2);
    ins[1] = c.b.i64s(all_axes_after_batch(c.rank(0)));
  } else if (!k) {
    // Runtime axes that may be empty: shifting keeps them empty, which would also reduce the
    // batch axis when noop_with_empty_axes=0. That case needs the rank to spell "all axes".
    if (!noop_empty) {
      V shifted = c.shifted_axes(1);
      V all = c.b.i64s(all_axes_after_batch(c.rank(0)));
      V n = c.b.op1("Size", {c.in[1]});
      V empty = c.b.op1("Equal", {n, c.b.i64(0)});
      // Where(empty, all, shifted) needs equal-length branches; use Concat+Slice instead:
      // take `all` when empty, else `shifted`.
      V joined = c.b.op1("Concat", {shifted, all}, {Attr::i("axis", 0)});
      V len_all = c.b.i64s({c.rank(0)});
      V n1 = c.b.op1("Reshape", {n, c.b.i64s({1})});
      V end = c.b.op1("Where", {c.b.op1("Reshape", {empty, c.b.i64s({1})}), c.b.op1("Add", {n1, len_all}), n1});
      V start = c.b.op1("Where", {c.b.op1("Reshape", {empty, c.b.i64s({1})}), n1, c.b.i64s({0})});
      ins[1] = c.b.op1("Slice", {joined, start, end});
    } else {
      ins[1] = c.shifted_axes(1);
    }
  } else {
    ins[1] = c.shifted_axes(1);
  }
  return all_batched(c.b.clone(c.node, ins));
}

// Single `axis` attribute (Softmax, LogSoftmax, Hardmax, ArgMax, ArgMin, TopK, LpNormalization,
// Split, Concat, Gather...): shift the attribute, keep the rest.
BatchResult axis_attr_rule(BatchCtx& c) {
  for (int i = 1; i < c.num_inputs(); ++i)
    if (c.has(i) && c.batched[i])
      c.unsupported(c.describe_input(i) + " is batched, but it must be shared by all examples",
                    "pass None in in_axes for the inputs that reach '" + c.node.input(i) + "'");
  const auto* a = c.attr("axis");
  int64_t default_axis = c.node.op_type() == "Softmax" || c.node.op_type() == "LogSoftmax" ||
                                 c.node.op_type() == "Hardmax" || c.node.op_type() == "TopK" ||
                                 c.node.op_type() == "LpNormalization"
                             ? -1
                             : 0;
  int64_t axis = a ? a->i() : default_axis;
  return all_batched(c.b.clone(c.node, c.in, {Attr::i("axis", shift_axis(axis))}));
}

BatchResult cumsum_rule(BatchCtx& c) {
  std::vector<V> ins = c.in;
  ins[1] = c.shifted_axes(1);
  return all_batched(c.b.clone(c.node, ins));
}

}  // namespace

void register_reduce_rules(BatchRules& r) {
  for (const char* op : {"ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                         "ReduceLogSumExp", "ReduceSumSquare"})
    r.add("", op, 18, reduce_input_axes_rule);
  r.add("", "ReduceSum", 13, reduce_input_axes_rule);
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax", "ArgMax", "ArgMin", "TopK", "LpNormalization"})
    r.add("", op, 11, axis_attr_rule);
  r.add("", "CumSum", 11, cumsum_rule);
}

}  // namespace onnax
