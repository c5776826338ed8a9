// Parsing into a given message (for example one on an arena), with parse_model's diagnostics.
#pragma once

#include <google/protobuf/arena.h>
#include <onnx/onnx_pb.h>

#include <string>

namespace onnax {

void parse_model_into(const std::string& bytes, onnx::ModelProto& model);
// Options for an arena holding a model and its transform's result: blocks start at 64 KB (the
// default starts at 256 bytes) and grow to 4 MB.
google::protobuf::ArenaOptions model_arena_options();
// load_model into a given message (for example one on an arena).
void load_model_into(const std::string& path, onnx::ModelProto& model);

}  // namespace onnax
