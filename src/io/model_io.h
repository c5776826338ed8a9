// Parsing into a given message (for example one on an arena), with parse_model's diagnostics.
#pragma once

#include <google/protobuf/arena.h>
#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

namespace onnax {

void parse_model_into(const std::string& bytes, onnx::ModelProto& model);
// Options for an arena holding a model and its transform's result: blocks start at 64 KB (the
// default starts at 256 bytes) and grow to 4 MB.
google::protobuf::ArenaOptions model_arena_options();
// load_model into a given message (for example one on an arena); `data_files` (when given) gets
// the external data files it read.
void load_model_into(const std::string& path, onnx::ModelProto& model, std::vector<std::string>* data_files = nullptr);
// Fails (kIo) when writing `out` or its external data file (`out`.data) would overwrite the
// input model `in` or one of the `data_files` it reads.
void check_output_paths(const std::string& in, const std::vector<std::string>& data_files, const std::string& out);

}  // namespace onnax
