#include "transforms/prepare.h"

#include <onnx/common/status.h>
#include <onnx/defs/schema.h>
#include <onnx/inliner/inliner.h>
#include <onnx/version_converter/convert.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_map>

#include "check/node_check.h"
#include "diagnostics/error.h"
#include "notice.h"
#include "rules/user_rules.h"
#include "transforms/contrib_ops.h"
#include "transforms/dropout_masks.h"
#include "transforms/inline_size.h"
#include "transforms/subgraph.h"

namespace onnax {

int64_t default_opset(const onnx::ModelProto& m) {
  for (const auto& o : m.opset_import())
    if (is_default_domain(o.domain())) return o.version();
  return -1;
}

void check_opset_imports(const onnx::ModelProto& m, const std::string& mode) {
  std::unordered_map<std::string, int64_t> seen;
  for (const auto& o : m.opset_import()) {
    const std::string domain = is_default_domain(o.domain()) ? "ai.onnx" : o.domain();
    const auto [it, added] = seen.emplace(domain, o.version());
    if (!added && it->second != o.version())
      diag::fail(Error::Kind::kInvalidModel,
                 mode + ": invalid model: it imports domain '" + domain + "' twice, at opsets " +
                     std::to_string(it->second) + " and " + std::to_string(o.version()) +
                     ". Fix: keep one opset_import entry per domain, with the version the model was written for");
  }
}

namespace {

// Reserves the names of `g` (and its subgraphs) that index_graph did not: output and
// value_info names, and everything inside subgraphs (`nested`, where node names too; the
// top-level graph's node names were reserved while indexing it).
void collect_names(const onnx::GraphProto& g, Prepared& p, bool nested) {
  for (const auto& vi : g.output()) p.value_names.reserve(vi.name());
  for (const auto& vi : g.value_info()) p.value_names.reserve(vi.name());
  if (nested) {
    for (const auto& vi : g.input()) p.value_names.reserve(vi.name());
    for (const auto& t : g.initializer()) p.value_names.reserve(t.name());
    for (const auto& s : g.sparse_initializer()) p.value_names.reserve(s.values().name());
  }
  auto subgraphs = [&](const onnx::NodeProto& n) {
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_names(a.g(), p, true);
      for (const auto& sg : a.graphs()) collect_names(sg, p, true);
    }
  };
  if (nested) {
    for (const auto& n : g.node()) {
      if (!n.name().empty()) p.node_names.reserve(n.name());
      for (const auto& o : n.output()) p.value_names.reserve(o);
      subgraphs(n);
    }
  } else {
    for (int ni : p.nodes_with_subgraphs) subgraphs(g.node(ni));
  }
  auto add_dims = [&](const onnx::ValueInfoProto& vi) {
    if (!vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
    for (const auto& d : vi.type().tensor_type().shape().dim())
      if (d.has_dim_param()) p.dim_params.insert(d.dim_param());
  };
  for (const auto& vi : g.input()) add_dims(vi);
  for (const auto& vi : g.output()) add_dims(vi);
  for (const auto& vi : g.value_info()) add_dims(vi);
}

// Interns every value name of the top-level graph in `names` and records each node's input
// and output ids. True when every node reads only values defined before it and every name is
// defined once (the common case, checked in the same single pass); false means the graph must
// be sorted (or is invalid, which sort_nodes reports) and indexed again. On the way, reserves
// the node names in `node_names` and lists the nodes that have subgraphs, so no other pass
// over the top-level nodes is needed for them.
bool index_graph(const onnx::GraphProto& g, NameScope& names, NodeValueIds& index, NameScope& node_names,
                 std::vector<int>& nodes_with_subgraphs) {
  index.ids.clear();
  index.offsets.clear();
  index.offsets.reserve(static_cast<size_t>(g.node_size()));
  index.input_counts.clear();
  index.input_counts.reserve(static_cast<size_t>(g.node_size()));
  // Size the name table and the id list once (growing them rehashes and copies), from an
  // estimate, since counting exactly would be one more pass over the nodes: most nodes have
  // one output and a few inputs; room is left for the names a transform generates.
  const size_t values = static_cast<size_t>(g.input_size() + g.initializer_size() + g.sparse_initializer_size()) +
                        static_cast<size_t>(g.node_size()) * 9 / 8 + 64;
  names.expect(static_cast<size_t>(names.size()) + values);
  index.ids.reserve(static_cast<size_t>(g.node_size()) * 3);
  nodes_with_subgraphs.clear();
  // Exporters name all nodes or none: judge by the first.
  if (g.node_size() > 0 && !g.node(0).name().empty())
    node_names.expect(static_cast<size_t>(node_names.size() + g.node_size()) * 9 / 8 + 64);
  std::vector<char> defined(static_cast<size_t>(names.size()) + values);
  auto define = [&](const std::string& name) {
    const int id = names.intern(name);
    if (static_cast<size_t>(id) >= defined.size()) defined.resize(static_cast<size_t>(id) + 1 + defined.size() / 2);
    const bool fresh = !defined[static_cast<size_t>(id)];
    defined[static_cast<size_t>(id)] = 1;
    return std::pair<int, bool>(id, fresh);
  };
  auto is_defined = [&](const std::string& name) {
    const int id = names.id(name);
    return id >= 0 && static_cast<size_t>(id) < defined.size() && defined[static_cast<size_t>(id)];
  };
  for (const auto& vi : g.input()) define(vi.name());
  for (const auto& t : g.initializer()) define(t.name());
  for (const auto& sp : g.sparse_initializer()) define(sp.values().name());
  bool sorted = true;
  constexpr int kAhead = 8;  // nodes: enough to cover a miss to memory
  for (int ni = 0; ni < g.node_size(); ++ni) {
    const onnx::NodeProto& node = g.node(ni);
    if (ni + kAhead < g.node_size())
      for (const auto& o : g.node(ni + kAhead).output()) names.prefetch(Interner::hashed(o));
    index.offsets.push_back(static_cast<uint32_t>(index.ids.size()));
    index.input_counts.push_back(static_cast<uint32_t>(node.input_size()));
    if (!node.name().empty()) node_names.reserve(node.name());
    const bool nested = has_subgraphs(node);
    if (nested) nodes_with_subgraphs.push_back(ni);
    for (const auto& in : node.input()) {
      if (in.empty()) {
        index.ids.push_back(-1);
        continue;
      }
      const int id = names.id(in);
      sorted = sorted && id >= 0 && static_cast<size_t>(id) < defined.size() && defined[static_cast<size_t>(id)];
      index.ids.push_back(id >= 0 ? id : names.intern(in));
    }
    if (sorted && nested)
      for (const auto& r : outer_scope_reads(node)) sorted = sorted && is_defined(r);
    for (const auto& o : node.output()) {
      if (o.empty()) {
        index.ids.push_back(-1);
        continue;
      }
      auto [id, fresh] = define(o);
      sorted = sorted && fresh;
      index.ids.push_back(id);
    }
  }
  for (const auto& o : g.output()) sorted = sorted && is_defined(o.name());
  return sorted;
}

}  // namespace

namespace {}  // namespace

std::unordered_map<std::string, int> model_opsets(const Prepared& p) {
  std::unordered_map<std::string, int> opsets;
  for (const auto& o : p.model->opset_import())
    opsets[o.domain() == "ai.onnx" ? std::string() : o.domain()] = static_cast<int>(o.version());
  opsets[""] = static_cast<int>(p.opset);
  return opsets;
}

namespace {

// Copies every field of `from` except its graph into `to` (fields by reflection, so none is
// forgotten, and unknown fields too, so a round trip loses nothing).
void copy_all_but_graph(const onnx::ModelProto& from, onnx::ModelProto* to) {
  using google::protobuf::FieldDescriptor;
  const auto* rf = from.GetReflection();
  const auto* rt = to->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  rf->ListFields(from, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->number() == onnx::ModelProto::kGraphFieldNumber) continue;
    if (!f->is_repeated()) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32: rt->SetInt32(to, f, rf->GetInt32(from, f)); break;
        case FieldDescriptor::CPPTYPE_INT64: rt->SetInt64(to, f, rf->GetInt64(from, f)); break;
        case FieldDescriptor::CPPTYPE_UINT32: rt->SetUInt32(to, f, rf->GetUInt32(from, f)); break;
        case FieldDescriptor::CPPTYPE_UINT64: rt->SetUInt64(to, f, rf->GetUInt64(from, f)); break;
        case FieldDescriptor::CPPTYPE_DOUBLE: rt->SetDouble(to, f, rf->GetDouble(from, f)); break;
        case FieldDescriptor::CPPTYPE_FLOAT: rt->SetFloat(to, f, rf->GetFloat(from, f)); break;
        case FieldDescriptor::CPPTYPE_BOOL: rt->SetBool(to, f, rf->GetBool(from, f)); break;
        case FieldDescriptor::CPPTYPE_ENUM: rt->SetEnumValue(to, f, rf->GetEnumValue(from, f)); break;
        case FieldDescriptor::CPPTYPE_STRING: rt->SetString(to, f, rf->GetString(from, f)); break;
        case FieldDescriptor::CPPTYPE_MESSAGE: rt->MutableMessage(to, f)->CopyFrom(rf->GetMessage(from, f)); break;
      }
      continue;
    }
    for (int i = 0; i < rf->FieldSize(from, f); ++i) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32: rt->AddInt32(to, f, rf->GetRepeatedInt32(from, f, i)); break;
        case FieldDescriptor::CPPTYPE_INT64: rt->AddInt64(to, f, rf->GetRepeatedInt64(from, f, i)); break;
        case FieldDescriptor::CPPTYPE_UINT32: rt->AddUInt32(to, f, rf->GetRepeatedUInt32(from, f, i)); break;
        case FieldDescriptor::CPPTYPE_UINT64: rt->AddUInt64(to, f, rf->GetRepeatedUInt64(from, f, i)); break;
        case FieldDescriptor::CPPTYPE_DOUBLE: rt->AddDouble(to, f, rf->GetRepeatedDouble(from, f, i)); break;
        case FieldDescriptor::CPPTYPE_FLOAT: rt->AddFloat(to, f, rf->GetRepeatedFloat(from, f, i)); break;
        case FieldDescriptor::CPPTYPE_BOOL: rt->AddBool(to, f, rf->GetRepeatedBool(from, f, i)); break;
        case FieldDescriptor::CPPTYPE_ENUM: rt->AddEnumValue(to, f, rf->GetRepeatedEnumValue(from, f, i)); break;
        case FieldDescriptor::CPPTYPE_STRING: rt->AddString(to, f, rf->GetRepeatedString(from, f, i)); break;
        case FieldDescriptor::CPPTYPE_MESSAGE:
          rt->AddMessage(to, f)->CopyFrom(rf->GetRepeatedMessage(from, f, i));
          break;
      }
    }
  }
  to->GetReflection()->MutableUnknownFields(to)->MergeFrom(rf->GetUnknownFields(from));
}

}  // namespace

void collect_runtime_inputs(Prepared& p) {
  p.runtime_inputs.clear();
  for (const auto& vi : p.graph->input())
    if (!p.initializer_names.count(vi.name())) p.runtime_inputs.push_back(&vi);
}

onnx::GraphProto& mutable_graph(Prepared& p) {
  if (p.graph != &p.model->graph()) {
    *p.model->mutable_graph() = *p.graph;
    p.graph = &p.model->graph();
    collect_runtime_inputs(p);
  }
  return *p.model->mutable_graph();
}

std::vector<NodePtr> take_nodes(Prepared& p) {
  std::vector<NodePtr> owned;
  if (p.graph != &p.model->graph()) return owned;
  const int count = p.graph->node_size();
  owned.resize(static_cast<size_t>(count));
  // Through a small buffer: one large array of raw pointers beside `owned` would be a second
  // allocation of the graph's size. From the end, so no extraction shifts the rest.
  onnx::NodeProto* taken[1024];
  auto* nodes = p.model->mutable_graph()->mutable_node();
  const bool on_arena = p.model->GetArena() != nullptr;
  for (int end = count; end > 0;) {
    const int n = std::min(1024, end);
    // (On an arena, the nodes themselves: ExtractSubrange would copy each to the heap.)
    if (on_arena)
      nodes->UnsafeArenaExtractSubrange(end - n, n, taken);
    else
      nodes->ExtractSubrange(end - n, n, taken);
    end -= n;
    for (int i = 0; i < n; ++i) owned[static_cast<size_t>(end + i)].reset(taken[i]);
  }
  return owned;
}

void take_initializers(Prepared& p, onnx::GraphProto& out) {
  if (p.graph == &p.model->graph()) {
    out.mutable_initializer()->Swap(p.model->mutable_graph()->mutable_initializer());
    out.mutable_sparse_initializer()->Swap(p.model->mutable_graph()->mutable_sparse_initializer());
  } else {
    *out.mutable_initializer() = p.graph->initializer();
    *out.mutable_sparse_initializer() = p.graph->sparse_initializer();
  }
}

namespace {
void prepare_graph(Prepared& p, const std::string& mode);
}  // namespace

Prepared prepare(const onnx::ModelProto& source, const std::string& mode) {
  Prepared p;
  p.owned_model = std::make_unique<onnx::ModelProto>();
  p.model = p.owned_model.get();
  copy_all_but_graph(source, p.model);
  p.graph = &source.graph();
  if (!source.has_graph())
    diag::fail(Error::Kind::kInvalidModel,
               mode + ": the model has no graph. Fix: pass an ONNX ModelProto with a graph");
  prepare_graph(p, mode);
  return p;
}

Prepared prepare(onnx::ModelProto&& source, const std::string& mode) {
  Prepared p;
  if (!source.has_graph())
    diag::fail(Error::Kind::kInvalidModel,
               mode + ": the model has no graph. Fix: pass an ONNX ModelProto with a graph");
  p.owned_model = std::make_unique<onnx::ModelProto>(std::move(source));
  p.model = p.owned_model.get();
  p.graph = &p.model->graph();
  prepare_graph(p, mode);
  return p;
}

Prepared prepare_in_place(onnx::ModelProto& model, const std::string& mode) {
  Prepared p;
  if (!model.has_graph())
    diag::fail(Error::Kind::kInvalidModel,
               mode + ": the model has no graph. Fix: pass an ONNX ModelProto with a graph");
  p.model = &model;
  p.graph = &p.model->graph();
  prepare_graph(p, mode);
  return p;
}

namespace {

// Every default-domain node, subgraphs included, must pass what the transforms check without
// shapes (node_defect: required inputs and attributes, named subgraph outputs, Einsum
// equations, per-axis attribute lengths, ...) and its schema's own check, as onnx.checker runs
// it, before ONNX's inference or version converter sees it: both trust the nodes they read (the
// converter crashes on a Reduce node with two `axes` attributes, inference on an Einsum with no
// equation, and loops forever on some malformed ones).
void verify_nodes(const onnx::GraphProto& g, int opset, const std::string& mode, bool converting,
                  std::unordered_map<std::string, int64_t> declared_ranks = {}) {
  // (Ranks as declared, for the checks that need one: the graph's and enclosing graphs'.)
  auto declare = [&](const onnx::ValueInfoProto& vi) {
    if (vi.type().has_tensor_type() && vi.type().tensor_type().has_shape())
      declared_ranks[vi.name()] = vi.type().tensor_type().shape().dim_size();
  };
  for (const auto& vi : g.input()) declare(vi);
  for (const auto& vi : g.value_info()) declare(vi);
  for (const auto& t : g.initializer()) declared_ranks[t.name()] = t.dims_size();
  for (const auto& n : g.node()) {
    if (n.domain().empty() || n.domain() == "ai.onnx")
      if (const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(n.op_type(), opset, "")) {
        std::vector<int32_t> ids;  // (as the index has them: inputs, then outputs)
        for (const auto& in : n.input()) ids.push_back(in.empty() ? -1 : 0);
        for (const auto& out : n.output()) ids.push_back(out.empty() ? -1 : 0);
        const NodeInputFactsOf declared(
            [&](int i) {
              const auto it = i < n.input_size() ? declared_ranks.find(n.input(i)) : declared_ranks.end();
              return it == declared_ranks.end() ? int64_t{-1} : it->second;
            },
            [](int) -> const std::vector<int64_t>* { return nullptr; });
        if (const std::string defect = node_defect(*schema, n, ids.data(), declared); !defect.empty())
          diag::fail(Error::Kind::kInvalidModel, mode + ": invalid model: " + diag::op_at(n, opset) + " " + defect);
        try {
          // (A deprecated schema fails Verify on any node; ONNX Runtime still runs those ops,
          // and their rules exist: GroupNormalization at opset 18.)
          if (!schema->Deprecated()) schema->Verify(n);
        } catch (const std::exception& e) {
          std::string why = e.what();
          why = why.substr(0, why.find('\n'));  // (the rest is the checker's context lines)
          while (!why.empty() && (why.back() == '.' || why.back() == ' ')) why.pop_back();
          diag::fail(Error::Kind::kInvalidModel,
                     mode + ": invalid model: " + diag::op_at(n, opset) + ": " + why +
                         ". Fix: repair the node (onnx.checker.check_model reports it)" +
                         (converting ? "; onnax upgrades models below opset " + std::to_string(kMinOpset) +
                                           " with ONNX's version converter, which needs valid nodes"
                                     : std::string()));
        }
      }
    for (const auto& a : n.attribute()) {
      if (a.has_g()) verify_nodes(a.g(), opset, mode, converting, declared_ranks);
      for (const auto& sub : a.graphs()) verify_nodes(sub, opset, mode, converting, declared_ranks);
    }
  }
}

// Whether `g` or a subgraph of it has a default-domain node of type `op`.
bool contains_op(const onnx::GraphProto& g, std::string_view op) {
  for (const auto& n : g.node()) {
    if (n.op_type() == op && (n.domain().empty() || n.domain() == "ai.onnx")) return true;
    for (const auto& a : n.attribute()) {
      if (a.has_g() && contains_op(a.g(), op)) return true;
      for (const auto& sg : a.graphs())
        if (contains_op(sg, op)) return true;
    }
  }
  return false;
}

// Local functions are found by domain and name, not by version, so the version a model or a
// function imports a domain of local functions at is bookkeeping. jax2onnx writes functions
// that import their own domain at version 18 where the model imports it at 1, and ONNX's
// inliner silently skips every function whose imports disagree with the model's: such imports
// take the model's version.
void reconcile_function_domains(onnx::ModelProto& m) {
  std::unordered_set<std::string> local;
  for (const auto& f : m.functions()) local.insert(f.domain());
  std::unordered_map<std::string, int64_t> imported;
  for (const auto& o : m.opset_import()) imported[o.domain()] = o.version();
  for (auto& f : *m.mutable_functions())
    for (auto& o : *f.mutable_opset_import()) {
      auto it = imported.find(o.domain());
      if (local.count(o.domain()) && it != imported.end()) o.set_version(it->second);
    }
}

std::string opset_list(const google::protobuf::RepeatedPtrField<onnx::OperatorSetIdProto>& opsets) {
  std::string out;
  for (const auto& o : opsets)
    out += (out.empty() ? "" : ", ") + (o.domain().empty() ? std::string("ai.onnx") : o.domain()) + ":" +
           std::to_string(o.version());
  return out;
}

// Whether `g` or a subgraph of it calls function `f`.
bool calls(const onnx::GraphProto& g, const onnx::FunctionProto& f) {
  for (const auto& n : g.node()) {
    if (n.op_type() == f.name() && n.domain() == f.domain()) return true;
    for (const auto& a : n.attribute()) {
      if (a.has_g() && calls(a.g(), f)) return true;
      for (const auto& sg : a.graphs())
        if (calls(sg, f)) return true;
    }
  }
  return false;
}

// The definitions users registered (onnax/rules.h) for operators the graph calls, added as
// model-local functions, so the inlining below runs every transform through them. jvp, vjp and
// grad keep an operator that also has a registered JVP (its rule then differentiates it).
void add_user_bodies(Prepared& p, const std::string& mode) {
  const std::shared_ptr<const UserRules> user = user_rules();
  std::vector<onnx::FunctionProto> wanted;
  for (const UserRule* r : user->bodies()) {
    if (mode != "vmap" && r->jvp) continue;
    if ((mode == "vjp" || mode == "grad") && r->vjp) continue;  // (reverse mode keeps the op)
    onnx::FunctionProto f = *r->body;
    f.set_domain(r->domain == "ai.onnx" ? std::string() : r->domain);
    f.set_name(r->op);
    bool defined = false;  // (the model's own definition wins)
    for (const auto& g : p.model->functions()) defined = defined || (g.domain() == f.domain() && g.name() == f.name());
    if (!defined && calls(*p.graph, f)) wanted.push_back(std::move(f));
  }
  if (wanted.empty()) return;
  mutable_graph(p);
  for (auto& f : wanted) {
    if (f.opset_import_size() == 0)
      for (const auto& o : p.model->opset_import()) *f.add_opset_import() = o;
    *p.model->add_functions() = std::move(f);
  }
}

// Dropout with a constant ratio of 0 is the identity in either mode (the mask keeps every
// element, the scale is 1), whatever its training_mode: exporters write it so with a run-time
// mode (jax2onnx's `deterministic` flag becomes an input), which no rule could otherwise batch
// or differentiate. Such nodes whose mask output is unused become Identity nodes.
bool is_zero_scalar(const onnx::TensorProto& t) {
  if (t.dims_size() > 1 || (t.dims_size() == 1 && t.dims(0) != 1)) return false;
  if (t.data_type() == onnx::TensorProto::FLOAT)
    return t.float_data_size() == 1 ? t.float_data(0) == 0.0f : t.raw_data() == std::string(4, '\0');
  if (t.data_type() == onnx::TensorProto::DOUBLE)
    return t.double_data_size() == 1 ? t.double_data(0) == 0.0 : t.raw_data() == std::string(8, '\0');
  return false;
}

void fold_zero_dropouts(Prepared& p) {
  auto dropout = [](const onnx::NodeProto& n) {
    return n.op_type() == "Dropout" && (n.domain().empty() || n.domain() == "ai.onnx") && n.input_size() >= 2 &&
           !n.input(1).empty() && (n.output_size() < 2 || n.output(1).empty());
  };
  const onnx::GraphProto& source = *p.graph;
  if (std::none_of(source.node().begin(), source.node().end(), dropout)) return;
  // Names of constant zero scalars: Constant nodes and initializers no input can override.
  std::unordered_set<std::string> zeros, fed;
  for (const auto& vi : source.input()) fed.insert(vi.name());
  for (const auto& t : source.initializer())
    if (!fed.count(t.name()) && is_zero_scalar(t)) zeros.insert(t.name());
  for (const auto& n : source.node())
    if (n.op_type() == "Constant" && n.output_size() == 1)
      if (const auto t = constant_tensor(n); t && is_zero_scalar(*t)) zeros.insert(n.output(0));
  auto identity = [&](const onnx::NodeProto& n) { return dropout(n) && zeros.count(n.input(1)); };
  if (std::none_of(source.node().begin(), source.node().end(), identity)) return;
  onnx::GraphProto& g = mutable_graph(p);
  for (auto& n : *g.mutable_node()) {
    if (!identity(n)) continue;
    n.set_op_type("Identity");
    n.mutable_input()->DeleteSubrange(1, n.input_size() - 1);
    n.clear_attribute();
    if (n.output_size() > 1) n.mutable_output()->DeleteSubrange(1, n.output_size() - 1);
  }
  // The ratios' Constant nodes nothing reads any more go too (no dead nodes left behind).
  std::unordered_set<std::string> read;
  std::function<void(const onnx::GraphProto&)> reads = [&](const onnx::GraphProto& sg) {
    for (const auto& n : sg.node()) {
      for (const auto& i : n.input()) read.insert(i);
      for (const auto& a : n.attribute()) {
        if (a.has_g()) reads(a.g());
        for (const auto& sub : a.graphs()) reads(sub);
      }
    }
    for (const auto& o : sg.output()) read.insert(o.name());
  };
  reads(g);
  auto* nodes = g.mutable_node();
  int kept = 0;
  for (int i = 0; i < nodes->size(); ++i) {
    const onnx::NodeProto& n = nodes->Get(i);
    if (n.op_type() == "Constant" && n.output_size() == 1 && zeros.count(n.output(0)) && !read.count(n.output(0)))
      continue;
    if (kept != i) nodes->SwapElements(kept, i);
    ++kept;
  }
  nodes->DeleteSubrange(kept, nodes->size() - kept);
}

// Orders and indexes p's graph, collects its names and infers the facts of its values.
void index_and_infer(Prepared& p) {
  if (!index_graph(*p.graph, p.value_names, p.node_ids, p.node_names, p.nodes_with_subgraphs)) {
    sort_nodes(mutable_graph(p));
    index_graph(*p.graph, p.value_names, p.node_ids, p.node_names, p.nodes_with_subgraphs);
  }
  const auto& g = *p.graph;
  collect_names(g, p, false);
  for (const auto& t : g.initializer()) p.initializer_names.insert(t.name());
  for (const auto& s : g.sparse_initializer()) p.initializer_names.insert(s.values().name());

  // Facts: ONNX's per-node inference over the sorted graph plus the model's annotations.
  infer_facts(g, model_opsets(p), p.value_names, p.node_ids, p.facts,
              [opsets = model_opsets(p)](const onnx::NodeProto& loop, const std::vector<const Facts*>& in, Dim trips,
                                         const std::function<const Facts*(std::string_view)>& outer) {
                return loop_output_facts(loop, in, trips, opsets, outer);
              });
}

void prepare_graph(Prepared& p, const std::string& mode) {
  check_opset_imports(*p.model, mode);
  int64_t opset = default_opset(*p.model);
  p.source_opset = opset;
  const std::string interval = "supported: " + std::to_string(kMinOpset) + "-" + std::to_string(kMaxOpset) + " (" +
                               std::to_string(kMinConvertibleOpset) + "-" + std::to_string(kMinOpset - 1) +
                               " are upgraded to " + std::to_string(kMinOpset) + " automatically)";
  if (opset < 0)
    diag::fail(Error::Kind::kVersion,
               mode + ": the model imports no default-domain (ai.onnx) opset; " + interval +
                   ". Fix: add an opset_import entry for domain \"\" with the opset the model was written for");
  if (opset > kMaxOpset || opset < kMinConvertibleOpset)
    diag::fail(Error::Kind::kVersion,
               mode + ": the model's ai.onnx opset is " + std::to_string(opset) + "; " + interval +
                   ". Fix: convert the model with onnx.version_converter.convert_version(model, " +
                   std::to_string(opset > kMaxOpset ? kMaxOpset : kMinOpset) + ") first");
  add_user_bodies(p, mode);
  if (p.model->functions_size() > 0) {
    if (const auto problem = inline_size_problem(*p.model, mode)) diag::fail(problem->first, problem->second);
    mutable_graph(p);  // inlining rewrites the graph
    reconcile_function_domains(*p.model);
    try {
      onnx::inliner::InlineLocalFunctions(*p.model, /*convert_version=*/true);
    } catch (const std::exception& e) {
      diag::fail(Error::Kind::kUnsupported,
                 mode + ": could not inline the model's local functions: " + std::string(e.what()) +
                     ". Fix: inline them before transforming (onnx.inliner.inline_local_functions)");
    }
    // The inliner leaves a function whose opset imports disagree with the model's on a standard
    // domain other than ai.onnx; its calls would then read as unknown ops.
    for (const auto& f : p.model->functions()) {
      if (!calls(p.model->graph(), f)) continue;
      diag::fail(Error::Kind::kUnsupported,
                 mode + ": could not inline local function " + f.domain() + "::" + f.name() +
                     ": its opset imports disagree with the model's (" + opset_list(f.opset_import()) +
                     " against the model's " + opset_list(p.model->opset_import()) +
                     "). Fix: import each domain at one version in the model and its functions");
    }
  }
  fold_zero_dropouts(p);
  if (opset < 9 && contains_op(*p.graph, "Scan"))
    diag::fail(Error::Kind::kVersion,
               mode + ": the model's ai.onnx opset is " + std::to_string(opset) +
                   " and it has a Scan, whose opset-8 form (a batch axis and sequence_lens) the ONNX version "
                   "converter does not upgrade correctly. Fix: re-export the model at opset 9 or newer (" +
                   std::to_string(kMinOpset) + " or newer avoids any conversion)");
  verify_nodes(*p.graph, static_cast<int>(opset), mode, opset < kMinOpset);
  if (opset < kMinOpset) {
    try {
      mutable_graph(p);
      *p.model = onnx::version_conversion::ConvertVersion(*p.model, static_cast<int>(kMinOpset));
      p.graph = &p.model->graph();
    } catch (const std::exception& e) {
      diag::fail(Error::Kind::kVersion,
                 mode + ": the model's ai.onnx opset is " + std::to_string(opset) + "; " + interval +
                     ", but the ONNX version converter could not upgrade it: " + e.what() +
                     ". Fix: re-export the model at opset " + std::to_string(kMinOpset) + " or newer");
    }
    notice(mode + ": upgraded the model from ai.onnx opset " + std::to_string(opset) + " to " +
           std::to_string(kMinOpset) + " with the ONNX version converter to transform it (the result returns to " +
           std::to_string(opset) + " where every node has a form there)");
    opset = kMinOpset;
  }
  p.opset = opset;
  index_and_infer(p);
  const bool expanded = expand_contrib_ops(p, mode);
  if (name_dropout_masks(p, mode) || expanded) {
    reindex(p);
    return;
  }
  collect_runtime_inputs(p);
}

}  // namespace

void reindex(Prepared& p) {
  p.value_names = NameScope();
  p.node_names = NameScope();
  p.facts = FactTable();
  p.nodes_with_subgraphs.clear();
  p.initializer_names.clear();
  index_and_infer(p);
  collect_runtime_inputs(p);
}

}  // namespace onnax
