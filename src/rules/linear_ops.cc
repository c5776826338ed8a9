// Ops linear in their float inputs whose JVP is the op itself on the tangents: signal
// processing (DFT, STFT), image rearrangement (Col2Im, AffineGrid, MaxUnpool), sequence
// reversal and cache writes (ReverseSequence, TensorScatter). Transposes where the adjoint is
// a selection (ReverseSequence, MaxUnpool, TensorScatter), for DFT, STFT, AffineGrid and Col2Im.
#include <climits>

#include "rules/derivative.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

using D = JvpCtx;

V zeros_like(Builder& b, V x) {
  return b.expand(b.scalar(0.0, b.facts(x).dtype), b.shape_of(x));
}

// Linear in inputs 0 and 1 jointly (TensorScatter writes update rows into the cache): the op
// on both tangents, a missing one as zeros.
Vs linear_in_first_two(D& c) {
  if (!c.t(0).valid() && !c.t(1).valid()) return Vs(c.ys.size());
  Vs ins = c.xs;
  ins[0] = c.t(0).valid() ? c.t(0) : zeros_like(c.b, c.x(0));
  ins[1] = c.t(1).valid() ? c.t(1) : zeros_like(c.b, c.x(1));
  Vs out = c.same_op_all(ins);
  out.resize(c.ys.size());
  return out;
}

// STFT is bilinear in the signal (0) and the window (2).
Vs stft_jvp(D& c) {
  // Each term has the output's shape, which inference may not see through run-time sizes.
  auto term = [&](V v) {
    if (c.b.facts(v).rank() < 0 && c.b.facts(c.y()).rank() >= 0) c.b.set_facts(v, c.b.facts(c.y()));
    return v;
  };
  V t;
  if (c.t(0).valid()) t = term(c.same_op({c.t(0), c.x(1), c.x(2), c.x(3)}));
  if (c.has(2) && c.t(2).valid()) t = c.b.add(t, term(c.same_op({c.x(0), c.x(1), c.t(2), c.x(3)})));
  return {t};
}

// MaxUnpool scatters X to the flat positions I of the output: its transpose gathers there.
Vs max_unpool_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(1) || c.linear(2))
    c.unsupported("the indices or output_shape is a tangent", "differentiate with respect to X only");
  V flat = b.reshape(c.ct(), b.i64s({-1}));
  V picked = b.op1("Gather", {flat, b.reshape(c.in(1), b.i64s({-1}))}, {Attr::i("axis", 0)});
  Vs out(c.ins.size());
  out[0] = b.reshape(picked, tangent_shape(c, c.in(0)));
  return out;
}

// The inverse DFT of a one-sided spectrum X (length L along the axis, complex) is the real
// signal y = irfft(X, n) of n samples (n = dft_length, else 2 (L - 1)): X cropped or zero-padded
// to n/2 + 1 bins, each bin k counted twice (as k and n - k) except bin 0 and, for even n, bin
// n/2, whose imaginary parts are ignored. Over the reals its adjoint is the one-sided forward
// DFT of the cotangent, weighted 1/n on those bins and 2/n on the others, then padded or
// cropped back to L bins.
Vs irfft_transpose(TransposeCtx& c) {
  auto& b = c.b;
  const int64_t rank = c.rank(c.in(0));
  const int32_t dt = b.facts(c.ct()).dtype;
  // The axis (attribute, input or default), as [axis] counted from the front.
  V ax = c.attr("axis")    ? b.i64s({c.attr_i("axis", 1)})
         : c.in(2).valid() ? b.reshape(c.in(2), b.i64s({1}))
                           : b.i64s({c.opset >= 20 ? -2 : 1});
  ax = b.op1("Where", {b.op1("Less", {ax, b.i64(0)}), b.op1("Add", {ax, b.i64(rank)}), ax});
  const V bins = b.op1("Gather", {tangent_shape(c, c.in(0)), ax}, {Attr::i("axis", 0)});  // L, as [1]
  const V n = c.in(1).valid() ? b.reshape(c.in(1), b.i64s({1}))
                              : b.op1("Mul", {b.op1("Sub", {bins, b.i64s({1})}), b.i64s({2})});
  Vs ins{c.ct(), b.reshape(n, b.i64s({}))};
  if (c.in(2).valid()) ins.push_back(c.in(2));
  V z = b.clone(c.node, ins, {Attr::i("inverse", 0), Attr::i("onesided", 1)})[0];
  // Weights per bin, along the axis: 1/n for bin 0 and the Nyquist bin, 2/n otherwise.
  const V half = b.op1("Add", {b.op1("Div", {n, b.i64s({2})}), b.i64s({1})});
  const V k = b.op1("Range", {b.i64(0), b.reshape(half, b.i64s({})), b.i64(1)});
  const V single = b.op1("Or", {b.op1("Equal", {k, b.i64(0)}), b.op1("Equal", {b.op1("Mul", {k, b.i64(2)}), n})});
  V w = b.op1("Where", {single, b.scalar(1.0, dt), b.scalar(2.0, dt)});
  w = b.op1("Div", {w, b.op1("Cast", {n}, {Attr::i("to", dt)})});
  const V along =
      b.op1("Where", {b.op1("Equal", {b.op1("Range", {b.i64(0), b.i64(rank), b.i64(1)}), ax}), half, b.i64(1)});
  z = b.op1("Mul", {z, b.reshape(w, along)});
  const V zero = b.i64s({0});
  z = b.op1("Pad", {z, b.concat({zero, b.op1("Max", {b.op1("Sub", {bins, half}), zero})}, 0), V{}, ax});
  z = b.op1("Slice", {z, zero, bins, ax});
  Vs out(c.ins.size());
  out[0] = z;
  return out;
}

// DFT is linear over the reals (last dim = real, imaginary). With F the unnormalised transform,
// the adjoint of F is conj(F)^T = n * (inverse DFT), and that of the normalised inverse is
// F / n. onesided drops outputs (adjoint: zero-pad them back), a real input keeps the real
// part, and dft_length pads or truncates the input (adjoint: crop or zero-pad back).
Vs dft_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(1) || c.linear(2)) c.unsupported("dft_length or axis is a tangent", "differentiate the signal only");
  const Facts& xf = b.facts(c.in(0));
  if (!xf.has_shape || xf.dims.empty() || !xf.dims.back().known())
    c.unsupported("whether the input is real (last dim 1) or complex (2) is not known statically");
  const bool real = xf.dims.back().value() == 1;
  const bool inverse = c.attr_i("inverse", 0) != 0;
  if (inverse && c.attr_i("onesided", 0)) return irfft_transpose(c);
  const int32_t dt = b.facts(c.ct()).dtype;
  V ax = c.attr("axis")    ? b.i64s({c.attr_i("axis", 1)})
         : c.in(2).valid() ? b.reshape(c.in(2), b.i64s({1}))
                           : b.i64s({c.opset >= 20 ? -2 : 1});
  auto dim = [&](V shape) { return b.op1("Gather", {shape, ax}, {Attr::i("axis", 0)}); };
  V xshape = tangent_shape(c, c.in(0));
  V n = c.in(1).valid() ? b.reshape(c.in(1), b.i64s({1})) : dim(xshape);
  V zero = b.i64s({0});
  V ct = c.ct();
  if (c.attr_i("onesided", 0))
    ct = b.op1("Pad", {ct, b.concat({zero, b.op1("Sub", {n, dim(b.shape_of(ct))})}, 0), V{}, ax});
  Vs ins{ct, V{}};
  if (c.in(2).valid()) ins.push_back(c.in(2));
  V z = b.clone(c.node, ins, {Attr::i("inverse", inverse ? 0 : 1), Attr::i("onesided", 0)})[0];
  V nf = b.op1("Cast", {n}, {Attr::i("to", dt)});
  z = b.op1(inverse ? "Div" : "Mul", {z, nf});
  if (real) {
    const int64_t last = static_cast<int64_t>(xf.dims.size()) - 1;
    z = b.op1("Slice", {z, b.i64s({0}), b.i64s({1}), b.i64s({last})});
  }
  if (c.in(1).valid()) {
    V len = dim(xshape);
    z = b.op1("Pad", {z, b.concat({zero, b.op1("Max", {b.op1("Sub", {len, n}), zero})}, 0), V{}, ax});
    z = b.op1("Slice", {z, zero, len, ax});
  }
  Vs out(c.ins.size());
  out[0] = z;
  return out;
}

// AffineGrid: grid[n, p, :] = theta[n] @ [base[p], 1] over the P sampling points, so
// ct_theta[n] = ct[n]^T (k x P) @ [base, 1] (P x (k+1)). The base coordinates are the op
// itself on an identity theta (same size and align_corners).
Vs affine_grid_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(1)) c.unsupported("size is a tangent", "differentiate theta only");
  const Facts& tf = b.facts(c.in(0));
  if (!tf.has_shape || tf.dims.size() != 3 || !tf.dims[1].known())
    c.unsupported("theta's shape (N, 2, 3) or (N, 3, 4) is not known statically");
  const int64_t k = tf.dims[1].value();
  const int32_t dt = b.facts(c.ct()).dtype;
  onnx::TensorProto eye;
  eye.set_data_type(dt);
  for (int64_t d : {int64_t{1}, k, k + 1}) eye.add_dims(d);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j <= k; ++j) {
      if (dt == onnx::TensorProto::DOUBLE)
        eye.add_double_data(i == j ? 1.0 : 0.0);
      else
        eye.add_float_data(i == j ? 1.0f : 0.0f);
    }
  V size1 = b.concat({b.i64s({1}), b.op1("Slice", {c.in(1), b.i64s({1}), b.i64s({INT64_MAX})})}, 0);
  V base = b.reshape(b.clone(c.node, {b.tensor_const(eye), size1})[0], b.i64s({-1, k}));
  V ones = b.expand(b.scalar(1.0, dt),
                    b.concat({b.op1("Slice", {b.shape_of(base), b.i64s({0}), b.i64s({1})}), b.i64s({1})}, 0));
  V homogeneous = b.concat({base, ones}, 1);  // (P, k + 1)
  V n = b.op1("Slice", {c.in(1), b.i64s({0}), b.i64s({1})});
  V flat = b.reshape(c.ct(), b.concat({n, b.i64s({-1, k})}, 0));  // (N, P, k)
  Vs out(c.ins.size());
  out[0] = b.op1("MatMul", {b.transpose(flat, {0, 2, 1}), homogeneous});
  return out;
}

// Col2Im sums the columns of blocks into an image; its adjoint is im2col: a Conv of each
// channel (as (N*C, 1, spatial...)) with a bank of one-hot kernels, one per block position,
// with the same strides, dilations and pads, giving (N*C, prod(block), L...) -> (N, C*prod, L).
Vs col2im_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(1) || c.linear(2)) c.unsupported("image_shape or block_shape is a tangent", "differentiate the input");
  // The bank: an identity over block positions, reshaped to (area, 1, block...).
  const int32_t dt = b.facts(c.ct()).dtype;
  V area = b.op1("ReduceProd", {c.in(2)}, {Attr::i("keepdims", 1)});
  V iota = b.op1("Range", {b.i64(0), b.op1("Squeeze", {area, b.i64s({0})}), b.i64(1)});
  V eye = b.op1("Cast", {b.op1("Equal", {b.unsqueeze(iota, {1}), b.unsqueeze(iota, {0})})}, {Attr::i("to", dt)});
  V bank = b.reshape(eye, b.concat({area, b.i64s({1}), c.in(2)}, 0));
  V image = b.reshape(c.ct(), b.concat({b.i64s({-1, 1}), b.shape_of(c.ct(), 2)}, 0));
  Attrs attrs;
  for (const char* name : {"strides", "dilations", "pads"})
    if (c.attr(name)) attrs.push_back(Attr::ints(name, c.attr_ints(name)));
  V cols = b.op1("Conv", {image, bank}, attrs);  // (N*C, area, L...)
  Vs out(c.ins.size());
  out[0] = b.reshape(cols, tangent_shape(c, c.in(0)));
  return out;
}

// TensorScatter writes the update rows into the cache: the cache's cotangent is the output's
// with the written positions cleared (the op writing zeros), the update's is read back from
// the written positions, found by scattering the update elements' numbers (as floats, exact
// for any realistic size) into a cache of -1 and scatter-adding the cotangent by them.
Vs tensor_scatter_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(2)) c.unsupported("write_indices is a tangent", "differentiate the cache and the update only");
  const int32_t dt = b.facts(c.ct()).dtype;
  Vs out(c.ins.size());
  V ushape = c.linear(1) ? tangent_shape(c, c.in(1)) : b.shape_of(c.in(1));
  if (c.linear(0)) {
    V zeros = b.expand(b.scalar(0.0, dt), ushape);
    out[0] = b.clone(c.node, {c.ct(), zeros, c.in(2)})[0];
  }
  if (c.linear(1)) {
    V count = b.op1("ReduceProd", {ushape}, {Attr::i("keepdims", 1)});
    V numbers = b.op1("Cast", {b.op1("Range", {b.i64(0), b.op1("Squeeze", {count, b.i64s({0})}), b.i64(1)})},
                      {Attr::i("to", dt)});
    V none = b.expand(b.scalar(-1.0, dt), b.shape_of(c.ct()));
    V where = b.op1("Cast", {b.clone(c.node, {none, b.reshape(numbers, ushape), c.in(2)})[0]},
                    {Attr::i("to", onnx::TensorProto::INT64)});
    V flat_where = b.reshape(where, b.i64s({-1}));
    V written = b.op1("GreaterOrEqual", {flat_where, b.i64(0)});
    V flat_ct = b.op1("Where", {written, b.reshape(c.ct(), b.i64s({-1})), b.scalar(0.0, dt)});
    V zeros = b.expand(b.scalar(0.0, dt), count);
    V summed = b.op1("ScatterElements", {zeros, b.op1("Max", {flat_where, b.i64(0)}), flat_ct},
                     {Attr::i("axis", 0), Attr::s("reduction", "add")});
    out[1] = b.reshape(summed, ushape);
  }
  return out;
}

// STFT frames the signal (frame f is signal[f * step + k], k < n), weights it by the window
// and DFTs each frame (one-sided by default). It is linear in the signal and in the window.
// With z the DFT adjoint of the cotangent per frame (scaled inverse DFT, as for DFT):
// signal: overlap-add z * window back to the frame positions (a scatter-add);
// window: sum over batch and frames of z * frames (real and imaginary parts).
Vs stft_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(1) || c.linear(3))
    c.unsupported("frame_step or frame_length is a tangent", "differentiate the signal or window");
  if (c.linear(0) && c.linear(2)) c.unsupported("both signal and window are tangents (not linear)");
  const int32_t dt = b.facts(c.ct()).dtype;
  const Facts& sf = b.facts(c.in(0));
  if (!sf.has_shape || sf.dims.size() != 3 || !sf.dims[2].known())
    c.unsupported("whether the signal is real (last dim 1) or complex (2) is not known statically");
  const bool real = sf.dims[2].value() == 1;
  V sshape = c.linear(0) ? tangent_shape(c, c.in(0)) : b.shape_of(c.in(0));
  V n = !c.in(2).valid() ? b.reshape(c.in(3), b.i64s({1}))
        : c.linear(2)    ? tangent_shape(c, c.in(2))
                         : b.shape_of(c.in(2), 0, 1);
  V zero = b.i64s({0}), two = b.i64s({2});
  V ct = c.ct();
  if (c.attr_i("onesided", 1))
    ct = b.op1("Pad", {ct, b.concat({zero, b.op1("Sub", {n, b.shape_of(ct, 2, 3)})}, 0), V{}, two});
  Attrs dft_attrs{Attr::i("inverse", 1), Attr::i("onesided", 0)};
  Vs dft_in{ct};
  if (c.opset >= 20) {
    dft_in.push_back(V{});
    dft_in.push_back(b.i64(2));
  } else {
    dft_attrs.push_back(Attr::i("axis", 2));
  }
  V z = b.op1("DFT", dft_in, dft_attrs);  // (B, F, n, 2)
  z = b.op1("Mul", {z, b.op1("Cast", {n}, {Attr::i("to", dt)})});
  if (real) z = b.op1("Slice", {z, b.i64s({0}), b.i64s({1}), b.i64s({3})});
  // Frame positions pos[f, k] = f * step + k, (F, n).
  V frames = b.shape_of(c.ct(), 1, 2);
  auto iota = [&](V len) { return b.op1("Range", {b.i64(0), b.op1("Squeeze", {len, zero}), b.i64(1)}); };
  V step = b.reshape(c.in(1), b.i64s({1}));
  V pos = b.op1("Add", {b.unsqueeze(b.op1("Mul", {iota(frames), step}), {1}), b.unsqueeze(iota(n), {0})});
  Vs out(c.ins.size());
  if (c.linear(0)) {
    if (c.in(2).valid()) z = b.op1("Mul", {z, b.unsqueeze(c.in(2), {0, 1, 3})});
    // Scatter-add (B, F*n, c) into (B, L, c) at pos along axis 1.
    V zc = b.shape_of(z, 3, 4);
    V flat = b.reshape(z, b.concat({b.i64s({0, -1}), zc}, 0));
    V idx = b.expand(b.reshape(pos, b.i64s({1, -1, 1})), b.shape_of(flat));
    V zeros = b.expand(b.scalar(0.0, dt), sshape);
    out[0] = b.op1("ScatterElements", {zeros, idx, flat}, {Attr::i("axis", 1), Attr::s("reduction", "add")});
  }
  if (c.linear(2)) {
    V framed = b.op1("Gather", {c.in(0), pos}, {Attr::i("axis", 1)});  // (B, F, n, c)
    out[2] = b.op1("ReduceSum", {b.op1("Mul", {z, framed}), b.i64s({0, 1, 3})}, {Attr::i("keepdims", 0)});
  }
  return out;
}

}  // namespace

void register_linear_ops(OpTable& table) {
  table.op("Col2Im").transpose(col2im_transpose);
  table.op("AffineGrid").transpose(affine_grid_transpose);
  table.op("DFT").transpose(dft_transpose);
  for (const char* op : {"DFT", "Col2Im", "AffineGrid", "ReverseSequence", "MaxUnpool"})
    table.op(op).jvp(linear_in_first_jvp);
  table.op("STFT").jvp(stft_jvp).transpose(stft_transpose);
  table.op("TensorScatter").jvp(linear_in_first_two).transpose(tensor_scatter_transpose);
  table.op("ReverseSequence").transpose([](TransposeCtx& c) { return selection_transpose(c, 0, /*each_once=*/true); });
  table.op("MaxUnpool").transpose(max_unpool_transpose);
}

}  // namespace onnax
