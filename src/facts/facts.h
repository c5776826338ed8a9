// Per-value facts the rules need: element type and (possibly symbolic) shape.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "facts/dims.h"
#include "ir/names.h"

namespace onnax {

struct Facts {
  int32_t dtype = 0;  // onnx::TensorProto::DataType, 0 when unknown
  bool has_shape = false;
  Dims dims;

  int64_t rank() const { return has_shape ? static_cast<int64_t>(dims.size()) : -1; }
  // "[batch, 3, N]" or "unknown shape"; for diagnostics.
  std::string shape_string() const;
  // The same facts with a dimension inserted at `axis` (0 <= axis <= rank).
  Facts with_dim(int64_t axis, Dim dim) const;
  static Facts of(int32_t dtype, Dims dims) { return Facts{dtype, true, std::move(dims)}; }
};

// Every dim's size, when the shape is known and no dim is symbolic or unknown.
std::optional<std::vector<int64_t>> static_dims(const Facts& f);

// True when both shapes are known and provably equal (equal sizes, or the same symbolic name).
bool same_static_shape(const Facts& a, const Facts& b);

Facts facts_from_type(const onnx::TypeProto& type);
// Gives every unknown dim of `facts` a symbol of its own (Dim::internal), so that ONNX's
// inference, which carries a symbol from input to output (a broadcast of x with itself, the rows
// of a Gemm), lets the rules see that two shapes are the same where neither size is known: a
// Reshape to [-1, features] before every Dense layer would otherwise make each broadcast in its
// gradient a run-time decision. An unknown dim claims nothing; nor does a fresh symbol.
void name_unknown_dims(Facts& facts, NameScope& scope);
// (Inline: called for every fact a builder records, most of which have no unknown dim.)
inline void name_unknown_dims_if_any(Facts& facts, NameScope& scope) {
  for (const Dim& d : facts.dims)
    if (d == Dim{}) return name_unknown_dims(facts, scope);
}
// What ONNX's per-node inference leaves out, added to its result `inferred` (one entry per
// output): a Loop's or Scan's outputs from its body's declarations (state keeps its rank; a
// Loop's scan outputs are the body's type with a leading dim), and the rank of input 0 (`in0`,
// nullptr: unknown) for ops that keep it though their sizes are run-time values (Split by
// computed lengths, reductions over run-time axes with keepdims, Slice, Concat, Pad, Tile,
// Transpose, Identity). vmap and reverse mode need those ranks. Used for the source graph and
// for every node a builder emits.
void refine_inferred(const onnx::NodeProto& node, const Facts* in0, std::vector<Facts>& inferred);
// Internal symbols (name_unknown_dims) are written as unknown dims, unless `keep_internal` (the
// types handed to ONNX's inference inside a transform).
void write_type(const Facts& facts, onnx::TypeProto* type, bool keep_internal = false);
// A source value_info entry as a transform's result should carry it: unchanged, unless its
// tensor shape claims what `facts` do not confirm (another rank, or a size the facts do not
// know or know to differ), as exporters sometimes write (jax2onnx 0.17.1 declares NHWC shapes
// for NCHW values). ONNX Runtime tolerates that on the source, but infers the result's new
// nodes from it (refusing them, or folding their Shape nodes to wrong constants); the facts,
// which take sizes only from inference, are written instead.
onnx::ValueInfoProto consistent_value_info(const onnx::ValueInfoProto& declared, const Facts& facts);

// The facts of every value of a graph, as ONNX's per-operator inference (with data
// propagation) and the model's own annotations tell them, indexed by the value's id in the
// model's NameScope. Built in one topological pass (facts/infer.cc).
class FactTable {
 public:
  // Empty facts (unknown dtype and shape) for ids the table has nothing for (or -1).
  const Facts& at(int id) const {
    static const Facts kUnknown;
    return id < 0 || static_cast<size_t>(id) >= facts_.size() ? kUnknown : facts_[static_cast<size_t>(id)];
  }
  int size() const { return static_cast<int>(facts_.size()); }
  // Makes room for ids below `values` at once (ids are dense), instead of growing per value.
  void cover(int values) {
    if (static_cast<size_t>(values) > facts_.size()) facts_.resize(static_cast<size_t>(values));
  }
  // The full type of a value whose type is not a tensor (sequence, optional, map), or nullptr;
  // kept so ONNX's inference can type the ops that read it.
  const onnx::TypeProto* non_tensor_type(int id) const;

  // Records (or replaces) the facts of value `id`.
  void set(int id, Facts facts);
  void set_type(int id, const onnx::TypeProto& type);
  // Value `id` gets the facts (and type) of value `existing`.
  void alias(int id, int existing);

 private:
  std::vector<Facts> facts_;
  std::unordered_map<int, onnx::TypeProto> non_tensor_;
};

// The tensor a Constant node produces (from value, value_int(s) or value_float(s)), if any.
std::optional<onnx::TensorProto> constant_tensor(const onnx::NodeProto& node);

// The ids (in a NameScope) of every node's inputs and outputs, computed in one pass so later
// passes never hash a name again. -1 stands for an empty (absent optional) name.
struct NodeValueIds {
  std::vector<int32_t> ids;            // node i: its inputs, then its outputs
  std::vector<uint32_t> offsets;       // node i's first entry in `ids`
  std::vector<uint32_t> input_counts;  // node i's number of inputs
  const int32_t* inputs(int node) const { return ids.data() + offsets[static_cast<size_t>(node)]; }
  const int32_t* outputs(int node, int input_count) const { return inputs(node) + input_count; }
  const int32_t* outputs(int node) const { return inputs(node) + inputs_of(node); }
  // Counts without reading the node itself (a miss to memory per node on large graphs).
  int inputs_of(int node) const { return static_cast<int>(input_counts[static_cast<size_t>(node)]); }
  int outputs_of(int node) const {
    const size_t i = static_cast<size_t>(node);
    const size_t end = i + 1 < offsets.size() ? offsets[i + 1] : ids.size();
    return static_cast<int>(end - offsets[i] - input_counts[i]);
  }
};

// The facts of a Loop's outputs from its inputs' facts and its exact number of iterations
// (Dim{}: not known), for what ONNX's Loop inference leaves out: the dims a state keeps (ONNX
// types a state only by its element type, as it may change shape between iterations), and a
// scan output's length. The transforms layer provides it (transforms/subgraph.h:
// loop_output_facts). The last argument gives the facts of the enclosing graph's values by
// name, for what the body reads.
using LoopInference = std::function<std::vector<Facts>(const onnx::NodeProto&, const std::vector<const Facts*>&, Dim,
                                                       const std::function<const Facts*(std::string_view)>&)>;

// Whether ONNX's data propagation may run on a node with these input facts: it materializes
// 1-D values element by element (one dim per element), so an input declared [2^40] would
// allocate without bound; shape values are short. False when an input is 1-D with more than
// kMaxPropagatedElements static elements (nullptr entries are unknown inputs).
inline constexpr int64_t kMaxPropagatedElements = 4096;
bool data_propagation_is_bounded(const Facts* const* inputs, size_t count);

// Refines `have` with what `known` says of the same value: the whole shape when `have` has none,
// else each dim `known` knows (or names) where `have` does not. False when nothing was gained
// (or the ranks disagree).
bool refine_with(Facts& have, const Facts& known);

// Runs ONNX's per-node type and shape inference (and partial data propagation, so shapes
// computed with Shape/Gather/Concat stay known) over `graph`, whose nodes must be in
// topological order and indexed in `node_ids` by `names`. Declared value_info fills in what
// inference cannot tell.
// `loops` (when given) refines the facts of Loops' outputs.
void infer_facts(const onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets, NameScope& names,
                 const NodeValueIds& node_ids, FactTable& table, const LoopInference& loops = nullptr);

}  // namespace onnax
