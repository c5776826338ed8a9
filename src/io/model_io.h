// Parsing into a given message (for example one on an arena), with parse_model's diagnostics.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

namespace onnax {

void parse_model_into(const std::string& bytes, onnx::ModelProto& model);
// load_model into a given message (for example one on an arena).
void load_model_into(const std::string& path, onnx::ModelProto& model);

}  // namespace onnax
