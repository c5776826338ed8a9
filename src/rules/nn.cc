// Convolution, pooling and normalisation. These ops already carry a leading batch dim N, so
// the vmap axis is merged into it: (B, N, ...) -> (B*N, ...) -> op -> (B, N', ...).
#include <algorithm>
#include <climits>
#include <functional>
#include <limits>
#include <optional>

#include "ir/graph_edit.h"
#include "rules/batching.h"
#include "rules/conv_batched_weight.h"
#include "rules/derivative.h"
#include "rules/op_table.h"
#include "rules/window.h"

namespace onnax {
namespace {

V merge_batch(BatchCtx& c, V x) {
  return c.b.reshape(x, c.b.concat({c.b.i64s({-1}), c.b.shape_of(x, 2)}, 0));
}

// (B*N, ...) -> (B, N, ...), N read from dim 1 of `like` (batched, (B, N, ...)); spelled out
// (not -1) so an empty batch reshapes too.
V split_batch(BatchCtx& c, V y, V like) {
  return c.b.reshape(y, c.b.concat({c.batch_size(), c.b.shape_of(like, 1, 2), c.b.shape_of(y, 1)}, 0));
}
V split_batch(BatchCtx& c, V y) {
  return split_batch(c, y, c.in[0]);
}

// Ops where only input 0 may be batched and every output has the N dim first. Batched
// weights cannot be merged (ONNX's group count is a static attribute, the batch size is not),
// so those cases take the per-example Scan.
BatchResult merge_rule(BatchCtx& c) {
  for (int i = 1; i < c.num_inputs(); ++i)
    if (c.has(i) && c.batched[i]) return scan_fallback(c);
  V x = merge_batch(c, c.in[0]);
  Vs ins = c.in;
  ins[0] = x;
  Vs outs = c.b.clone(c.node, ins);
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

// Conv alone has a vectorized rule for per-example weights (ConvTranspose takes the Scan).
BatchResult conv_only_rule(BatchCtx& c) {
  if (c.has(1) && c.batched[1])
    if (auto vectorized = conv_batched_weight(c)) return *vectorized;
  return conv_rule(c);
}

// Per-channel parameters (C) as a tensor aligned with (N, C, spatial...) of rank r.
V channel_param(BatchCtx& c, int i, int64_t r) {
  std::vector<int64_t> axes;
  for (int64_t k = 1; k < r - 1; ++k) axes.push_back(k + (c.batched[i] ? 1 : 0));
  V p = c.b.unsqueeze(c.in[i], axes);
  if (c.batched[i]) p = c.b.unsqueeze(p, {1});  // (B, 1, C, 1...) against (B, N, C, ...)
  return p;
}

// Parameter i of a normalization, per channel and aligned with x (channel_param) in x's element type.
V channel_param_as_x(BatchCtx& c, int i, int64_t r) {
  const V p = channel_param(c, i, r);
  return c.dtype(i) == c.dtype(0) ? p : c.b.op1("Cast", {p}, {Attr::i("to", c.dtype(0))});
}

// BatchNormalization in training mode: each example is a batch of its own, so it normalises with
// the mean and (population) variance of its own N and spatial positions per channel, and updates
// its own running statistics: running = input * momentum + current * (1 - momentum).
BatchResult batchnorm_training_rule(BatchCtx& c) {
  auto& b = c.b;
  const int64_t r = c.rank(0);
  const bool xb = c.batched[0];
  const int64_t shift = xb ? 1 : 0;
  std::vector<int64_t> axes{shift};  // N and the spatial axes
  for (int64_t k = 2; k < r; ++k) axes.push_back(k + shift);
  const V ax = b.i64s(axes);
  const int32_t dt = c.dtype(0);
  const V mean = b.op1("ReduceMean", {c.in[0], ax}, {Attr::i("keepdims", 1)});
  const V centered = b.op1("Sub", {c.in[0], mean});
  const V var = b.op1("ReduceMean", {b.op1("Mul", {centered, centered}), ax}, {Attr::i("keepdims", 1)});
  const float eps = c.attr("epsilon") ? c.attr("epsilon")->f() : 1e-5f;
  const V inv_std = b.op1("Reciprocal", {b.op1("Sqrt", {b.op1("Add", {var, b.scalar(eps, dt)})})});
  const V y = b.op1("Add", {b.op1("Mul", {b.op1("Mul", {centered, inv_std}), channel_param_as_x(c, 1, r)}),
                            channel_param_as_x(c, 2, r)});
  BatchResult res;
  res.out.push_back(y);
  res.batched.push_back(xb || c.batched[1] || c.batched[2]);
  if (c.node.output_size() < 2) return res;
  const float momentum = c.attr("momentum") ? c.attr("momentum")->f() : 0.9f;
  // (B, 1, C, 1, ...) or (1, C, 1, ...) -> (B, C) or (C).
  auto per_example = [&](V stat, int running) {
    V v = b.op1("Squeeze", {stat, ax});
    const int32_t st = c.dtype(running);
    if (st != dt) v = b.op1("Cast", {v}, {Attr::i("to", st)});
    return b.op1("Add", {b.op1("Mul", {c.in[static_cast<size_t>(running)], b.scalar(momentum, st)}),
                         b.op1("Mul", {v, b.scalar(1.0 - momentum, st)})});
  };
  res.out.push_back(per_example(mean, 3));
  res.batched.push_back(xb || c.batched[3]);
  if (c.node.output_size() < 3) return res;
  res.out.push_back(per_example(var, 4));
  res.batched.push_back(xb || c.batched[4]);
  return res;
}

// BatchNormalization in inference mode; batched statistics or affine parameters are
// applied elementwise: (x - mean) / sqrt(var + eps) * scale + bias.
BatchResult batchnorm_rule(BatchCtx& c) {
  if (c.attr_i("training_mode", 0)) return batchnorm_training_rule(c);
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
  Vs ins{c.in[0], ones_like_example(c, 1), zeros_like_example(c, 2)};
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
  Vs ins{c.in[0], ones_like_example(c, 1)};
  if (c.has(2)) ins.push_back(zeros_like_example(c, 2));
  Vs outs = c.b.clone(c.node, ins, {Attr::i("axis", c.batched[0] ? shift_axis(axis) : axis)});
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
  Vs ins = c.in;
  ins[0] = merge_batch(c, c.in[0]);
  if (c.has(3) && axes.empty()) {
    // sizes[0] is N per example; the merged tensor has B*N rows.
    Vs parts{c.batch_size()};
    if (r > 1) parts.push_back(c.b.i64s(std::vector<int64_t>(r - 1, 1)));
    ins[3] = c.b.op1("Mul", {c.in[3], c.b.concat(parts, 0)});
  }
  V y = c.b.clone(c.node, ins)[0];
  return all_batched({split_batch(c, y)});
}

}  // namespace

// GridSample: X (N, C, ...) and the grid (N, ..., r) both lead with N. The one not batched is
// broadcast to the batch, then (B, N) merges into B*N in both.
BatchResult grid_sample_rule(BatchCtx& c) {
  const V x = c.materialize(0);
  Vs ins = {merge_batch(c, x), merge_batch(c, c.materialize(1))};
  return all_batched({split_batch(c, c.b.clone(c.node, ins)[0], x)});
}

// DeformConv: X, the offsets and the mask lead with N; with shared weights and bias the batch
// merges into N (the inputs not batched broadcast first). Batched weights take the
// per-example Scan, as for Conv.
BatchResult deform_conv_rule(BatchCtx& c) {
  if ((c.has(1) && c.batched[1]) || (c.has(3) && c.batched[3])) return scan_fallback(c);
  const V x = c.materialize(0);
  Vs ins = c.in;
  for (int i : {0, 2, 4})
    if (c.has(i)) ins[static_cast<size_t>(i)] = merge_batch(c, i == 0 ? x : c.materialize(i));
  return all_batched({split_batch(c, c.b.clone(c.node, ins)[0], x)});
}

// RoiAlign: the batch merges into N (X: (Bv*N, C, H, W)) and into the boxes (Bv*R of them),
// each example's box indices shifted by its offset b * N.
BatchResult roi_align_rule(BatchCtx& c) {
  auto& b = c.b;
  const V x = c.materialize(0);
  const V n = b.shape_of(x, 1, 2);  // [N]
  const V rois = c.materialize(1), idx = c.materialize(2);
  const V examples = b.op1("Range", {b.i64(0), b.op1("Squeeze", {c.batch_size(), b.i64s({0})}), b.i64(1)});
  const V offsets = b.op1("Mul", {b.unsqueeze(examples, {1}), n});  // (Bv, 1)
  Vs ins = {merge_batch(c, x), b.reshape(rois, b.i64s({-1, 4})), b.reshape(b.op1("Add", {idx, offsets}), b.i64s({-1}))};
  return all_batched({split_batch(c, b.clone(c.node, ins)[0], rois)});  // (Bv*R, ...) -> (Bv, R, ...)
}

// FlexAttention (ai.onnx.preview): Q, K and V lead with the batch N; the vmap batch merges into
// it. Score and probability modifiers see (B*N, H, L, S) tensors, which is the same
// elementwise computation unless a modifier reads a value of the enclosing graph (a per-example
// bias, say, whose broadcast against N would break): those take the per-example Scan.
BatchResult flex_attention_rule(BatchCtx& c) {
  for (const auto& a : c.node.attribute())
    if (a.has_g() && !graph_outer_reads(a.g()).empty()) return scan_fallback(c);
  const V q = c.materialize(0);
  const Vs ins = {merge_batch(c, q), merge_batch(c, c.materialize(1)), merge_batch(c, c.materialize(2))};
  return all_batched({split_batch(c, c.b.clone(c.node, ins)[0], q)});
}

}  // namespace onnax

// ---------------------------------------------------------------------------------------
// Derivatives of normalisation, pooling and convolution.
namespace onnax {
namespace {

using D = JvpCtx;

// A per-channel parameter (C) shaped to broadcast against (N, C, spatial...) of rank r.
// (A symbolic zero stays one.)
V per_channel(Builder& b, V p, int64_t r) {
  std::vector<int64_t> axes;
  for (int64_t k = 1; k < r - 1; ++k) axes.push_back(k);
  return b.unsqueeze(p, axes);
}

Vs batchnorm_training_jvp(D& c);

Vs batchnorm_jvp(D& c) {
  if (c.attr_i("training_mode", 0)) return batchnorm_training_jvp(c);
  auto& b = c.b;
  const int64_t r = c.rank(0);
  V scale = per_channel(b, c.x(1), r), mean = per_channel(b, c.x(3), r), var = per_channel(b, c.x(4), r);
  V inv = b.op1("Reciprocal", {b.op1("Sqrt", {b.op1("Add", {var, c.scalar(c.attr_f("epsilon", 1e-5f))})})});
  V xc = b.op1("Sub", {c.x(0), mean});
  V xhat = b.op1("Mul", {xc, inv});
  // y = (x - mean) * inv * scale + bias, inv = 1 / sqrt(var + eps), d inv / d var = -inv^3 / 2.
  // Each term is emitted in turn (a zero tangent's term emits nothing).
  V t = c.emit(c.t(0) * (scale * inv));
  t = c.emit(t + per_channel(b, c.t(1), r) * xhat);
  t = c.emit(t + c.like_out(per_channel(b, c.t(2), r)));
  t = c.emit(t + c.like_out(c.emit(per_channel(b, c.t(3), r) * -(scale * inv))));
  const Expr dinv = -0.5 * (inv * (inv * inv));
  t = c.emit(t + c.like_out(c.emit(per_channel(b, c.t(4), r) * ((xc * scale) * dinv))));
  Vs out(c.ys.size());
  out[0] = c.like_out(t);
  return out;
}

// Normalisation over `axes` (kept as size-1 dims): xhat = (x - mean) * inv with
// inv = 1/sqrt(var + eps) (or, uncentred as RMSNorm, xhat = x * inv with var = mean(x^2)),
// then y = xhat * scale + bias with scale/bias shaped by `affine`.
// The mean and inverse standard deviation of x over the normalised axes, when the forward
// node computes them (invalid: compute them).
struct Statistics {
  V mean, inv_std;
};

// With `statistics`, outputs 1 and 2 are the mean and inverse standard deviation
// (LayerNormalization's); other callers give them their own meaning.
Vs normalize_jvp(D& c, const std::vector<int64_t>& axes, bool centered, const std::function<V(V)>& affine,
                 bool statistics = false, Statistics given = {}) {
  auto& b = c.b;
  V ax = b.i64s(axes);
  auto mean = [&](V v) { return b.op1("ReduceMean", {v, ax}, {Attr::i("keepdims", 1)}); };
  const bool from_node = centered && given.mean.valid() && given.inv_std.valid();
  V mu = from_node ? given.mean : centered ? mean(c.x(0)) : V{};
  V xc = centered ? b.op1("Sub", {c.x(0), mu}) : c.x(0);
  V inv = from_node ? given.inv_std
                    : b.op1("Reciprocal", {b.op1("Sqrt", {b.op1("Add", {mean(b.op1("Mul", {xc, xc})),
                                                                        c.scalar(c.attr_f("epsilon", 1e-5f))})})});
  V xhat = b.op1("Mul", {xc, inv});
  Vs out(c.ys.size());
  V t_xhat, t_mu, t_inv;
  // The optional statistics outputs (LayerNormalization's Mean and InvStdDev): their tangents
  // only when the node has them, else reverse mode would leave their primal parts dead.
  const bool wants_mean = statistics && c.ys.size() > 1 && c.ys[1].valid();
  const bool wants_inv = statistics && c.ys.size() > 2 && c.ys[2].valid();
  if (c.t(0).valid()) {
    t_mu = centered ? mean(c.t(0)) : V{};
    V tc = centered ? b.op1("Sub", {c.t(0), t_mu}) : c.t(0);
    b.set_witness(tc, c.x(0));
    V xt = b.op1("Mul", {tc, xhat});
    b.set_witness(xt, c.x(0));
    t_xhat = b.op1("Mul", {inv, b.op1("Sub", {tc, b.op1("Mul", {xhat, mean(xt)})})});
    if (wants_inv) {
      // d inv = -inv^3 * mean(xc * tc)
      V xct = b.op1("Mul", {xc, tc});
      b.set_witness(xct, c.x(0));
      t_inv = b.op1("Mul", {b.op1("Neg", {b.op1("Mul", {inv, b.op1("Mul", {inv, inv})})}), mean(xct)});
    }
  }
  V t = b.mul(t_xhat, affine(c.x(1)));
  t = c.emit(t + c.like_out(c.emit(xhat * affine(c.t(1)))));
  t = c.emit(t + c.like_out(affine(c.t(2))));
  out[0] = c.like_out(t);
  if (wants_mean) out[1] = t_mu;
  if (wants_inv) out[2] = t_inv;
  return out;
}

// LayerNormalization's own Mean and InvStdDev (outputs 1 and 2), which its derivative needs:
// read when the model names them, else named on the forward node (ONNX Runtime computes them
// anyway), sparing six recomputing nodes per LayerNormalization in reverse mode and at run
// time. Only where they have x's element type (float x, stash_type float); else recomputed.
Statistics layer_norm_statistics(D& c, int64_t axis) {
  const bool named = c.ys.size() > 2 && c.ys[1].valid() && c.ys[2].valid();
  if (c.dtype(0) != onnx::TensorProto::FLOAT || c.attr_i("stash_type", 1) != onnx::TensorProto::FLOAT) return {};
  if (named) return {c.ys[1], c.ys[2]};
  const Facts& xf = c.b.facts(c.x(0));
  Facts stat;
  stat.dtype = onnx::TensorProto::FLOAT;
  if (xf.has_shape) {
    stat.has_shape = true;
    stat.dims = xf.dims;
    for (size_t k = static_cast<size_t>(axis); k < stat.dims.size(); ++k) stat.dims[k] = Dim::of(1);
  }
  const Vs outs = c.b.name_optional_outputs(c.node, 1, {{"_mean", stat}, {"_inv_std_dev", stat}});
  return outs.size() == 2 ? Statistics{outs[0], outs[1]} : Statistics{};
}

// Normalised over axis..end; scale/bias broadcast against those trailing dims.
Vs trailing_normalize_jvp(D& c, bool centered) {
  const int64_t r = c.rank(0);
  int64_t axis = c.attr_i("axis", -1);
  if (axis < 0) axis += r;
  std::vector<int64_t> axes;
  for (int64_t k = axis; k < r; ++k) axes.push_back(k);
  const Statistics given = centered && r >= 0 ? layer_norm_statistics(c, axis) : Statistics{};
  return normalize_jvp(
      c, axes, centered, [](V v) { return v; }, true, given);
}

// Training mode normalises with the batch statistics over (N, spatial...) per channel and
// updates running = input * momentum + current * (1 - momentum), with the population
// variance; d var = 2 mean(xc * dx) (the mean of xc is 0, so dx need not be centred).
Vs batchnorm_training_jvp(D& c) {
  auto& b = c.b;
  const int64_t r = c.rank(0);
  std::vector<int64_t> axes{0};
  for (int64_t k = 2; k < r; ++k) axes.push_back(k);
  Vs out = normalize_jvp(c, axes, true, [&](V v) { return per_channel(b, v, r); });
  out.resize(c.ys.size());
  if (out.size() < 2) return out;
  const double m = c.attr_f("momentum", 0.9f);
  V ax = b.i64s(axes);
  V t_mu, t_var;
  if (c.t(0).valid()) {
    auto mean = [&](V v) { return b.op1("ReduceMean", {v, ax}, {Attr::i("keepdims", 0)}); };
    t_mu = mean(c.t(0));
    V xc = b.op1("Sub", {c.x(0), b.op1("ReduceMean", {c.x(0), ax}, {Attr::i("keepdims", 1)})});
    V prod = b.op1("Mul", {xc, c.t(0)});
    b.set_witness(prod, c.x(0));
    t_var = b.op1("Mul", {mean(prod), c.scalar(2.0)});
  }
  auto running = [&](V t_in, V t_cur) {
    const V t = c.emit(t_in * m);
    return c.emit(t + t_cur * (1.0 - m));
  };
  out[1] = running(c.t(3), t_mu);
  if (out.size() > 2) out[2] = running(c.t(4), t_var);
  return out;
}

Vs instancenorm_jvp(D& c) {
  const int64_t r = c.rank(0);
  std::vector<int64_t> axes;
  for (int64_t k = 2; k < r; ++k) axes.push_back(k);
  return normalize_jvp(c, axes, true, [&](V v) { return per_channel(c.b, v, r); });
}

// The tangent `t` has the shape of `x`; says so where inference cannot (GroupNormalization's
// output has no inferred shape, so later rules would not know the tangent's rank).
V like_input(Builder& b, V t, V x) {
  b.set_facts(t, b.facts(x));
  b.set_witness(t, x);
  return t;
}

// GroupNormalization normalises (N, G, C/G * spatial) views of x. Opset 18 scales and shifts
// per group (G,), opset 21 per channel (C,). The output has x's shape, which the rule knows
// itself: ONNX infers no shape for the opset-21 function op.
Vs groupnorm_jvp(D& c) {
  auto& b = c.b;
  const int64_t groups = c.attr_i("num_groups", 0);
  if (groups <= 0) c.unsupported("num_groups is missing or not positive", "set num_groups to the number of groups");
  const bool per_group = c.opset < 21;
  V xshape = b.shape_of(c.x(0));
  V gshape = b.concat({b.op1("Slice", {xshape, b.i64s({0}), b.i64s({1})}), b.i64s({groups, -1})}, 0);
  V ax = b.i64s({2});
  auto mean = [&](V v) { return b.op1("ReduceMean", {v, ax}, {Attr::i("keepdims", 1)}); };
  V xr = b.reshape(c.x(0), gshape);
  V xc = b.op1("Sub", {xr, mean(xr)});
  V inv = b.op1("Reciprocal",
                {b.op1("Sqrt", {b.op1("Add", {mean(b.op1("Mul", {xc, xc})), c.scalar(c.attr_f("epsilon", 1e-5f))})})});
  V xhat = b.op1("Mul", {xc, inv});
  V t_xhat;
  if (c.t(0).valid()) {
    V tr = b.reshape(c.t(0), gshape);
    b.set_witness(tr, xr);
    V tc = b.op1("Sub", {tr, mean(tr)});
    b.set_witness(tc, xr);
    V xt = b.op1("Mul", {tc, xhat});
    b.set_witness(xt, xr);
    t_xhat = b.op1("Mul", {inv, b.op1("Sub", {tc, b.op1("Mul", {xhat, mean(xt)})})});
    b.set_witness(t_xhat, xr);
  }
  V t;
  if (per_group) {
    auto grp = [&](V v) { return b.unsqueeze(v, {1}); };  // (G,) -> (G, 1) against (N, G, M)
    t = b.mul(t_xhat, grp(c.x(1)));
    t = c.emit(t + xhat * grp(c.t(1)));
    if (c.t(2).valid()) t = c.emit(t + b.expand(grp(c.t(2)), b.shape_of(xr)));  // (no Shape node otherwise)
    if (!t.valid()) return {t};
    b.set_witness(t, xr);
    return {like_input(b, b.reshape(t, xshape), c.x(0))};
  }
  const int64_t r = c.rank(0);
  // (Each scale is shaped before the normalised value is: the order results have always had.)
  if (t_xhat.valid()) {
    const V scale = per_channel(b, c.x(1), r);
    t = c.emit(b.reshape(t_xhat, xshape) * scale);
  }
  if (c.t(1).valid()) {
    const V t_scale = per_channel(b, c.t(1), r);
    t = c.emit(t + b.reshape(xhat, xshape) * t_scale);
  }
  t = c.emit(t + b.expand(per_channel(b, c.t(2), r), xshape));
  return {t.valid() ? like_input(b, t, c.x(0)) : t};
}

Vs global_average_transpose(TransposeCtx& c) {
  auto& b = c.b;
  V shape = tangent_shape(c, c.in(0));
  const int32_t dt = b.facts(c.ct()).dtype;
  V spatial = b.op1(
      "Cast",
      {b.op1("ReduceProd", {b.op1("Slice", {shape, b.i64s({2}), b.i64s({INT64_MAX})})}, {Attr::i("keepdims", 0)})},
      {Attr::i("to", dt)});
  return {b.op1("Div", {b.expand(c.ct(), shape), spatial})};
}

Vs maxpool_jvp(D& c) {
  auto& b = c.b;
  // The primal's argmax positions (flat over the whole input) select the tangent.
  // Row-major indices: the node's own unless it stores column-major ones (then recomputed).
  const bool row_major = c.attr_i("storage_order", 0) == 0;
  V idx = row_major && c.ys.size() > 1 && c.ys[1].valid()
              ? c.ys[1]
              : b.clone(c.node, {c.x(0)}, {Attr::i("storage_order", 0)}, {}, 2)[1];
  V flat = b.reshape(c.t(0), b.i64s({-1}));
  b.set_witness(flat, b.reshape(c.x(0), b.i64s({-1})));  // the flat tangent's primal twin
  V picked = b.op1("Gather", {flat, b.reshape(idx, b.i64s({-1}))}, {Attr::i("axis", 0)});
  b.set_witness(picked, b.reshape(c.y(), b.i64s({-1})));
  Vs out(c.ys.size());
  out[0] = b.reshape(picked, b.shape_of(c.y()));
  return out;
}

Vs conv_jvp(D& c) {
  auto& b = c.b;
  V t;
  // (Each term has the output's shape, without the bias: its primal twin is the output.)
  if (c.t(0).valid()) t = c.term(b.clone(c.node, {c.t(0), c.x(1)})[0]);
  if (c.t(1).valid()) t = b.add(t, c.term(b.clone(c.node, {c.x(0), c.t(1)})[0]));
  if (c.has(2) && c.t(2).valid()) t = b.add(t, c.like_out(per_channel(b, c.t(2), c.rank(0))));
  return {c.like_out(t)};
}

// The shape of tape input i, tangent or primal.
V shape_any(TransposeCtx& c, int i) {
  return c.linear(i) ? tangent_shape(c, c.in(i)) : c.b.shape_of(c.in(i));
}

V spatial_of(Builder& b, V shape, int64_t spatial) {
  return b.op1("Slice", {shape, b.i64s({2}), b.i64s({2 + spatial})});
}

std::vector<int64_t> spatial_axes(int64_t spatial) {
  std::vector<int64_t> axes;
  for (int64_t k = 0; k < spatial; ++k) axes.push_back(2 + k);
  return axes;
}

// Kernel spatial dims: the kernel_shape attribute, else the weight's (input 1's) shape.
V kernel_dims(TransposeCtx& c, int64_t spatial) {
  const std::vector<int64_t> k = c.attr_ints("kernel_shape");
  return k.empty() ? spatial_of(c.b, shape_any(c, 1), spatial) : c.b.i64s(k);
}

bool zero_pads(const Window& w) {
  if (!w.static_known) return false;
  for (int64_t p : w.static_pads)
    if (p != 0) return false;
  return true;
}

// Cotangent of the input of a Conv with unit strides and static pads no wider than the kernel:
// a Conv of the output cotangent with the kernel flipped and its channel roles swapped (per
// group), padded by extent - 1 - pad on each side, which gives exactly the input's span. ONNX
// Runtime runs that Conv in 0.7-0.9x the time of the equivalent ConvTranspose for 3x3 kernels.
std::optional<V> stride_one_input_transpose(TransposeCtx& c, const Window& w) {
  auto& b = c.b;
  if (!w.static_known || !std::all_of(w.strides.begin(), w.strides.end(), [](int64_t s) { return s == 1; }))
    return std::nullopt;
  const Facts& wf = facts_or_twin(b, c.in(1));
  const std::optional<std::vector<int64_t>> kernel = static_kernel(c.node, wf, w.spatial);
  const int64_t group = c.attr_i("group", 1);
  if (!kernel || !wf.has_shape || wf.rank() != w.spatial + 2 || !wf.dims[1].known() || group < 1) return std::nullopt;
  const int64_t per_group = wf.dims[1].value();  // input channels per group
  std::vector<int64_t> pads(static_cast<size_t>(2 * w.spatial));
  for (int64_t k = 0; k < w.spatial; ++k) {
    const int64_t extent = (kernel->at(k) - 1) * w.dilations[k] + 1;
    const int64_t begin = extent - 1 - w.static_pads[k], end = extent - 1 - w.static_pads[w.spatial + k];
    if (begin < 0 || end < 0) return std::nullopt;
    pads[k] = begin;
    pads[w.spatial + k] = end;
  }
  // (M, C/g, k...) -> (C, M/g, k...) with the kernel reversed along every spatial axis.
  V weight = c.in(1);
  std::vector<int64_t> swap{1, 0};
  for (int64_t k = 0; k < w.spatial; ++k) swap.push_back(2 + k);
  if (group == 1) {
    weight = b.transpose(weight, swap);
  } else {
    std::vector<int64_t> split{group, -1, per_group}, perm{0, 2, 1}, merged{group * per_group, -1};
    split.insert(split.end(), kernel->begin(), kernel->end());
    merged.insert(merged.end(), kernel->begin(), kernel->end());
    for (int64_t k = 0; k < w.spatial; ++k) perm.push_back(3 + k);
    weight = b.reshape(b.transpose(b.reshape(weight, b.i64s(split)), perm), b.i64s(merged));
  }
  const std::vector<int64_t> spatial = spatial_axes(w.spatial);
  weight = b.op1("Slice", {weight, b.i64s(std::vector<int64_t>(spatial.size(), -1)),
                           b.i64s(std::vector<int64_t>(spatial.size(), std::numeric_limits<int64_t>::min())),
                           b.i64s(spatial), b.i64s(std::vector<int64_t>(spatial.size(), -1))});
  return b.op1("Conv", {c.ct(), weight},
               {Attr::ints("dilations", w.dilations), Attr::i("group", group), Attr::ints("pads", pads)});
}

// Cotangent of Conv's input: a ConvTranspose of the output cotangent with the same kernel and
// no pads (output_padding s-1 makes it cover pad_begin + in), from which the input's span is
// cut out; run-time pads (auto_pad=SAME_*) only move the cut.
V conv_input_transpose(TransposeCtx& c, const Window& w, V in_sp) {
  auto& b = c.b;
  if (const std::optional<V> by_conv = stride_one_input_transpose(c, w)) return *by_conv;
  std::vector<int64_t> out_pad;
  for (int64_t k = 0; k < w.spatial; ++k) out_pad.push_back(w.strides[k] - 1);
  Attrs attrs{Attr::ints("strides", w.strides), Attr::ints("dilations", w.dilations),
              Attr::ints("output_padding", out_pad), Attr::i("group", c.attr_i("group", 1))};
  V y = b.op1("ConvTranspose", {c.ct(), c.in(1)}, attrs);
  V ends = b.op1("Add", {w.begin, in_sp});
  return b.op1("Slice", {y, w.begin, ends, b.i64s(spatial_axes(w.spatial))});
}

// Cotangent of the weight of the Conv `x -> conv(x, W)` (window `w`) given the output
// cotangent `ct`: a grouped correlation of the padded input with `ct`, with the roles of stride
// and dilation exchanged, cropped to the kernel dims `kdims`.
V conv_weight_grad(TransposeCtx& c, const Window& w, V x, V ct, V kdims) {
  auto& b = c.b;
  const int64_t g = c.attr_i("group", 1);
  const int64_t spatial = w.spatial;
  if (!zero_pads(w)) x = b.op1("Pad", {x, nc_pads(b, w.begin, w.end)});
  // A[c, j*N + n, ...] = X[n, j*Cg + c, ...]
  V xs = b.shape_of(x);
  V spatial_dims = spatial_of(b, xs, spatial);
  V five = b.reshape(x, b.concat({b.op1("Slice", {xs, b.i64s({0}), b.i64s({1})}), b.i64s({g, -1}), spatial_dims}, 0));
  std::vector<int64_t> perm{2, 1, 0};
  for (int64_t k = 0; k < spatial; ++k) perm.push_back(3 + k);
  V a = b.reshape(b.transpose(five, perm), b.concat({b.i64s({0, -1}), spatial_dims}, 0));
  std::vector<int64_t> swap{1, 0};
  for (int64_t k = 0; k < spatial; ++k) swap.push_back(2 + k);
  V wt = b.transpose(ct, swap);  // (M, N, out...)
  V o = b.op1(
      "Conv", {a, wt},
      {Attr::ints("strides", w.dilations), Attr::ints("dilations", w.strides), Attr::i("group", g)});  // (Cg, M, k'...)
  V cropped = b.op1("Slice", {o, b.i64s(std::vector<int64_t>(spatial, 0)), kdims, b.i64s(spatial_axes(spatial))});
  return b.transpose(cropped, swap);
}

// The weight's cotangent from the forward Conv's own windows, when the channel count and the
// kernel are static: the windows of x (a Conv with one-hot kernels and the node's pads,
// strides, dilations), then per group dW[m, q] = sum over examples and output positions of
// ct[n, m, s] * windows[n, q, s]. Under vmap the window Conv's kernels are shared and the
// contraction is an Einsum, so per-example weight gradients stay vectorized, where the
// correlation form (conv_weight_grad) is a Conv whose kernel is the batched cotangent.
std::optional<V> conv_weight_grad_by_windows(TransposeCtx& c, int64_t spatial) {
  auto& b = c.b;
  const Facts& xf = b.facts(c.in(0));
  if (!xf.has_shape || xf.rank() != spatial + 2 || !xf.dims[1].known()) return std::nullopt;
  const int64_t channels = xf.dims[1].value();
  const std::optional<std::vector<int64_t>> found = static_kernel(c.node, facts_or_twin(b, c.in(1)), spatial);
  const int64_t group = c.attr_i("group", 1);
  if (!found || group < 1 || channels % group != 0) return std::nullopt;
  const std::vector<int64_t>& kernel = *found;
  int64_t k_total = 1;
  for (int64_t k : kernel) k_total *= k;
  const V windows = conv_windows(b, c.node, c.in(0), channels, kernel);
  const int64_t q = channels / group * k_total;
  const Facts& wf = facts_or_twin(b, c.in(1));
  const Dim m = wf.has_shape && wf.rank() == spatial + 2 ? wf.dims[0] : Dim{};
  if (group == 1 && xf.dims[0].known() && xf.dims[0].value() == 1 && m.known()) {
    // One example and one group: dW = ct (M, S) times windows (Q, S) transposed, one Gemm,
    // which ONNX Runtime runs in 0.5-0.8x the time of the Einsum below (ResNet-50's layers).
    const V p = b.reshape(windows, b.i64s({q, -1}));
    const V ct = b.reshape(c.ct(), b.i64s({m.value(), -1}));
    const V dw = b.op1("Gemm", {ct, p}, {Attr::i("transB", 1)});
    std::vector<int64_t> shape{m.value(), channels};
    shape.insert(shape.end(), kernel.begin(), kernel.end());
    return b.reshape(dw, b.i64s(shape));
  }
  const V p = b.reshape(windows, b.i64s({0, group, q, -1}));  // (N, g, Q, S)
  std::vector<int64_t> shape{-1, channels / group};
  shape.insert(shape.end(), kernel.begin(), kernel.end());
  // Output positions per example, when static.
  int64_t positions = 1;
  const Facts& pf = b.facts(windows);
  for (int64_t k = 0; k < spatial && positions > 0; ++k)
    positions =
        pf.has_shape && pf.rank() == spatial + 2 && pf.dims[2 + k].known() ? positions * pf.dims[2 + k].value() : 0;
  const int64_t per_group = m.known() && m.value() % group == 0 ? m.value() / group : 0;
  if (per_group > 0 && per_group <= positions) {
    // Few output channels per group against output positions: one product per example (and
    // group), ct (M/g, S) times windows (Q, S) transposed, summed over the examples. ONNX
    // Runtime fuses the transpose into the MatMul; 2-3x faster than the Einsum at batch 8-32
    // (bench/cnn_per_example.py's layers). With more channels than positions the per-example
    // products would outweigh the windows, and the Einsum stays.
    const V ct = b.reshape(c.ct(), b.i64s({0, group, per_group, -1}));  // (N, g, M/g, S)
    V dw = b.op1("MatMul", {ct, b.transpose(p, {0, 1, 3, 2})});         // (N, g, M/g, Q)
    if (!(xf.dims[0].known() && xf.dims[0].value() == 1))
      dw = b.op1("ReduceSum", {dw, b.i64s({0})}, {Attr::i("keepdims", 0)});
    return b.reshape(dw, b.i64s(shape));  // (M, C/g, k...)
  }
  const V ct = b.reshape(c.ct(), b.concat({b.i64s({0, group, -1}), b.shape_of(p, 3, 4)}, 0));  // (N, g, M/g, S)
  const V dw = b.op1("Einsum", {ct, p}, {Attr::s("equation", "ngms,ngqs->gmq")});
  return b.reshape(dw, b.i64s(shape));  // (M, C/g, k...)
}

Vs conv_transpose_rule(TransposeCtx& c) {
  if (c.linear(0) && c.linear(1)) c.unsupported("both input and weight are tangents (not linear)");
  const int64_t spatial = c.rank(c.in(c.linear(0) ? 0 : 1)) - 2;
  V in_sp = spatial_of(c.b, shape_any(c, 0), spatial);
  Window w = window_geometry(c.b, c.node, spatial, in_sp, kernel_dims(c, spatial));
  Vs out(c.ins.size());
  if (c.linear(0)) out[0] = conv_input_transpose(c, w, in_sp);
  if (c.linear(1)) {
    const std::optional<V> by_windows = conv_weight_grad_by_windows(c, spatial);
    out[1] = by_windows ? *by_windows : conv_weight_grad(c, w, c.in(0), c.ct(), kernel_dims(c, spatial));
  }
  return out;
}

// ConvTranspose(x, W) is the adjoint of the Conv u -> conv(u, W) (same strides, dilations,
// group and pads) that maps its output space back to x's. Pads given by auto_pad=SAME_* or
// output_shape follow ONNX's formula from the run-time sizes:
// total = s (in - 1) + output_padding + (k - 1) d + 1 - out.
Window conv_transpose_window(TransposeCtx& c, int64_t spatial, V in_sp, V out_sp, V kdims) {
  auto& b = c.b;
  const std::string mode = node_s(c.node, "auto_pad", "NOTSET");
  const bool computed = mode == "SAME_UPPER" || mode == "SAME_LOWER" || c.attr("output_shape") != nullptr;
  onnx::NodeProto plain = c.node;  // strides, dilations and explicit pads as a Conv reads them
  if (computed) {
    for (int k = plain.attribute_size() - 1; k >= 0; --k)
      if (plain.attribute(k).name() == "auto_pad" || plain.attribute(k).name() == "pads")
        plain.mutable_attribute()->DeleteSubrange(k, 1);
  }
  Window w = window_geometry(b, plain, spatial, in_sp, kdims);
  if (!computed) return w;
  std::vector<int64_t> op = c.attr_ints("output_padding");
  if (op.empty()) op.assign(spatial, 0);
  V one = b.i64(1), s = b.i64s(w.strides);
  V extent = b.op1("Add", {b.op1("Mul", {b.op1("Sub", {kdims, one}), b.i64s(w.dilations)}), one});
  V total = b.op1(
      "Sub",
      {b.op1("Add", {b.op1("Add", {b.op1("Mul", {s, b.op1("Sub", {in_sp, one})}), b.i64s(op)}), extent}), out_sp});
  // A negative total (an output_shape beyond the natural size) extends the output at the end
  // with elements no input reaches, as ONNX Runtime and the reference evaluator do; the
  // transpose then crops the Conv's surplus outputs instead.
  total = b.op1("Max", {total, b.i64(0)});
  V half = b.op1("Div", {total, b.i64(2)});
  V rest = b.op1("Sub", {total, half});
  w.begin = mode == "SAME_UPPER" ? half : rest;
  w.end = mode == "SAME_UPPER" ? rest : half;
  w.static_known = false;
  return w;
}

Vs conv_transpose_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(0) && c.linear(1)) c.unsupported("both input and weight are tangents (not linear)");
  const int64_t spatial = c.rank(c.in(c.linear(0) ? 0 : 1)) - 2;
  V in_sp = spatial_of(b, shape_any(c, 0), spatial);
  V kdims = kernel_dims(c, spatial);
  Window w = conv_transpose_window(c, spatial, in_sp, b.shape_of(c.ct(), 2), kdims);
  Vs out(c.ins.size());
  if (c.linear(0)) {
    // The pads move into an explicit Pad so run-time pads work too.
    V ct = zero_pads(w) ? c.ct() : b.op1("Pad", {c.ct(), nc_pads(b, w.begin, w.end)});
    out[0] = b.op1("Conv", {ct, c.in(1)},
                   {Attr::ints("strides", w.strides), Attr::ints("dilations", w.dilations),
                    Attr::i("group", c.attr_i("group", 1))});
    if (!w.static_known)
      out[0] = b.op1("Slice", {out[0], b.i64s(std::vector<int64_t>(spatial, 0)), in_sp, b.i64s(spatial_axes(spatial))});
  }
  if (c.linear(1)) out[1] = conv_weight_grad(c, w, c.ct(), c.in(0), kdims);
  return out;
}

}  // namespace

void register_nn(OpTable& table) {
  table.op("Conv").batch(conv_only_rule).jvp(conv_jvp).transpose(conv_transpose_rule);
  table.op("ConvTranspose").batch(conv_rule).jvp(conv_jvp).transpose(conv_transpose_transpose);
  table.op("MaxPool").batch(maxpool_rule).jvp(maxpool_jvp);
  table.op("GlobalAveragePool")
      .batch(merge_rule)
      .jvp([](D& c) -> Vs { return {c.t(0).valid() ? c.same_op({c.t(0)}) : V{}}; })
      .transpose(global_average_transpose);
  // (Their derivatives: pool.cc, shape.cc.)
  for (const char* op :
       {"AveragePool", "LpPool", "GlobalMaxPool", "GlobalLpPool", "LRN", "DepthToSpace", "SpaceToDepth"})
    table.op(op).batch(merge_rule);
  table.op("BatchNormalization").batch(batchnorm_rule, 15).jvp(batchnorm_jvp);
  table.op("InstanceNormalization").batch(channel_affine_rule, 6).jvp(instancenorm_jvp);
  table.op("GroupNormalization").batch(channel_affine_rule, 21).jvp(groupnorm_jvp);
  table.op("LayerNormalization").batch(trailing_norm_rule, 17).jvp([](D& c) {
    return trailing_normalize_jvp(c, true);
  });
  table.op("RMSNormalization").batch(trailing_norm_rule, 23).jvp([](D& c) { return trailing_normalize_jvp(c, false); });
  // (Their derivatives: resize.cc, grid_sample.cc, deform_conv.cc, roi_align.cc, expand.cc.)
  table.op("Resize").batch(resize_rule, 18);
  table.op("GridSample").batch(grid_sample_rule, 16);
  table.op("DeformConv").batch(deform_conv_rule, 19);
  table.op("RoiAlign").batch(roi_align_rule, 16);
  table.op_in("ai.onnx.preview", "FlexAttention").batch(flex_attention_rule);
}

}  // namespace onnax
