#include "diagnostics/error.h"

#include <onnx/onnx_pb.h>

namespace onnax::diag {

void fail(Error::Kind kind, const std::string& message) {
  throw Error(kind, message);
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string dtype_name(int32_t elem_type) {
  switch (elem_type) {
    case onnx::TensorProto::FLOAT: return "float32";
    case onnx::TensorProto::DOUBLE: return "float64";
    case onnx::TensorProto::FLOAT16: return "float16";
    case onnx::TensorProto::BFLOAT16: return "bfloat16";
    case onnx::TensorProto::INT8: return "int8";
    case onnx::TensorProto::INT16: return "int16";
    case onnx::TensorProto::INT32: return "int32";
    case onnx::TensorProto::INT64: return "int64";
    case onnx::TensorProto::UINT8: return "uint8";
    case onnx::TensorProto::UINT16: return "uint16";
    case onnx::TensorProto::UINT32: return "uint32";
    case onnx::TensorProto::UINT64: return "uint64";
    case onnx::TensorProto::BOOL: return "bool";
    case onnx::TensorProto::STRING: return "string";
    case onnx::TensorProto::COMPLEX64: return "complex64";
    case onnx::TensorProto::COMPLEX128: return "complex128";
    case 0: return "unknown dtype";
    default: return onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(elem_type));
  }
}

std::string node_location(const onnx::NodeProto& node) {
  if (!node.name().empty()) return "node '" + node.name() + "'";
  for (const auto& o : node.output())
    if (!o.empty()) return "output '" + o + "'";
  return "output ''";
}

std::string op_at(const onnx::NodeProto& node, int64_t opset) {
  const bool default_domain = node.domain().empty() || node.domain() == "ai.onnx";
  return (default_domain ? std::string("ai.onnx") : node.domain()) + "::" + node.op_type() + " (opset " +
         std::to_string(opset) + ") at " + node_location(node);
}

}  // namespace onnax::diag
