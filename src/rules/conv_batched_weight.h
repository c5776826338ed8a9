// vmap of Conv whose weights are batched, vectorized (no per-example Scan).
#pragma once

#include <optional>
#include <vector>

#include "rules/batching.h"

namespace onnax {

// The kernel's spatial size of a Conv node: its kernel_shape attribute, else the weight's
// static dims (`weight`: the weight's facts); nullopt when neither tells it.
std::optional<std::vector<int64_t>> static_kernel(const onnx::NodeProto& conv, const Facts& weight, int64_t spatial);

// The windows the Conv node `conv` sees in `x` (N, C, ...), C = `channels`: a depthwise Conv
// with constant one-hot kernels and the node's auto_pad, pads, strides and dilations, so the
// windows are exactly the node's. Result (N, C*K, out...), K = prod(kernel), channel c*K + j
// holding x[c] at window offset j (row-major), in x's element type.
V conv_windows(Builder& b, const onnx::NodeProto& conv, V x, int64_t channels, const std::vector<int64_t>& kernel);

// The batched Conv when the channel count and kernel size are static; nullopt otherwise
// (the caller then falls back to the per-example Scan).
std::optional<BatchResult> conv_batched_weight(BatchCtx& c);

}  // namespace onnax
