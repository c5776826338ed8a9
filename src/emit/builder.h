// The builder rules emit nodes through: fresh collision-free names, constants, and the
// spelling each opset wants. Rules see values only as handles (V) with facts.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "facts/facts.h"
#include "ir/names.h"
#include "ir/proto_ptr.h"
#include "ir/small_vec.h"

namespace onnax {

// Handle of a value in the graph being built. id < 0 means "absent optional input".
struct V {
  int id = -1;
  bool valid() const { return id >= 0; }
};
// The inputs or outputs of one node (few: no heap allocation for up to 4).
using Vs = SmallVec<V, 4>;

// One attribute to set on an emitted node.
struct Attr {
  onnx::AttributeProto proto;
  static Attr i(std::string_view name, int64_t v);
  static Attr f(std::string_view name, float v);
  static Attr s(std::string_view name, std::string_view v);
  static Attr ints(std::string_view name, const std::vector<int64_t>& v);
  static Attr graph(std::string_view name, onnx::GraphProto g);  // a subgraph (Loop/Scan/If body)
};
using Attrs = std::vector<Attr>;

class Builder {
 public:
  Builder(onnx::GraphProto& out, NameScope& value_names, NameScope& node_names, int64_t opset);
  ~Builder();
  Builder(Builder&&) noexcept;

  // Autodiff support. A value is a tangent when it depends linearly on the seeds; every node
  // that reads a tangent is linear in it. With a tape set, such nodes go to the tape (to be
  // transposed for reverse mode) instead of the graph.
  struct TapeNode {
    NodePtr node;  // has no node name: it never reaches the result
    Vs inputs;
    Vs outputs;
    std::string origin;  // the naming origin when it was emitted (its source value)
  };
  // The tape's nodes live on an arena of this builder: the tape must not outlive it.
  void set_tape(std::deque<TapeNode>* tape) {
    tape_ = tape;
    if (tape) recorded_ = tape;  // (still read while transposing, with the tape unset)
  }
  // Reverse mode: nodes reading tangents go to the tape.
  bool has_tape() const { return tape_ != nullptr; }
  // The tape node a transpose rule is running for (nullptr: none); clone() of it takes its
  // outputs from the record, since the node itself names none.
  void set_transposing(const TapeNode* node) { transposing_ = node; }
  // While transposing, tangents exist only on the tape: reading one is an internal error.
  void forbid_tangent_inputs(bool forbid) { forbid_tangents_ = forbid; }
  bool tangent(V v) const { return v.valid() && tangent_[v.id]; }
  // Run-time shapes (1-D int64 values) already emitted for values, so a shape many transposes
  // ask for is computed once (rules/derivative.cc: runtime_shape).
  V known_shape(V v) const {
    auto it = shapes_.find(v.id);
    return it == shapes_.end() ? V{} : it->second;
  }
  void remember_shape(V v, V shape) { shapes_[v.id] = shape; }
  // The tape node that computed `v` (nullptr: none, or not on the tape).
  const TapeNode* tape_node_of(V v) const {
    const int32_t k = v.valid() ? values_[static_cast<size_t>(v.id)].tape_index : -1;
    return k < 0 || !recorded_ ? nullptr : &(*recorded_)[static_cast<size_t>(k)];
  }
  void mark_tangent(V v) { tangent_[v.id] = 1; }
  // A primal value with the same shape as tangent `t` (its primal twin), when known: lets
  // transposes read run-time shapes of values that exist only on the tape.
  void set_witness(V t, V primal) {
    if (static_cast<size_t>(t.id) >= witness_.size()) witness_.resize(values_.size());
    witness_[static_cast<size_t>(t.id)] = primal;
  }
  V witness(V t) const {
    return t.valid() && static_cast<size_t>(t.id) < witness_.size() ? witness_[static_cast<size_t>(t.id)] : V{};
  }
  int value_count() const { return static_cast<int>(values_.size()); }
  // Runs ONNX's per-node inference on every emitted node so emitted values have facts
  // (ranks, static and symbolic dims) — needed when transposing broadcasts.
  void enable_inference(const std::unordered_map<std::string, int>& opsets);
  // Inferred facts of emitted Loops' outputs replace their unknown dims (facts.h: LoopInference;
  // a transform that can infer bodies sets it).
  void set_loop_inference(LoopInference infer) { loop_inference_ = std::move(infer); }
  void register_data(const std::string& name, const onnx::TensorProto* tensor);

  // Arithmetic on possibly-zero values: an invalid V is a symbolic zero, so zero * y and
  // zero + y emit nothing.
  V add(V a, V b);
  V sub(V a, V b);
  V mul(V a, V b);
  V div(V a, V b);
  V neg(V a);
  // Zeros with the run-time shape of `like` (its element type unless `dtype` is given).
  V zeros_like(V like, int32_t dtype = 0);

  // Reuse of values emitted before: nodes computed again (see op()) and int64 shape arithmetic
  // on known operands folded to (shared) constants. Only for transforms that never move or drop
  // emitted nodes afterwards (autodiff; vmap relocates some), since a reused value must stay
  // where it was first computed. (Folding under vmap passes its tests but changed one node of
  // the corpus's vmaps, so it stays autodiff's.)
  void enable_reuse() { reuse_ = true; }
  int64_t opset() const { return opset_; }
  // A builder for a subgraph (e.g. a Loop body) sharing this builder's name scopes, so names
  // stay unique across the whole model.
  Builder nested(onnx::GraphProto& body) const { return Builder(body, value_names_, node_names_, opset_); }
  std::string fresh_value_name(std::string_view base) { return value_names_.fresh(base); }
  // The model's name scopes, for subgraphs built outside the builder and then emitted by it.
  NameScope& value_scope() { return value_names_; }
  NameScope& node_scope() { return node_names_; }
  // The model's opset imports by domain ("" for ai.onnx), for subgraphs made into models of
  // their own (set_opsets or enable_inference gives them).
  const std::unordered_map<std::string, int>& opsets() const { return opsets_; }
  void set_opsets(std::unordered_map<std::string, int> opsets) { opsets_ = std::move(opsets); }
  onnx::NodeProto& last_node() { return *out_.mutable_node(out_.node_size() - 1); }
  // Names generated next derive from `base` (e.g. the source value being transformed).
  void set_origin(std::string_view base) { origin_ = base; }
  void set_origin(std::string_view base, std::string_view suffix) { origin_.assign(base).append(suffix); }
  const std::string& origin() const { return origin_; }

  // Registers a value the graph has before any node runs (graph input, initializer, seed): a
  // leaf, which op() may reuse computations on.
  V existing(std::string_view name, Facts facts);
  // The same, with facts that live elsewhere for the builder's lifetime (the transform's table
  // of source facts): shared by pointer, not copied.
  V existing(std::string_view name, const Facts* shared);
  // Registers the output of a source node the transform copies (not a leaf), by its name's id
  // in the value-name scope (no lookup).
  V existing_id(int name_id, const Facts* shared);
  // A view of the value-name scope's copy: valid while the scope lives.
  std::string_view name(V v) const { return values_[v.id].name; }
  const Facts& facts(V v) const;
  void set_facts(V v, Facts f);
  // `v`'s facts gain what `known` (facts of a value of the same shape) knows more: its rank when
  // `v` has none, its static sizes and its symbols (not the builder's own, Dim::internal) where
  // `v`'s dims are unknown or only named by the builder, its element type when `v` has none.
  void learn_dims(V v, const Facts& known);
  // Facts kept elsewhere for the builder's lifetime (a transform's table of source facts),
  // read through a pointer instead of copied: `shared` itself, or with `lead` put in front
  // when `with_lead` (vmap's batch dim), built only if someone asks for them.
  void share_facts(V v, const Facts* shared, bool with_lead = false, Dim lead = Dim{});
  // Marks `v` so the transform writes its facts as value_info: for values ONNX inference
  // cannot type (e.g. Split by run-time sizes), so later transforms of the result can.
  // (Once per value: with reuse, a rule may get an already declared value back.)
  void declare(V v) {
    if (static_cast<size_t>(v.id) >= is_declared_.size()) is_declared_.resize(values_.size(), 0);
    if (is_declared_[static_cast<size_t>(v.id)]) return;
    is_declared_[static_cast<size_t>(v.id)] = 1;
    declared_.push_back(v);
  }
  const std::vector<V>& declared() const { return declared_; }
  int64_t rank(V v) const { return facts(v).rank(); }

  // Emits a node; outputs get fresh names derived from the origin and op type. With reuse on,
  // a node on leaves alone (existing values and constants, none a tangent) identical to one
  // emitted before is not emitted again: its outputs are returned.
  Vs op(std::string_view type, const Vs& inputs, const Attrs& attrs = {}, int num_outputs = 1);
  V op1(std::string_view type, const Vs& inputs, const Attrs& attrs = {}) { return op(type, inputs, attrs, 1)[0]; }
  // op1 for a node whose output facts the caller knows exactly (a shape helper computing them
  // from constant operands): no inference runs, which on the ONNX path costs microseconds.
  V op1_known(std::string_view type, const Vs& inputs, const Attrs& attrs, Facts facts);
  // Emits a node whose subgraphs read `reads` from this graph by name (If branches). They count
  // as inputs where the tape is concerned: reading a tangent sends the node to the tape, whose
  // record lists them after `inputs` (the transpose rule gets them as inputs). Never reused.
  Vs op_reading(std::string_view type, const Vs& inputs, const Vs& reads, const Attrs& attrs, int num_outputs);
  // The name a subgraph uses to read `v`: tape values are unnamed, so one gets a fresh name
  // (it never appears in the result; the transpose rule maps it to a value that does).
  std::string_view name_for_read(V v);
  // Emits a copy of `node` (type, domain, attributes) with new inputs; attributes in
  // `overrides` replace or add, names in `drop` are removed.
  // num_outputs >= 0 emits that many outputs instead of the node's own count.
  Vs clone(const onnx::NodeProto& node, const Vs& inputs, const Attrs& overrides = {},
           const std::vector<std::string>& drop = {}, int num_outputs = -1);
  // While a transform rewrites `node` (nullptr: none), the first clone of it with unchanged
  // attributes and inputs that carry the source's input names is emitted as an exact copy,
  // keeping the source's node and output names: no fresh names, and a readable result.
  // With `owner` (the unique owner of `node`), that exact copy is `node` itself: the builder
  // takes it from the owner instead of copying it. Rules may still read the node afterwards (it
  // is the same object, unchanged).
  // `output_ids` (optional) are the ids of the node's outputs in the value-name scope, so the
  // exact copy registers them without looking the names up.
  void allow_source_names(const onnx::NodeProto* node, NodePtr* owner = nullptr, const int32_t* output_ids = nullptr) {
    source_names_node_ = node;
    source_owner_ = node && !tape_ ? owner : nullptr;
    source_output_ids_ = node ? output_ids : nullptr;
  }
  // Names the optional outputs first, first + 1, ... of the node emitted or adopted last, which
  // must be the copy of `node` with those outputs absent: each named after the node's first
  // output plus its suffix, with the given facts. Lets a rule read what the node computes
  // anyway (LayerNormalization's statistics). Empty when the last node is not that node.
  Vs name_optional_outputs(const onnx::NodeProto& node, int first,
                           const std::vector<std::pair<std::string_view, Facts>>& outputs);
  // Forward mode: nodes emitted after the source node at `source_index` (one the transform
  // copied unchanged, reading `source_inputs`) compute its outputs too, as `same[i]` does
  // `source_outputs[i]`. Their nodes take over those outputs' names (and so their readers); the
  // source node gets their names for them, nothing reads it, and drop_dead_nodes removes it:
  // its work is not done twice. Returns false (and changes nothing) unless the node at
  // `source_index` defines `source_outputs` and nothing else and every `same[i]` is made by a
  // node after it.
  bool take_over_outputs(int source_index, const Vs& source_inputs, const Vs& source_outputs, const Vs& same);
  // The number of iterations `node` (a Loop reading `inputs`) runs when it is certain: a known
  // trip count, a condition input absent or a known true, and a body that passes its condition
  // along.
  Dim exact_trips(const onnx::NodeProto& node, const Vs& inputs) const;
  // The index of the node (emitted, or adopted with its outputs: adopt_node) that defines the
  // first of `values` any node defines, when it is an `op_type` node, every output it defines is
  // among `values` and every value in `reads` is defined before it; -1 otherwise. (The other
  // values are not its outputs.)
  int defining_node(const Vs& values, const Vs& reads, std::string_view op_type) const;
  // For each of `values`: whether the node at `index` makes it (false for every one when
  // index < 0).
  std::vector<char> made_by(int index, const Vs& values) const;
  // Reverse mode's twin of take_over_outputs: the node emitted last (after the readers of
  // `source_outputs`, reading what defining_node(source_outputs, its inputs) allowed) computes
  // them too, as `same[i]` does `source_outputs[i]` (those `index` defines; the first twin of
  // each). It takes their names and the position
  // `index` of the node defining them, which gets the last node's names and the last position,
  // where drop_dead_nodes removes it when nothing reads them.
  void take_place_of(int index, const Vs& source_outputs, const Vs& same);
  // Emits `node` unchanged, taking ownership of it (no copy).
  // (A node on the graph's arena is added as is; a heap node is handed to that arena.)
  void adopt_node(NodePtr node) { out_.mutable_node()->AddAllocated(node.release()); }
  // adopt_node, recording the node as the producer of `outputs` (its output values) for
  // take_place_of.
  void adopt_node(NodePtr node, const Vs& outputs);
  // Emits a one-output node whose output has exactly `output_name` (already reserved).
  V op_named(std::string_view type, const Vs& inputs, const Attrs& attrs, const std::string& output_name);

  // Renames the output `v` (produced by a node emitted at index >= first_node) to `name`.
  void rename(V v, const std::string& new_name, int first_node);
  // Renames several values in one pass over the whole graph (old name -> new name).
  void rename_all(const std::vector<std::pair<V, std::string>>& renames);
  // Removes the nodes this builder made (not the source nodes it copied) whose outputs no graph
  // node reads and `still_read` (graph outputs, names read inside subgraphs) does not name;
  // then the nodes only those read, and so on. Such nodes are what tape nodes alone read (a
  // Softmax's axis, a Shape a transpose then found constant) and the parts of a function's
  // expansion the derivative does not need; ONNX Runtime warns about each dead constant.
  // Call it last: node indices change (subgraph_nodes() follows).
  void drop_dead_nodes(const std::function<bool(std::string_view)>& still_read);
  // Graph-node reads of `v` so far (those of nodes this builder emitted or was told of).
  uint32_t reads(V v) const {
    return v.valid() && static_cast<size_t>(v.id) < uses_.size() ? uses_[static_cast<size_t>(v.id)] : 0;
  }
  // The values of the Constant nodes tensor_const made, in order.
  const std::vector<V>& constants() const { return constants_; }
  // Counts a read of `v` by a node that did not go through the builder (an adopted one).
  void count_read(V v) {
    if (!v.valid()) return;
    if (static_cast<size_t>(v.id) >= uses_.size()) uses_.resize(values_.size(), 0);
    ++uses_[static_cast<size_t>(v.id)];
  }
  // Whether drop_dead_nodes removed the node that made `v`.
  bool dropped(V v) const { return v.valid() && values_[static_cast<size_t>(v.id)].producer == kDropped; }
  // Indices of emitted graph nodes that carry subgraphs (If/Loop/Scan bodies), whose nodes may
  // read this graph's values by name.
  const std::vector<int>& subgraph_nodes() const { return subgraph_nodes_; }
  int node_count() const { return out_.node_size(); }

  // Constants (deduplicated per builder).
  V i64s(const std::vector<int64_t>& values);  // 1-D int64
  V i64(int64_t value);                        // int64 scalar
  V scalar(double value, int32_t dtype);       // scalar of any numeric dtype
  V tensor_const(const onnx::TensorProto& t);

  // Shape helpers that keep facts up to date. unsqueeze, squeeze, transpose, reshape and
  // expand of a symbolic zero (an invalid V) are the symbolic zero: they are linear.
  V unsqueeze(V x, const std::vector<int64_t>& axes);
  V squeeze(V x, const std::vector<int64_t>& axes);
  V transpose(V x, const std::vector<int64_t>& perm);
  V shape_of(V x, int64_t start = 0, std::optional<int64_t> end = std::nullopt);
  V concat(const std::vector<V>& parts, int64_t axis);
  // With allowzero, a 0 in `shape` means an empty dim, not "copy the input's".
  V reshape(V x, V shape, bool allowzero = false);
  V expand(V x, V shape);
  // The shape of `x` as a 1-D int64 value: a constant when its facts know every dim (the shape
  // then needs no node, and the helpers above know their outputs' dims), else a Shape node.
  V shape_value(V x);
  // The value whose whole shape `shape` is (made by shape_of(x) or shape_value(x)), if any: what
  // reshape and expand to it give has that value's dims, symbolic ones included, which ONNX's
  // inference (without the shape's data) cannot tell.
  V shape_source(V shape) const {
    const size_t i = shape.valid() ? static_cast<size_t>(shape.id) : shape_sources_.size();
    return i < shape_sources_.size() ? shape_sources_[i] : V{};
  }
  // `x` with its axis 0 in reverse order (a Slice with step -1); keeps x's facts.
  V reverse_first_axis(V x);

  // If `v` is a Constant/initializer this builder knows, its int64 values.
  const std::vector<int64_t>* known_i64(V v) const;
  void remember_i64(const std::string& name, std::vector<int64_t> values);
  // Remembers a small integer/bool tensor's values (axes, shapes, flags) under its name.
  void remember_tensor(const std::string& name, const onnx::TensorProto& t);

 private:
  static constexpr int32_t kDropped = -2;
  // A value's facts are its own (an index into facts_), shared (a pointer, possibly with a
  // leading dim to add), or unknown. Most values of a large vmap are shared, so the builder
  // neither copies nor stores their facts.
  struct Value {
    std::string_view name;  // into value_names_ (every value's name is in the scope)
    const Facts* shared = nullptr;
    Dim lead;
    mutable int32_t own = -1;  // set on first read of a shared value with a lead
    int32_t producer = -1;     // index in the graph of the node that made it (-1: existing, or on the tape; kDropped)
    int32_t tape_index = -1;   // index in the tape of the node that made it (-1: none)
    bool with_lead = false;
    bool leaf = false;  // not computed by this builder: existing() or a constant
  };
  // (`recorded`: see finish.)
  Vs emit(std::string_view type, const Vs& inputs, const Attrs& attrs, int num_outputs, const Vs* recorded = nullptr);
  // `name` must be a view of value_names_'s own copy (from fresh_view or interned()).
  V add_value(std::string_view name, Facts facts);
  // The value `x` regroups: through the Reshape/Squeeze/Unsqueeze/Flatten nodes this builder
  // put in the graph, back to the first value no such node made.
  V reshape_origin(V x) const;
  // The constant an int64 shape computation on known operands gives (see emit/int64_fold.h);
  // invalid when it does not fold. (With reuse on.)
  V folded_int64(std::string_view type, const Vs& inputs, const Attrs& attrs);
  // The value a Transpose (`attrs`) of `inputs[0]` gives when that is the output of a Transpose
  // this builder emitted: the first one's input, or one Transpose of it; invalid otherwise.
  V transposed_transpose(const Vs& inputs, const Attrs& attrs);
  // folded_int64, or the constant shape of a value whose dims in range are static (a Shape).
  V folded(std::string_view type, const Vs& inputs, const Attrs& attrs);
  std::string_view interned(std::string_view name) { return value_names_.name(value_names_.intern(name)); }
  // A node appended to the graph. A node bound for the tape (it reads a tangent while a tape
  // is set) is bare: op type, domain and attributes only. It never reaches the result, so it
  // gets no node name, no input names and unnamed outputs; its record on the tape holds the
  // values, and only ONNX's inference (on a copy) needs names.
  onnx::NodeProto* new_node(std::string_view type, bool for_tape);
  // Names a graph node once its outputs are named.
  // (`first_output`: its first output's name, hashed, when the caller has it.)
  void name_node(onnx::NodeProto* n, const HashedName* first_output = nullptr);
  bool reads_tangent(const Vs& inputs) const;
  bool bound_for_tape(const Vs& inputs) const;
  std::string_view name_base(char separator, std::string_view type, bool lowercase);
  bool same_input_names(const onnx::NodeProto& node, const Vs& inputs) const;
  void add_inputs(onnx::NodeProto* node, const Vs& inputs) const;
  // Bookkeeping after a node is complete: tangent flags, inferred facts, tape routing.
  // `recorded` (default: `inputs`) is what the node reads, subgraph reads included: whether it
  // is linear (bound for the tape) and what its tape record lists as inputs.
  void finish(onnx::NodeProto& node, const Vs& inputs, const Vs& outputs, const Vs* recorded = nullptr);
  void infer(onnx::NodeProto& node, const Vs& inputs, const Vs& outputs);
  void propagate_witness(const onnx::NodeProto& node, const Vs& inputs, const Vs& outputs);
  void refine_loop_outputs(const onnx::NodeProto& node, const Vs& inputs, const Vs& outputs);
  // The names of `s` (an output of the node at `source_node`) and `t` (of the node making it)
  // trade places in those nodes: each value keeps its name, now made by the other node.
  void trade_names(int source_node, V s, V t);
  LoopInference loop_inference_;
  std::unordered_map<std::string_view, V> by_name_;  // values by name, the first named_upto_ of them
  size_t named_upto_ = 0;

  onnx::GraphProto& out_;
  NameScope& value_names_;
  NameScope& node_names_;
  int64_t opset_;
  std::string origin_;
  std::string name_base_;  // reused buffer for generated names
  // Elements in fixed chunks: references stay valid while more are added (as with a deque),
  // but with one allocation per 256 elements where a deque of builder values makes one per 3.
  template <typename T>
  class ChunkedStore {
   public:
    T& operator[](size_t i) { return chunks_[i / kChunk][i % kChunk]; }
    const T& operator[](size_t i) const { return chunks_[i / kChunk][i % kChunk]; }
    size_t size() const { return size_; }
    // A new element, filled in place by the caller.
    T& add() {
      if (size_ % kChunk == 0) chunks_.push_back(std::make_unique<T[]>(kChunk));
      return (*this)[size_++];
    }

   private:
    static constexpr size_t kChunk = 256;
    std::vector<std::unique_ptr<T[]>> chunks_;
    size_t size_ = 0;
  };
  ChunkedStore<Value> values_;
  // Own facts of values (Value::own indexes it); mutable because reading a shared value with
  // a lead builds its facts here.
  mutable ChunkedStore<Facts> facts_;
  int32_t own_facts(Facts f) const {
    facts_.add() = std::move(f);
    return static_cast<int32_t>(facts_.size() - 1);
  }
  // Nodes on leaves emitted by op(), by type, output count, input ids and attributes.
  std::unordered_map<std::string, Vs> op_cache_;
  std::string op_key_;  // reused buffer for op_cache_ keys
  // Other one-output nodes op() emitted recently, by a hash of type, inputs and attributes: a
  // direct-mapped table of fixed size (a cache; a colliding node replaces the older one).
  // Repeats come from nearby rules, and a table that never grows costs no allocation or page
  // fault per node, which on large graphs cost more than the lookups.
  struct Recent {
    int32_t node = -1;  // index in the graph (-1: empty)
    int32_t output = -1;
    uint32_t tag = 0;  // the hash's high bits: most mismatches are seen without reading the node
  };
  static constexpr size_t kRecentSlots = size_t{1} << 13;
  std::vector<Recent> recent_;
  // A hash of a node's type, inputs and attributes (the slot is its low bits).
  static uint64_t recent_hash(std::string_view type, const Vs& inputs, const Attrs& attrs);
  // The output of the node recorded under `hash` when it has this type, inputs and attributes
  // (invalid: none).
  V same_node(uint64_t hash, std::string_view type, const Vs& inputs, const Attrs& attrs) const;
  bool reuse_ = false;
  // Constants already emitted, by value (scalars by dtype and the double's exact bits).
  std::map<std::vector<int64_t>, V> i64s_cache_;
  std::map<int64_t, V> i64_cache_;
  std::map<std::pair<int32_t, uint64_t>, V> scalar_cache_;
  // (Hashed: looked up for every int64 operand of a foldable op, by names often 30-80 long.)
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::vector<int64_t>, NameHash, std::equal_to<>> known_i64_;
  std::vector<char> tangent_;
  std::deque<TapeNode>* tape_ = nullptr;                 // a deque: growing it never moves the nodes
  std::deque<TapeNode>* recorded_ = nullptr;             // the last tape set
  std::unordered_map<int, V> shapes_;                    // see known_shape
  std::unique_ptr<google::protobuf::Arena> tape_arena_;  // holds the tape's nodes (made on first use)
  const TapeNode* transposing_ = nullptr;
  bool forbid_tangents_ = false;
  std::vector<V> declared_;
  std::vector<char> is_declared_;  // by value id
  std::vector<V> witness_;         // by value id (invalid: none)
  std::vector<V> shape_sources_;   // by value id (invalid: none); see shape_source
  std::vector<uint32_t> uses_;     // by value id: how many graph nodes read it (not tape nodes)
  // The graph nodes this builder made, by node index: where their inputs' ids start in
  // emitted_inputs_ (source nodes it copied have no entry), for drop_dead_nodes.
  struct EmittedInputs {
    static constexpr uint32_t kNone = UINT32_MAX;
    uint32_t begin = kNone;
    uint32_t count = 0;
  };
  std::vector<EmittedInputs> emitted_;
  std::vector<V> constants_;  // see constants()
  std::vector<int32_t> emitted_inputs_;
  // Records the node just appended to the graph, `n`, as made by this builder (a no-op if it
  // went to the tape).
  void record_emitted(const onnx::NodeProto* n, const Vs& inputs);
  std::vector<int> subgraph_nodes_;
  const onnx::NodeProto* source_names_node_ = nullptr;
  NodePtr* source_owner_ = nullptr;
  const int32_t* source_output_ids_ = nullptr;
  struct Inference;
  std::unique_ptr<Inference> inference_;
  const Facts* given_facts_ = nullptr;  // set by op1_known while its node is emitted
  std::unordered_map<std::string, int> opsets_;
};

}  // namespace onnax
