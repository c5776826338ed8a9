// Graph edits by name: what nodes read and define, through nested subgraphs (If/Loop/Scan
// bodies), renaming, pruning and ordering. The bottom layer every other one uses.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ir/names.h"

namespace onnax {

// ai.onnx, written "" or "ai.onnx".
inline bool is_default_domain(std::string_view domain) {
  return domain.empty() || domain == "ai.onnx";
}
inline bool is_default_domain(const onnx::NodeProto& node) {
  return is_default_domain(node.domain());
}

// True when a node has graph attributes (If/Loop/Scan bodies); only those read outer scopes.
inline bool has_subgraphs(const onnx::NodeProto& node) {
  for (const auto& a : node.attribute())
    if (a.has_g() || a.graphs_size() > 0) return true;
  return false;
}

// Names a subgraph reads from enclosing scopes (recursively), for batchedness checks.
std::vector<std::string> outer_scope_reads(const onnx::NodeProto& node);

// Replaces reads of `from` by `to` in g's nodes, nested subgraphs and outputs.
void rename_reads(onnx::GraphProto& g, const std::string& from, const std::string& to);
// Orders the graph's nodes topologically (stable: keeps the given order where it is valid),
// reporting cycles and inputs that nothing defines.
void sort_nodes(onnx::GraphProto& g);
// The same inside the subgraphs (If/Loop/Scan bodies) of node `n` alone.
void rename_subgraph_reads(onnx::NodeProto& n, const std::string& from, const std::string& to);

// The graph attribute `name` of `node` (nullptr: none).
const onnx::GraphProto* graph_attribute(const onnx::NodeProto& node, const char* name);

// Names `g` reads from enclosing scopes (each once, in order of first use, nested subgraphs
// included).
std::vector<std::string> graph_outer_reads(const onnx::GraphProto& g);

// Removes the initializers that shadow graph inputs of the same name (the known values
// standalone_model added): the enclosing node feeds those inputs.
void strip_known_values(onnx::GraphProto& g);

// For each output of `g`: whether it depends on any value named in `active` (graph inputs or
// values read from enclosing scopes), through its nodes and their subgraphs.
std::vector<char> outputs_depending_on(const onnx::GraphProto& g, const std::unordered_set<std::string>& active);
// The names of `active` and of every value of `g` that depends on one of them (nodes in
// topological order; a node's subgraph reads count as its inputs). A Loop's outputs are judged
// one by one (its final state k depends on what reaches state k over the iterations), so the
// primal outputs of a loop that also carries tangents do not depend on the tangents.
std::unordered_set<std::string> values_depending_on(const onnx::GraphProto& g,
                                                    const std::unordered_set<std::string>& active);

// Drops the nodes of `g` that none of its outputs needs.
void prune(onnx::GraphProto& g);

// Gives every value `g` defines (inputs, initializers, node outputs, in nested subgraphs too)
// a fresh name in `scope`, and every node a fresh name in `node_scope`, so `g` can become a
// subgraph of a model whose names those scopes hold. Reads of names `g` does not define
// (enclosing scopes) are unchanged.
void rename_definitions(onnx::GraphProto& g, NameScope& scope, NameScope& node_scope);

// Renames, in `node`'s subgraphs, the reads of names they do not define themselves (values of
// the enclosing graph) by `map`.
void rename_outer_reads(onnx::NodeProto& node, const std::unordered_map<std::string, std::string>& map);
// Renames the reads of `g`'s nodes (their inputs and their subgraphs' reads of `g`) by `map`:
// the value a name stood for is read under another name (an enclosing graph's, say).
void rename_reads(onnx::GraphProto& g, const std::unordered_map<std::string, std::string>& map);
// The names `g`'s nodes read: their inputs and what their subgraphs read from `g` or above.
std::unordered_set<std::string> names_read(const onnx::GraphProto& g);

// `name` as a new output of `g` with the type of `type_of`: through an Identity (its output
// named fresh in `scope`) when `name` is already an output or a graph input (a body's outputs
// must be distinct values) or is read from an enclosing scope.
void add_output(onnx::GraphProto& g, const std::string& name, const onnx::ValueInfoProto& type_of, NameScope& scope);

// A default-domain node of `type` on `inputs` with one output, for graphs built by name.
onnx::NodeProto make_node(const char* type, std::vector<std::string> inputs, const std::string& output);

// Every field of `from` but its graph (versions, opset imports, functions, metadata, producer)
// into `to`, for a model built around a new graph.
void copy_model_fields(const onnx::ModelProto& from, onnx::ModelProto& to);

// The ValueInfo of `name` among g's inputs and outputs (nullptr: none).
const onnx::ValueInfoProto* find_value_info(const onnx::GraphProto& g, const std::string& name);

}  // namespace onnax
