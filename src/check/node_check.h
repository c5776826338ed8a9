// Defects of a single node that its operator's schema rules out and that the transforms' rules
// would otherwise trip over (reading an input that is not there, indexing by a permutation
// that is not one): checked on the nodes a transform rewrites, just before their rule runs.
#pragma once

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace onnax {

// What is known about a node's inputs: input i's rank (-1 when unknown), and its int64 values
// when it is a constant (nullptr otherwise).
struct NodeInputFacts {
  std::function<int64_t(int)> rank;
  std::function<const std::vector<int64_t>*(int)> constant_ints;
};

// What is wrong with `node` as an instance of `schema`, or "" when nothing the rules rely on is:
// a required input that is missing or has an empty name, a Transpose perm that is not a
// permutation of the input's axes, a GatherND batch_dims beyond its inputs' ranks, reduced axes
// (attribute or constant input) out of range or repeated, an `axis` attribute out of range.
std::string node_defect(const onnx::OpSchema& schema, const onnx::NodeProto& node, const NodeInputFacts& inputs);

}  // namespace onnax
