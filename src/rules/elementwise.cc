// Elementwise operators: one broadcast-aware rule for all of them. Batched operands get
// size-1 axes after the batch axis so that numpy-style right alignment keeps the batch axis
// in front of every per-example axis.
#include <cmath>

#include "rules/batching.h"
#include "rules/derivative.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

BatchResult broadcast_rule(BatchCtx& c) {
  int64_t out_rank = 0;
  for (int i = 0; i < c.num_inputs(); ++i)
    if (c.has(i)) out_rank = std::max(out_rank, c.rank(i));
  Vs ins;
  ins.reserve(static_cast<size_t>(c.num_inputs()));
  for (int i = 0; i < c.num_inputs(); ++i) ins.push_back(c.has(i) ? c.pad_rank(i, out_rank) : V{});
  return all_batched(c.b.clone(c.node, ins));
}

// Ops whose first input fixes the output shape and whose other inputs broadcast to it
// unidirectionally (PRelu's slope, Clip's scalar bounds): batch the first input if any
// other input is batched, then apply the broadcast rule.
BatchResult unidirectional_rule(BatchCtx& c) {
  bool others = false;
  for (int i = 1; i < c.num_inputs(); ++i) others = others || (c.has(i) && c.batched[i]);
  if (others && !c.batched[0]) {
    c.in[0] = c.materialize(0);
    c.batched[0] = true;
  }
  return broadcast_rule(c);
}

// Clip's min/max must be scalars; batched bounds become elementwise Max/Min.
BatchResult clip_rule(BatchCtx& c) {
  bool bounds_batched = (c.has(1) && c.batched[1]) || (c.has(2) && c.batched[2]);
  if (!bounds_batched) return all_batched(c.b.clone(c.node, c.in));
  V x = c.pad_rank(0, 0);
  if (c.has(1)) x = c.b.op1("Max", {x, c.pad_rank(1, c.rank(0))});
  if (c.has(2)) x = c.b.op1("Min", {x, c.pad_rank(2, c.rank(0))});
  return all_batched({x});
}

// Unary ops (and ops whose extra inputs only carry a dtype or scalar settings).
BatchResult unary_rule(BatchCtx& c) {
  for (int i = 1; i < c.num_inputs(); ++i)
    if (c.has(i) && c.batched[i]) {
      if (c.node.op_type() == "CastLike") break;  // only the target's dtype matters
      c.unsupported(c.describe_input(i) + " is batched, but it must be shared by all examples",
                    "pass None in in_axes for the inputs that reach '" + c.node.input(i) + "'");
    }
  BatchResult r = all_batched(c.b.clone(c.node, c.in));
  r.batched[0] = c.batched[0];  // CastLike with only the target batched stays shared
  return r;
}

// One Dropout over the batch: in inference mode the identity; in training mode it draws an
// independent mask per element, so per example, as separate runs would (a `seed` attribute then
// gives one draw for the whole batch, not the per-example draws of separate seeded runs).
BatchResult dropout_rule(BatchCtx& c) {
  if (c.has(1) && c.batched[1])
    c.unsupported(c.describe_input(1) + " (ratio) is batched", "pass None for the ratio's source in in_axes");
  if (c.has(2) && c.batched[2])
    c.unsupported(c.describe_input(2) + " (training_mode) is batched",
                  "pass None for the training flag's source in in_axes");
  return all_batched(c.b.clone(c.node, c.in));
}

}  // namespace

}  // namespace onnax

// ---------------------------------------------------------------------------------------
// Derivatives. JVP rules read like the math: t(i) is input i's tangent (possibly a symbolic
// zero), x(i) its primal, y() the primal output. Non-smooth points follow JAX: relu'(0) = 0,
// abs'(0) = 1, max/min split ties evenly, and so does clip at its bounds (a min of a max).
namespace onnax {
namespace {

using D = JvpCtx;

// t * f'(x) for a unary op, f' given as an expression. (The op has one input, so a rule that
// runs has its tangent: see JvpCtx.)
JvpRule unary(std::function<Expr(D&)> derivative) {
  return expr_jvp([derivative = std::move(derivative)](D& c) { return c.t(0) * derivative(c); });
}

Vs max_min_jvp(D& c) {
  // Each input's tangent weighted by where it attains the result, ties split evenly. (The
  // masks are emitted first, in input order, then the weighted sum.)
  Expr count, acc;
  std::vector<V> masks;
  for (size_t i = 0; i < c.xs.size(); ++i) {
    masks.push_back(c.emit(mask(equal(c.x(i), c.y()))));
    count = c.emit(count + masks.back());
  }
  for (size_t i = 0; i < c.xs.size(); ++i) acc = acc + c.t(i) * masks[i];
  return {c.like_out(c.emit(acc / count))};
}

// Gelu's derivative; intermediate values are emitted in the order of the formulas.
Expr gelu_derivative(D& c) {
  const Expr x = c.x(0);
  if (c.attr("approximate") && c.attr("approximate")->s() == "tanh") {
    const double k = std::sqrt(2.0 / M_PI);
    const V x2 = c.emit(square(x));
    const V th = c.emit(tanh(k * (x + 0.044715 * (x2 * x))));
    const V du = c.emit(k * (1.0 + (3 * 0.044715) * x2));
    const V left = c.emit(0.5 * (1.0 + th));
    const V right = c.emit((0.5 * x) * ((1.0 - square(th)) * du));
    return left + right;
  }
  const V cdf = c.emit(0.5 * (1.0 + erf(x * M_SQRT1_2)));
  const V pdf = c.emit((1.0 / std::sqrt(2.0 * M_PI)) * exp(-0.5 * square(x)));
  return cdf + x * pdf;
}

// y = min(max(x, lo), hi) differentiated as JAX does: a tie of max or min splits the tangent
// evenly, so at a bound x and the bound each get half (jax.grad(jnp.clip) is 0.5 there). When
// lo > hi, y = hi and only hi's tangent passes.
Vs clip_jvp(D& c) {
  const V x = c.x(0), lo = c.x(1), hi = c.x(2);
  // 1 where `a` wins, 1/2 on a tie, 0 where it loses (`wins`: Greater for max, Less for min).
  auto share = [&](V a, V other, std::string_view wins) {
    return c.emit(mask(Expr::apply(wins, {a, other})) + mask(equal(a, other)) * 0.5);
  };
  V raised = x, from_x, to_lo;  // max(x, lo), and the shares of x and lo in it
  if (lo.valid()) {
    raised = c.b.op1("Max", {x, lo});
    from_x = share(x, lo, "Greater");
    if (c.t(1).valid()) to_lo = c.emit(1.0 - from_x);
  }
  V kept, to_hi;  // the shares of max(x, lo) and hi in the min
  if (hi.valid()) {
    kept = share(raised, hi, "Less");
    if (c.t(2).valid()) to_hi = c.emit(1.0 - kept);
  }
  // t times the shares that apply (an absent bound has no share: a factor of one).
  auto scaled = [&](V t, V f1, V f2) {
    Expr e = t;
    if (f1.valid()) e = e * f1;
    if (f2.valid()) e = e * f2;
    return c.emit(e);
  };
  V t = scaled(c.t(0), from_x, kept);
  t = c.emit(t + c.like_out(scaled(c.t(1), to_lo, kept)));
  return {c.emit(t + c.like_out(c.emit(c.t(2) * to_hi)))};
}

Vs where_jvp(D& c) {
  if (!c.t(1).valid() && !c.t(2).valid()) return {V{}};
  const V zero = c.b.scalar(0.0, c.b.facts(c.y()).dtype);
  const V ta = c.t(1).valid() ? c.t(1) : zero;
  const V tb = c.t(2).valid() ? c.t(2) : zero;
  return {c.like_out(c.emit(where(c.x(0), ta, tb)))};
}

Vs prelu_jvp(D& c) {
  const V negative = c.emit(less(c.x(0), 0.0));
  const V t = c.emit(c.t(0) * where(negative, c.x(1), 1.0));
  return {c.like_out(c.emit(t + c.t(1) * where(negative, c.x(0), 0.0)))};
}

Vs pow_jvp(D& c) {
  auto& b = c.b;
  V t;
  if (c.t(0).valid()) {
    // d/dx x^e = e x^(e - 1), e cast to x's type (Pow's exponent may be an integer).
    const V e = c.x(1);
    const V em1 = b.op1("Sub", {e, b.scalar(1.0, b.facts(e).dtype)});
    t = c.emit(c.t(0) * (Expr::apply("Cast", {e}, {Attr::i("to", c.dtype(0))}) * Expr::apply("Pow", {c.x(0), em1})));
  }
  // As JAX: log of a zero base is replaced by log(1) (the product with y = 0 is 0 anyway).
  const Expr x = c.x(0);
  return {c.like_out(c.emit(t + c.t(1) * (log(where(equal(x, 0.0), 1.0, x)) * c.y())))};
}

// Transposes of the linear elementwise ops.
Vs add_transpose(TransposeCtx& c) {
  Vs out(c.ins.size());
  for (size_t i = 0; i < c.ins.size(); ++i)
    if (c.linear(i)) out[i] = unbroadcast_to(c.b, c.ct(), c.in(i));
  return out;
}
Vs sub_transpose(TransposeCtx& c) {
  return {c.linear(0) ? unbroadcast_to(c.b, c.ct(), c.in(0)) : V{},
          c.linear(1) ? unbroadcast_to(c.b, c.b.neg(c.ct()), c.in(1)) : V{}};
}
Vs mul_transpose(TransposeCtx& c) {
  if (c.linear(0) && c.linear(1)) c.unsupported("both factors are tangents (the product is not linear)");
  const int i = c.linear(0) ? 0 : 1;
  Vs out(2);
  out[i] = unbroadcast_to(c.b, c.b.op1("Mul", {c.ct(), c.in(1 - i)}), c.in(i));
  return out;
}
Vs div_transpose(TransposeCtx& c) {
  if (c.linear(1)) c.unsupported("the divisor is a tangent (the quotient is not linear in it)");
  return {unbroadcast_to(c.b, c.b.op1("Div", {c.ct(), c.in(1)}), c.in(0)), V{}};
}
Vs where_transpose(TransposeCtx& c) {
  Vs out(3);
  V zero = c.b.scalar(0.0, c.b.facts(c.ct()).dtype ? c.b.facts(c.ct()).dtype : onnx::TensorProto::FLOAT);
  if (c.linear(1)) out[1] = unbroadcast_to(c.b, c.b.op1("Where", {c.in(0), c.ct(), zero}), c.in(1));
  if (c.linear(2)) out[2] = unbroadcast_to(c.b, c.b.op1("Where", {c.in(0), zero, c.ct()}), c.in(2));
  return out;
}
Vs cast_transpose(TransposeCtx& c) {
  const int32_t to = c.b.facts(c.in(0)).dtype;
  Vs out(c.ins.size());
  if (to) {
    out[0] = c.b.op1("Cast", {c.ct()}, {Attr::i("to", to)});
    return out;
  }
  // The input's type is known only at run time: cast like its primal twin.
  const V twin = c.b.witness(c.in(0));
  if (!twin.valid()) c.unsupported("the dtype of the cast's input is unknown");
  out[0] = c.b.op1("CastLike", {c.ct(), twin});
  return out;
}

}  // namespace

void register_elementwise(OpTable& table) {
  // Batching by shape class: one input (the op applies per element), broadcasting inputs.
  // Each op's derivative rules follow.
  for (const char* op :
       {"Abs",     "Neg",         "Exp",       "Log",       "Sqrt",     "Reciprocal",    "Floor", "Ceil",
        "Round",   "Sign",        "Sin",       "Cos",       "Tan",      "Asin",          "Acos",  "Atan",
        "Sinh",    "Cosh",        "Asinh",     "Acosh",     "Atanh",    "Erf",           "IsNaN", "IsInf",
        "Not",     "BitwiseNot",  "Relu",      "LeakyRelu", "Elu",      "Selu",          "Celu",  "Gelu",
        "Sigmoid", "HardSigmoid", "HardSwish", "Softplus",  "Softsign", "Mish",          "Tanh",  "ThresholdedRelu",
        "Shrink",  "Cast",        "CastLike",  "Identity",  "Swish",    "RegexFullMatch"}) {
    table.op(op).batch(unary_rule);
  }
  for (const char* op : {"Add",        "Sub",       "Mul",        "Div",         "Pow",
                         "Mod",        "BitShift",  "And",        "Or",          "Xor",
                         "Equal",      "Less",      "Greater",    "LessOrEqual", "GreaterOrEqual",
                         "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Where",       "Sum",
                         "Mean",       "Max",       "Min",        "StringConcat"}) {
    table.op(op).batch(broadcast_rule);
  }
  table.op("Neg").jvp(expr_jvp([](D& c) { return -c.t(0); })).transpose([](TransposeCtx& c) -> Vs {
    return {c.b.neg(c.ct())};
  });
  table.op("Add").jvp([](D& c) -> Vs { return {c.like_out(c.emit(c.t(0) + c.t(1)))}; }).transpose(add_transpose);
  table.op("Sub").jvp([](D& c) -> Vs { return {c.like_out(c.emit(c.t(0) - c.t(1)))}; }).transpose(sub_transpose);
  // (Each product term has the output's shape: its primal twin is the output.)
  table.op("Mul")
      .jvp([](D& c) -> Vs {
        // A square x * x: t * (x + x), one linear node (reverse mode then computes ct * x once),
        // and the same bits as t * x + x * t.
        if (c.x(0).valid() && c.x(0).id == c.x(1).id && c.t(0).valid())
          return {c.like_out(c.term(c.emit(c.t(0) * (c.x(0) + c.x(0)))))};
        // (a * tb before ta * b: the order results have always had.)
        const V right = c.term(c.emit(c.x(0) * c.t(1)));
        const V left = c.term(c.emit(c.t(0) * c.x(1)));
        return {c.like_out(c.emit(left + right))};
      })
      .transpose(mul_transpose);
  table.op("Div")
      .jvp([](D& c) -> Vs {
        // d(a / b) = ta / b - (tb * y) / b
        const V left = c.term(c.emit(c.t(0) / c.x(1)));
        const V right = c.term(c.emit(c.term(c.emit(c.t(1) * c.y())) / c.x(1)));
        return {c.like_out(c.emit(left - right))};
      })
      .transpose(div_transpose);
  auto sum_of_tangents = [](D& c) {
    Expr t;
    for (size_t i = 0; i < c.xs.size(); ++i) t = t + c.t(static_cast<int>(i));
    return t;
  };
  table.op("Sum")
      .jvp([sum_of_tangents](D& c) -> Vs { return {c.like_out(c.emit(sum_of_tangents(c)))}; })
      .transpose(add_transpose);
  table.op("Mean").jvp([sum_of_tangents](D& c) -> Vs {
    return {c.like_out(c.emit(sum_of_tangents(c) / static_cast<double>(c.xs.size())))};
  });
  table.op("Max").jvp(max_min_jvp);
  table.op("Min").jvp(max_min_jvp);
  table.op("Pow").jvp(pow_jvp);
  table.op("Where").jvp(where_jvp).transpose(where_transpose);
  table.op("PRelu").batch(unidirectional_rule).jvp(prelu_jvp);
  table.op("Clip").batch(clip_rule, 11).jvp(clip_jvp);
  table.op("Gelu").jvp(unary(gelu_derivative));
  auto identity = [](D& c) -> Vs { return {c.t(0)}; };
  table.op("Identity").jvp(identity).transpose([](TransposeCtx& c) -> Vs { return {c.ct()}; });
  // OptionalGetElement of a tensor (opset 18 accepts plain tensors) returns it; an optional
  // input carries no tangent (only tensors are differentiated).
  table.op("OptionalGetElement").jvp(identity);
  table.op("Dropout").batch(dropout_rule, 12).jvp([](D& c) -> Vs {
    // Inference (training_mode absent or a known false): the identity. Training: the tangent
    // passes through the node's own mask (prepare names it: transforms/dropout_masks.h),
    // scaled like the data: by 1 / (1 - ratio) when the run trains, by 1 when a run-time
    // flag says it does not (the mask is then all true).
    const auto* k = c.has(2) ? c.b.known_i64(c.x(2)) : nullptr;
    const bool inference = !c.has(2) || (k && k->size() == 1 && (*k)[0] == 0);
    if (inference || !c.t(0).valid()) return {c.t(0), V{}};
    if (c.ys.size() < 2 || !c.y(1).valid())
      c.unsupported("training-mode Dropout draws its mask at random and the node does not output it",
                    "add the mask output to the Dropout node (its second output), or run in inference mode");
    const V ratio = c.has(1) ? c.b.op1("CastLike", {c.x(1), c.x(0)}) : c.scalar(0.5);
    V scale = c.emit(1.0 / (1.0 - ratio));
    const bool training = k && k->size() == 1 && (*k)[0] != 0;
    if (!training) scale = c.emit(where(c.x(2), scale, 1.0));
    const V kept = c.emit(mask(c.y(1)) * scale);
    return {c.emit(c.t(0) * kept), V{}};
  });
  table.op("Cast")
      .jvp(expr_jvp([](D& c) { return Expr::linear("Cast", {c.t(0)}, {Attr::i("to", c.attr_i("to", 1))}); }))
      .transpose(cast_transpose);
  table.op("CastLike")
      .jvp(expr_jvp([](D& c) {
        return Expr::linear("CastLike", {c.t(0), c.x(1)});
      }))
      .transpose(cast_transpose);
  table.op("Exp").jvp(unary([](D& c) { return c.y(); }));
  table.op("Log").jvp(expr_jvp([](D& c) { return c.t(0) / c.x(0); }));
  table.op("Sqrt").jvp(expr_jvp([](D& c) { return c.t(0) / (2.0 * c.y()); }));
  table.op("Reciprocal").jvp(unary([](D& c) { return -square(c.y()); }));
  table.op("Sin").jvp(unary([](D& c) { return cos(c.x(0)); }));
  table.op("Cos").jvp(unary([](D& c) { return -sin(c.x(0)); }));
  table.op("Tan").jvp(unary([](D& c) { return 1.0 + square(c.y()); }));
  table.op("Tanh").jvp(unary([](D& c) { return 1.0 - square(c.y()); }));
  table.op("Sigmoid").jvp(unary([](D& c) { return c.y() * (1.0 - c.y()); }));
  table.op("Relu").jvp(unary([](D& c) { return mask(greater(c.x(0), 0.0)); }));
  // JAX's convention: abs'(0) = 1 (jax.grad(jnp.abs)(0.0) is 1, for -0.0 too).
  table.op("Abs").jvp(unary([](D& c) { return where(greater_or_equal(c.x(0), 0.0), 1.0, -1.0); }));
  table.op("LeakyRelu").jvp(unary([](D& c) { return where(greater(c.x(0), 0.0), 1.0, c.attr_f("alpha", 0.01f)); }));
  table.op("Elu").jvp(unary([](D& c) { return where(greater(c.x(0), 0.0), 1.0, c.y() + c.attr_f("alpha", 1.0f)); }));
  table.op("Selu").jvp(unary([](D& c) {
    const double a = c.attr_f("alpha", 1.67326319217681884765625f), g = c.attr_f("gamma", 1.05070102214813232421875f);
    return where(greater(c.x(0), 0.0), g, (g * a) * exp(c.x(0)));
  }));
  table.op("Celu").jvp(
      unary([](D& c) { return where(greater(c.x(0), 0.0), 1.0, exp(c.x(0) / c.attr_f("alpha", 1.0f))); }));
  table.op("Softplus").jvp(unary([](D& c) { return sigmoid(c.x(0)); }));
  table.op("Softsign").jvp(unary([](D& c) {
    const V d = c.emit(1.0 + abs(c.x(0)));
    return reciprocal(square(d));
  }));
  table.op("Erf").jvp(unary([](D& c) { return (2.0 / std::sqrt(M_PI)) * exp(-square(c.x(0))); }));
  table.op("HardSigmoid").jvp(unary([](D& c) {
    const double a = c.attr_f("alpha", 0.2f), beta = c.attr_f("beta", 0.5f);
    const V z = c.emit(c.x(0) * a + beta);
    const V inside = c.emit(logical_and(greater(z, 0.0), less(z, 1.0)));
    return mask(inside) * a;
  }));
  table.op("HardSwish").jvp(unary([](D& c) {
    // x * hardsigmoid(x) with alpha = 1/6, beta = 1/2.
    const V hs = c.b.op1("HardSigmoid", {c.x(0)}, {Attr::f("alpha", 1.0f / 6), Attr::f("beta", 0.5f)});
    const V z = c.emit(c.x(0) / 6.0 + 0.5);
    const V inside = c.emit(logical_and(greater(z, 0.0), less(z, 1.0)));
    return hs + (c.x(0) / 6.0) * mask(inside);
  }));
  table.op("Mish").jvp(unary([](D& c) {
    const V th = c.emit(tanh(softplus(c.x(0))));
    const V sech2 = c.emit(1.0 - square(th));
    return th + c.x(0) * (sech2 * sigmoid(c.x(0)));
  }));
  table.op("ThresholdedRelu").jvp(unary([](D& c) { return mask(greater(c.x(0), c.attr_f("alpha", 1.0f))); }));
  table.op("Shrink").jvp(unary([](D& c) {
    const double l = c.attr_f("lambd", 0.5f);
    return mask(logical_or(less(c.x(0), -l), greater(c.x(0), l)));
  }));
  table.op("Asin").jvp(unary([](D& c) { return reciprocal(sqrt(1.0 - square(c.x(0)))); }));
  table.op("Acos").jvp(unary([](D& c) { return -reciprocal(sqrt(1.0 - square(c.x(0)))); }));
  table.op("Atan").jvp(unary([](D& c) { return reciprocal(1.0 + square(c.x(0))); }));
  table.op("Sinh").jvp(unary([](D& c) { return cosh(c.x(0)); }));
  table.op("Cosh").jvp(unary([](D& c) { return sinh(c.x(0)); }));
  table.op("Asinh").jvp(unary([](D& c) { return reciprocal(sqrt(square(c.x(0)) + 1.0)); }));
  table.op("Acosh").jvp(unary([](D& c) { return reciprocal(sqrt(square(c.x(0)) - 1.0)); }));
  table.op("Atanh").jvp(unary([](D& c) { return reciprocal(1.0 - square(c.x(0))); }));
  for (const char* op : {"Floor", "Ceil", "Round", "Sign", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                         "IsNaN", "IsInf", "Not", "And", "Or", "Xor"})
    table.op(op).zero();
  // MelWeightMatrix depends on its edge frequencies only through the FFT bins they floor to
  // (the triangles are drawn between integer bins), so it is piecewise constant in them.
  table.op("MelWeightMatrix").zero();
  // Integer, bool and string results: nothing to differentiate.
  for (const char* op : {"BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "RegexFullMatch",
                         "StringConcat", "StringSplit", "NonMaxSuppression"})
    table.op(op).zero();
  // Mod is a - b * k with k = trunc(a / b) (fmod=1) or floor(a / b) (fmod=0), piecewise
  // constant, so d = da - k db away from the jumps; trunc(q) = sign(q) * floor(|q|).
  table.op("Mod").jvp([](D& c) -> Vs {
    Expr k;  // (emitted only when b has a tangent)
    if (c.t(1).valid()) {
      const V q = c.emit(c.x(0) / c.x(1));
      k = c.attr_i("fmod", 0) ? Expr(c.emit(Expr::apply("Sign", {q}) * Expr::apply("Floor", {abs(q)})))
                              : Expr::apply("Floor", {q});
    }
    return {c.like_out(c.emit(c.like_out(c.t(0)) - c.t(1) * k))};
  });
}

}  // namespace onnax
