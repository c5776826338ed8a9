// vmap of Conv with per-example weights (the case per-example gradients of CNNs produce).
// ONNX's group count is a static attribute and the batch size is symbolic, so the usual
// "fold the batch into groups" trick is unavailable. Instead the windows are extracted once
// by a Conv with constant one-hot kernels (same pads, strides, dilations and auto_pad, so the
// windows are exactly the ones the original Conv sees), and each example's weights are
// applied to its windows by one batched MatMul:
//   patches  (B?, N, C*K, S...)   K = prod(kernel), channel c*K + j = x[c] at offset j
//   weights  (B, M, C/g, k...)  -> (B, 1, g, M/g, Q)      Q = (C/g)*K
//   patches                     -> (B?, N, g, Q, prod(S))
//   MatMul                      -> (B, N, g, M/g, prod(S)) -> (B, N, M, S...)
#include "rules/conv_batched_weight.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace onnax {

namespace {

// Constant one-hot kernels (C*K, 1, k...) in row-major window order, as `like`'s dtype.
V window_kernels(Builder& b, int64_t channels, const std::vector<int64_t>& kernel, V like) {
  int64_t k_total = 1;
  for (int64_t k : kernel) k_total *= k;
  onnx::TensorProto t;
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_dims(channels * k_total);
  t.add_dims(1);
  for (int64_t k : kernel) t.add_dims(k);
  for (int64_t o = 0; o < channels * k_total; ++o)
    for (int64_t j = 0; j < k_total; ++j) t.add_float_data(j == o % k_total ? 1.0f : 0.0f);
  V e = b.tensor_const(t);
  if (b.facts(like).dtype != onnx::TensorProto::FLOAT) e = b.op1("CastLike", {e, like});
  return e;
}

}  // namespace

std::optional<std::vector<int64_t>> static_kernel(const onnx::NodeProto& conv, const Facts& weight, int64_t spatial) {
  std::vector<int64_t> kernel;
  for (const auto& a : conv.attribute())
    if (a.name() == "kernel_shape") kernel.assign(a.ints().begin(), a.ints().end());
  if (kernel.empty()) {
    if (!weight.has_shape || weight.rank() != spatial + 2) return std::nullopt;
    for (int64_t k = 0; k < spatial; ++k) {
      const Dim& d = weight.dims[static_cast<size_t>(2 + k)];
      if (!d.known()) return std::nullopt;
      kernel.push_back(d.value());
    }
  }
  if (static_cast<int64_t>(kernel.size()) != spatial) return std::nullopt;
  return kernel;
}

V conv_windows(Builder& b, const onnx::NodeProto& conv, V x, int64_t channels, const std::vector<int64_t>& kernel) {
  // A 1x1 kernel's windows are the input itself (every stride-th position): no Conv. (Its pads
  // are zero unless explicit; SAME pads of a 1-wide kernel are always zero.)
  if (std::all_of(kernel.begin(), kernel.end(), [](int64_t k) { return k == 1; })) {
    bool padded = false;
    std::vector<int64_t> strides;
    for (const auto& a : conv.attribute()) {
      if (a.name() == "pads") padded = std::any_of(a.ints().begin(), a.ints().end(), [](int64_t p) { return p != 0; });
      if (a.name() == "strides") strides.assign(a.ints().begin(), a.ints().end());
    }
    if (!padded) {
      if (std::all_of(strides.begin(), strides.end(), [](int64_t s) { return s == 1; })) return x;
      const auto spatial = static_cast<int64_t>(kernel.size());
      std::vector<int64_t> axes;
      for (int64_t k = 0; k < spatial; ++k) axes.push_back(2 + k);
      return b.op1("Slice", {x, b.i64s(std::vector<int64_t>(kernel.size(), 0)),
                             b.i64s(std::vector<int64_t>(kernel.size(), std::numeric_limits<int64_t>::max())),
                             b.i64s(axes), b.i64s(strides)});
    }
  }
  Attrs attrs{Attr::i("group", channels), Attr::ints("kernel_shape", kernel)};
  for (const auto& a : conv.attribute())
    if (a.name() == "auto_pad" || a.name() == "dilations" || a.name() == "pads" || a.name() == "strides")
      attrs.push_back(Attr{a});
  return b.op1("Conv", {x, window_kernels(b, channels, kernel, x)}, attrs);
}

std::optional<BatchResult> conv_batched_weight(BatchCtx& c) {
  const Facts* xf = c.facts[0];
  const Facts* wf = c.facts[1];
  if (!xf || !wf || !xf->has_shape || !wf->has_shape || xf->rank() < 3 || wf->rank() != xf->rank()) return std::nullopt;
  const int64_t spatial = xf->rank() - 2;
  const Dim& channels = xf->dims[1];
  const std::optional<std::vector<int64_t>> kernel = static_kernel(c.node, *wf, spatial);
  const int64_t group = c.attr_i("group", 1);
  if (!channels.known() || !kernel || group < 1 || channels.value() % group) return std::nullopt;
  int64_t k_total = 1;
  for (int64_t k : *kernel) k_total *= k;
  const int64_t q = channels.value() / group * k_total;

  // Windows of every (example's) input.
  V x = c.in[0];
  if (c.batched[0]) x = c.b.reshape(x, c.b.concat({c.b.i64s({-1}), c.b.shape_of(x, 2)}, 0));
  V patches = conv_windows(c.b, c.node, x, channels.value(), *kernel);
  if (c.batched[0])
    patches =
        c.b.reshape(patches, c.b.concat({c.batch_size(), c.b.shape_of(c.in[0], 1, 2), c.b.shape_of(patches, 1)}, 0));
  const std::vector<int64_t> lead(c.batched[0] ? 2 : 1, 0);  // keep B? and N
  std::vector<int64_t> p_shape = lead;
  p_shape.insert(p_shape.end(), {group, q, -1});
  V p = c.b.reshape(patches, c.b.i64s(p_shape));

  const Dim& m = wf->dims[0];
  const int64_t per_group = m.known() && m.value() % group == 0 ? m.value() / group : -1;
  V w = c.b.unsqueeze(c.b.reshape(c.in[1], c.b.i64s({0, group, per_group, q})), {1});  // (B, 1, g, M/g, Q)
  V y = c.b.op1("MatMul", {w, p});                                                     // (B, N, g, M/g, S)
  // (B, N, M, S...): M from the weights, the output's spatial sizes from the windows.
  V out_shape = c.b.concat({c.b.shape_of(y, 0, 2), c.b.shape_of(c.in[1], 1, 2),
                            c.b.shape_of(patches, c.batched[0] ? 3 : 2, c.batched[0] ? 3 + spatial : 2 + spatial)},
                           0);
  y = c.b.reshape(y, out_shape);
  if (c.has(2)) {
    // Bias (B?, M) -> (B?, 1, M, 1...) or (M, 1...) against y (B, N, M, S...).
    std::vector<int64_t> axes;
    if (c.batched[2]) axes.push_back(1);
    for (int64_t k = 0; k < spatial; ++k) axes.push_back((c.batched[2] ? 3 : 1) + k);
    y = c.b.op1("Add", {y, c.b.unsqueeze(c.in[2], axes)});
  }
  return all_batched({y});
}

}  // namespace onnax
