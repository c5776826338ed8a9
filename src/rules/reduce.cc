// Reductions and axis-wise ops: the batch axis stays in front, per-example axes shift by one.
#include <algorithm>
#include <optional>

#include "rules/batching.h"
#include "rules/derivative.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

std::vector<int64_t> all_axes_after_batch(int64_t rank) {
  std::vector<int64_t> axes;
  for (int64_t a = 1; a <= rank; ++a) axes.push_back(a);
  return axes;
}

// Reduce* with axes as an input (ReduceSum since 13, all others since 18).
BatchResult reduce_input_axes_rule(BatchCtx& c) {
  Vs ins = c.in;
  const bool noop_empty = c.attr_i("noop_with_empty_axes", 0) != 0;
  const auto* k = c.has(1) ? c.known_i64(1) : nullptr;
  bool axes_empty = !c.has(1) || (k && k->empty());
  if (axes_empty) {
    if (noop_empty) return all_batched(c.b.clone(c.node, ins));
    if (c.rank(0) == 0) {
      // Every axis of a scalar is none: reduce a unit axis put after the batch axis instead (an
      // empty axes list would sum over the batch). keepdims keeps a scalar a scalar.
      ins.resize(2);
      ins[0] = c.b.unsqueeze(c.in[0], {1});
      ins[1] = c.b.i64s({1});
      return all_batched(c.b.clone(c.node, ins, {Attr::i("keepdims", 0)}));
    }
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
  // A per-example axis still gives every example its input's shape: the per-example map.
  if (c.batched[1]) return scan_fallback(c);
  Vs ins = c.in;
  ins[1] = c.shifted_axes(1);
  return all_batched(c.b.clone(c.node, ins));
}

}  // namespace

}  // namespace onnax

// ---------------------------------------------------------------------------------------
// Derivatives of reductions and axis-wise ops.
namespace onnax {
namespace {

using D = JvpCtx;

// The reduced axes, normalised against the input rank and sorted, each once (all axes when none
// are given), or nothing when they are only known at run time.
std::optional<std::vector<int64_t>> reduced_axes(const onnx::NodeProto& node, Builder& b, V x, V axes_in) {
  const int64_t r = b.rank(x);
  std::vector<int64_t> axes;
  if (axes_in.valid()) {
    const auto* k = b.known_i64(axes_in);
    if (!k) return std::nullopt;
    axes = *k;
  } else {
    for (const auto& a : node.attribute())
      if (a.name() == "axes") axes.assign(a.ints().begin(), a.ints().end());
  }
  if (r < 0) return axes.empty() ? std::nullopt : std::optional<std::vector<int64_t>>(axes);
  if (axes.empty())
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  for (auto& a : axes)
    if (a < 0) a += r;
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());  // (an axis named twice is reduced once)
  return axes;
}

// How many elements of x each output element of the reduction sums (its reduced dims' product),
// when those dims are known.
std::optional<int64_t> reduced_count(Builder& b, const onnx::NodeProto& node, V x, V axes_in, bool noop) {
  const Facts& f = b.facts(x);
  if (!f.has_shape) return std::nullopt;
  const auto axes = reduced_axes(node, b, x, axes_in);
  if (!axes || (axes->empty() && noop)) return std::nullopt;
  int64_t n = 1;
  for (int64_t a : *axes) {
    if (a < 0 || a >= f.rank() || !f.dims[static_cast<size_t>(a)].known()) return std::nullopt;
    if (__builtin_mul_overflow(n, f.dims[static_cast<size_t>(a)].value(), &n)) return std::nullopt;
  }
  if (n <= 0) return std::nullopt;  // (an empty reduction: the run-time path divides as before)
  return n;
}

// y with the reduced axes kept (size 1), for broadcasting against x.
V keep_dims(D& c, V y) {
  if (c.attr_i("keepdims", 1)) return y;
  auto axes = reduced_axes(c.node, c.b, c.x(0), c.x(1));
  if (axes) return c.b.unsqueeze(y, *axes);
  // Run-time axes: Unsqueeze takes them as they are (negative ones count from the end of
  // the unsqueezed, i.e. the input's, rank). Empty axes reduce everything to a scalar (or
  // nothing with noop_with_empty_axes), which broadcasts as it is.
  if (!c.has(1)) c.unsupported("the reduced axes are computed at run time", "use constant axes");
  return c.b.op1("Unsqueeze", {y, c.x(1)});
}

V reduce_sum_like(D& c, V t) {
  if (!t.valid()) return t;
  // Every summand these rules build has the reduced input's shape.
  if (c.b.tangent(t) && !c.b.witness(t).valid()) c.b.set_witness(t, c.x(0));
  Vs ins{t};
  if (c.has(1)) ins.push_back(c.x(1));
  Attrs attrs{Attr::i("keepdims", c.attr_i("keepdims", 1))};
  if (c.attr("noop_with_empty_axes"))
    attrs.push_back(Attr::i("noop_with_empty_axes", c.attr_i("noop_with_empty_axes", 0)));
  V res = c.b.op1("ReduceSum", ins, attrs);
  // The sum has the reduction's output shape; with run-time axes inference cannot tell, and
  // reverse mode needs at least the rank.
  if (c.b.facts(res).rank() < 0 && c.b.facts(c.y()).rank() >= 0) c.b.set_facts(res, c.b.facts(c.y()));
  return res;
}

Vs linear_same_op(D& c) {
  Vs ins = c.xs;
  ins[0] = c.t(0);
  if (!ins[0].valid()) return {V{}};
  return c.same_op_all(ins);
}

// ReduceSum / ReduceMean transpose: put the reduced axes back and broadcast.
Vs reduce_transpose(TransposeCtx& c, bool mean) {
  auto& b = c.b;
  V ct = c.ct();
  const bool noop = c.attr_i("noop_with_empty_axes", 0) != 0;
  V axes_in = c.in(1);
  const auto* k = axes_in.valid() ? b.known_i64(axes_in) : nullptr;
  if (noop && (!axes_in.valid() || (k && k->empty()))) return {ct};
  if (!c.attr_i("keepdims", 1)) {
    if (axes_in.valid() && !(k && k->empty())) {
      // An axis the reduction named twice goes back once (Unsqueeze rejects repeats).
      const auto once = k && b.rank(c.in(0)) >= 0 ? reduced_axes(c.node, b, c.in(0), axes_in) : std::nullopt;
      ct = once && once->size() < k->size() ? b.unsqueeze(ct, *once) : b.op1("Unsqueeze", {ct, axes_in});
    }
    // (Reducing every axis without keepdims gives a scalar, which Expand broadcasts as is.)
  }
  V shape = tangent_shape(c, c.in(0));
  const int32_t dt = b.facts(c.ct()).dtype;
  if (mean) {
    // Each input element gets 1/n of its mean's cotangent, n the number of elements reduced:
    // a constant when the reduced dims are known (scaled before the broadcast, on fewer
    // elements), else Size(ct) / Size(input) at run time.
    if (const auto n = dt ? reduced_count(b, c.node, c.in(0), axes_in, noop) : std::nullopt) {
      ct = b.op1("Mul", {ct, b.scalar(1.0 / static_cast<double>(*n), dt)});
      mean = false;
    }
  }
  V out = b.expand(ct, shape);
  if (mean) {
    V n_out = b.op1("Cast", {b.op1("Size", {c.ct()})}, {Attr::i("to", dt)});
    V n_in = b.op1("Cast", {b.op1("ReduceProd", {shape}, {Attr::i("keepdims", 0)})}, {Attr::i("to", dt)});
    out = b.op1("Mul", {out, b.op1("Div", {n_out, n_in})});
  }
  Vs res(c.ins.size());
  res[0] = out;
  return res;
}

// The sum of `v` (shaped like y) along the op's `axis`, kept: a tangent, y its primal twin.
V sum_along_axis(D& c, V v) {
  c.b.set_witness(v, c.y());
  return c.b.op1("ReduceSum", {v, c.b.i64s({c.attr_i("axis", -1)})}, {Attr::i("keepdims", 1)});
}

// dy = y * (t - sum(y * t))
Vs softmax_jvp(D& c) {
  const V s = sum_along_axis(c, c.emit(c.y() * c.t(0)));
  return {c.emit(c.y() * (c.t(0) - s))};
}

// dy = t - sum(exp(y) * t)
Vs log_softmax_jvp(D& c) {
  const V s = sum_along_axis(c, c.emit(exp(c.y()) * c.t(0)));
  return {c.emit(c.t(0) - s)};
}

}  // namespace

void register_reduce(OpTable& table) {
  for (const char* op : {"ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                         "ReduceLogSumExp", "ReduceSumSquare"})
    table.op(op).batch(reduce_input_axes_rule, 18);
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax", "ArgMax", "ArgMin", "TopK"})
    table.op(op).batch(axis_attr_rule, 11);
  table.op("ReduceSum").batch(reduce_input_axes_rule, 13).jvp(linear_same_op).transpose([](TransposeCtx& c) {
    return reduce_transpose(c, false);
  });
  table.op("ReduceMean").jvp(linear_same_op).transpose([](TransposeCtx& c) { return reduce_transpose(c, true); });
  // (Each reduction has one differentiable input, so its tangent t(0) is never zero here.)
  table.op("ReduceSumSquare").jvp([](D& c) -> Vs { return {reduce_sum_like(c, c.emit((2.0 * c.x(0)) * c.t(0)))}; });
  table.op("ReduceL2").jvp([](D& c) -> Vs {
    const V s = reduce_sum_like(c, c.emit(c.x(0) * c.t(0)));
    return {c.emit(s / c.y())};
  });
  table.op("ReduceL1").jvp([](D& c) -> Vs {
    return {reduce_sum_like(c, c.emit(Expr::apply("Sign", {c.x(0)}) * c.t(0)))};
  });
  table.op("ReduceLogSumExp").jvp([](D& c) -> Vs {
    const V w = c.emit(exp(c.x(0) - keep_dims(c, c.y())));
    return {reduce_sum_like(c, c.emit(w * c.t(0)))};
  });
  table.op("ReduceLogSum").jvp([](D& c) -> Vs { return {c.emit(reduce_sum_like(c, c.t(0)) / exp(c.y()))}; });
  auto extremum = [](D& c) -> Vs {
    // Ties share the tangent evenly, as in JAX.
    const V at_extremum = c.emit(mask(equal(c.x(0), keep_dims(c, c.y()))));
    const V share = reduce_sum_like(c, c.emit(c.t(0) * at_extremum));
    return {c.emit(share / reduce_sum_like(c, at_extremum))};
  };
  table.op("ReduceMax").jvp(extremum);
  table.op("ReduceMin").jvp(extremum);
  table.op("ReduceProd").jvp([](D& c) -> Vs {
    // d prod = sum(prod / x * t); exact away from zeros of x.
    const V w = c.emit(keep_dims(c, c.y()) / c.x(0));
    return {reduce_sum_like(c, c.emit(w * c.t(0)))};
  });
  table.op("Softmax").jvp(softmax_jvp);
  table.op("LogSoftmax").jvp(log_softmax_jvp);
  table.op("CumSum").batch(cumsum_rule, 11).jvp(linear_same_op).transpose([](TransposeCtx& c) -> Vs {
    V out = c.b.clone(c.node, {c.ct(), c.in(1)}, {Attr::i("reverse", c.attr_i("reverse", 0) ? 0 : 1)})[0];
    return {out, V{}};
  });
  table.op("TopK").jvp([](D& c) -> Vs {
    return {c.b.op1("GatherElements", {c.t(0), c.y(1)}, {Attr::i("axis", c.attr_i("axis", -1))}), V{}};
  });
  // d cumprod = cumprod * cumsum(dx / x) with the same axis, exclusive and reverse (exact
  // away from zeros of x, like ReduceProd).
  table.op("CumProd").batch(cumsum_rule, 26).jvp([](D& c) -> Vs {
    auto& b = c.b;
    const V ratio = c.emit(c.t(0) / c.x(0));
    b.set_witness(ratio, c.x(0));
    V sums = b.op1("CumSum", {ratio, c.x(1)},
                   {Attr::i("exclusive", c.attr_i("exclusive", 0)), Attr::i("reverse", c.attr_i("reverse", 0))});
    b.set_witness(sums, c.x(0));
    return {c.emit(c.y() * sums)};
  });
  // y = x / n with n = ||x||_p along axis: dy = (dx - y dn) / n, dn = sum(s dx) with s = y
  // (p = 2) or sign(x) (p = 1).
  // (Every version: its axis attribute has meant the same since opset 1.)
  table.op("LpNormalization").batch(axis_attr_rule).jvp([](D& c) -> Vs {
    auto& b = c.b;
    const int64_t p = c.attr_i("p", 2);
    if (p != 1 && p != 2) c.unsupported("p=" + std::to_string(p) + " is not 1 or 2", "use p=1 or p=2");
    V axis = b.i64s({c.attr_i("axis", -1)});
    V n = b.op1(p == 2 ? "ReduceL2" : "ReduceL1", {c.x(0), axis}, {Attr::i("keepdims", 1)});
    const V s = p == 2 ? c.y() : b.op1("Sign", {c.x(0)});
    const V prod = c.emit(s * c.t(0));
    b.set_witness(prod, c.x(0));
    const V dn = b.op1("ReduceSum", {prod, axis}, {Attr::i("keepdims", 1)});
    const V num = c.emit(c.t(0) - c.y() * dn);
    b.set_witness(num, c.x(0));
    return {c.emit(num / n)};
  });
  // DequantizeLinear is (x - zero_point) * scale: linear in the scale (x and zero_point are
  // integers), so its tangent is the op applied to the scale's tangent.
  table.op("DequantizeLinear")
      .jvp([](D& c) -> Vs {
        // (x can carry a tangent only where its type is unknown; only the scale's counts.)
        if (!c.t(1).valid()) return {V{}};
        return {c.same_op({c.x(0), c.t(1), c.x(2)})};
      })
      .transpose([](TransposeCtx& c) -> Vs {
        auto& b = c.b;
        if (c.linear(0) || c.linear(2) || !c.linear(1))
          c.unsupported("only the scale can be a tangent", "differentiate with respect to the scale only");
        V sshape = tangent_shape(c, c.in(1));
        // (x - zero_point) as the scale's dtype: the op itself with unit scales.
        V ones = b.expand(b.scalar(1.0, b.facts(c.ct()).dtype), sshape);
        V prod = b.op1("Mul", {c.ct(), b.clone(c.node, {c.in(0), ones, c.in(2)})[0]});
        const int64_t xrank = c.rank(c.in(0));
        const int64_t srank = c.rank(c.in(1));
        int64_t axis = c.attr_i("axis", 1);
        if (axis < 0) axis += xrank;
        if (const int64_t block = c.attr_i("block_size", 0); block > 0) {
          // Scale j along the axis serves elements j*block .. j*block + block - 1 (the last block
          // may be short): zero-pad to whole blocks, split the axis into (blocks, block), sum the
          // second.
          const V ax = b.i64s({axis});
          const V xshape = b.shape_of(c.in(0));
          const V blocks = b.op1("Gather", {sshape, ax}, {Attr::i("axis", 0)});
          const V size = b.op1("Gather", {xshape, ax}, {Attr::i("axis", 0)});
          const V missing = b.op1("Sub", {b.op1("Mul", {blocks, b.i64s({block})}), size});
          const V padded = b.op1("Pad", {prod, b.concat({b.i64s({0}), missing}, 0), V{}, ax});
          const V split = b.concat({b.op1("Slice", {xshape, b.i64s({0}), ax}), blocks, b.i64s({block}),
                                    b.op1("Slice", {xshape, b.i64s({axis + 1}), b.i64s({INT64_MAX})})},
                                   0);
          const V sums = b.op1("ReduceSum", {b.reshape(padded, split), b.i64s({axis + 1})}, {Attr::i("keepdims", 0)});
          return {V{}, sums, V{}};
        }
        std::vector<int64_t> axes;
        for (int64_t k = 0; k < xrank; ++k)
          if (srank == 0 || k != axis) axes.push_back(k);
        V sums = axes.empty() ? prod : b.op1("ReduceSum", {prod, b.i64s(axes)}, {Attr::i("keepdims", 1)});
        return {V{}, b.reshape(sums, sshape), V{}};
      });
  for (const char* op : {"ArgMax", "ArgMin", "Hardmax"}) table.op(op).zero();
}

}  // namespace onnax
