// Ops linear in their float inputs whose JVP is the op itself on the tangents: signal
// processing (DFT, STFT), image rearrangement (Col2Im, AffineGrid, MaxUnpool), sequence
// reversal and cache writes (ReverseSequence, TensorScatter). Transposes where the adjoint is
// a selection (ReverseSequence, MaxUnpool); the others are forward mode only for now.
#include "rules/derivative.h"

namespace onnax {
namespace {

using D = JvpCtx;

// The op on input 0's tangent, the other inputs unchanged (linear in input 0 alone).
std::vector<V> linear_in_first(D& c) {
  if (!c.t(0).valid()) return std::vector<V>(c.ys.size());
  std::vector<V> ins = c.xs;
  ins[0] = c.t(0);
  std::vector<V> out = c.same_op_all(ins);
  out.resize(c.ys.size());
  return out;
}

V zeros_like(Builder& b, V x) {
  return b.expand(b.scalar(0.0, b.facts(x).dtype), b.shape_of(x));
}

// Linear in inputs 0 and 1 jointly (TensorScatter writes update rows into the cache): the op
// on both tangents, a missing one as zeros.
std::vector<V> linear_in_first_two(D& c) {
  if (!c.t(0).valid() && !c.t(1).valid()) return std::vector<V>(c.ys.size());
  std::vector<V> ins = c.xs;
  ins[0] = c.t(0).valid() ? c.t(0) : zeros_like(c.b, c.x(0));
  ins[1] = c.t(1).valid() ? c.t(1) : zeros_like(c.b, c.x(1));
  std::vector<V> out = c.same_op_all(ins);
  out.resize(c.ys.size());
  return out;
}

// STFT is bilinear in the signal (0) and the window (2).
std::vector<V> stft_jvp(D& c) {
  V t;
  if (c.t(0).valid()) t = c.same_op({c.t(0), c.x(1), c.x(2), c.x(3)});
  if (c.has(2) && c.t(2).valid()) t = c.b.add(t, c.same_op({c.x(0), c.x(1), c.t(2), c.x(3)}));
  return {t};
}

// MaxUnpool scatters X to the flat positions I of the output: its transpose gathers there.
std::vector<V> max_unpool_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(1) || c.linear(2))
    c.unsupported("the indices or output_shape is a tangent", "differentiate with respect to X only");
  V flat = b.reshape(c.ct(), b.i64s({-1}));
  V picked = b.op1("Gather", {flat, b.reshape(c.in(1), b.i64s({-1}))}, {Attr::i("axis", 0)});
  std::vector<V> out(c.ins.size());
  out[0] = b.reshape(picked, tangent_shape(c, c.in(0)));
  return out;
}

}  // namespace

void register_linear_op_derivatives(DerivativeRules& r) {
  for (const char* op : {"DFT", "Col2Im", "AffineGrid", "ReverseSequence", "MaxUnpool"}) r.jvp(op, linear_in_first);
  r.jvp("STFT", stft_jvp);
  r.jvp("TensorScatter", linear_in_first_two);
  r.transpose("ReverseSequence", [](TransposeCtx& c) { return selection_transpose(c, 0); });
  r.transpose("MaxUnpool", max_unpool_transpose);
}

}  // namespace onnax
