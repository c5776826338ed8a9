// How many nodes inlining a model's local functions writes, computed before inlining: nested
// functions that each call the next twice make a 1.7 KB model 2^20 nodes (and a 2.5 KB one 2^30,
// which ONNX's inliner dies on), so untrusted models are measured first.
#pragma once

#include <onnax/onnax.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace onnax {

// Inlining that would write more nodes than this is refused (real models stay far below it).
inline constexpr uint64_t kMaxInlinedNodes = uint64_t{1} << 24;

// Nothing when inlining `model`'s local functions writes at most kMaxInlinedNodes nodes
// (subgraphs included), else why not (a function calling itself, or too many nodes) as the
// error to raise.
std::optional<std::pair<Error::Kind, std::string>> inline_size_problem(const onnx::ModelProto& model,
                                                                       const std::string& mode);

}  // namespace onnax
