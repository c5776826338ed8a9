// A result at an older ai.onnx opset than the one onnax transforms at (18): what a model exported
// at opset 13 must come back as, to run where its source ran. ONNX's version converter has no
// downgrade for most operators (Add 14 -> 13, Shape 15 -> 14, ...) although their nodes mean the
// same at the older opset; here every node is checked against the older schema, the forms that
// moved from attributes to inputs are moved back (Reduce* axes, Squeeze/Unsqueeze axes, Split
// sizes, Shape's start/end), and anything without an older form (a LayerNormalization before 17,
// a ScatterElements with a reduction before 16) keeps the model where it is.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>

namespace onnax {

// Rewrites `model` (ai.onnx opset >= target) to ai.onnx opset `target`, or leaves it unchanged
// and returns why not (the first node that has no form there, and what it lacks).
std::string lower_opset(onnx::ModelProto& model, int64_t target);

// A transform's result back at its source's opset when that is older (prepare upgraded it);
// when it cannot be, the result stays and a notice says why.
void return_to_source_opset(onnx::ModelProto& result, int64_t source_opset, const std::string& mode);

}  // namespace onnax
