// DP-SGD without per-example gradients where it can: the per-example gradient of a MatMul's
// weight is an outer product G[b] = X[b]^T D[b] (X [B, K, m] the layer's input rows, D [B, K, n]
// its output cotangents), so
//   ||G[b]||^2 = sum(X[b] X[b]^T * D[b] D[b]^T)   (= ||X[b]||^2 ||D[b]||^2 when K = 1), and
//   sum_b c[b] G[b] = (c . X)^T D                    over all B*K rows at once.
// Both cost O(B K^2 (m + n)) or O(B K m n) without writing the [B, m, n] gradients that the
// generic form materialises and reads twice (for an MLP at batch 64: 64 times every weight).
#pragma once

#include <onnx/onnx_pb.h>

#include <optional>
#include <string>
#include <vector>

#include "training/step_writer.h"

namespace onnax::training {

// A [B, K, c] operand of the outer product: the value `name` ([B, K, c], or [B, L, K', c]
// with K = L K'), or, when `transposed`, the transpose of its last two axes.
struct Rows {
  std::string name;
  bool transposed = false;
  int rank = 3;
};

struct OuterProduct {
  Rows x;  // X [B, K, m]
  Rows d;  // D [B, K, n]
  int64_t k = 0, m = 0, n = 0;
};

// For each parameter: its gradient's outer-product form, when the per-example gradient
// `p.grad` [B, m, n] is a MatMul of [B, m, K] and [B, K, n] operands, or the transpose of one
// (Gemm with transB: [B, n, K] x [B, K, m]), or the sum over axis 1 of a MatMul of [B, L, m, K']
// and [B, L, K', n] (a weight broadcast over a leading axis), with K = L K' known and the
// norm from them is cheaper than from the gradient (K = 1, or K (m + n) < m n). `model` is
// the step's graph so far, without the parameters as inputs (they are declared from
// `params`' facts for the shape inference that finds K).
std::vector<std::optional<OuterProduct>> outer_product_forms(const onnx::ModelProto& model,
                                                             const std::vector<Param>& params);

// Every example's squared norm [B] of the gradient `f` describes, in the gradient's dtype.
std::string outer_product_squared_norm(StepWriter& sw, OuterProduct& f, const std::string& hint);

// sum_b factor[b] G[b], the [m, n] clipped sum, with `factor` [B] in the gradient's dtype.
std::string outer_product_weighted_sum(StepWriter& sw, OuterProduct& f, const std::string& factor,
                                       const std::string& hint);

}  // namespace onnax::training
