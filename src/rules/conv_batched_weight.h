// vmap of Conv whose weights are batched, vectorized (no per-example Scan).
#pragma once

#include <optional>

#include "rules/batching.h"

namespace onnax {

// The batched Conv when the channel count and kernel size are static; nullopt otherwise
// (the caller then falls back to the per-example Scan).
std::optional<BatchResult> conv_batched_weight(BatchCtx& c);

}  // namespace onnax
