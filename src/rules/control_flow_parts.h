// The parts of control_flow.cc's rules that the transpose of a Loop (loop_transpose.cc) shares.
#pragma once

#include <onnx/onnx_pb.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "emit/builder.h"
#include "facts/facts.h"
#include "rules/derivative.h"

namespace onnax {
struct Selection;

namespace control_flow {

// "Loop 'name'" or "Loop producing 'output'" (a node differentiated as another, as a Scan is as
// a Loop, keeps its own op type in doc_string).
std::string node_label(const onnx::NodeProto& node);

// jvp or vjp of a body as a model of its own, by the transform's `bodies` (control_flow.cc).
onnx::GraphProto derive_body(const BodyTransforms& bodies, bool forward, onnx::ModelProto model,
                             const Selection& selection, const std::string& where, bool for_reverse_mode);

// A loop-carried value the body passes through unchanged (directly or by an Identity).
bool invariant_state(const onnx::GraphProto& body, int k);

// `v` as a tensor named `name` when the builder knows its value (a small integer or bool
// constant of static shape: axes, shapes, flags); nullopt otherwise.
std::optional<onnx::TensorProto> known_constant(const Builder& b, V v, const std::string& name);

// A tape node has no names: transposes name the tangent it computed.
std::string tape_label(const TransposeCtx& c);

// The distinct names in `names`, and for each name its position in that list.
struct Distinct {
  std::vector<std::string> names;
  std::unordered_map<std::string, size_t> index;
  size_t add(const std::string& n) {
    auto [it, added] = index.emplace(n, names.size());
    if (added) names.push_back(n);
    return it->second;
  }
};

Facts scalar_facts(int32_t dtype);
bool maybe_differentiable(int32_t dtype);
onnx::ValueInfoProto scalar_info(const std::string& name, int32_t dtype);

// The transpose of a JVP loop on the tape (loop_transpose.cc).
Vs loop_transpose(TransposeCtx& c);

}  // namespace control_flow
}  // namespace onnax
