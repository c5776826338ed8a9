// Defects of a single node that its operator's schema rules out and that the transforms' rules
// would otherwise trip over (reading an input that is not there, indexing by a permutation
// that is not one): checked on the nodes a transform rewrites, just before their rule runs.
#pragma once

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <vector>

namespace onnax {

// What a transform knows about a node's inputs; asked only by the checks of the few ops that
// need it. (An interface, not std::functions: the check runs on every rewritten node, and a
// std::function holding a lambda with a few captures allocates.)
class NodeInputFacts {
 public:
  virtual ~NodeInputFacts() = default;
  // Input i's rank, -1 when unknown or absent.
  virtual int64_t rank(int input) const = 0;
  // Input i's int64 values when it is a constant, else nullptr.
  virtual const std::vector<int64_t>* constant_ints(int input) const = 0;
};

// NodeInputFacts from two callables (e.g. lambdas over the transform's tables).
template <typename Rank, typename ConstantInts>
class NodeInputFactsOf final : public NodeInputFacts {
 public:
  NodeInputFactsOf(Rank rank, ConstantInts constant_ints) : rank_(rank), constant_ints_(constant_ints) {}
  int64_t rank(int input) const override { return rank_(input); }
  const std::vector<int64_t>* constant_ints(int input) const override { return constant_ints_(input); }

 private:
  Rank rank_;
  ConstantInts constant_ints_;
};

// What is wrong with `node` as an instance of `schema`, with its remedy ("... . Fix: ..."), or
// "" when nothing the rules rely on is: outputs beyond the schema's count or a required one left
// unnamed, a required input missing or left empty (or a variadic
// one left empty, which ONNX allows but no rule can read), a Transpose perm that is not a
// permutation of the input's axes, a GatherND batch_dims beyond its inputs' ranks, reduced axes
// (attribute or constant input) or an `axis` attribute out of range, an STFT with neither a window
// nor a frame_length, an Attention query, key or value of a rank other than 3 or 4.
// `input_ids` are the node's value ids in the transform's index (NodeValueIds): its inputs', then
// its outputs', -1 for an empty name.
std::string node_defect(const onnx::OpSchema& schema, const onnx::NodeProto& node, const int32_t* input_ids,
                        const NodeInputFacts& inputs);

// What would make ONNX's own shape inference of a default-domain `node` hang rather than fail (a
// malformed Einsum equation such as "ij-"), worded as node_defect words it; "" when nothing
// does. For running ONNX's inference on a model no transform has checked (onnax check).
std::string inference_hazard(const onnx::NodeProto& node);

}  // namespace onnax
