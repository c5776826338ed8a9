#include <google/protobuf/arena.h>
#include <onnx/defs/schema.h>
#include <onnx/defs/tensor_proto_util.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <deque>
#include <new>
#include <optional>
#include <set>

#include "check/node_check.h"
#include "diagnostics/limits.h"
#include "facts/facts.h"
#include "facts/fast_shapes.h"
#include "facts/schemas.h"
#include "ir/control_flow_outputs.h"
#include "ir/graph_edit.h"

namespace onnax {
namespace {

Facts facts_of_tensor(const onnx::TensorProto& t) {
  Facts f = Facts::of(t.data_type(), {});
  f.dims.reserve(static_cast<size_t>(t.dims_size()));
  for (int64_t d : t.dims()) f.dims.push_back(Dim::of(d));
  return f;
}

// The TypeProtos ONNX's inference functions read, built from the fact table only for the
// nodes that need ONNX's inference (most nodes take the fast shape functions and never pay
// for them). Nodes with subgraphs resolve outer-scope reads through a map of every value; it
// is built the first time such a node comes and kept up to date from then on.
class OnnxTypes {
 public:
  OnnxTypes(const FactTable& table, const NameScope& names) : table_(table), names_(names) {}

  // The map for `node`: its inputs' types, or every value's when it has subgraphs.
  std::unordered_map<std::string, onnx::TypeProto*>& for_node(const onnx::NodeProto& node, const int32_t* input_ids,
                                                              bool has_subgraphs) {
    if (has_subgraphs) {
      if (!all_built_) {
        for (int id = 0; id < table_.size(); ++id) add(all_, id);
        all_built_ = true;
      }
      return all_;
    }
    local_.clear();
    for (int i = 0; i < node.input_size(); ++i)
      if (input_ids[i] >= 0) add(local_, input_ids[i]);
    return local_;
  }
  // The full map (outer scope of subgraphs); filled once a subgraph node needs it.
  std::unordered_map<std::string, onnx::TypeProto*>& all() { return all_; }
  // Keeps the full map current once it exists.
  void defined(int id) {
    if (all_built_) add(all_, id);
  }

 private:
  void add(std::unordered_map<std::string, onnx::TypeProto*>& map, int id) {
    const Facts& f = table_.at(id);
    const onnx::TypeProto* other = table_.non_tensor_type(id);
    if (!other && f.dtype == 0) return;
    onnx::TypeProto* t = google::protobuf::Arena::CreateMessage<onnx::TypeProto>(&arena_);
    if (other)
      t->CopyFrom(*other);
    else
      write_type(f, t, /*keep_internal=*/true);
    map[std::string(names_.name(id))] = t;
  }

  const FactTable& table_;
  const NameScope& names_;
  google::protobuf::Arena arena_;
  std::unordered_map<std::string, onnx::TypeProto*> local_, all_;
  bool all_built_ = false;
};

// The facts a node output's declared type gives when inference cannot confirm it: its dtype,
// rank and symbolic dims, with its sizes unknown. A declaration is only a claim (exporters
// write wrong ones, and ONNX Runtime runs such models, since its kernels take sizes from the
// data); transforms bake known sizes into their results as constants, so they take no size
// inference did not find. (Non-tensor types are kept whole.)
onnx::TypeProto unconfirmed_declaration(const onnx::TypeProto& declared) {
  onnx::TypeProto t = declared;
  if (t.has_tensor_type() && t.tensor_type().has_shape())
    for (auto& d : *t.mutable_tensor_type()->mutable_shape()->mutable_dim())
      if (d.has_dim_value()) d.clear_dim_value();
  return t;
}

bool has_rank(const onnx::TypeProto& t) {
  return t.has_tensor_type() && t.tensor_type().has_shape();
}

// The shape of loop-carried state (Loop, Scan) whose body reads and writes it with declared
// shapes of the same rank (dims they disagree on are unknown). ONNX's inference leaves such outputs without a shape,
// since in general state may change shape between iterations; reverse mode needs the rank of what it differentiates.
// How many times Loop `n` runs when constants (`data`) decide it: a trip count, no condition or
// a true one, and a body that passes its condition along. Its scan outputs then have that many
// rows: the same in every run of an enclosing body, so reverse mode can stack them.
Dim known_trips(const onnx::NodeProto& n, const std::unordered_map<std::string, const onnx::TensorProto*>& data) {
  auto scalar = [&](int i, int32_t dtype) -> std::optional<int64_t> {
    if (i >= n.input_size()) return std::nullopt;
    const auto it = data.find(n.input(i));
    if (it == data.end() || it->second->data_type() != dtype || it->second->dims_size() > 1) return std::nullopt;
    const onnx::TensorProto& t = *it->second;
    if (dtype == onnx::TensorProto::BOOL) {
      if (t.has_raw_data())
        return t.raw_data().size() == 1 ? std::optional<int64_t>(t.raw_data()[0] != 0) : std::nullopt;
      return t.int32_data_size() == 1 ? std::optional<int64_t>(t.int32_data(0) != 0) : std::nullopt;
    }
    try {
      const std::vector<int64_t> v = onnx::ParseData<int64_t>(&t);
      if (v.size() == 1) return v[0];
    } catch (const std::exception&) {
      // (malformed data: unknown)
    }
    return std::nullopt;
  };
  const auto trips = scalar(0, onnx::TensorProto::INT64);
  if (!trips) return Dim{};
  const bool no_condition = n.input_size() < 2 || n.input(1).empty();
  if (!no_condition && scalar(1, onnx::TensorProto::BOOL) != std::optional<int64_t>(1)) return Dim{};
  const onnx::GraphProto* body = graph_attribute(n, "body");
  return body && passes_condition_along(*body) ? Dim::of(std::max<int64_t>(*trips, 0)) : Dim{};
}

// A Loop's scan outputs left untyped (inference without subgraph support, as in the builder)
// get the body's declared type with a leading unknown dim.
void keep_rank(const onnx::NodeProto& n, const Facts& in, std::vector<Facts>& inferred) {
  if (in.rank() < 0 || !(n.domain().empty() || n.domain() == "ai.onnx")) return;
  static const std::set<std::string, std::less<>> same_rank{"Split", "Slice", "Transpose", "Concat",
                                                            "Pad",   "Tile",  "Identity"};
  bool keeps = same_rank.count(n.op_type()) != 0;
  if (n.op_type().rfind("Reduce", 0) == 0) {
    keeps = true;  // keepdims defaults to 1
    for (const auto& a : n.attribute())
      if (a.name() == "keepdims" && a.i() == 0) keeps = false;
  }
  if (!keeps) return;
  for (auto& f : inferred)
    if (!f.has_shape) f = Facts::of(f.dtype ? f.dtype : in.dtype, Dims(static_cast<size_t>(in.rank()), Dim{}));
}

void refine_state_shapes(const onnx::NodeProto& n, std::vector<Facts>& inferred) {
  const bool loop = n.op_type() == "Loop", scan = n.op_type() == "Scan";
  if (!(loop || scan) || !(n.domain().empty() || n.domain() == "ai.onnx")) return;
  const onnx::GraphProto* body = nullptr;
  int64_t scan_inputs = 0;
  for (const auto& a : n.attribute()) {
    if (a.name() == "body" && a.has_g()) body = &a.g();
    if (a.name() == "num_scan_inputs") scan_inputs = a.i();
  }
  if (!body) return;
  const int states = loop ? n.input_size() - 2 : n.input_size() - static_cast<int>(scan_inputs);
  const int in0 = loop ? 2 : 0, out0 = loop ? 1 : 0;
  for (int k = 0; k < states && k < n.output_size() && static_cast<size_t>(k) < inferred.size(); ++k) {
    if (inferred[static_cast<size_t>(k)].has_shape || in0 + k >= body->input_size() || out0 + k >= body->output_size())
      continue;
    const onnx::TypeProto& ti = body->input(in0 + k).type();
    const onnx::TypeProto& to = body->output(out0 + k).type();
    if (!ti.has_tensor_type() || !to.has_tensor_type() || !ti.tensor_type().has_shape() ||
        !to.tensor_type().has_shape())
      continue;
    const Facts fi = facts_from_type(ti), fo = facts_from_type(to);
    if (!fi.has_shape || !fo.has_shape || fi.dims.size() != fo.dims.size()) continue;
    // Dims the two declarations agree on are known; others are unknown (the rank is certain).
    Facts f = fi;
    for (size_t d = 0; d < fi.dims.size(); ++d)
      if (!fi.dims[d].same_as(fo.dims[d])) f.dims[d] = Dim{};
    if (inferred[static_cast<size_t>(k)].dtype) f.dtype = inferred[static_cast<size_t>(k)].dtype;
    inferred[static_cast<size_t>(k)] = std::move(f);
  }
  if (!loop) return;
  for (int k = std::max(states, 0); k < n.output_size() && static_cast<size_t>(k) < inferred.size(); ++k) {
    Facts& out = inferred[static_cast<size_t>(k)];
    if (out.has_shape || out0 + k >= body->output_size() || !body->output(out0 + k).type().has_tensor_type()) continue;
    const Facts per_step = facts_from_type(body->output(out0 + k).type());
    if (!per_step.has_shape) continue;
    Facts f = per_step.with_dim(0, Dim{});
    if (out.dtype) f.dtype = out.dtype;
    out = std::move(f);
  }
}

// ONNX's STFT inference (opset 17 to 28, onnx 1.23) reads a missing `onesided` as 0, but the
// operator's default is 1 (ONNX Runtime and the reference return frame_length / 2 + 1 bins).
// Shapes computed from the wrong count broke reverse mode, so the bins are corrected here.
void correct_stft_bins(const onnx::NodeProto& n, const Facts* in0, std::vector<Facts>& inferred) {
  if (n.op_type() != "STFT" || !(n.domain().empty() || n.domain() == "ai.onnx") || inferred.empty()) return;
  for (const auto& a : n.attribute())
    if (a.name() == "onesided") return;  // stated: ONNX reads it
  Facts& y = inferred[0];
  if (!y.has_shape || y.rank() != 4) return;
  const bool real = in0 && in0->has_shape && in0->rank() == 3 && in0->dims[2].known() && in0->dims[2].value() == 1;
  y.dims[2] = real && y.dims[2].known() ? Dim::of(y.dims[2].value() / 2 + 1) : Dim{};
}

}  // namespace

void refine_inferred(const onnx::NodeProto& node, const Facts* in0, std::vector<Facts>& inferred) {
  refine_state_shapes(node, inferred);
  correct_stft_bins(node, in0, inferred);
  if (in0) keep_rank(node, *in0, inferred);
}

void infer_facts(const onnx::GraphProto& g, const std::unordered_map<std::string, int>& opsets, NameScope& names,
                 const NodeValueIds& node_ids, FactTable& table, const LoopInference& loops) {
  std::unordered_map<std::string, const onnx::TensorProto*> data;
  std::unordered_map<std::string, const onnx::SparseTensorProto*> sparse;
  std::vector<const onnx::ValueInfoProto*> declared(static_cast<size_t>(names.size()), nullptr);  // by id
  std::deque<onnx::TensorProto> constants;  // Constant nodes' values (stable addresses)
  auto id_of = [&](const std::string& name) { return names.id(name); };
  table.cover(names.size());
  for (const auto& t : g.initializer()) {
    table.set(id_of(t.name()), facts_of_tensor(t));
    data[t.name()] = &t;
  }
  for (const auto& s : g.sparse_initializer()) {
    table.set(id_of(s.values().name()), facts_of_tensor(s.values()));
    sparse[s.values().name()] = &s;
  }
  for (const auto& vi : g.input())
    if (table.at(id_of(vi.name())).dtype == 0) table.set_type(id_of(vi.name()), vi.type());
  auto declare = [&](const onnx::ValueInfoProto& vi) {
    const int id = id_of(vi.name());
    if (id >= 0 && static_cast<size_t>(id) < declared.size()) declared[static_cast<size_t>(id)] = &vi;
  };
  for (const auto& vi : g.value_info()) declare(vi);
  for (const auto& vi : g.output()) declare(vi);

  const auto default_domain = opsets.find("");
  const int default_opset = default_domain == opsets.end() ? 0 : default_domain->second;
  const onnx::ShapeInferenceOptions options(/*check_type=*/false, /*error_mode=*/0, /*data_prop=*/true);
  onnx::shape_inference::DataValueMap generated;
  OnnxTypes onnx_types(table, names);
  onnx::shape_inference::GraphInferenceContext graph_ctx(onnx_types.all(), opsets, nullptr, {},
                                                         onnx::OpSchemaRegistry::Instance(), &generated);
  // Stores what was inferred for output `id`: a declared type wins where inference found
  // none, or only a dtype where the declaration gives a rank, less its sizes
  // (unconfirmed_declaration). Unknown dims get symbols of their own (name_unknown_dims).
  auto record = [&](int id, const std::string& name, Facts& f, const onnx::TypeProto* other) {
    if (name.empty()) return;
    const onnx::ValueInfoProto* d =
        id >= 0 && static_cast<size_t>(id) < declared.size() ? declared[static_cast<size_t>(id)] : nullptr;
    const bool inferred_typed = f.dtype != 0 || other;
    if (d && d->has_type() && (!inferred_typed || (!other && !f.has_shape && has_rank(d->type())))) {
      const onnx::TypeProto t = unconfirmed_declaration(d->type());
      if (!t.has_tensor_type()) {
        table.set_type(id, t);
      } else {
        Facts df = facts_from_type(t);
        name_unknown_dims(df, names);
        table.set(id, std::move(df));
      }
    } else if (other) {
      table.set_type(id, *other);
    } else {
      name_unknown_dims(f, names);
      table.set(id, std::move(f));
    }
    onnx_types.defined(id);
  };
  SchemaCache schemas;
  std::vector<const Facts*> in_facts;
  std::vector<Facts> inferred;
  std::vector<std::optional<onnx::TypeProto>> non_tensor;  // outputs ONNX types as non-tensors
  for (int ni = 0; ni < g.node_size(); ++ni) {
    limits::poll();
    const onnx::NodeProto& n = g.node(ni);
    const int32_t* input_ids = node_ids.inputs(ni);
    const int32_t* output_ids = node_ids.outputs(ni, n.input_size());
    in_facts.assign(static_cast<size_t>(n.input_size()), nullptr);
    for (int i = 0; i < n.input_size(); ++i)
      if (input_ids[i] >= 0) in_facts[static_cast<size_t>(i)] = &table.at(input_ids[i]);
    inferred.resize(static_cast<size_t>(n.output_size()));
    for (Facts& f : inferred) f = Facts{};
    const bool fast =
        n.output_size() == 1 && fast_infer(n, n.input_size(), 1, default_opset, in_facts.data(), inferred[0]);
    if (fast) {
      // The common case: one tensor output, typed by the fast shape functions.
      record(output_ids[0], n.output(0), inferred[0], nullptr);
      continue;
    }
    if (!inferred.empty()) inferred[0] = Facts{};
    non_tensor.assign(static_cast<size_t>(n.output_size()), std::nullopt);
    const std::string domain = n.domain() == "ai.onnx" ? "" : n.domain();
    auto op = opsets.find(domain);
    const onnx::OpSchema* schema = op == opsets.end() ? nullptr : schemas.find(n.op_type(), domain, op->second);
    // ONNX's inference functions trust the node to fit its schema: some crash on one that does
    // not (GatherND with batch_dims -5). Such a node keeps unknown facts here; the transform
    // reports the defect if it has to rewrite the node.
    // (Constant values are not looked up: ONNX checks the values it reads.)
    const NodeInputFactsOf known(
        [&](int i) {
          const Facts* f = i < n.input_size() ? in_facts[static_cast<size_t>(i)] : nullptr;
          return f ? f->rank() : int64_t{-1};
        },
        [](int) -> const std::vector<int64_t>* { return nullptr; });
    // ONNX's context takes the node mutably only because inferring a subgraph attribute
    // (If/Loop/Scan bodies) records value_info in it; such nodes get a private copy so the
    // graph (possibly the caller's source model) is never written. The copy's bodies then
    // carry the types inferred for their inputs and outputs, which refine_inferred reads
    // (exporters such as onnxscript leave Loop bodies' inputs and outputs untyped).
    std::optional<onnx::NodeProto> with_subgraphs;
    if (schema && schema->has_type_and_shape_inference_function() &&
        node_defect(*schema, n, input_ids, known).empty()) {
      try {
        for (const auto& a : n.attribute())
          if (a.has_g() || a.graphs_size() > 0) with_subgraphs = n;
        onnx::NodeProto& node = with_subgraphs ? *with_subgraphs : const_cast<onnx::NodeProto&>(n);
        auto& types = onnx_types.for_node(n, input_ids, with_subgraphs.has_value());
        onnx::shape_inference::InferenceContextImpl ctx(node, types, data, sparse, options, &generated, &graph_ctx);
        schema->GetTypeAndShapeInferenceFunction()(ctx);
        for (int i = 0; i < n.output_size(); ++i) {
          const onnx::TypeProto* t = ctx.getOutputType(i);
          if (!t || t->value_case() == onnx::TypeProto::VALUE_NOT_SET) continue;
          if (t->has_tensor_type())
            inferred[static_cast<size_t>(i)] = facts_from_type(*t);
          else
            non_tensor[static_cast<size_t>(i)] = *t;
        }
        if (schema->has_data_propagation_function() && data_propagation_is_bounded(in_facts.data(), in_facts.size())) {
          onnx::shape_inference::DataPropagationContextImpl dctx(node, types, data, generated);
          schema->GetDataPropagationFunction()(dctx);
        }
      } catch (const std::bad_alloc&) {
        throw;  // (out of memory is an error, not an unknown type)
      } catch (const std::exception&) {
        // Inference is best effort here: declared types (below) and the rules' own
        // diagnostics cover values it cannot type.
      }
    }
    refine_inferred(with_subgraphs ? *with_subgraphs : n,
                    n.input_size() > 0 && input_ids[0] >= 0 ? &table.at(input_ids[0]) : nullptr,
                    inferred);  // (Only for outputs ONNX left short: inferring a body is the expensive part.)
    const bool short_of_dims = std::any_of(inferred.begin(), inferred.end(), [](const Facts& f) {
      return !f.has_shape || std::any_of(f.dims.begin(), f.dims.end(), [](Dim d) { return !d.known(); });
    });
    if (loops && short_of_dims && n.op_type() == "Loop" && (n.domain().empty() || n.domain() == "ai.onnx")) {
      static const Facts kUnknown;
      std::vector<const Facts*> in;
      for (const Facts* f : in_facts) in.push_back(f ? f : &kUnknown);
      auto outer = [&](std::string_view name) -> const Facts* {
        const int id = names.id(name);
        return id < 0 ? nullptr : &table.at(id);
      };
      const std::vector<Facts> refined = loops(n, in, known_trips(n, data), outer);
      for (size_t i = 0; i < refined.size() && i < inferred.size(); ++i) refine_with(inferred[i], refined[i]);
    }

    if (auto t = constant_tensor(n)) {
      constants.push_back(std::move(*t));
      inferred[0] = facts_of_tensor(constants.back());
      data[n.output(0)] = &constants.back();
    }
    for (int i = 0; i < n.output_size(); ++i) {
      const auto& other = non_tensor[static_cast<size_t>(i)];
      record(output_ids[i], n.output(i), inferred[static_cast<size_t>(i)], other ? &*other : nullptr);
    }
  }
  for (const auto& vi : g.output())
    if (table.at(id_of(vi.name())).dtype == 0 && vi.has_type()) table.set_type(id_of(vi.name()), vi.type());
}

}  // namespace onnax
