// Folding of shape arithmetic: int64 scalars and vectors whose values are known (sizes, pads,
// axes). Rules compute such values with ONNX ops so that symbolic sizes keep working; where the
// sizes are static, the builder emits the result as a constant instead of the nodes (SAME pads
// of a Conv on static images were 15 nodes).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "emit/builder.h"

namespace onnax {

// A known int64 operand: its values and rank (0 or 1).
struct KnownInt64 {
  const std::vector<int64_t>* values;
  int64_t rank;
};

struct FoldedInt64 {
  std::vector<int64_t> values;
  int64_t rank;  // 0 or 1
};

// Whether `type` is one of the ops fold_int64 evaluates (a cheap test before looking operands up).
bool int64_foldable(std::string_view type);

// The result of `type` on known operands (absent optional inputs are null `values`), when it is
// an int64 scalar or vector that fold_int64 computes exactly as ONNX defines it; nullopt otherwise
// (the node is then emitted).
std::optional<FoldedInt64> fold_int64(std::string_view type, std::span<const KnownInt64> inputs, const Attrs& attrs);

}  // namespace onnax
