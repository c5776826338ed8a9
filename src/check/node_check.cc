#include "check/node_check.h"

#include <algorithm>
#include <vector>

namespace onnax {
namespace {

std::string required_inputs(const onnx::OpSchema& schema, const onnx::NodeProto& node) {
  const auto& formals = schema.inputs();
  if (node.input_size() < schema.min_input())
    return "has " + std::to_string(node.input_size()) + " input(s); its schema requires at least " +
           std::to_string(schema.min_input());
  for (int i = 0; i < node.input_size() && !formals.empty(); ++i) {
    if (!node.input(i).empty()) continue;
    // Inputs past the formal list belong to the last (variadic) formal input.
    const size_t formal = std::min(static_cast<size_t>(i), formals.size() - 1);
    if (formals[formal].GetOption() == onnx::OpSchema::Optional) continue;
    return "gives its required input " + std::to_string(i) + " ('" + formals[formal].GetName() +
           "') an empty name, so it has no value";
  }
  return "";
}

std::string transpose_perm(const onnx::NodeProto& node, int64_t rank) {
  for (const auto& a : node.attribute()) {
    if (a.name() != "perm") continue;
    const int64_t n = a.ints_size();
    std::vector<char> seen(static_cast<size_t>(n), 0);
    bool permutation = rank < 0 || n == rank;
    for (int64_t p : a.ints()) {
      permutation = permutation && p >= 0 && p < n && !seen[static_cast<size_t>(p)];
      if (p >= 0 && p < n) seen[static_cast<size_t>(p)] = 1;
    }
    if (permutation) return "";
    std::string listed;
    for (int64_t p : a.ints()) listed += (listed.empty() ? "" : ", ") + std::to_string(p);
    return "has perm [" + listed + "], which is not a permutation of the axes 0.." +
           std::to_string((rank < 0 ? n : rank) - 1) + " of its input (rank " +
           (rank < 0 ? std::string("unknown") : std::to_string(rank)) + ")";
  }
  return "";
}

// 0 <= batch_dims < the rank of data and of indices (those known).
std::string gathernd_batch_dims(const onnx::NodeProto& node, int64_t data_rank, int64_t indices_rank) {
  for (const auto& a : node.attribute()) {
    if (a.name() != "batch_dims") continue;
    const int64_t b = a.i();
    if (b >= 0 && (data_rank < 0 || b < data_rank) && (indices_rank < 0 || b < indices_rank)) return "";
    return "has batch_dims " + std::to_string(b) + ", which must be at least 0 and below the ranks of data (" +
           (data_rank < 0 ? std::string("unknown") : std::to_string(data_rank)) + ") and indices (" +
           (indices_rank < 0 ? std::string("unknown") : std::to_string(indices_rank)) + ")";
  }
  return "";
}

}  // namespace

std::string node_defect(const onnx::OpSchema& schema, const onnx::NodeProto& node,
                        const std::function<int64_t(int)>& input_rank) {
  if (std::string why = required_inputs(schema, node); !why.empty()) return why;
  if (!schema.domain().empty()) return "";
  if (schema.Name() == "Transpose") return transpose_perm(node, input_rank(0));
  if (schema.Name() == "GatherND") return gathernd_batch_dims(node, input_rank(0), input_rank(1));
  return "";
}

}  // namespace onnax
