// Subgraphs (Loop, Scan and If bodies) handled as models of their own, so the graph-level
// transforms (jvp, vjp) differentiate a body exactly as they differentiate a model, and the
// result is put back into a node of the enclosing graph under collision-free names.
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "facts/facts.h"
#include "ir/names.h"

namespace onnax {

// The graph attribute `name` of `node` (nullptr: none).
const onnx::GraphProto* graph_attribute(const onnx::NodeProto& node, const char* name);

// Names `g` reads from enclosing scopes (each once, in order of first use, nested subgraphs
// included).
std::vector<std::string> graph_outer_reads(const onnx::GraphProto& g);

// A model whose graph is `body` with every input typed: an input the body leaves untyped gets
// `input_facts[i]` (element type and rank; its dims unknown, since a loop-carried value may
// change shape from one iteration to the next). With `keep_dims`, the input gets the dims of
// `input_facts[i]` too (where the body's declaration has a dim unknown or no shape): for facts
// that hold in every iteration (loop_carried_facts). `extra_inputs` become graph inputs after
// the body's own (values the body reads from enclosing scopes, by the same names).
// `known_values` are inputs whose value is the same in every run of the body (constants it reads
// from outside, state a loop passes through unchanged): they also become initializers of the
// same names, so inference inside the body sees them (an Unsqueeze by outer-scope axes keeps
// its rank). Strip them from the derived graph with strip_known_values.
onnx::ModelProto standalone_model(const onnx::GraphProto& body, const std::vector<const Facts*>& input_facts,
                                  const std::vector<std::pair<std::string, Facts>>& extra_inputs,
                                  const std::unordered_map<std::string, int>& opsets,
                                  const std::vector<onnx::TensorProto>& known_values = {}, bool keep_dims = false);

// The facts of a Loop body's inputs that hold in every iteration. `input_facts` are those of
// the values entering the body (iteration number, condition, then `states` loop-carried values,
// then any other inputs). A carried value keeps a dim only when the body gives it back as it got
// it (the same size or symbol), checked by inferring the body until nothing changes (a fixed
// point: dims only become unknown), so a recurrent state or a weight the loop passes along has
// static dims inside the body, while one that grows keeps only its rank. Other inputs keep their
// facts. Any failure to infer leaves every carried value with its rank only. `grows` (when
// given) gets, per carried value, the shape the body provably gives back instead of the one it
// got (a known dim of another size, or another rank), empty when none is known.
// `body_outputs` (when given) gets the facts of the body's outputs inferred from the result
// (empty when no fixed point was reached).
std::vector<Facts> loop_carried_facts(const onnx::GraphProto& body, int states,
                                      const std::vector<const Facts*>& input_facts,
                                      const std::vector<std::pair<std::string, Facts>>& extra_inputs,
                                      const std::unordered_map<std::string, int>& opsets,
                                      const std::vector<onnx::TensorProto>& known_values = {},
                                      std::vector<std::string>* grows = nullptr,
                                      std::vector<Facts>* body_outputs = nullptr);

// The facts of a Loop's outputs from those of its inputs (`input_facts`, one per input of
// `loop`): each final state with the dims it keeps (loop_carried_facts), each scan output the
// body's per-iteration facts stacked over `trips` iterations (Dim{} when not known). Values the
// body reads from the enclosing graph have the facts `outer` gives by name (nullptr: unknown);
// without `outer`, such a body gives nothing. Empty when the body cannot be inferred.
std::vector<Facts> loop_output_facts(const onnx::NodeProto& loop, const std::vector<const Facts*>& input_facts,
                                     Dim trips, const std::unordered_map<std::string, int>& opsets,
                                     const std::function<const Facts*(std::string_view)>& outer = nullptr);

// Removes the initializers that shadow graph inputs of the same name (the known values
// standalone_model added): the enclosing node feeds those inputs.
void strip_known_values(onnx::GraphProto& g);

// For each output of `g`: whether it depends on any value named in `active` (graph inputs or
// values read from enclosing scopes), through its nodes and their subgraphs.
std::vector<char> outputs_depending_on(const onnx::GraphProto& g, const std::unordered_set<std::string>& active);
// The names of `active` and of every value of `g` that depends on one of them (nodes in
// topological order; a node's subgraph reads count as its inputs).
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

// The ValueInfo of `name` among g's inputs and outputs (nullptr: none).
const onnx::ValueInfoProto* find_value_info(const onnx::GraphProto& g, const std::string& name);

// A ValueInfo named `name` with `facts`' element type and shape (rank only when `rank_only`).
onnx::ValueInfoProto typed_value_info(const std::string& name, const Facts& facts, bool rank_only = false);

}  // namespace onnax
