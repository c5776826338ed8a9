// Convolution, pooling and normalisation. These ops already carry a leading batch dim N, so
// the vmap axis is merged into it: (B, N, ...) -> (B*N, ...) -> op -> (B, N', ...).
#include <algorithm>
#include <climits>
#include <functional>

#include "rules/batching.h"
#include "rules/conv_batched_weight.h"
#include "rules/derivative.h"

namespace onnax {
namespace {

V merge_batch(BatchCtx& c, V x) {
  return c.b.reshape(x, c.b.concat({c.b.i64s({-1}), c.b.shape_of(x, 2)}, 0));
}

// (B*N, ...) -> (B, N, ...). N is spelled out (not -1) so an empty batch reshapes too.
V split_batch(BatchCtx& c, V y) {
  return c.b.reshape(y, c.b.concat({c.batch_size(), c.b.shape_of(c.in[0], 1, 2), c.b.shape_of(y, 1)}, 0));
}

// Ops where only input 0 may be batched and every output has the N dim first. Batched
// weights cannot be merged (ONNX's group count is a static attribute, the batch size is not),
// so those cases take the per-example Scan.
BatchResult merge_rule(BatchCtx& c) {
  for (int i = 1; i < c.num_inputs(); ++i)
    if (c.has(i) && c.batched[i]) return scan_fallback(c);
  V x = merge_batch(c, c.in[0]);
  std::vector<V> ins = c.in;
  ins[0] = x;
  std::vector<V> outs = c.b.clone(c.node, ins);
  for (auto& o : outs)
    if (o.valid()) o = split_batch(c, o);
  return all_batched(outs);
}

// MaxPool's optional Indices output counts elements of the whole (N, C, ...) input; after
// merging, example b's indices are offset by b * (elements per example). Subtract that.
BatchResult maxpool_rule(BatchCtx& c) {
  BatchResult r = merge_rule(c);
  if (r.out.size() > 1 && r.out[1].valid()) {
    V per_example = c.b.op1("ReduceProd", {c.b.shape_of(c.in[0], 1)}, {Attr::i("keepdims", 0)});
    V range = c.b.op1("Range", {c.b.i64(0), c.b.op1("Squeeze", {c.batch_size(), c.b.i64s({0})}), c.b.i64(1)});
    V offsets = c.b.op1("Mul", {range, per_example});
    std::vector<int64_t> axes;
    for (int64_t k = 1; k <= c.rank(0); ++k) axes.push_back(k);
    r.out[1] = c.b.op1("Sub", {r.out[1], c.b.unsqueeze(offsets, axes)});
  }
  return r;
}

// Conv/ConvTranspose: a batched bias alone is added after a bias-free convolution.
BatchResult conv_rule(BatchCtx& c) {
  const bool weight_batched = c.has(1) && c.batched[1];
  if (weight_batched && c.node.op_type() == "Conv")
    if (auto vectorized = conv_batched_weight(c)) return *vectorized;
  if (!c.has(2) || !c.batched[2] || weight_batched) return merge_rule(c);
  BatchCtx inner = c;
  inner.in.resize(2);
  inner.batched.resize(2);
  inner.facts.resize(2);
  V y = c.batched[0] ? merge_rule(inner).out[0] : c.b.clone(c.node, {c.in[0], c.in[1]})[0];
  // (B, M) -> (B, 1, M, 1, ...) against y (B, N, M, spatial...).
  std::vector<int64_t> axes{1};
  for (int64_t k = 0; k < c.rank(0) - 2; ++k) axes.push_back(3 + k);
  return all_batched({c.b.op1("Add", {y, c.b.unsqueeze(c.in[2], axes)})});
}

// Per-channel parameters (C) as a tensor aligned with (N, C, spatial...) of rank r.
V channel_param(BatchCtx& c, int i, int64_t r) {
  std::vector<int64_t> axes;
  for (int64_t k = 1; k < r - 1; ++k) axes.push_back(k + (c.batched[i] ? 1 : 0));
  V p = c.b.unsqueeze(c.in[i], axes);
  if (c.batched[i]) p = c.b.unsqueeze(p, {1});  // (B, 1, C, 1...) against (B, N, C, ...)
  return p;
}

// BatchNormalization in inference mode; batched statistics or affine parameters are
// applied elementwise: (x - mean) / sqrt(var + eps) * scale + bias.
BatchResult batchnorm_rule(BatchCtx& c) {
  if (c.attr_i("training_mode", 0))
    c.unsupported("training_mode=1 (batch statistics) is not supported", "export the model in inference mode");
  bool params = false;
  for (int i = 1; i < c.num_inputs(); ++i) params = params || (c.has(i) && c.batched[i]);
  if (!params) return merge_rule(c);
  const int64_t r = c.rank(0);
  const int32_t dt = c.dtype(0);
  const float eps = c.attr("epsilon") ? c.attr("epsilon")->f() : 1e-5f;
  V x = c.pad_rank(0, r);
  V var = c.b.op1("Add", {channel_param(c, 4, r), c.b.scalar(eps, c.dtype(4))});
  V norm = c.b.op1("Div", {c.b.op1("Sub", {x, channel_param(c, 3, r)}), c.b.op1("Sqrt", {var})});
  V y = c.b.op1("Add", {c.b.op1("Mul", {norm, channel_param(c, 1, r)}), channel_param(c, 2, r)});
  (void)dt;
  return all_batched({y});
}

// Ones shaped like the per-example parameter i (whose batched value is (B, ...)).
V ones_like_example(BatchCtx& c, int i) {
  V shape = c.batched[i] ? c.b.shape_of(c.in[i], 1) : c.b.shape_of(c.in[i]);
  return c.b.expand(c.b.scalar(1.0, c.dtype(i)), shape);
}
V zeros_like_example(BatchCtx& c, int i) {
  V shape = c.batched[i] ? c.b.shape_of(c.in[i], 1) : c.b.shape_of(c.in[i]);
  return c.b.expand(c.b.scalar(0.0, c.dtype(i)), shape);
}

// InstanceNormalization / GroupNormalization: per-channel scale and bias; batched ones are
// applied after normalising with unit scale and zero bias.
BatchResult channel_affine_rule(BatchCtx& c) {
  bool affine = (c.has(1) && c.batched[1]) || (c.has(2) && c.batched[2]);
  if (!affine) return merge_rule(c);
  const int64_t r = c.rank(0);
  std::vector<V> ins{c.in[0], ones_like_example(c, 1), zeros_like_example(c, 2)};
  BatchCtx inner = c;
  inner.in = ins;
  inner.batched = {c.batched[0], false, false};
  V y = c.batched[0] ? merge_rule(inner).out[0] : c.b.clone(c.node, ins)[0];
  V out = c.b.op1("Add", {c.b.op1("Mul", {y, channel_param(c, 1, r)}), channel_param(c, 2, r)});
  return all_batched({out});
}

// LayerNormalization / RMSNormalization: normalise over axis..end; batched scale/bias
// broadcast against the trailing dims, so they are applied afterwards elementwise.
BatchResult trailing_norm_rule(BatchCtx& c) {
  const int64_t axis = c.attr_i("axis", -1);
  bool affine = (c.has(1) && c.batched[1]) || (c.has(2) && c.batched[2]);
  const int64_t r = c.rank(0);
  if (!affine) return all_batched(c.b.clone(c.node, c.in, {Attr::i("axis", shift_axis(axis))}));
  std::vector<V> ins{c.in[0], ones_like_example(c, 1)};
  if (c.has(2)) ins.push_back(zeros_like_example(c, 2));
  std::vector<V> outs = c.b.clone(c.node, ins, {Attr::i("axis", c.batched[0] ? shift_axis(axis) : axis)});
  V y = c.b.op1("Mul", {outs[0], c.pad_rank(1, r)});
  if (c.has(2)) y = c.b.op1("Add", {y, c.pad_rank(2, r)});
  BatchResult res;
  res.out = outs;
  res.out[0] = y;
  res.batched.assign(outs.size(), c.batched[0]);
  res.batched[0] = true;
  for (size_t i = 0; i < outs.size(); ++i)
    if (!outs[i].valid()) res.batched[i] = false;
  return res;
}

BatchResult resize_rule(BatchCtx& c) {
  const int64_t r = c.rank(0);
  bool params_batched = false;
  for (int i = 1; i < c.num_inputs(); ++i) params_batched = params_batched || (c.has(i) && c.batched[i]);
  // Merging the vmap axis into dim 0 is exact only when dim 0 is not resized.
  bool touches_dim0 = false;
  std::vector<int64_t> axes = c.attr_ints("axes");
  for (int64_t a : axes) touches_dim0 = touches_dim0 || a == 0 || a == -r;
  if (c.has(2))
    if (const auto* k = c.known_i64(2); k && !k->empty() && (*k)[0] != 1) touches_dim0 = true;
  if (params_batched || (touches_dim0 && !axes.empty()) || !c.batched[0]) return scan_fallback(c);
  std::vector<V> ins = c.in;
  ins[0] = merge_batch(c, c.in[0]);
  if (c.has(3) && axes.empty()) {
    // sizes[0] is N per example; the merged tensor has B*N rows.
    std::vector<V> parts{c.batch_size()};
    if (r > 1) parts.push_back(c.b.i64s(std::vector<int64_t>(r - 1, 1)));
    ins[3] = c.b.op1("Mul", {c.in[3], c.b.concat(parts, 0)});
  }
  V y = c.b.clone(c.node, ins)[0];
  return all_batched({split_batch(c, y)});
}

}  // namespace

void register_nn_rules(BatchRules& r) {
  for (const char* op : {"AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "LRN",
                         "DepthToSpace", "SpaceToDepth"})
    r.add("", op, 1, merge_rule);
  r.add("", "MaxPool", 1, maxpool_rule);
  r.add("", "Conv", 1, conv_rule);
  r.add("", "ConvTranspose", 1, conv_rule);
  r.add("", "BatchNormalization", 15, batchnorm_rule);
  r.add("", "InstanceNormalization", 6, channel_affine_rule);
  r.add("", "GroupNormalization", 21, channel_affine_rule);
  r.add("", "LayerNormalization", 17, trailing_norm_rule);
  r.add("", "RMSNormalization", 23, trailing_norm_rule);
  r.add("", "Resize", 18, resize_rule);
}

}  // namespace onnax

// ---------------------------------------------------------------------------------------
// Derivatives of normalisation, pooling and convolution.
namespace onnax {
namespace {

using D = JvpCtx;

// A per-channel parameter (C) shaped to broadcast against (N, C, spatial...) of rank r.
V per_channel(Builder& b, V p, int64_t r) {
  std::vector<int64_t> axes;
  for (int64_t k = 1; k < r - 1; ++k) axes.push_back(k);
  return b.unsqueeze(p, axes);
}

std::vector<V> batchnorm_jvp(D& c) {
  if (c.attr_i("training_mode", 0))
    c.unsupported("training_mode=1 is not differentiable yet", "differentiate the model in inference mode");
  auto& b = c.b;
  const int64_t r = c.rank(0);
  V scale = per_channel(b, c.x(1), r), mean = per_channel(b, c.x(3), r), var = per_channel(b, c.x(4), r);
  V inv = b.op1("Reciprocal", {b.op1("Sqrt", {b.op1("Add", {var, c.scalar(c.attr_f("epsilon", 1e-5f))})})});
  V xc = b.op1("Sub", {c.x(0), mean});
  V xhat = b.op1("Mul", {xc, inv});
  V t;
  if (c.t(0).valid()) t = b.mul(c.t(0), b.op1("Mul", {scale, inv}));
  if (c.t(1).valid()) t = b.add(t, b.mul(per_channel(b, c.t(1), r), xhat));
  if (c.t(2).valid()) t = b.add(t, c.like_out(per_channel(b, c.t(2), r)));
  if (c.t(3).valid())
    t = b.add(t, c.like_out(b.mul(per_channel(b, c.t(3), r), b.op1("Neg", {b.op1("Mul", {scale, inv})}))));
  if (c.t(4).valid()) {
    // d inv / d var = -inv^3 / 2
    V dinv = b.op1("Mul", {c.scalar(-0.5), b.op1("Mul", {inv, b.op1("Mul", {inv, inv})})});
    t = b.add(t, c.like_out(b.mul(per_channel(b, c.t(4), r), b.op1("Mul", {b.op1("Mul", {xc, scale}), dinv}))));
  }
  std::vector<V> out(c.ys.size());
  out[0] = c.like_out(t);
  return out;
}

// Normalisation over `axes` (kept as size-1 dims): xhat = (x - mean) * inv with
// inv = 1/sqrt(var + eps) (or, uncentred as RMSNorm, xhat = x * inv with var = mean(x^2)),
// then y = xhat * scale + bias with scale/bias shaped by `affine`.
std::vector<V> normalize_jvp(D& c, const std::vector<int64_t>& axes, bool centered, const std::function<V(V)>& affine) {
  auto& b = c.b;
  V ax = b.i64s(axes);
  auto mean = [&](V v) { return b.op1("ReduceMean", {v, ax}, {Attr::i("keepdims", 1)}); };
  V mu = centered ? mean(c.x(0)) : V{};
  V xc = centered ? b.op1("Sub", {c.x(0), mu}) : c.x(0);
  V var = mean(b.op1("Mul", {xc, xc}));
  V inv = b.op1("Reciprocal", {b.op1("Sqrt", {b.op1("Add", {var, c.scalar(c.attr_f("epsilon", 1e-5f))})})});
  V xhat = b.op1("Mul", {xc, inv});
  std::vector<V> out(c.ys.size());
  V t_xhat, t_mu, t_inv;
  if (c.t(0).valid()) {
    t_mu = centered ? mean(c.t(0)) : V{};
    V tc = centered ? b.op1("Sub", {c.t(0), t_mu}) : c.t(0);
    b.set_witness(tc, c.x(0));
    V xt = b.op1("Mul", {tc, xhat});
    b.set_witness(xt, c.x(0));
    t_xhat = b.op1("Mul", {inv, b.op1("Sub", {tc, b.op1("Mul", {xhat, mean(xt)})})});
    // d inv = -inv^3 * mean(xc * tc)
    V xct = b.op1("Mul", {xc, tc});
    b.set_witness(xct, c.x(0));
    t_inv = b.op1("Mul", {b.op1("Neg", {b.op1("Mul", {inv, b.op1("Mul", {inv, inv})})}), mean(xct)});
  }
  V t = b.mul(t_xhat, affine(c.x(1)));
  if (c.t(1).valid()) t = b.add(t, c.like_out(b.mul(xhat, affine(c.t(1)))));
  if (c.has(2) && c.t(2).valid()) t = b.add(t, c.like_out(affine(c.t(2))));
  out[0] = t.valid() ? c.like_out(t) : t;
  if (out.size() > 1) out[1] = t_mu;
  if (out.size() > 2) out[2] = t_inv;
  return out;
}

// Normalised over axis..end; scale/bias broadcast against those trailing dims.
std::vector<V> trailing_normalize_jvp(D& c, bool centered) {
  const int64_t r = c.rank(0);
  int64_t axis = c.attr_i("axis", -1);
  if (axis < 0) axis += r;
  std::vector<int64_t> axes;
  for (int64_t k = axis; k < r; ++k) axes.push_back(k);
  return normalize_jvp(c, axes, centered, [](V v) { return v; });
}

std::vector<V> instancenorm_jvp(D& c) {
  const int64_t r = c.rank(0);
  std::vector<int64_t> axes;
  for (int64_t k = 2; k < r; ++k) axes.push_back(k);
  return normalize_jvp(c, axes, true, [&](V v) { return per_channel(c.b, v, r); });
}

std::vector<V> global_average_transpose(TransposeCtx& c) {
  auto& b = c.b;
  V shape = tangent_shape(c, c.in(0));
  const int32_t dt = b.facts(c.ct()).dtype;
  V spatial = b.op1(
      "Cast",
      {b.op1("ReduceProd", {b.op1("Slice", {shape, b.i64s({2}), b.i64s({INT64_MAX})})}, {Attr::i("keepdims", 0)})},
      {Attr::i("to", dt)});
  return {b.op1("Div", {b.expand(c.ct(), shape), spatial})};
}

std::vector<V> maxpool_jvp(D& c) {
  if (!c.t(0).valid()) return std::vector<V>(c.ys.size());
  auto& b = c.b;
  // The primal's argmax positions (flat over the whole input) select the tangent.
  V idx = c.ys.size() > 1 && c.ys[1].valid() ? c.ys[1] : b.clone(c.node, {c.x(0)}, {}, {}, 2)[1];
  if (c.attr_i("storage_order", 0))
    c.unsupported("storage_order=1 (column-major indices)", "use the default storage_order=0");
  V flat = b.reshape(c.t(0), b.i64s({-1}));
  b.set_witness(flat, b.reshape(c.x(0), b.i64s({-1})));  // the flat tangent's primal twin
  V picked = b.op1("Gather", {flat, b.reshape(idx, b.i64s({-1}))}, {Attr::i("axis", 0)});
  b.set_witness(picked, b.reshape(c.y(), b.i64s({-1})));
  std::vector<V> out(c.ys.size());
  out[0] = b.reshape(picked, b.shape_of(c.y()));
  return out;
}

std::vector<V> conv_jvp(D& c) {
  auto& b = c.b;
  V t;
  if (c.t(0).valid()) t = b.clone(c.node, {c.t(0), c.x(1)})[0];
  if (c.t(1).valid()) t = b.add(t, b.clone(c.node, {c.x(0), c.t(1)})[0]);
  if (c.has(2) && c.t(2).valid()) t = b.add(t, c.like_out(per_channel(b, c.t(2), c.rank(0))));
  return {c.like_out(t)};
}

// Explicit [begin..., end...] pads of a Conv. SAME_UPPER / SAME_LOWER are resolved from the
// static spatial sizes (ONNX: total = max(0, (ceil(in / s) - 1) * s + (k - 1) * d + 1 - in),
// the odd unit at the end for SAME_UPPER, at the beginning for SAME_LOWER); Flax and
// TensorFlow exports use them with a symbolic batch but static image sizes.
std::vector<int64_t> conv_pads(TransposeCtx& c, int64_t spatial) {
  const auto* ap = c.attr("auto_pad");
  const std::string mode = ap ? ap->s() : "NOTSET";
  if (mode == "VALID") return std::vector<int64_t>(2 * spatial, 0);
  if (mode == "SAME_UPPER" || mode == "SAME_LOWER") {
    const Facts& xf = c.b.facts(c.in(0));
    const Facts& wf = c.b.facts(c.in(1));
    const std::vector<int64_t> strides = c.attr_ints("strides"), dil = c.attr_ints("dilations");
    const std::vector<int64_t> kshape = c.attr_ints("kernel_shape");
    std::vector<int64_t> pads(2 * spatial, 0);
    for (int64_t k = 0; k < spatial; ++k) {
      const bool x_known = xf.has_shape && xf.rank() == spatial + 2 && xf.dims[2 + k].known();
      const bool w_known = !kshape.empty() || (wf.has_shape && wf.rank() == spatial + 2 && wf.dims[2 + k].known());
      if (!x_known || !w_known)
        c.unsupported("auto_pad=" + mode + " needs the input's spatial sizes, which are not static");
      const int64_t in = xf.dims[2 + k].value, s = strides.empty() ? 1 : strides[k], d = dil.empty() ? 1 : dil[k];
      const int64_t kk = kshape.empty() ? wf.dims[2 + k].value : kshape[k];
      const int64_t total = std::max<int64_t>(0, ((in + s - 1) / s - 1) * s + (kk - 1) * d + 1 - in);
      const int64_t small = total / 2, big = total - small;
      pads[k] = mode == "SAME_UPPER" ? small : big;
      pads[spatial + k] = mode == "SAME_UPPER" ? big : small;
    }
    return pads;
  }
  if (mode != "NOTSET" && !mode.empty())
    c.unsupported("auto_pad=" + mode + " is not supported in reverse mode (NOTSET, VALID, SAME_UPPER, SAME_LOWER are)");
  std::vector<int64_t> pads = c.attr_ints("pads");
  if (pads.empty()) pads.assign(2 * spatial, 0);
  return pads;
}

std::vector<int64_t> ints_or(const std::vector<int64_t>& v, int64_t n, int64_t fill) {
  return v.empty() ? std::vector<int64_t>(n, fill) : v;
}

// Cotangent of Conv's input: a ConvTranspose of the output cotangent with the same kernel,
// padded at the end (output_padding) and cropped to the input's run-time size.
V conv_input_transpose(TransposeCtx& c, int64_t spatial) {
  auto& b = c.b;
  const std::vector<int64_t> strides = ints_or(c.attr_ints("strides"), spatial, 1);
  const std::vector<int64_t> dil = ints_or(c.attr_ints("dilations"), spatial, 1);
  std::vector<int64_t> out_pad;
  for (int64_t k = 0; k < spatial; ++k) out_pad.push_back(std::max<int64_t>(strides[k], dil[k]) - 1);
  for (int64_t k = 0; k < spatial; ++k) out_pad[k] = std::min(out_pad[k], strides[k] - 1);
  Attrs attrs{Attr::ints("strides", strides), Attr::ints("dilations", dil), Attr::ints("pads", conv_pads(c, spatial)),
              Attr::ints("output_padding", out_pad), Attr::i("group", c.attr_i("group", 1))};
  V y = b.op1("ConvTranspose", {c.ct(), c.in(1)}, attrs);
  std::vector<int64_t> axes, starts(spatial, 0);
  for (int64_t k = 0; k < spatial; ++k) axes.push_back(2 + k);
  V ends = b.op1("Slice", {tangent_shape(c, c.in(0)), b.i64s({2}), b.i64s({2 + spatial})});
  return b.op1("Slice", {y, b.i64s(starts), ends, b.i64s(axes)});
}

// Cotangent of Conv's weight: a grouped correlation of the (padded) input with the output
// cotangent, with the roles of stride and dilation exchanged.
V conv_weight_transpose(TransposeCtx& c, int64_t spatial) {
  auto& b = c.b;
  const int64_t g = c.attr_i("group", 1);
  const std::vector<int64_t> strides = ints_or(c.attr_ints("strides"), spatial, 1);
  const std::vector<int64_t> dil = ints_or(c.attr_ints("dilations"), spatial, 1);
  const std::vector<int64_t> pads = conv_pads(c, spatial);
  V x = c.in(0);
  bool padded = false;
  for (int64_t p : pads) padded = padded || p != 0;
  if (padded) {
    std::vector<int64_t> full(2 * (spatial + 2), 0);
    for (int64_t k = 0; k < spatial; ++k) {
      full[2 + k] = pads[k];
      full[spatial + 2 + 2 + k] = pads[spatial + k];
    }
    x = b.op1("Pad", {x, b.i64s(full)});
  }
  // A[c, j*N + n, ...] = X[n, j*Cg + c, ...]
  V xs = b.shape_of(x);
  V spatial_dims = b.op1("Slice", {xs, b.i64s({2}), b.i64s({2 + spatial})});
  V five = b.reshape(x, b.concat({b.op1("Slice", {xs, b.i64s({0}), b.i64s({1})}), b.i64s({g, -1}), spatial_dims}, 0));
  std::vector<int64_t> perm{2, 1, 0};
  for (int64_t k = 0; k < spatial; ++k) perm.push_back(3 + k);
  V a = b.reshape(b.transpose(five, perm), b.concat({b.i64s({0, -1}), spatial_dims}, 0));
  std::vector<int64_t> swap{1, 0};
  for (int64_t k = 0; k < spatial; ++k) swap.push_back(2 + k);
  V wt = b.transpose(c.ct(), swap);  // (M, N, out...)
  V o = b.op1("Conv", {a, wt},
              {Attr::ints("strides", dil), Attr::ints("dilations", strides), Attr::i("group", g)});  // (Cg, M, k'...)
  std::vector<int64_t> axes, starts(spatial, 0);
  for (int64_t k = 0; k < spatial; ++k) axes.push_back(2 + k);
  V kdims = b.op1("Slice", {tangent_shape(c, c.in(1)), b.i64s({2}), b.i64s({2 + spatial})});
  V cropped = b.op1("Slice", {o, b.i64s(starts), kdims, b.i64s(axes)});
  return b.transpose(cropped, swap);
}

std::vector<V> conv_transpose_rule(TransposeCtx& c) {
  const int64_t spatial = c.rank(c.in(c.linear(0) ? 1 : 0)) - 2;
  if (c.linear(0) && c.linear(1)) c.unsupported("both input and weight are tangents (not linear)");
  std::vector<V> out(c.ins.size());
  if (c.linear(0)) out[0] = conv_input_transpose(c, spatial);
  if (c.linear(1)) out[1] = conv_weight_transpose(c, spatial);
  return out;
}

}  // namespace

void register_nn_derivatives(DerivativeRules& r) {
  r.transpose("Conv", conv_transpose_rule);
  r.jvp("BatchNormalization", batchnorm_jvp);
  r.jvp("LayerNormalization", [](D& c) { return trailing_normalize_jvp(c, true); });
  r.jvp("RMSNormalization", [](D& c) { return trailing_normalize_jvp(c, false); });
  r.jvp("InstanceNormalization", instancenorm_jvp);
  r.jvp("GlobalAveragePool", [](D& c) -> std::vector<V> { return {c.t(0).valid() ? c.same_op({c.t(0)}) : V{}}; });
  r.transpose("GlobalAveragePool", global_average_transpose);
  r.jvp("MaxPool", maxpool_jvp);
  r.jvp("Conv", conv_jvp);
  r.jvp("ConvTranspose", conv_jvp);
}

}  // namespace onnax
