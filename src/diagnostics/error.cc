#include "diagnostics/error.h"

#include <onnx/onnx_pb.h>

namespace onnax::diag {

void fail(Error::Kind kind, const std::string& message) {
  // Names come from the model: a control character in one (a NUL, an escape sequence) is shown
  // escaped, so the message stays one readable line and a NUL cannot cut it short.
  std::string shown;
  shown.reserve(message.size());
  for (const char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      shown += "\\x";
      shown += kHex[u >> 4];
      shown += kHex[u & 15];
    } else {
      shown += c;
    }
  }
  throw Error(kind, shown);
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
