// Shape functions for the most common floating-point operators, used in place of ONNX's
// per-node inference where they give the same answer much faster. ONNX's inference builds an
// InferenceContextImpl (attribute maps, type copies) for every node, which costs several
// microseconds; elementwise chains and MatMuls dominate real models and large generated ones.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "facts/facts.h"

namespace onnax {

// The output facts of `node` when it is one of the operators handled here and every input
// (inputs[i], nullptr when unknown) is a floating tensor; false means "ask ONNX's inference". Results agree
// with ONNX's inference (tests/cpp/fast_shapes_test.cc checks this against it), and type the
// function ops ONNX cannot (their output shapes are checked against ONNX Runtime in Python).
// `node` supplies the op type, domain and attributes; the counts are passed separately because
// a node bound for the autodiff tape carries no input or output names.
//
// Reductions (Reduce*), Reshape and Expand are answered only when their axes / target shape (input 1)
// is a known constant: `constants` (may be null) gives input i's int64 values, or nullptr.
class ConstantInputs {
 public:
  virtual const std::vector<int64_t>* values(int input) const = 0;

 protected:
  ~ConstantInputs() = default;
};
bool fast_infer(const onnx::NodeProto& node, int input_count, int output_count, int opset, const Facts* const* inputs,
                Facts& out, const ConstantInputs* constants = nullptr);

// The output dims of Reshape(x, target) for constant target dims: positive values as they are,
// 0 copies x's dim (or is 0 with allowzero), one -1 takes what is left when every other size is
// known. Nothing where ONNX's inference must decide (or reports an invalid node).
std::optional<Dims> reshaped_dims(const Facts& x, const std::vector<int64_t>& target, bool allowzero);
// The output dims of Expand(x, target) for constant target dims: x's dims broadcast against
// them, aligned from the right. Nothing when a target dim is negative or contradicts a known dim.
std::optional<Dims> expanded_dims(const Dims& x, const std::vector<int64_t>& target);
// The dims of a and b broadcast against each other as ONNX's inference broadcasts them (a
// known size other than 1 wins, one distinct symbolic dim survives, others are unknown).
// Nothing when known sizes conflict.
std::optional<Dims> broadcast_dims(const Dims& a, const Dims& b);

}  // namespace onnax
