// Helpers that build diagnostics in the contract's shape (DESIGN.md section 6).
#pragma once

#include <onnax/diagnostics.h>

#include <string>
#include <string_view>
#include <vector>

namespace onnx {
class NodeProto;
}

namespace onnax::diag {

[[noreturn]] void fail(Error::Kind kind, const std::string& message);

// "[a, b, c]" for display in messages.
std::string join(const std::vector<std::string>& items, std::string_view sep = ", ");

// "float32", "int64", ... for an ONNX TensorProto element type.
std::string dtype_name(int32_t elem_type);

// Where a node is, for messages: "node 'name'", or "output 'first named output'" for an unnamed
// node.
std::string node_location(const onnx::NodeProto& node);

// "ai.onnx::MatMul (opset 18) at node 'mm'": the operator, its effective opset and the node.
std::string op_at(const onnx::NodeProto& node, int64_t opset);

}  // namespace onnax::diag
