// Shared front half of every transform: validate the model, bring its opset into the
// supported interval, inline local functions, order the nodes and collect value facts.
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "facts/facts.h"
#include "ir/graph_edit.h"
#include "ir/names.h"
#include "ir/proto_ptr.h"

namespace onnax {

inline constexpr int64_t kMinOpset = 18;
inline constexpr int64_t kMaxOpset = 28;
inline constexpr int64_t kMinConvertibleOpset = 7;

struct Prepared {
  // The model being transformed, whose graph becomes the result's: a private copy of the
  // model's other fields (owned_model), or the caller's own model (prepare_in_place). It holds
  // a graph only when it is the caller's or prepare had to change it (sort, inline, upgrade);
  // otherwise `graph` is the caller's, read but never written, which spares copying and
  // freeing every node of large models.
  onnx::ModelProto* model = nullptr;
  std::unique_ptr<onnx::ModelProto> owned_model;
  const onnx::GraphProto* graph = nullptr;  // the graph to transform; nodes in topological order
  int64_t opset = 0;                        // default-domain opset
  int64_t source_opset = 0;                 // the model's own, before any upgrade
  NameScope value_names;                    // every value name in the model and its subgraphs; ids index `facts`
  FactTable facts;
  NodeValueIds node_ids;  // ids of each node's inputs and outputs (of `graph`)
  NameScope node_names;
  std::vector<int> nodes_with_subgraphs;  // indices in `graph` of nodes with graph attributes
  std::unordered_set<std::string> initializer_names;
  std::vector<const onnx::ValueInfoProto*> runtime_inputs;  // graph inputs without initializers
  std::unordered_set<std::string> dim_params;               // symbolic dims used by the model

  // The facts of a value by name (unknown facts when the model has no such value).
  const Facts& fact(std::string_view name) const { return facts.at(value_names.id(name)); }
};

Prepared prepare(const onnx::ModelProto& source, const std::string& mode);
// The same for a model the caller gives away: its graph becomes p's private graph without a
// copy, so transforms can move its nodes and initializers into their result.
Prepared prepare(onnx::ModelProto&& source, const std::string& mode);
// The same, transforming `model` itself (which may live on an arena): it must outlive p, and
// the transform leaves its result in it.
Prepared prepare_in_place(onnx::ModelProto& model, const std::string& mode);

// Parses `model` onto an arena, prepares it in place, runs `transform` (which leaves its result
// in *p.model) and serializes the result: the serialized entry points of every transform.
std::string transform_serialized(const std::string& model, const std::string& mode,
                                 const std::function<void(Prepared&)>& transform);

// The model's ai.onnx opset import (-1: none).
int64_t default_opset(const onnx::ModelProto& m);
// Fails (kInvalidModel) when the model imports a domain twice at different versions ("" and
// "ai.onnx" are one domain): ONNX's checker accepts it, but which entry counts is then
// ambiguous. (Read one way here and another there, [22, 2^31] made a transform lower its
// result one opset at a time from 2^31 to 22, and [13, 19] sent an upgrade down the lowering
// path of unchecked nodes.) The transforms, jacfwd/jacrev/hessian and convert_opset call it
// before they read the opset.
void check_opset_imports(const onnx::ModelProto& m, const std::string& mode);

// p.runtime_inputs from p's graph: its inputs that no initializer gives a value.
void collect_runtime_inputs(Prepared& p);

// After a transform rewrote p's (private) graph: its names, node indices and facts from scratch.
void reindex(Prepared& p);

// The graph, made private to `p` first when it is still the source's (copy on write).
// Invalidates pointers into the previous graph (runtime_inputs are recomputed).
onnx::GraphProto& mutable_graph(Prepared& p);

// The nodes of p's graph when it is private, taken out of it (in order), so a transform can hand
// nodes that pass through unchanged to its result by pointer: the same objects, never copied.
// Empty when the graph is the caller's (then nodes are read in place and copied).
std::vector<NodePtr> take_nodes(Prepared& p);

// The initializers of p's graph for the output graph: moved when private, else copied.
void take_initializers(Prepared& p, onnx::GraphProto& out);

// The model's opset imports by domain ("" for ai.onnx, at the effective opset p.opset).
std::unordered_map<std::string, int> model_opsets(const Prepared& p);

}  // namespace onnax
