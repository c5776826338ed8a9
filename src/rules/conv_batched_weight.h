// vmap of Conv whose weights are batched, vectorized (no per-example Scan).
#pragma once

#include <optional>
#include <vector>

#include "rules/batching.h"

namespace onnax {

// Constant one-hot kernels (C*K, 1, k...) in row-major window order, as `like`'s dtype: a
// Conv with them (group C, the window's pads, strides and dilations) extracts the windows,
// channel c*K + j holding x[c] at window offset j.
V window_kernels(Builder& b, int64_t channels, const std::vector<int64_t>& kernel, V like);

// The batched Conv when the channel count and kernel size are static; nullopt otherwise
// (the caller then falls back to the per-example Scan).
std::optional<BatchResult> conv_batched_weight(BatchCtx& c);

}  // namespace onnax
