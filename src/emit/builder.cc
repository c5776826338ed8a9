#include "emit/builder.h"

#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <limits>
#include <new>
#include <stdexcept>

#include "diagnostics/error.h"
#include "emit/graph_writer.h"
#include "emit/int64_fold.h"
#include "facts/fast_shapes.h"
#include "facts/schemas.h"
#include "ir/control_flow_outputs.h"
#include "ir/graph_edit.h"

namespace onnax {

Attr Attr::i(std::string_view name, int64_t v) {
  return Attr{attr_i(name, v)};
}
Attr Attr::f(std::string_view name, float v) {
  return Attr{attr_f(name, v)};
}
Attr Attr::s(std::string_view name, std::string_view v) {
  Attr a;
  a.proto.set_name(std::string(name));
  a.proto.set_type(onnx::AttributeProto::STRING);
  a.proto.set_s(std::string(v));
  return a;
}
Attr Attr::ints(std::string_view name, const std::vector<int64_t>& v) {
  return Attr{attr_ints(name, v)};
}

Attr Attr::graph(std::string_view name, onnx::GraphProto g) {
  Attr a;
  a.proto.set_name(std::string(name));
  a.proto.set_type(onnx::AttributeProto::GRAPH);
  *a.proto.mutable_g() = std::move(g);
  return a;
}

struct Builder::Inference {
  int default_opset = 0;
  // ONNX's inference functions read input types from a name-keyed map of TypeProtos; it is
  // filled per node from the builder's facts, only for the nodes the fast shape functions
  // do not cover.
  std::unordered_map<std::string, onnx::TypeProto*> types;
  std::deque<onnx::TypeProto> type_storage;
  std::unordered_map<std::string, const onnx::TensorProto*> data;
  std::unordered_map<std::string, const onnx::SparseTensorProto*> sparse;
  onnx::shape_inference::DataValueMap generated;
  SchemaCache schemas;
  std::vector<const Facts*> in_facts;
};

Builder::Builder(onnx::GraphProto& out, NameScope& value_names, NameScope& node_names, int64_t opset)
    : out_(out), value_names_(value_names), node_names_(node_names), opset_(opset) {}
Builder::~Builder() = default;
Builder::Builder(Builder&&) noexcept = default;

V Builder::add_value(std::string_view name, Facts facts) {
  Value& value = values_.add();
  value.name = name;
  if (facts.dtype != 0 || facts.has_shape) value.own = own_facts(std::move(facts));
  tangent_.push_back(0);
  const int id = static_cast<int>(values_.size() - 1);
  return V{id};
}

void Builder::enable_inference(const std::unordered_map<std::string, int>& opsets) {
  inference_ = std::make_unique<Inference>();
  opsets_ = opsets;
  auto def = opsets.find("");
  inference_->default_opset = def == opsets.end() ? 0 : def->second;
}

const Facts& Builder::facts(V v) const {
  static const Facts kUnknown;
  const Value& value = values_[static_cast<size_t>(v.id)];
  if (value.own >= 0) return facts_[static_cast<size_t>(value.own)];
  if (!value.shared) return kUnknown;
  if (!value.with_lead) return *value.shared;
  Facts f = *value.shared;
  if (f.has_shape) f.dims.insert(f.dims.begin(), value.lead);
  value.own = own_facts(std::move(f));
  return facts_[static_cast<size_t>(value.own)];
}

void Builder::set_facts(V v, Facts f) {
  name_unknown_dims_if_any(f, value_names_);
  Value& value = values_[static_cast<size_t>(v.id)];
  value.shared = nullptr;
  if (value.own >= 0)
    facts_[static_cast<size_t>(value.own)] = std::move(f);
  else
    value.own = own_facts(std::move(f));
}

void Builder::learn_dims(V v, const Facts& known) {
  Facts merged = facts(v);
  if (refine_with(merged, known)) set_facts(v, std::move(merged));
}

void Builder::share_facts(V v, const Facts* shared, bool with_lead, Dim lead) {
  Value& value = values_[static_cast<size_t>(v.id)];
  value.own = -1;  // (a stale own entry stays in the store, unused)
  value.shared = shared;
  value.with_lead = with_lead;
  value.lead = lead;
}

void Builder::register_data(const std::string& n, const onnx::TensorProto* tensor) {
  if (inference_) inference_->data[n] = tensor;
}

void Builder::infer(onnx::NodeProto& node, const Vs& inputs, const Vs& outputs) {
  auto& inf = *inference_;
  // `inputs` are the node's inputs in order.
  inf.in_facts.assign(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].valid() && facts(inputs[i]).dtype) inf.in_facts[i] = &facts(inputs[i]);
  if (outputs.size() == 1 && outputs[0].valid()) {
    // Axes and target shapes: the constants this builder knows.
    struct Known final : ConstantInputs {
      const Builder& b;
      const Vs& in;
      Known(const Builder& builder, const Vs& values) : b(builder), in(values) {}
      const std::vector<int64_t>* values(int i) const override {
        return static_cast<size_t>(i) < in.size() && in[static_cast<size_t>(i)].valid()
                   ? b.known_i64(in[static_cast<size_t>(i)])
                   : nullptr;
      }
    } known(*this, inputs);
    Facts f;
    if (fast_infer(node, static_cast<int>(inputs.size()), 1, inf.default_opset, inf.in_facts.data(), f, &known)) {
      set_facts(outputs[0], std::move(f));
      return;
    }
  }
  const std::string domain = node.domain() == "ai.onnx" ? "" : node.domain();
  auto op = opsets_.find(domain);
  const onnx::OpSchema* schema = op == opsets_.end() ? nullptr : inf.schemas.find(node.op_type(), domain, op->second);
  if (!schema || !schema->has_type_and_shape_inference_function()) return;
  // ONNX's inference reads inputs by name: a tape node has none (and its tangent values have
  // none), so it is inferred on a copy with stand-in names.
  std::optional<onnx::NodeProto> named;
  auto input_name = [&](size_t i) {
    const std::string_view n = name(inputs[i]);
    return n.empty() ? "\x01onnax_tape_input_" + std::to_string(i) : std::string(n);
  };
  if (node.input_size() != static_cast<int>(inputs.size()) || node.output_size() != static_cast<int>(outputs.size())) {
    named.emplace(node);
    named->clear_input();
    named->clear_output();
    for (size_t i = 0; i < inputs.size(); ++i) named->add_input(inputs[i].valid() ? input_name(i) : std::string());
    for (size_t i = 0; i < outputs.size(); ++i)
      named->add_output(outputs[i].valid() ? "\x01onnax_tape_output_" + std::to_string(i) : std::string());
  }
  onnx::NodeProto& target = named ? *named : node;
  inf.types.clear();
  inf.type_storage.clear();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inf.in_facts[i]) continue;
    write_type(*inf.in_facts[i], &inf.type_storage.emplace_back(), /*keep_internal=*/true);
    inf.types[input_name(i)] = &inf.type_storage.back();
  }
  try {
    const onnx::ShapeInferenceOptions options(false, 0, true);
    onnx::shape_inference::InferenceContextImpl ctx(target, inf.types, inf.data, inf.sparse, options, &inf.generated);
    schema->GetTypeAndShapeInferenceFunction()(ctx);
    if (schema->has_data_propagation_function() &&
        data_propagation_is_bounded(inf.in_facts.data(), inf.in_facts.size())) {
      // (Data propagation covers 1-D shapes only: its failure, on an Add of 2-D int64 constants
      // say, must not discard the types just inferred.)
      try {
        onnx::shape_inference::DataPropagationContextImpl dctx(target, inf.types, inf.data, inf.generated);
        schema->GetDataPropagationFunction()(dctx);
      } catch (const std::bad_alloc&) {
        throw;
      } catch (const std::exception&) {
      }
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i].valid()) continue;
      const auto* t = ctx.getOutputType(i);
      if (!t || t->value_case() == onnx::TypeProto::VALUE_NOT_SET) continue;
      set_facts(outputs[i], facts_from_type(*t));
    }
  } catch (const std::bad_alloc&) {
    throw;  // (out of memory is an error, not an unknown type)
  } catch (const std::exception&) {
    // Facts stay unknown; rules that need them report it.
  }
  {
    // What ONNX's inference leaves out (it has no subgraph support here).
    std::vector<Facts> inferred;
    for (V o : outputs) inferred.push_back(o.valid() ? facts(o) : Facts{});
    refine_inferred(node, inf.in_facts.empty() ? nullptr : inf.in_facts[0], inferred);
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].valid() && inferred[i].has_shape && !facts(outputs[i]).has_shape)
        set_facts(outputs[i], std::move(inferred[i]));
  }
  // Data propagation records what it learns by output name: a stand-in's entry would make the
  // next tape node's inference fail ("data for input already exists") and mean nothing after.
  if (named)
    for (const auto& o : named->output())
      if (!o.empty()) inf.generated.erase(o);
  if (loop_inference_ && node.op_type() == "Loop" && (node.domain().empty() || node.domain() == "ai.onnx"))
    refine_loop_outputs(node, inputs, outputs);
}

Dim Builder::exact_trips(const onnx::NodeProto& node, const Vs& inputs) const {
  const std::vector<int64_t>* trips = inputs.size() > 0 && inputs[0].valid() ? known_i64(inputs[0]) : nullptr;
  if (!trips || trips->size() != 1) return Dim{};
  // The body's condition must be the one it got, passed along: a computed one stops the loop
  // early even when the node has no condition input (as ONNX Runtime runs it).
  if (inputs.size() > 1 && inputs[1].valid()) {
    const std::vector<int64_t>* cond = known_i64(inputs[1]);
    if (!cond || cond->size() != 1 || (*cond)[0] == 0) return Dim{};
  }
  const onnx::GraphProto* body = graph_attribute(node, "body");
  return body && passes_condition_along(*body) ? Dim::of(std::max<int64_t>((*trips)[0], 0)) : Dim{};
}

void Builder::refine_loop_outputs(const onnx::NodeProto& node, const Vs& inputs, const Vs& outputs) {
  static const Facts kUnknown;
  std::vector<const Facts*> in;
  for (V v : inputs) in.push_back(v.valid() ? &facts(v) : &kUnknown);
  // Values the body reads from this graph, by name: the map grows with the values made since it
  // was last asked (only bodies that read the enclosing graph ask).
  auto outer = [&](std::string_view n) -> const Facts* {
    for (; named_upto_ < values_.size(); ++named_upto_)
      if (!values_[named_upto_].name.empty())
        by_name_.emplace(values_[named_upto_].name, V{static_cast<int32_t>(named_upto_)});
    const auto it = by_name_.find(n);
    return it == by_name_.end() ? nullptr : &facts(it->second);
  };
  const std::vector<Facts> inferred = loop_inference_(node, in, exact_trips(node, inputs), outer);
  for (size_t i = 0; i < outputs.size() && i < inferred.size(); ++i)
    if (outputs[i].valid()) learn_dims(outputs[i], inferred[i]);
}

void Builder::finish(onnx::NodeProto& node, const Vs& inputs, const Vs& outputs, const Vs* recorded) {
  const Vs& reads = recorded ? *recorded : inputs;
  const bool linear = reads_tangent(reads);
  if (linear && forbid_tangents_)
    throw std::logic_error("onnax internal error: a transpose rule read a tangent value while emitting " +
                           node.op_type());
  const bool to_tape = linear && tape_;
  for (V v : outputs)
    if (v.valid()) {
      tangent_[v.id] = linear ? 1 : 0;
      if (!to_tape) values_[static_cast<size_t>(v.id)].producer = out_.node_size() - 1;
    }
  if (!to_tape) {
    for (V v : inputs) {
      if (!v.valid()) continue;
      if (static_cast<size_t>(v.id) >= uses_.size()) uses_.resize(values_.size(), 0);
      ++uses_[static_cast<size_t>(v.id)];
    }
    for (const auto& a : node.attribute())
      if (a.has_g() || a.graphs_size() > 0) {
        subgraph_nodes_.push_back(out_.node_size() - 1);
        break;
      }
  }
  if (node.op_type() == "Constant" && node.output_size() == 1) {
    for (const auto& a : node.attribute()) {
      if (a.name() == "value" && a.has_t()) {
        if (inference_) inference_->data[node.output(0)] = &a.t();
        remember_tensor(node.output(0), a.t());  // (known_i64: e.g. axes a subgraph reads)
      } else if (a.name() == "value_ints") {
        remember_i64(node.output(0), {a.ints().begin(), a.ints().end()});
      } else if (a.name() == "value_int") {
        remember_i64(node.output(0), {a.i()});
      }
    }
  }
  if (given_facts_ && outputs.size() == 1 && outputs[0].valid())
    set_facts(outputs[0], *given_facts_);
  else if (inference_)
    infer(node, inputs, outputs);
  if (linear) propagate_witness(node, inputs, outputs);
  // (new_node made a tape-bound node on the tape's arena, outside the graph)
  if (to_tape) {
    for (V v : outputs)
      if (v.valid()) values_[static_cast<size_t>(v.id)].tape_index = static_cast<int32_t>(tape_->size());
    tape_->push_back(TapeNode{NodePtr(&node), reads, outputs, origin_});
  }
}

void Builder::propagate_witness(const onnx::NodeProto& node, const Vs& inputs, const Vs& outputs) {
  // Shape-preserving and elementwise linear ops: the output has the shape of an input (or of
  // a tangent input's witness) whenever the facts say so.
  static constexpr std::string_view kSameShape[] = {"Neg", "Identity", "Cast", "CastLike", "Dropout"};
  static constexpr std::string_view kBroadcasting[] = {"Add", "Sub",  "Mul", "Div", "Where",
                                                       "Sum", "Relu", "Max", "Min"};
  if (outputs.empty() || !outputs[0].valid()) return;
  const std::string_view type = node.op_type();
  const bool same_shape = std::find(std::begin(kSameShape), std::end(kSameShape), type) != std::end(kSameShape);
  if (!same_shape && std::find(std::begin(kBroadcasting), std::end(kBroadcasting), type) == std::end(kBroadcasting))
    return;
  const Facts& of = facts(outputs[0]);
  if (same_shape) {
    V w = tangent(inputs[0]) ? witness(inputs[0]) : inputs[0];
    if (w.valid()) set_witness(outputs[0], w);
    return;
  }
  for (V in : inputs) {
    if (!in.valid()) continue;
    V w = tangent(in) ? witness(in) : in;
    if (w.valid() && same_static_shape(facts(w), of)) {
      set_witness(outputs[0], w);
      return;
    }
  }
  // Facts with unknown dims cannot prove it; a tangent operand of the output's rank whose
  // co-operands are no larger (lower rank or size-1/equal static dims) has the output's shape.
  for (V in : inputs) {
    if (!tangent(in) || !witness(in).valid()) continue;
    const Facts& wf = facts(witness(in));
    if (!of.has_shape || wf.rank() != of.rank()) continue;
    bool dominated = true;
    for (V other : inputs) {
      if (!other.valid() || other.id == in.id) continue;
      const Facts& f = facts(other);
      if (!f.has_shape || f.rank() > wf.rank()) {
        dominated = false;
        break;
      }
      for (int64_t i = 0; i < f.rank(); ++i) {
        const Dim& d = f.dims[i];
        const Dim& w = wf.dims[wf.rank() - f.rank() + i];
        const bool one = d.known() && d.value() == 1;
        if (!one && !d.same_as(w)) dominated = false;
      }
    }
    if (dominated) {
      set_witness(outputs[0], witness(in));
      return;
    }
  }
}

V Builder::add(V a, V b) {
  if (!a.valid()) return b;
  if (!b.valid()) return a;
  return op1("Add", {a, b});
}
V Builder::sub(V a, V b) {
  if (!b.valid()) return a;
  if (!a.valid()) return neg(b);
  return op1("Sub", {a, b});
}
V Builder::mul(V a, V b) {
  if (!a.valid() || !b.valid()) return V{};
  return op1("Mul", {a, b});
}
V Builder::div(V a, V b) {
  if (!a.valid()) return V{};
  return op1("Div", {a, b});
}
V Builder::zeros_like(V like, int32_t dtype) {
  const int32_t dt = dtype ? dtype : facts(like).dtype;
  // A dtype ONNX's inference could not tell (a Loop state, say) is taken from `like` when the
  // model runs.
  const V zero = dt ? scalar(0.0, dt) : op1("CastLike", {scalar(0.0, onnx::TensorProto::FLOAT), like});
  return expand(zero, shape_of(like));
}
V Builder::neg(V a) {
  if (!a.valid()) return V{};
  return op1("Neg", {a});
}

V Builder::existing(std::string_view name, Facts facts) {
  const V v = add_value(interned(name), std::move(facts));
  values_[static_cast<size_t>(v.id)].leaf = true;
  return v;
}

V Builder::existing(std::string_view name, const Facts* shared) {
  const V v = add_value(interned(name), Facts{});
  share_facts(v, shared);
  values_[static_cast<size_t>(v.id)].leaf = true;
  return v;
}

V Builder::existing_id(int name_id, const Facts* shared) {
  const V v = add_value(value_names_.name(name_id), Facts{});
  share_facts(v, shared);
  return v;
}

// The name base for what this builder emits next: the origin (or "onnax"), a separator and
// the op type (lowercased for values), built in a reused buffer.
std::string_view Builder::name_base(char separator, std::string_view type, bool lowercase) {
  name_base_.assign(origin_.empty() ? std::string_view("onnax") : std::string_view(origin_));
  name_base_.push_back(separator);
  // (Op types are ASCII; std::tolower would consult the locale for every character.)
  for (char c : type) name_base_.push_back(lowercase && c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  return name_base_;
}

bool Builder::bound_for_tape(const Vs& inputs) const {
  return tape_ && reads_tangent(inputs);
}

bool Builder::reads_tangent(const Vs& inputs) const {
  for (V v : inputs)
    if (tangent(v)) return true;
  return false;
}

onnx::NodeProto* Builder::new_node(std::string_view type, bool for_tape) {
  if (for_tape) {
    // Tape nodes live until the builder's transform ends and are freed together: on an arena
    // of their own they cost no heap allocation each (a third of reverse mode's nodes).
    if (!tape_arena_) {
      google::protobuf::ArenaOptions options;
      options.start_block_size = 64 * 1024;
      options.max_block_size = 4 * 1024 * 1024;
      tape_arena_ = std::make_unique<google::protobuf::Arena>(options);
    }
    auto* n = google::protobuf::Arena::CreateMessage<onnx::NodeProto>(tape_arena_.get());
    n->set_op_type(type.data(), type.size());
    return n;
  }
  auto* n = out_.add_node();
  n->set_op_type(type.data(), type.size());
  return n;
}

void Builder::name_node(onnx::NodeProto* n, const HashedName* first_output) {
  // After its first output: that name is unique among values, so among the nodes named so, and
  // node scopes' fresh names avoid value names. Only a source node (or a subgraph's) may
  // already have it. This spares interning a second name per node in the node scope.
  if (n->output_size() > 0 && !n->output(0).empty() &&
      !node_names_.contains(first_output ? *first_output : Interner::hashed(n->output(0)))) {
    n->set_name(n->output(0));
    return;
  }
  const std::string_view name = node_names_.fresh_view(name_base('/', n->op_type(), false), &value_names_);
  n->set_name(name.data(), name.size());
}

void Builder::add_inputs(onnx::NodeProto* n, const Vs& inputs) const {
  for (V v : inputs) {
    const std::string_view nm = v.valid() ? name(v) : std::string_view();
    n->add_input(nm.data(), nm.size());
  }
}

// Deterministic ops without subgraphs: the same inputs and attributes give the same values.
static bool reusable(std::string_view type, const Attrs& attrs) {
  if (type.rfind("Random", 0) == 0 || type == "Bernoulli" || type == "Multinomial" || type == "Dropout") return false;
  for (const auto& a : attrs)
    if (a.proto.has_g() || a.proto.graphs_size() > 0) return false;
  return true;
}

// Equal attributes of the kinds reusable nodes carry (tensors and graphs never compare equal).
static bool same_attribute(const onnx::AttributeProto& a, const onnx::AttributeProto& b) {
  if (a.name() != b.name() || a.type() != b.type()) return false;
  auto same_floats = [](float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; };
  switch (a.type()) {
    case onnx::AttributeProto::INT: return a.i() == b.i();
    case onnx::AttributeProto::FLOAT: return same_floats(a.f(), b.f());
    case onnx::AttributeProto::STRING: return a.s() == b.s();
    case onnx::AttributeProto::INTS:
      return std::equal(a.ints().begin(), a.ints().end(), b.ints().begin(), b.ints().end());
    case onnx::AttributeProto::FLOATS:
      return std::equal(a.floats().begin(), a.floats().end(), b.floats().begin(), b.floats().end(), same_floats);
    case onnx::AttributeProto::STRINGS:
      return std::equal(a.strings().begin(), a.strings().end(), b.strings().begin(), b.strings().end());
    default: return false;
  }
}

uint64_t Builder::recent_hash(std::string_view type, const Vs& inputs, const Attrs& attrs) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](uint64_t x) { h = (h ^ x) * 0x100000001b3ull; };
  for (char ch : type) mix(static_cast<unsigned char>(ch));
  for (V v : inputs) mix(static_cast<uint32_t>(v.id));
  for (const auto& a : attrs) {
    mix(a.proto.i());
    for (int64_t x : a.proto.ints()) mix(static_cast<uint64_t>(x));
  }
  return h ^ (h >> 29);
}

V Builder::same_node(uint64_t hash, std::string_view type, const Vs& inputs, const Attrs& attrs) const {
  if (recent_.empty()) return V{};
  const Recent& r = recent_[hash & (kRecentSlots - 1)];
  if (r.node < 0 || r.tag != static_cast<uint32_t>(hash >> 32)) return V{};
  const EmittedInputs& e = emitted_[static_cast<size_t>(r.node)];
  if (e.count != inputs.size()) return V{};
  for (size_t i = 0; i < inputs.size(); ++i)
    if (emitted_inputs_[e.begin + i] != inputs[i].id) return V{};
  const onnx::NodeProto& n = out_.node(r.node);
  if (n.op_type() != type || n.attribute_size() != static_cast<int>(attrs.size())) return V{};
  for (size_t k = 0; k < attrs.size(); ++k)
    if (!same_attribute(n.attribute(static_cast<int>(k)), attrs[k].proto)) return V{};
  return V{r.output};
}

// The dims [start, end) of `f` (Shape's and Slice's clamping: negatives count from the end)
// when every one is a known size.
static std::optional<std::vector<int64_t>> static_dims_between(const Facts& f, int64_t start, int64_t end) {
  if (!f.has_shape) return std::nullopt;
  const int64_t r = f.rank();
  auto at = [&](int64_t p) { return std::clamp(p < 0 ? p + r : p, int64_t{0}, r); };
  std::vector<int64_t> dims;
  for (int64_t i = at(start); i < at(end); ++i) {
    if (!f.dims[static_cast<size_t>(i)].known()) return std::nullopt;
    dims.push_back(f.dims[static_cast<size_t>(i)].value());
  }
  return dims;
}

V Builder::folded_int64(std::string_view type, const Vs& inputs, const Attrs& attrs) {
  // A slice of a value's whole shape whose dims in that range are static (a Conv's spatial
  // sizes, the batch symbolic).
  if (type == "Slice" && inputs.size() >= 3 && inputs.size() <= 4 && shape_source(inputs[0]).valid()) {
    const Facts& xf = facts(shape_source(inputs[0]));
    const auto* starts = known_i64(inputs[1]);
    const auto* ends = known_i64(inputs[2]);
    const auto* axes = inputs.size() > 3 ? known_i64(inputs[3]) : nullptr;
    if (xf.has_shape && starts && ends && starts->size() == 1 && ends->size() == 1 &&
        (inputs.size() == 3 || (axes && axes->size() == 1 && ((*axes)[0] == 0 || (*axes)[0] == -1)))) {
      if (const auto dims = static_dims_between(xf, (*starts)[0], (*ends)[0])) return i64s(*dims);
    }
  }
  // One static dim of a value's whole shape (a trip count taken from a sequence's length).
  if (type == "Gather" && inputs.size() == 2 && shape_source(inputs[0]).valid()) {
    int64_t axis = 0;
    for (const auto& a : attrs)
      if (a.proto.name() == "axis") axis = a.proto.i();
    const auto* index = known_i64(inputs[1]);
    const Facts& xf = facts(shape_source(inputs[0]));
    if ((axis == 0 || axis == -1) && index && index->size() == 1 && facts(inputs[1]).rank() == 0 && xf.has_shape) {
      const int64_t i = (*index)[0] < 0 ? (*index)[0] + xf.rank() : (*index)[0];
      if (i >= 0 && i < xf.rank() && xf.dims[static_cast<size_t>(i)].known())
        return i64(xf.dims[static_cast<size_t>(i)].value());
    }
  }
  // (On the stack: this runs for every int64 op, and most do not fold.)
  std::array<KnownInt64, 8> known{};
  if (inputs.size() > known.size()) return V{};
  size_t count = 0;
  for (V v : inputs) {
    if (!v.valid()) {
      known[count++] = {nullptr, -1};
      continue;
    }
    const Facts& f = facts(v);
    if (f.dtype != onnx::TensorProto::INT64 || !f.has_shape || f.rank() > 1) return V{};
    const std::vector<int64_t>* values = known_i64(v);
    if (!values) return V{};
    known[count++] = {values, f.rank()};
  }
  const std::optional<FoldedInt64> folded = fold_int64(type, std::span<const KnownInt64>(known.data(), count), attrs);
  if (!folded) return V{};
  return folded->rank == 0 ? i64(folded->values.at(0)) : i64s(folded->values);
}

// A Shape's start and end attributes (end absent: the whole shape).
static std::pair<int64_t, std::optional<int64_t>> shape_range(const Attrs& attrs) {
  int64_t start = 0;
  std::optional<int64_t> end;
  for (const auto& a : attrs) {
    if (a.proto.name() == "start") start = a.proto.i();
    if (a.proto.name() == "end") end = a.proto.i();
  }
  return {start, end};
}
static constexpr int64_t kWholeShape = std::numeric_limits<int64_t>::max();

V Builder::folded(std::string_view type, const Vs& inputs, const Attrs& attrs) {
  if (int64_foldable(type)) return folded_int64(type, inputs, attrs);
  // The shape of a value whose dims in range are static (shape_of leaves the whole shape to
  // this). (A tangent's Shape goes to the tape, as before.)
  if (type == "Shape" && inputs.size() == 1 && inputs[0].valid() && !tangent(inputs[0])) {
    const auto [start, end] = shape_range(attrs);
    if (const auto dims = static_dims_between(facts(inputs[0]), start, end.value_or(kWholeShape))) return i64s(*dims);
  }
  return V{};
}

V Builder::transposed_transpose(const Vs& inputs, const Attrs& attrs) {
  if (inputs.size() != 1 || !inputs[0].valid()) return V{};
  const int32_t p = values_[static_cast<size_t>(inputs[0].id)].producer;
  if (p < 0 || static_cast<size_t>(p) >= emitted_.size() ||
      emitted_[static_cast<size_t>(p)].begin == EmittedInputs::kNone)
    return V{};
  const onnx::NodeProto& inner = out_.node(p);
  if (inner.op_type() != "Transpose" || !inner.domain().empty() || emitted_[static_cast<size_t>(p)].count != 1)
    return V{};
  const V x = V{emitted_inputs_[emitted_[static_cast<size_t>(p)].begin]};
  if (!x.valid()) return V{};
  const int64_t rank = facts(x).rank();
  if (rank < 0) return V{};
  // A missing perm reverses the axes.
  auto perm_of = [&](auto&& attributes, auto&& name_of, auto&& ints_of) {
    std::vector<int64_t> perm;
    for (const auto& a : attributes)
      if (name_of(a) == "perm") perm = ints_of(a);
    if (perm.empty())
      for (int64_t i = rank; i-- > 0;) perm.push_back(i);
    return perm;
  };
  const std::vector<int64_t> first = perm_of(
      inner.attribute(), [](const onnx::AttributeProto& a) { return a.name(); },
      [](const onnx::AttributeProto& a) { return std::vector<int64_t>(a.ints().begin(), a.ints().end()); });
  const std::vector<int64_t> second = perm_of(
      attrs, [](const Attr& a) { return a.proto.name(); },
      [](const Attr& a) { return std::vector<int64_t>(a.proto.ints().begin(), a.proto.ints().end()); });
  if (static_cast<int64_t>(first.size()) != rank || static_cast<int64_t>(second.size()) != rank) return V{};
  std::vector<int64_t> both;
  bool identity = true;
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t s = second[static_cast<size_t>(i)];
    if (s < 0 || s >= rank) return V{};
    both.push_back(first[static_cast<size_t>(s)]);
    identity = identity && both.back() == i;
  }
  return identity ? x : transpose(x, both);
}

Vs Builder::op(std::string_view type, const Vs& inputs, const Attrs& attrs, int num_outputs) {
  if (reuse_ && num_outputs == 1)
    if (const V f = folded(type, inputs, attrs); f.valid()) return {f};
  // A transpose of a transpose this builder emitted is one transpose of the first's input (none
  // when they cancel): a weight transposed for a Gemm and back for its cotangent.
  if (reuse_ && num_outputs == 1 && type == "Transpose")
    if (const V t = transposed_transpose(inputs, attrs); t.valid()) return {t};
  // With reuse on, a computation emitted again returns the first one's outputs instead of a
  // copy: the transpose of a weight shared by many layers (once per use in reverse mode), the
  // sum of one cotangent that a normalization's scale, bias and mean gradients each take.
  // Nodes on leaves alone are found by a key of their inputs and attributes; others among the
  // recent nodes (see recent_).
  bool cacheable = reuse_ && !inputs.empty() && reusable(type, attrs);
  bool on_leaves = cacheable;
  for (size_t i = 0; cacheable && i < inputs.size(); ++i) {
    const V v = inputs[i];
    cacheable = !tangent(v);
    on_leaves = on_leaves && (!v.valid() || values_[static_cast<size_t>(v.id)].leaf);
  }
  const bool recent = cacheable && !on_leaves && num_outputs == 1;
  const uint64_t hash = recent ? recent_hash(type, inputs, attrs) : 0;
  if (cacheable && on_leaves) {
    op_key_.assign(type);
    op_key_.push_back('\0');
    auto put = [&](int32_t x) { op_key_.append(reinterpret_cast<const char*>(&x), sizeof x); };
    put(num_outputs);
    for (V v : inputs) put(v.id);
    for (const auto& a : attrs) a.proto.AppendToString(&op_key_);
    // (A value marked a tangent after it was made, a zero tangent, is not the computation's.)
    if (auto it = op_cache_.find(op_key_); it != op_cache_.end() && !reads_tangent(it->second)) return it->second;
  } else if (recent) {
    if (const V same = same_node(hash, type, inputs, attrs); same.valid() && !tangent(same)) return Vs{same};
  }
  Vs outs = emit(type, inputs, attrs, num_outputs);
  if (cacheable && on_leaves) op_cache_.emplace(op_key_, outs);
  if (recent) {
    // (Emitted into the graph: no input is a tangent.)
    const int32_t node = out_.node_size() - 1;
    if (recent_.empty()) recent_.resize(kRecentSlots);
    if (node >= 0 && static_cast<size_t>(node) < emitted_.size() &&
        emitted_[static_cast<size_t>(node)].begin != EmittedInputs::kNone)
      recent_[hash & (kRecentSlots - 1)] = Recent{node, outs[0].id, static_cast<uint32_t>(hash >> 32)};
  }
  return outs;
}

Vs Builder::emit(std::string_view type, const Vs& inputs, const Attrs& attrs, int num_outputs, const Vs* recorded) {
  const bool for_tape = bound_for_tape(recorded ? *recorded : inputs);
  HashedName base;  // of the outputs' names (hashed once for the tables it is looked up in)
  if (!for_tape) {
    // The name tables of large graphs outgrow the caches: start loading the slots the first
    // output's name (and the node's, named after it) will probe while the node is being built.
    base = Interner::hashed(name_base('_', type, true));
    value_names_.prefetch(base);
    node_names_.prefetch(base);
  }
  auto* n = new_node(type, for_tape);
  if (!for_tape) add_inputs(n, inputs);
  for (const auto& a : attrs) *n->add_attribute() = a.proto;
  Vs outs;
  HashedName first_output;
  for (int i = 0; i < num_outputs; ++i) {
    if (for_tape) {
      outs.push_back(add_value(std::string_view(), Facts{}));
      continue;
    }
    const HashedName nm = value_names_.fresh_hashed(base);
    if (i == 0) first_output = nm;
    n->add_output(nm.text.data(), nm.text.size());
    outs.push_back(add_value(nm.text, Facts{}));
  }
  if (!for_tape) name_node(n, num_outputs > 0 ? &first_output : nullptr);
  finish(*n, inputs, outs, recorded);
  if (!for_tape) record_emitted(n, inputs);
  return outs;
}

V Builder::op1_known(std::string_view type, const Vs& inputs, const Attrs& attrs, Facts facts) {
  given_facts_ = &facts;
  const V y = op1(type, inputs, attrs);
  given_facts_ = nullptr;
  return y;
}

Vs Builder::op_reading(std::string_view type, const Vs& inputs, const Vs& reads, const Attrs& attrs, int num_outputs) {
  Vs all = inputs;
  for (V r : reads) all.push_back(r);
  return emit(type, inputs, attrs, num_outputs, &all);
}

std::string_view Builder::name_for_read(V v) {
  Value& value = values_[static_cast<size_t>(v.id)];
  if (value.name.empty()) value.name = value_names_.fresh_view(name_base('_', "read", false));
  return value.name;
}

V Builder::op_named(std::string_view type, const Vs& inputs, const Attrs& attrs, const std::string& output_name) {
  auto* n = new_node(type, false);  // (named: stays named even on the tape)
  add_inputs(n, inputs);
  for (const auto& a : attrs) *n->add_attribute() = a.proto;
  n->add_output(output_name);
  V out = add_value(interned(output_name), Facts{});
  name_node(n);
  finish(*n, inputs, {out});
  record_emitted(n, inputs);
  return out;
}

bool Builder::same_input_names(const onnx::NodeProto& node, const Vs& inputs) const {
  if (static_cast<int>(inputs.size()) != node.input_size()) return false;
  for (int i = 0; i < node.input_size(); ++i)
    if (inputs[i].valid() ? name(inputs[i]) != node.input(i) : !node.input(i).empty()) return false;
  return true;
}

Vs Builder::clone(const onnx::NodeProto& node, const Vs& inputs, const Attrs& overrides,
                  const std::vector<std::string>& drop, int num_outputs) {
  if (source_names_node_ == &node && overrides.empty() && drop.empty() && num_outputs < 0 &&
      same_input_names(node, inputs) && !bound_for_tape(inputs)) {
    source_names_node_ = nullptr;  // the names can be taken once
    onnx::NodeProto* n = nullptr;
    if (source_owner_ && source_owner_->get() == &node) {
      out_.mutable_node()->AddAllocated(source_owner_->release());  // the same object: no copy
      n = out_.mutable_node(out_.node_size() - 1);
    } else {
      n = out_.add_node();
      *n = node;
    }
    source_owner_ = nullptr;
    Vs outs;
    for (int i = 0; i < node.output_size(); ++i) {
      const std::string& o = node.output(i);
      const bool by_id = source_output_ids_ && source_output_ids_[i] >= 0;
      outs.push_back(o.empty() ? V{}
                               : add_value(by_id ? value_names_.name(source_output_ids_[i]) : interned(o), Facts{}));
    }
    source_output_ids_ = nullptr;
    finish(*n, inputs, outs);
    return outs;
  }
  // Shape arithmetic on known values folds as in op() (expansions clone their nodes), and a
  // Shape is shape_of's (so a Gather or Slice of it folds where its dims are static).
  if (reuse_ && overrides.empty() && drop.empty() && num_outputs < 0 && node.output_size() == 1 &&
      node.domain().empty() && (node.op_type() == "Shape" || int64_foldable(node.op_type())) &&
      !(transposing_ && transposing_->node.get() == &node)) {
    Attrs attrs;
    for (const auto& a : node.attribute()) attrs.push_back(Attr{a});
    if (node.op_type() == "Shape" && inputs.size() == 1 && inputs[0].valid() && !tangent(inputs[0])) {
      const auto [start, end] = shape_range(attrs);
      return {shape_of(inputs[0], start, end)};
    }
    if (const V f = folded(node.op_type(), inputs, attrs); f.valid()) return {f};
  }
  const bool for_tape = bound_for_tape(inputs);
  auto* n = new_node(node.op_type(), for_tape);
  n->set_domain(node.domain());
  if (!for_tape) add_inputs(n, inputs);
  for (const auto& a : node.attribute()) {
    bool replaced =
        std::any_of(overrides.begin(), overrides.end(), [&](const Attr& o) { return o.proto.name() == a.name(); });
    bool dropped = std::find(drop.begin(), drop.end(), a.name()) != drop.end();
    if (!replaced && !dropped) *n->add_attribute() = a;
  }
  for (const auto& a : overrides) *n->add_attribute() = a.proto;
  Vs outs;
  // The tape node being transposed has no output names: its outputs are the tape's record, and
  // clones of it are named like op()'s outputs.
  const TapeNode* tape_node = transposing_ && transposing_->node.get() == &node ? transposing_ : nullptr;
  const int own_count = tape_node ? static_cast<int>(tape_node->outputs.size()) : node.output_size();
  auto absent = [&](int i) { return tape_node ? !tape_node->outputs[i].valid() : node.output(i).empty(); };
  const int count = num_outputs >= 0 ? num_outputs : own_count;
  for (int i = 0; i < count; ++i) {
    if (i < own_count && absent(i) && num_outputs < 0) {
      if (!for_tape) n->add_output("");
      outs.push_back(V{});
      continue;
    }
    if (for_tape) {
      outs.push_back(add_value(std::string_view(), Facts{}));
      continue;
    }
    std::string_view nm;
    if (tape_node) {
      nm = value_names_.fresh_view(name_base('_', node.op_type(), true));
    } else {
      const std::string base = i < node.output_size() && !node.output(i).empty() ? node.output(i)
                               : node.output_size() ? node.output(0) + "_" + std::to_string(i)
                                                    : std::string("v");
      nm = value_names_.fresh_view(base + "_b");
    }
    n->add_output(nm.data(), nm.size());
    outs.push_back(add_value(nm, Facts{}));
  }
  if (!for_tape) name_node(n);
  finish(*n, inputs, outs);
  if (!for_tape) record_emitted(n, inputs);
  return outs;
}

void Builder::rename(V v, const std::string& new_name, int first_node) {
  const std::string old(values_[v.id].name);
  for (int i = first_node; i < out_.node_size(); ++i) {
    auto* n = out_.mutable_node(i);
    for (auto& in : *n->mutable_input())
      if (in == old) in = new_name;
    for (auto& o : *n->mutable_output())
      if (o == old) o = new_name;
  }
  values_[v.id].name = interned(new_name);
  if (auto it = known_i64_.find(old); it != known_i64_.end()) {
    std::vector<int64_t> values = it->second;  // (inserting may rehash: copy first)
    known_i64_[new_name] = std::move(values);
  }
}

void Builder::rename_all(const std::vector<std::pair<V, std::string>>& renames) {
  if (renames.empty()) return;
  std::unordered_map<std::string, std::string> map;
  // Only nodes from the first renamed value's producer on can mention the old names (values
  // are used after they are made); derivative outputs are usually made last.
  int first = out_.node_size();
  for (const auto& [v, n] : renames) {
    map[std::string(values_[v.id].name)] = n;
    first = std::min(first, values_[v.id].producer);
  }
  for (int i = std::max(first, 0); i < out_.node_size(); ++i) {
    onnx::NodeProto& node = *out_.mutable_node(i);
    for (auto& in : *node.mutable_input())
      if (auto it = map.find(in); it != map.end()) in = it->second;
    for (auto& o : *node.mutable_output())
      if (auto it = map.find(o); it != map.end()) o = it->second;
  }
  for (const auto& [v, n] : renames) values_[v.id].name = interned(n);
}

V Builder::i64s(const std::vector<int64_t>& values) {
  if (auto it = i64s_cache_.find(values); it != i64s_cache_.end()) return it->second;
  onnx::TensorProto t;
  t.set_data_type(onnx::TensorProto::INT64);
  t.add_dims(static_cast<int64_t>(values.size()));
  for (int64_t x : values) t.add_int64_data(x);
  V v = tensor_const(t);
  known_i64_[std::string(name(v))] = values;
  i64s_cache_.emplace(values, v);
  return v;
}

V Builder::i64(int64_t value) {
  if (auto it = i64_cache_.find(value); it != i64_cache_.end()) return it->second;
  onnx::TensorProto t;
  t.set_data_type(onnx::TensorProto::INT64);
  t.add_int64_data(value);
  V v = tensor_const(t);
  known_i64_[std::string(name(v))] = {value};
  i64_cache_.emplace(value, v);
  return v;
}

V Builder::scalar(double value, int32_t dtype) {
  // Keyed by the exact bits: a decimal rendering would merge 1e-12 with 0 (an epsilon lost).
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const std::pair<int32_t, uint64_t> key{dtype, bits};
  if (auto it = scalar_cache_.find(key); it != scalar_cache_.end()) return it->second;
  onnx::TensorProto t;
  t.set_data_type(dtype);
  switch (dtype) {
    case onnx::TensorProto::FLOAT: t.add_float_data(static_cast<float>(value)); break;
    case onnx::TensorProto::DOUBLE: t.add_double_data(value); break;
    case onnx::TensorProto::INT64: t.add_int64_data(static_cast<int64_t>(value)); break;
    case onnx::TensorProto::UINT64: t.add_uint64_data(static_cast<uint64_t>(value)); break;
    case onnx::TensorProto::UINT32: t.add_uint64_data(static_cast<uint64_t>(value)); break;
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::INT16:
    case onnx::TensorProto::INT8:
    case onnx::TensorProto::UINT16:
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::BOOL: t.add_int32_data(static_cast<int32_t>(value)); break;
    default: {
      // float16/bfloat16 and others: build a float and let a Cast convert it.
      V f = scalar(value, onnx::TensorProto::FLOAT);
      V c = op1("Cast", {f}, {Attr::i("to", dtype)});
      set_facts(c, Facts::of(dtype, {}));
      scalar_cache_.emplace(key, c);
      return c;
    }
  }
  V v = tensor_const(t);
  scalar_cache_.emplace(key, v);
  return v;
}

V Builder::tensor_const(const onnx::TensorProto& t) {
  auto* n = new_node("Constant", false);
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  *a->mutable_t() = t;
  const std::string_view nm = value_names_.fresh_view("onnax_const");
  n->add_output(nm.data(), nm.size());
  name_node(n);
  Facts f;
  f.dtype = t.data_type();
  f.has_shape = true;
  for (int64_t d : t.dims()) f.dims.push_back(Dim::of(d));
  V v = add_value(nm, f);
  values_[static_cast<size_t>(v.id)].leaf = true;
  finish(*n, {}, {v});
  record_emitted(n, {});
  constants_.push_back(v);
  return v;
}

Vs Builder::name_optional_outputs(const onnx::NodeProto& node, int first,
                                  const std::vector<std::pair<std::string_view, Facts>>& outputs) {
  if (out_.node_size() == 0 || node.output_size() == 0) return {};
  onnx::NodeProto* n = out_.mutable_node(out_.node_size() - 1);
  if (n->op_type() != node.op_type() || n->output_size() == 0 || n->output(0) != node.output(0)) return {};
  for (int k = first; k < first + static_cast<int>(outputs.size()); ++k)
    if (k < n->output_size() && !n->output(k).empty()) return {};
  Vs values;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const int k = first + static_cast<int>(i);
    while (n->output_size() <= k) n->add_output("");
    const std::string_view nm = value_names_.fresh_view(node.output(0) + std::string(outputs[i].first));
    n->set_output(k, nm.data(), nm.size());
    const V v = add_value(nm, outputs[i].second);
    values_[static_cast<size_t>(v.id)].producer = out_.node_size() - 1;
    values.push_back(v);
  }
  return values;
}

// The output of `n` named `name` (nullptr: none).
static std::string* output_named(onnx::NodeProto& n, std::string_view name) {
  for (auto& o : *n.mutable_output())
    if (o == name) return &o;
  return nullptr;
}

void Builder::trade_names(int source_node, V s, V t) {
  Value& sv = values_[static_cast<size_t>(s.id)];
  Value& tv = values_[static_cast<size_t>(t.id)];
  std::string* in_source = output_named(*out_.mutable_node(source_node), sv.name);
  std::string* in_taker = output_named(*out_.mutable_node(tv.producer), tv.name);
  if (!in_source || !in_taker) throw std::logic_error("onnax internal error: trading names of non-outputs");
  in_source->assign(tv.name);
  in_taker->assign(sv.name);
  std::swap(sv.producer, tv.producer);
}

bool Builder::take_over_outputs(int source_index, const Vs& source_inputs, const Vs& source_outputs, const Vs& same) {
  const int count = out_.node_size();
  if (source_index < 0 || source_index >= count - 1 || source_outputs.size() != same.size()) return false;
  onnx::NodeProto& source = *out_.mutable_node(source_index);
  emitted_.resize(static_cast<size_t>(count));
  // Every output of the source node must be taken over: it is dropped as unread afterwards,
  // and source nodes reading it by name are not counted as readers. Each taker is a node after
  // the source node (one this builder emitted, so before the source node's readers).
  size_t taken = 0;
  for (size_t i = 0; i < same.size(); ++i) {
    if (!source_outputs[i].valid() || !same[i].valid()) continue;
    const int32_t p = values_[static_cast<size_t>(same[i].id)].producer;
    if (p <= source_index || p >= count || !output_named(source, name(source_outputs[i])) ||
        !output_named(*out_.mutable_node(p), name(same[i])))
      return false;
    ++taken;
  }
  size_t defined = 0;
  for (const auto& o : source.output()) defined += o.empty() ? 0 : 1;
  if (taken != defined) return false;
  for (size_t i = 0; i < same.size(); ++i) {
    const V s = source_outputs[i], t = same[i];
    if (!s.valid() || !t.valid()) continue;
    const int32_t taker = values_[static_cast<size_t>(t.id)].producer;
    trade_names(source_index, s, t);
    // The taker now defines values source nodes read by name: it stays.
    emitted_[static_cast<size_t>(taker)] = EmittedInputs{};
  }
  // The source node is this builder's to drop (its inputs' reads counted, as for the nodes it
  // emits).
  emitted_[static_cast<size_t>(source_index)] = {static_cast<uint32_t>(emitted_inputs_.size()),
                                                 static_cast<uint32_t>(source_inputs.size())};
  for (V v : source_inputs) {
    emitted_inputs_.push_back(v.id);
    count_read(v);
  }
  for (Recent& r : recent_)
    if (r.node == source_index) r.node = -1;
  return true;
}

void Builder::adopt_node(NodePtr node, const Vs& outputs) {
  adopt_node(std::move(node));
  for (V v : outputs)
    if (v.valid()) values_[static_cast<size_t>(v.id)].producer = out_.node_size() - 1;
}

int Builder::defining_node(const Vs& values, const Vs& reads, std::string_view op_type) const {
  auto producer = [&](V v) { return v.valid() ? values_[static_cast<size_t>(v.id)].producer : -1; };
  int index = -1;
  for (V v : values)
    if (producer(v) >= 0) {
      index = producer(v);
      break;
    }
  size_t count = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (producer(values[i]) != index) continue;
    bool repeated = false;
    for (size_t j = 0; j < i; ++j) repeated = repeated || values[j].id == values[i].id;
    count += repeated ? 0 : 1;
  }
  if (index < 0 || out_.node(index).op_type() != op_type) return -1;
  size_t defined = 0;
  for (const auto& o : out_.node(index).output()) defined += o.empty() ? 0 : 1;
  if (count != defined) return -1;
  // (Values of source nodes are defined before a node that reads them: a source node's inputs
  // are.)
  for (V r : reads)
    if (r.valid() && values_[static_cast<size_t>(r.id)].producer >= index) return -1;
  return index;
}

std::vector<char> Builder::made_by(int index, const Vs& values) const {
  std::vector<char> out;
  for (V v : values) out.push_back(index >= 0 && v.valid() && values_[static_cast<size_t>(v.id)].producer == index);
  return out;
}

void Builder::take_place_of(int index, const Vs& source_outputs, const Vs& same) {
  const int last = out_.node_size() - 1;
  if (index < 0 || index >= last || source_outputs.size() != same.size())
    throw std::logic_error("onnax internal error: take_place_of without a node to replace");
  std::vector<int32_t> traded;
  for (size_t i = 0; i < same.size(); ++i) {
    const V s = source_outputs[i], t = same[i];
    if (!s.valid() || values_[static_cast<size_t>(s.id)].producer != index ||
        std::find(traded.begin(), traded.end(), s.id) != traded.end())
      continue;
    if (!t.valid() || values_[static_cast<size_t>(t.id)].producer != last)
      throw std::logic_error("onnax internal error: take_place_of: an output without its twin");
    traded.push_back(s.id);
    trade_names(index, s, t);
  }
  // The nodes trade places: every value keeps its name, now defined at the other position.
  out_.mutable_node()->SwapElements(index, last);
  for (size_t i = 0; i < values_.size(); ++i) {
    Value& v = values_[i];
    if (v.producer == index)
      v.producer = last;
    else if (v.producer == last)
      v.producer = index;
  }
  for (int& k : subgraph_nodes_) {
    if (k == index)
      k = last;
    else if (k == last)
      k = index;
  }
  // The taker defines values source nodes read by name: it stays. The source node is dropped
  // when its new names are unread (with its reads, when this builder emitted and counted them).
  emitted_.resize(static_cast<size_t>(last) + 1);
  const EmittedInputs source_reads = emitted_[static_cast<size_t>(index)];
  emitted_[static_cast<size_t>(index)] = EmittedInputs{};
  emitted_[static_cast<size_t>(last)] = source_reads.begin == EmittedInputs::kNone
                                            ? EmittedInputs{static_cast<uint32_t>(emitted_inputs_.size()), 0}
                                            : source_reads;
  for (Recent& r : recent_)
    if (r.node == index || r.node == last) r.node = -1;
}

void Builder::record_emitted(const onnx::NodeProto* n, const Vs& inputs) {
  const int index = out_.node_size() - 1;
  if (index < 0 || &out_.node(index) != n) return;  // (bound for the tape)
  if (emitted_.size() <= static_cast<size_t>(index)) emitted_.resize(static_cast<size_t>(index) + 1 + index / 2);
  emitted_[static_cast<size_t>(index)] = {static_cast<uint32_t>(emitted_inputs_.size()),
                                          static_cast<uint32_t>(inputs.size())};
  for (V v : inputs) emitted_inputs_.push_back(v.id);
}

// (Source nodes adopted unchanged are not counted as readers: they read only source values,
// which no emitted node makes, so nothing removable loses a reader by it.)
void Builder::drop_dead_nodes(const std::function<bool(std::string_view)>& still_read) {
  const size_t node_count = static_cast<size_t>(out_.node_size());
  emitted_.resize(node_count);
  if (uses_.size() < values_.size()) uses_.resize(values_.size(), 0);
  // Per node, its outputs something reads (only zero-use values are looked up by name).
  std::vector<uint32_t> live(node_count, 0);
  auto read_by_name = [&](size_t v) { return still_read(values_[v].name); };
  for (size_t v = 0; v < values_.size(); ++v) {
    const int32_t p = values_[v].producer;
    if (p >= 0 && emitted_[static_cast<size_t>(p)].begin != EmittedInputs::kNone && (uses_[v] > 0 || read_by_name(v)))
      ++live[static_cast<size_t>(p)];
  }
  // Readers come after what they read: from the last node back, a node is dead when nothing
  // live reads it, and its inputs lose a reader.
  std::vector<char> dead(node_count, 0);
  bool any = false;
  for (size_t k = node_count; k-- > 0;) {
    const EmittedInputs& e = emitted_[k];
    if (e.begin == EmittedInputs::kNone || live[k] > 0) continue;
    dead[k] = 1;
    any = true;
    for (uint32_t i = e.begin; i < e.begin + e.count; ++i) {
      const int32_t id = emitted_inputs_[i];
      if (id < 0 || --uses_[static_cast<size_t>(id)] > 0) continue;
      const int32_t p = values_[static_cast<size_t>(id)].producer;
      if (p >= 0 && live[static_cast<size_t>(p)] > 0 && !read_by_name(static_cast<size_t>(id)))
        --live[static_cast<size_t>(p)];
    }
  }
  if (!any) return;
  std::vector<int32_t> new_index(node_count, kDropped);
  auto* nodes = out_.mutable_node();
  int kept = 0;
  for (size_t i = 0; i < node_count; ++i) {
    if (dead[i]) continue;
    if (kept != static_cast<int>(i)) nodes->SwapElements(kept, static_cast<int>(i));
    new_index[i] = kept++;
  }
  nodes->DeleteSubrange(kept, nodes->size() - kept);
  for (size_t v = 0; v < values_.size(); ++v)
    if (int32_t& p = values_[v].producer; p >= 0) p = new_index[static_cast<size_t>(p)];
  std::vector<int> subgraph_nodes;
  for (int k : subgraph_nodes_)
    if (new_index[static_cast<size_t>(k)] >= 0) subgraph_nodes.push_back(new_index[static_cast<size_t>(k)]);
  subgraph_nodes_ = std::move(subgraph_nodes);
  emitted_.clear();  // (by the old indices)
  emitted_inputs_.clear();
}

const std::vector<int64_t>* Builder::known_i64(V v) const {
  if (!v.valid() || name(v).empty()) return nullptr;  // (tape values have no name)
  auto it = known_i64_.find(name(v));
  return it == known_i64_.end() ? nullptr : &it->second;
}

void Builder::remember_tensor(const std::string& n, const onnx::TensorProto& t) {
  if (t.dims_size() > 1 || t.data_location() == onnx::TensorProto::EXTERNAL) return;
  std::vector<int64_t> vals;
  auto from_raw = [&](auto sample) {
    using T = decltype(sample);
    const std::string& raw = t.raw_data();
    vals.resize(raw.size() / sizeof(T));
    for (size_t i = 0; i < vals.size(); ++i) {
      T x;
      std::memcpy(&x, raw.data() + i * sizeof(T), sizeof(T));
      vals[i] = static_cast<int64_t>(x);
    }
  };
  switch (t.data_type()) {
    case onnx::TensorProto::INT64:
      if (t.has_raw_data())
        from_raw(int64_t{});
      else
        vals.assign(t.int64_data().begin(), t.int64_data().end());
      break;
    case onnx::TensorProto::INT32:
      if (t.has_raw_data())
        from_raw(int32_t{});
      else
        vals.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    case onnx::TensorProto::BOOL:
      if (t.has_raw_data())
        from_raw(uint8_t{});
      else
        vals.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    default: return;
  }
  // Rules index by these values (axes, shapes): a tensor holding another count of values than
  // its dims say would mislead them.
  const int64_t expected = t.dims_size() == 0 ? 1 : t.dims(0);
  const size_t element = t.data_type() == onnx::TensorProto::INT64   ? 8
                         : t.data_type() == onnx::TensorProto::INT32 ? 4
                                                                     : 1;
  if (static_cast<int64_t>(vals.size()) != expected || (t.has_raw_data() && t.raw_data().size() % element != 0))
    diag::fail(
        Error::Kind::kInvalidModel,
        "invalid model: the " + diag::dtype_name(t.data_type()) + " tensor '" + n + "' has dims [" +
            (t.dims_size() ? std::to_string(t.dims(0)) : std::string()) + "] (" + std::to_string(expected) +
            " value(s)) but its data holds " + std::to_string(vals.size()) +
            (t.has_raw_data() ? " (" + std::to_string(t.raw_data().size()) + " bytes of raw_data)" : std::string()) +
            ". Fix: make its dims and its data agree (onnx.numpy_helper.from_array builds consistent tensors)");
  if (vals.size() <= 64) known_i64_[n] = std::move(vals);
}

void Builder::remember_i64(const std::string& n, std::vector<int64_t> values) {
  known_i64_[n] = std::move(values);
}

static int64_t norm_axis(int64_t a, int64_t rank) {
  return a < 0 ? a + rank : a;
}

V Builder::unsqueeze(V x, const std::vector<int64_t>& axes) {
  if (!x.valid()) return x;
  if (axes.empty()) return x;
  V y = op1("Unsqueeze", {x, i64s(axes)});
  Facts f = facts(x);
  if (f.has_shape) {
    int64_t out_rank = f.rank() + static_cast<int64_t>(axes.size());
    std::vector<int64_t> sorted;
    for (int64_t a : axes) sorted.push_back(norm_axis(a, out_rank));
    std::sort(sorted.begin(), sorted.end());
    const bool valid = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end() && sorted.front() >= 0 &&
                       sorted.back() < out_rank;
    if (valid)
      for (int64_t a : sorted) f.dims.insert(f.dims.begin() + a, Dim::of(1));
    else
      f = Facts{f.dtype, false, {}};  // (axes that do not fit x: its rank was misjudged; claim nothing)
  }
  set_facts(y, f);
  return y;
}

V Builder::squeeze(V x, const std::vector<int64_t>& axes) {
  if (!x.valid()) return x;
  V y = op1("Squeeze", {x, i64s(axes)});
  Facts f = facts(x);
  if (f.has_shape) {
    std::vector<int64_t> sorted;
    for (int64_t a : axes) sorted.push_back(norm_axis(a, f.rank()));
    std::sort(sorted.rbegin(), sorted.rend());
    for (int64_t a : sorted) f.dims.erase(f.dims.begin() + a);
  }
  set_facts(y, f);
  return y;
}

V Builder::transpose(V x, const std::vector<int64_t>& perm) {
  if (!x.valid()) return x;
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity) return x;
  V y = op1("Transpose", {x}, {Attr::ints("perm", perm)});
  Facts f = facts(x);
  if (f.has_shape && f.rank() == static_cast<int64_t>(perm.size())) {
    Facts g = f;
    for (size_t i = 0; i < perm.size(); ++i) g.dims[i] = f.dims[perm[i]];
    f = g;
  }
  set_facts(y, f);
  return y;
}

V Builder::shape_of(V x, int64_t start, std::optional<int64_t> end) {
  // Static dims are a constant. (The whole shape folds in op(), with reuse on; shape_value
  // gives it otherwise.)
  if (start != 0 || end)
    if (const auto dims = static_dims_between(facts(x), start, end.value_or(kWholeShape))) return i64s(*dims);
  Attrs attrs;
  if (start != 0) attrs.push_back(Attr::i("start", start));
  if (end) attrs.push_back(Attr::i("end", *end));
  V y = op1("Shape", {x}, attrs);
  // A folded shape is a constant (shared by every value of that shape: not one value's source).
  if (values_[static_cast<size_t>(y.id)].leaf) return y;
  if (start == 0 && !end) {
    if (static_cast<size_t>(y.id) >= shape_sources_.size()) shape_sources_.resize(values_.size());
    shape_sources_[static_cast<size_t>(y.id)] = x;
  }
  Facts f;
  f.dtype = onnx::TensorProto::INT64;
  int64_t r = rank(x);
  if (r >= 0) {
    int64_t s = std::clamp(norm_axis(start, r), int64_t{0}, r);
    int64_t e = end ? std::clamp(norm_axis(*end, r), int64_t{0}, r) : r;
    f = Facts::of(onnx::TensorProto::INT64, {Dim::of(std::max<int64_t>(0, e - s))});
  }
  set_facts(y, f);
  return y;
}

V Builder::concat(const std::vector<V>& parts, int64_t axis) {
  if (parts.size() == 1) return parts[0];
  // Fold concatenations of known int64 vectors into one constant.
  bool all_known = axis == 0;
  std::vector<int64_t> folded;
  for (V p : parts) {
    const auto* k = known_i64(p);
    if (!k || rank(p) != 1) {
      all_known = false;
      break;
    }
    folded.insert(folded.end(), k->begin(), k->end());
  }
  if (all_known) return i64s(folded);
  V y = op1("Concat", parts, {Attr::i("axis", axis)});
  Facts f = facts(parts[0]);
  if (f.has_shape) {
    int64_t ax = norm_axis(axis, f.rank());
    int64_t total = 0;
    for (V p : parts) {
      const Facts& pf = facts(p);
      if (!pf.has_shape || pf.rank() != f.rank() || !pf.dims[ax].known()) {
        total = -1;
        break;
      }
      total += pf.dims[ax].value();
    }
    f.dims[ax] = total >= 0 ? Dim::of(total) : Dim{};
  }
  set_facts(y, f);
  return y;
}

V Builder::reshape_origin(V x) const {
  for (;;) {
    const int32_t producer = values_[static_cast<size_t>(x.id)].producer;
    if (producer < 0 || static_cast<size_t>(producer) >= emitted_.size()) return x;
    const EmittedInputs& e = emitted_[static_cast<size_t>(producer)];
    if (e.begin == EmittedInputs::kNone || e.count == 0 || emitted_inputs_[e.begin] < 0) return x;
    const std::string& type = out_.node(producer).op_type();
    if (type != "Reshape" && type != "Squeeze" && type != "Unsqueeze" && type != "Flatten") return x;
    x = V{emitted_inputs_[e.begin]};
  }
}

V Builder::reshape(V x, V shape, bool allowzero) {
  if (!x.valid()) return x;
  const Attrs attrs = allowzero ? Attrs{Attr::i("allowzero", 1)} : Attrs{};
  const int32_t dtype = facts(x).dtype;
  if (const auto* k = known_i64(shape)) {
    // A reshape of a reshape is one reshape of the original data (these ops only regroup dims,
    // never reorder elements): a bias's cotangent, summed with its broadcast dims kept, then
    // put back to the bias's shape, is read where it was summed. A 0 in the shape (without
    // allowzero) would copy a dim of the skipped input, so then nothing is skipped.
    if (allowzero || std::find(k->begin(), k->end(), 0) == k->end()) x = reshape_origin(x);
    if (auto dims = reshaped_dims(facts(x), *k, allowzero)) {
      Facts reshaped = Facts::of(dtype, std::move(*dims));
      if (same_static_shape(facts(x), reshaped)) return x;  // to its own static shape
      return op1_known("Reshape", {x, shape}, attrs, std::move(reshaped));
    }
  }
  // To the shape of a value: its dims. (Without allowzero, a 0 in the shape at run time would
  // copy x's dim instead, and a symbolic dim may be 0.)
  if (const V source = shape_source(shape); source.valid() && allowzero && facts(source).has_shape)
    return op1_known("Reshape", {x, shape}, attrs, Facts::of(dtype, Dims(facts(source).dims)));
  V y = op1("Reshape", {x, shape}, attrs);
  // ONNX's inference reads the shape's propagated data (symbolic dims from a Shape node): what
  // it found is at least the rank below.
  if (facts(y).has_shape) return y;
  Facts f;
  f.dtype = dtype;
  const Facts& sf = facts(shape);
  if (sf.has_shape && sf.rank() == 1 && sf.dims[0].known()) {
    f.has_shape = true;
    f.dims.resize(sf.dims[0].value());
    if (const auto* k = known_i64(shape)) {
      for (size_t i = 0; i < k->size(); ++i)
        if ((*k)[i] > 0) f.dims[i] = Dim::of((*k)[i]);
    }
  }
  set_facts(y, f);
  return y;
}

V Builder::reverse_first_axis(V x) {
  const Facts f = facts(x);
  const V y = op1("Slice", {x, i64s({-1}), i64s({std::numeric_limits<int64_t>::min()}), i64s({0}), i64s({-1})});
  set_facts(y, f);
  return y;
}

V Builder::expand(V x, V shape) {
  if (!x.valid()) return x;
  const Facts& xf = facts(x);
  if (const auto* k = known_i64(shape); k && xf.has_shape)
    if (auto dims = expanded_dims(xf.dims, *k))
      return op1_known("Expand", {x, shape}, {}, Facts::of(xf.dtype, std::move(*dims)));
  // To the shape of a value: x's dims broadcast against that value's.
  if (const V source = shape_source(shape); source.valid() && xf.has_shape && facts(source).has_shape)
    if (auto dims = broadcast_dims(xf.dims, facts(source).dims))
      return op1_known("Expand", {x, shape}, {}, Facts::of(xf.dtype, std::move(*dims)));
  V y = op1("Expand", {x, shape});
  if (facts(y).has_shape) return y;  // (as in reshape)
  Facts f;
  f.dtype = facts(x).dtype;
  const Facts& sf = facts(shape);
  if (sf.has_shape && sf.rank() == 1 && sf.dims[0].known() && rank(x) >= 0) {
    f.has_shape = true;
    f.dims.resize(std::max<int64_t>(sf.dims[0].value(), rank(x)));
  }
  set_facts(y, f);
  return y;
}

V Builder::shape_value(V x) {
  const auto dims = static_dims(facts(x));
  return dims ? i64s(*dims) : shape_of(x);
}

}  // namespace onnax
