// Slice and Range, including per-example bounds: a window whose start differs between
// examples but whose length does not (lax.dynamic_slice, sliding windows, x[i:i+k] with a
// per-example i) becomes a gather of each example's positions.
#include <algorithm>
#include <vector>

#include "rules/batching.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

// One entry of Slice's starts/ends/steps (or a Range operand) as an int64 value: a scalar when
// it is shared, one value per example ([B]) when it is batched.
struct Bound {
  V v;
  bool batched = false;
};

Bound slice_entry(BatchCtx& c, int i, int64_t j, int64_t fallback) {
  auto& b = c.b;
  if (!c.has(i)) return {b.i64(fallback), false};
  V e = b.op1("Gather", {c.in[i], b.i64(j)}, {Attr::i("axis", c.batched[i] ? 1 : 0)});
  if (c.dtype(i) != onnx::TensorProto::INT64) e = b.op1("Cast", {e}, {Attr::i("to", onnx::TensorProto::INT64)});
  return {e, c.batched[i]};
}

// The number of positions start, start + step, ... before `end` (exclusive), 0 if none: what
// Slice and Range count, without the overflow of (end - start + step - 1) / step.
V position_count(Builder& b, V start, V end, V step) {
  const V zero = b.i64(0), one = b.i64(1);
  const V forward = b.op1("Greater", {step, zero});
  const V span = b.op1("Where", {forward, b.op1("Sub", {end, start}), b.op1("Sub", {start, end})});
  // (A zero step is invalid in both ops; clamping it to 1 keeps Div from trapping.)
  const V stride = b.op1("Max", {b.op1("Abs", {step}), one});
  const V count = b.op1("Add", {b.op1("Div", {b.op1("Sub", {span, one}), stride}), one});
  return b.op1("Where", {b.op1("Greater", {span, zero}), count, zero});
}

// Per-example positions of one sliced axis of length `dim`, clamped as Slice clamps them:
// starts and ends count from the back when negative and are clipped to [0, dim] going
// forward, to [-1, dim - 1] (starts: [0, dim - 1]) going backward.
V slice_positions(BatchCtx& c, Bound start, Bound end, Bound step, V dim) {
  auto& b = c.b;
  const V zero = b.i64(0), minus_one = b.i64(-1);
  const V last = b.op1("Sub", {dim, b.i64(1)});
  auto from_back = [&](V v) { return b.op1("Where", {b.op1("Less", {v, zero}), b.op1("Add", {v, dim}), v}); };
  auto clip = [&](V v, V low, V high) { return b.op1("Min", {b.op1("Max", {v, low}), high}); };
  const V forward = b.op1("Greater", {step.v, zero});
  const V s = from_back(start.v), e = from_back(end.v);
  const V first = b.op1("Where", {forward, clip(s, zero, dim), clip(s, zero, last)});
  const V stop = b.op1("Where", {forward, clip(e, zero, dim), clip(e, minus_one, last)});
  const V length = common_length(b, b.reshape(position_count(b, first, stop, step.v), b.i64s({-1})));
  // first + step * [0, 1, ..., length - 1], one row per example when first or step is batched
  // (a per-example end alone moves no position: the common length is all it decides).
  V iota = b.op1("Range", {zero, length, b.i64(1)});
  const bool rows = start.batched || step.batched;
  if (!rows) return b.op1("Add", {first, b.op1("Mul", {step.v, iota})});
  const V steps = b.op1("Mul", {step.batched ? b.unsqueeze(step.v, {1}) : step.v, b.unsqueeze(iota, {0})});
  return b.op1("Add", {b.unsqueeze(first, {1}), steps});
}

// Slice with per-example starts, ends or steps: the shared entries slice as usual, then each
// per-example entry gathers its axis's positions example by example.
BatchResult per_example_slice(BatchCtx& c) {
  auto& b = c.b;
  require_shared(c, 3, "axes");
  const int64_t rank = c.rank(0);
  const Facts* sf = c.facts[1];
  if (!sf || !sf->has_shape || sf->rank() != 1 || !sf->dims[0].known())
    c.unsupported("per-example starts/ends need the number of sliced axes statically",
                  "declare the length of 'starts'");
  const int64_t entries = sf->dims[0].value();
  std::vector<int64_t> axes;
  if (c.has(3)) {
    const std::vector<int64_t>* known = c.known_i64(3);
    if (!known) c.unsupported("per-example starts/ends need the axes when transforming", "make 'axes' a constant");
    axes = *known;
  } else {
    for (int64_t k = 0; k < entries; ++k) axes.push_back(k);
  }
  if (static_cast<int64_t>(axes.size()) != entries)
    c.unsupported("'axes' has " + std::to_string(axes.size()) + " entries but 'starts' has " + std::to_string(entries),
                  "give starts, ends, axes and steps the same length");
  V x = c.in[0];
  bool x_batched = c.batched[0];
  for (int64_t j = 0; j < entries; ++j) {
    const Bound start = slice_entry(c, 1, j, 0), end = slice_entry(c, 2, j, 0), step = slice_entry(c, 4, j, 1);
    const int64_t axis =
        axes[static_cast<size_t>(j)] < 0 ? axes[static_cast<size_t>(j)] + rank : axes[static_cast<size_t>(j)];
    if (axis < 0 || axis >= rank)
      c.unsupported(
          "axis " + std::to_string(axes[static_cast<size_t>(j)]) + " is out of range for " + c.describe_input(0),
          "use axes in [-rank, rank - 1]");
    const int64_t at = axis + (x_batched ? 1 : 0);
    if (!start.batched && !end.batched && !step.batched) {
      auto one = [&](Bound v) { return b.unsqueeze(v.v, {0}); };
      x = b.op1("Slice", {x, one(start), one(end), b.i64s({at}), one(step)});
      continue;
    }
    const V dim = b.op1("Squeeze", {b.shape_of(x, at, at + 1), b.i64s({0})});
    const V positions = slice_positions(c, start, end, step, dim);
    const bool per_example = start.batched || step.batched;
    x = gather_per_example(b, x, x_batched, rank, positions, per_example, 1, axis);
    x_batched = x_batched || per_example;
  }
  BatchResult r;
  r.out = {x};
  r.batched = {x_batched};
  return r;
}

BatchResult slice_rule(BatchCtx& c) {
  for (int i = 1; i < c.num_inputs(); ++i)
    if (c.has(i) && c.batched[i]) return per_example_slice(c);
  Vs ins = c.in;
  ins.resize(std::max(4, c.num_inputs()));
  if (c.has(3)) {
    ins[3] = c.shifted_axes(3);
  } else {
    const Facts* sf = c.facts[1];
    if (!sf || !sf->has_shape || sf->rank() != 1 || !sf->dims[0].known())
      c.unsupported("Slice without axes needs the length of 'starts' statically", "give Slice an explicit axes input");
    std::vector<int64_t> axes;
    for (int64_t k = 1; k <= sf->dims[0].value(); ++k) axes.push_back(k);
    V a = c.b.i64s(axes);
    if (c.dtype(1) != onnx::TensorProto::INT64) a = c.b.op1("Cast", {a}, {Attr::i("to", c.dtype(1))});
    ins[3] = a;
  }
  return all_batched(c.b.clone(c.node, ins));
}

// Range with a per-example start, limit or delta: each example's sequence, all of one length.
BatchResult range_rule(BatchCtx& c) {
  auto& b = c.b;
  const int32_t dtype = c.dtype(0);
  const bool integral = dtype != onnx::TensorProto::FLOAT && dtype != onnx::TensorProto::DOUBLE;
  auto operand = [&](int i) -> Bound {
    V v = c.in[i];
    if (integral && dtype != onnx::TensorProto::INT64)
      v = b.op1("Cast", {v}, {Attr::i("to", onnx::TensorProto::INT64)});
    return {v, c.batched[i]};
  };
  const Bound start = operand(0), limit = operand(1), delta = operand(2);
  V count;
  if (integral) {
    count = position_count(b, start.v, limit.v, delta.v);
  } else {
    // ONNX's count for floating point: ceil((limit - start) / delta), at least 0.
    const V steps = b.op1("Ceil", {b.op1("Div", {b.op1("Sub", {limit.v, start.v}), delta.v})});
    count = b.op1("Cast", {b.op1("Max", {steps, b.scalar(0, dtype)})}, {Attr::i("to", onnx::TensorProto::INT64)});
  }
  const V length = common_length(b, b.reshape(count, b.i64s({-1})));
  V iota = b.op1("Range", {b.i64(0), length, b.i64(1)});
  if (!integral) iota = b.op1("Cast", {iota}, {Attr::i("to", dtype)});
  const bool rows = start.batched || delta.batched;
  if (rows) iota = b.unsqueeze(iota, {0});
  auto column = [&](Bound x) { return x.batched ? b.unsqueeze(x.v, {1}) : x.v; };
  V out = b.op1("Add", {column(start), b.op1("Mul", {column(delta), iota})});
  if (integral && dtype != onnx::TensorProto::INT64) out = b.op1("Cast", {out}, {Attr::i("to", dtype)});
  BatchResult r;
  r.out = {out};
  r.batched = {rows};
  return r;
}

}  // namespace

void register_slice(OpTable& table) {
  table.op("Slice").batch(slice_rule, 13);
  table.op("Range").batch(range_rule, 11);
}

}  // namespace onnax
