// vmap: maps a model over a new batch axis. A generic interpreter: it walks the graph once in
// topological order and asks the batching rule of each node whose inputs are batched; nodes
// that see no batched input are copied unchanged (unbatched values are never batched).
#include <onnax/onnax.h>
#include <onnx/defs/schema.h>

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "check/node_check.h"
#include "diagnostics/error.h"
#include "diagnostics/limits.h"
#include "emit/builder.h"
#include "facts/schemas.h"
#include "ir/graph_edit.h"
#include "notice.h"
#include "rules/batching.h"
#include "rules/op_table.h"
#include "transforms/bodies.h"
#include "transforms/contrib_ops.h"
#include "transforms/lower_opset.h"
#include "transforms/prepare.h"
#include "transforms/provenance.h"
#include "transforms/ragged_loops.h"
#include "transforms/tidy.h"

namespace onnax {
namespace {

struct Mapped {
  V v;
  bool batched = false;
};

std::string input_names(const Prepared& p) {
  std::vector<std::string> names;
  for (const auto* vi : p.runtime_inputs) names.push_back("'" + vi->name() + "'");
  return "[" + diag::join(names) + "]";
}

// Normalises a user axis for a value of per-example rank r: valid range [-(r+1), r].
int64_t normalize_axis(int64_t axis, int64_t rank, const std::string& what, const std::string& option) {
  if (rank < 0) {
    if (axis == 0) return 0;
    diag::fail(Error::Kind::kSelection, "vmap: " + option + " gives axis " + std::to_string(axis) + " for " + what +
                                            ", whose rank is unknown, so only axis 0 is possible. Fix: use " + option +
                                            " 0 or declare the shape of " + what);
  }
  if (axis < -(rank + 1) || axis > rank)
    diag::fail(Error::Kind::kSelection, "vmap: " + option + " gives axis " + std::to_string(axis) + " for " + what +
                                            " of per-example rank " + std::to_string(rank) + "; the valid range is [" +
                                            std::to_string(-(rank + 1)) + ", " + std::to_string(rank) +
                                            "]. Fix: choose an axis in that range");
  return axis < 0 ? axis + rank + 1 : axis;
}

// Initializers that in_axes names with an axis (an ensemble: one weight set per example) become
// batched graph inputs: their stored value is dropped (the caller feeds the stacked sets, or
// stores them in the result).
void lift_batched_initializers(Prepared& p, const VmapOptions& opt) {
  if (opt.in_axes_form != VmapOptions::InAxesForm::kByName) return;
  std::vector<std::string> lifted;
  for (const auto& [name, axis] : opt.in_axes_by_name)
    if (axis && p.initializer_names.count(name)) lifted.push_back(name);
  if (lifted.empty()) return;
  onnx::GraphProto& g = mutable_graph(p);
  for (const auto& name : lifted) {
    auto* inits = g.mutable_initializer();
    int at = -1;
    for (int i = 0; i < inits->size() && at < 0; ++i)
      if (inits->Get(i).name() == name) at = i;
    if (at < 0)
      diag::fail(Error::Kind::kSelection, "vmap: in_axes batches '" + name +
                                              "', a sparse initializer, which cannot be batched. Fix: store it "
                                              "dense, or pass None for it");
    bool declared = false;
    for (const auto& vi : g.input()) declared = declared || vi.name() == name;
    if (!declared) {  // (an input with a default keeps its declaration)
      onnx::ValueInfoProto* vi = g.add_input();
      vi->set_name(name);
      auto* tt = vi->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(inits->Get(at).data_type());
      auto* shape = tt->mutable_shape();
      for (int64_t d : inits->Get(at).dims()) shape->add_dim()->set_dim_value(d);
    }
    inits->DeleteSubrange(at, 1);
    p.initializer_names.erase(name);
  }
  collect_runtime_inputs(p);
}

std::vector<Axis> resolve_in_axes(const Prepared& p, const VmapOptions& opt) {
  const size_t n = p.runtime_inputs.size();
  std::vector<Axis> axes(n, opt.in_axis);
  if (opt.in_axes_form == VmapOptions::InAxesForm::kByName) {
    std::unordered_map<std::string, size_t> index;
    for (size_t i = 0; i < n; ++i) index[p.runtime_inputs[i]->name()] = i;
    for (size_t i = 0; i < n; ++i) axes[i] = std::nullopt;
    for (const auto& [name, axis] : opt.in_axes_by_name) {
      auto it = index.find(name);
      if (it == index.end() && !axis && p.initializer_names.count(name)) continue;  // (shared anyway)
      if (it == index.end()) {
        std::string extra = p.initializer_names.count(name)
                                ? " ('" + name + "' is an initializer: None keeps it shared, an axis batches it)"
                                : "";
        std::vector<std::string> inits;
        for (const auto& t : p.initializer_names) inits.push_back("'" + t + "'");
        std::sort(inits.begin(), inits.end());
        diag::fail(Error::Kind::kSelection,
                   "vmap: in_axes names '" + name + "', which is not a runtime graph input" + extra +
                       "; available inputs: " + input_names(p) +
                       (inits.empty() ? std::string() : "; initializers: " + diag::join(inits)) +
                       ". Fix: use one of the available names");
      }
      axes[it->second] = axis;
    }
  } else if (opt.in_axes_form == VmapOptions::InAxesForm::kPerInput) {
    if (opt.in_axes.size() != n)
      diag::fail(Error::Kind::kSelection, "vmap: in_axes has " + std::to_string(opt.in_axes.size()) +
                                              " entries but the model has " + std::to_string(n) + " runtime inputs " +
                                              input_names(p) +
                                              ". Fix: give one entry per input in this order (None for shared "
                                              "inputs), or a single int for all, or a mapping by name");
    axes = opt.in_axes;
  }
  bool any = false;
  for (const auto& a : axes) any = any || a.has_value();
  if (!any)
    diag::fail(Error::Kind::kSelection, "vmap: in_axes batches no input (all None); inputs: " + input_names(p) +
                                            ". Fix: give at least one input an integer axis");
  return axes;
}

std::string pick_axis_name(const Prepared& p, const VmapOptions& opt) {
  if (!opt.axis_name.empty()) {
    // Reusing a name would declare the batch size equal to an existing dimension.
    if (p.dim_params.count(opt.axis_name))
      diag::fail(Error::Kind::kSelection, "vmap: axis_name '" + opt.axis_name +
                                              "' is already a symbolic dimension of the model, so the batch axis "
                                              "would be declared equal to it. Fix: choose another axis_name, or "
                                              "leave it unset to get a fresh name");
    return opt.axis_name;
  }
  std::string name = "batch";
  for (int k = 1; p.dim_params.count(name); ++k) name = "batch_" + std::to_string(k);
  return name;
}

std::vector<int64_t> move_axis_perm(int64_t from, int64_t to, int64_t rank) {
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i)
    if (i != from) perm.push_back(i);
  perm.insert(perm.begin() + to, from);
  return perm;
}

// Removes the Constant nodes that the result does not read: the source's (`source_constants`),
// whose values (axes, shapes) the rules read to emit shifted copies, and the builder's own that
// a rule made and then did not use. ONNX Runtime warns about each one. A graph output or a name
// a subgraph reads keeps one.
void drop_unread_constants(onnx::GraphProto& g, const Builder& b, const std::vector<V>& source_constants) {
  std::unordered_set<std::string_view> dead;
  for (const std::vector<V>* constants : {&source_constants, &b.constants()})
    for (V v : *constants)
      if (b.reads(v) == 0) dead.insert(b.name(v));
  if (dead.empty()) return;
  for (const auto& o : g.output()) dead.erase(o.name());
  std::vector<std::string> outer;
  for (const auto& n : g.node())
    if (has_subgraphs(n))
      for (auto& r : outer_scope_reads(n)) outer.push_back(std::move(r));
  for (const auto& r : outer) dead.erase(r);
  if (dead.empty()) return;
  auto* nodes = g.mutable_node();
  int kept = 0;
  for (int i = 0; i < nodes->size(); ++i) {
    const onnx::NodeProto& n = nodes->Get(i);
    if (n.op_type() == "Constant" && n.output_size() == 1 && dead.count(n.output(0))) continue;
    if (kept != i) nodes->SwapElements(kept, i);
    ++kept;
  }
  nodes->DeleteSubrange(kept, nodes->size() - kept);
}

}  // namespace

namespace {

// One vmap of a prepared model, as named steps over shared state: resolve the axes, give
// initializers that are graph outputs a name of their own, bind the initializers and inputs
// (batched inputs moved to axis 0), resolve out_axes, sweep the nodes (a node no batched value
// reaches is copied unchanged, others go through their batching rule or the per-example map),
// then move or broadcast each output to its axis and write the result into *p.model. When p's
// graph is private (the caller gave the model away, or prepare had to rewrite it), nodes that
// pass through unchanged are moved into the result instead of copied.
class Vectorization {
 public:
  Vectorization(Prepared& p, const VmapOptions& opt) : p_(p), opt_(opt) {}

  void run() {
    lift_batched_initializers(p_, opt_);
    in_axes_ = resolve_in_axes(p_, opt_);
    find_per_example_nodes();
    axis_name_ = pick_axis_name(p_, opt_);
    batch_dim_ = Dim::named(axis_name_);
    rename_output_initializers();
    start_result();
    bind_initializers();
    bind_inputs();
    resolve_out_axes();
    sweep();
    write_outputs();
    write_result();
  }

 private:
  Builder& b() { return *b_; }
  const Facts& src_facts(const std::string& name) const { return p_.fact(name); }
  Mapped* mapped_id(int id) {
    if (id < 0 || static_cast<size_t>(id) >= env_.size() || !env_[static_cast<size_t>(id)].v.valid()) return nullptr;
    return &env_[static_cast<size_t>(id)];
  }
  Mapped* mapped(const std::string& name) { return mapped_id(p_.value_names.id(name)); }
  void bind_id(int id, Mapped m) {
    if (static_cast<size_t>(id) >= env_.size()) env_.resize(static_cast<size_t>(p_.value_names.size()));
    env_[static_cast<size_t>(id)] = m;
  }
  void bind(const std::string& name, Mapped m) { bind_id(p_.value_names.intern(name), m); }
  // The graph output position of a value id (-1: not a graph output).
  int output_position(int id) const {
    return id < 0 || static_cast<size_t>(id) >= output_pos_.size() ? -1 : output_pos_[static_cast<size_t>(id)];
  }

  // Loops whose examples may run different numbers of iterations run whole per example.
  void find_per_example_nodes() {
    std::unordered_set<std::string> batched_inputs;
    for (size_t i = 0; i < in_axes_.size(); ++i)
      if (in_axes_[i]) batched_inputs.insert(p_.runtime_inputs[i]->name());
    per_example_nodes_ = wrap_ragged_loops(p_, batched_inputs);
  }

  // An initializer that is also a graph output must be broadcast under the output's name, so
  // the (still shared) initializer takes a new one (in a private copy of the graph).
  void rename_output_initializers() {
    src_graph_ = p_.graph;
    const onnx::GraphProto& given = *p_.graph;  // stays valid: mutable_graph copies from it
    for (const auto& o : given.output()) {
      if (!p_.initializer_names.count(o.name())) continue;
      bool is_input = false;
      for (const auto& vi : p_.graph->input()) is_input = is_input || vi.name() == o.name();
      if (is_input) continue;
      onnx::GraphProto* private_graph = &mutable_graph(p_);
      src_graph_ = private_graph;
      const std::string renamed = p_.value_names.fresh(o.name() + "_shared");
      for (auto& t : *private_graph->mutable_initializer())
        if (t.name() == o.name()) t.set_name(renamed);
      for (auto& n : *private_graph->mutable_node()) {
        for (auto& in : *n.mutable_input())
          if (in == o.name()) in = renamed;
        rename_subgraph_reads(n, o.name(), renamed);
      }
      p_.initializer_names.erase(o.name());
      p_.initializer_names.insert(renamed);
      const int old_id = p_.value_names.id(o.name()), new_id = p_.value_names.id(renamed);
      p_.facts.alias(new_id, old_id);
      for (auto& id : p_.node_ids.ids)
        if (id == old_id) id = new_id;
      output_alias_[o.name()] = renamed;
    }
  }

  void start_result() {
    // On the model's arena when it has one, so moving the result into it is a swap.
    out_holder_ = make_proto<onnx::GraphProto>(p_.model->GetArena());
    out_ = out_holder_.get();
    out_->set_name(src_graph_->name());
    out_->set_doc_string(src_graph_->doc_string());
    b_.emplace(*out_, p_.value_names, p_.node_names, p_.opset);
    b().set_opsets(model_opsets(p_));  // (control-flow rules make bodies models of their own)
    // What each source value became, indexed by its id in p.value_names: the nodes' value ids
    // come precomputed from prepare, so the sweep never hashes a name.
    env_.resize(static_cast<size_t>(p_.value_names.size()));
  }

  // Initializers: shared, and their int64 contents are known to rules (axes, shapes).
  void bind_initializers() {
    for (const auto& t : src_graph_->initializer()) {
      bind(t.name(), Mapped{b().existing(t.name(), &src_facts(t.name())), false});
      b().remember_tensor(t.name(), t);
    }
    for (const auto& s : src_graph_->sparse_initializer())
      bind(s.values().name(), Mapped{b().existing(s.values().name(), &src_facts(s.values().name())), false});
  }

  // Graph inputs: batched ones get the batch dim at their in_axis and are moved to axis 0.
  void bind_inputs() {
    std::vector<std::pair<V, std::vector<int64_t>>> entry_moves;
    size_t k = 0;
    for (const auto& vi : src_graph_->input()) {
      if (p_.initializer_names.count(vi.name())) {
        new_inputs_.push_back(vi);
        continue;
      }
      const Axis axis = in_axes_[k++];
      const Facts& f = src_facts(vi.name());
      onnx::ValueInfoProto nvi = vi;
      if (!axis) {
        bind(vi.name(), Mapped{b().existing(vi.name(), &f), false});
        new_inputs_.push_back(std::move(nvi));
        continue;
      }
      if (!vi.type().has_tensor_type())
        diag::fail(Error::Kind::kUnsupported, "vmap: input '" + vi.name() +
                                                  "' is not a tensor (sequence/map/optional inputs cannot be "
                                                  "batched). Fix: pass None for it in in_axes");
      const int64_t r = f.rank();
      const int64_t a = normalize_axis(*axis, r, "input '" + vi.name() + "'", "in_axes");
      if (r >= 0) write_type(f.with_dim(a, batch_dim_), nvi.mutable_type());
      new_inputs_.push_back(std::move(nvi));
      V v = b().existing(vi.name(), f.with_dim(a, batch_dim_));
      if (!batch_source_) batch_source_ = {vi.name(), a};
      if (a != 0) entry_moves.emplace_back(v, move_axis_perm(a, 0, r + 1));
      bind(vi.name(), Mapped{v, true});
    }
    for (auto& [v, perm] : entry_moves) {
      const std::string name(b().name(v));
      b().set_origin(name);
      V moved = b().transpose(v, perm);
      mapped(name)->v = moved;
    }
  }

  // The batch size as a 1-D int64 value, read from the first batched input on first use.
  V batch_size() {
    if (!batch_size_) {
      b().set_origin(axis_name_);
      V in = b().existing(batch_source_->first, Facts{});
      batch_size_ = b().shape_of(in, batch_source_->second, batch_source_->second + 1);
      b().set_facts(*batch_size_, Facts::of(onnx::TensorProto::INT64, {Dim::of(1)}));
    }
    return *batch_size_;
  }

  void resolve_out_axes() {
    output_pos_.assign(static_cast<size_t>(p_.value_names.size()), -1);
    out_axes_.assign(static_cast<size_t>(src_graph_->output_size()), 0);
    if (opt_.out_axes.size() > 1 && opt_.out_axes.size() != static_cast<size_t>(src_graph_->output_size()))
      diag::fail(Error::Kind::kSelection, "vmap: out_axes has " + std::to_string(opt_.out_axes.size()) +
                                              " entries but the model has " +
                                              std::to_string(src_graph_->output_size()) +
                                              " outputs. Fix: give one entry per output, or a single int");
    for (int i = 0; i < src_graph_->output_size(); ++i) {
      const auto& o = src_graph_->output(i);
      output_pos_[static_cast<size_t>(p_.value_names.id(o.name()))] = i;
      const Axis requested = opt_.out_axes.empty()       ? Axis(0)
                             : opt_.out_axes.size() == 1 ? opt_.out_axes[0]
                                                         : opt_.out_axes[static_cast<size_t>(i)];
      out_axes_[static_cast<size_t>(i)] =
          requested
              ? Axis(normalize_axis(*requested, src_facts(o.name()).rank(), "output '" + o.name() + "'", "out_axes"))
              : std::nullopt;
    }
  }

  // A private graph's nodes are taken out of it, so nodes that pass through unchanged can be
  // handed to the result as they are (a pointer moves; nothing is copied, allocated or freed).
  void sweep() {
    const int node_count = src_graph_->node_size();
    out_->mutable_node()->Reserve(node_count);  // most nodes pass through one to one
    owned_ = take_nodes(p_);
    batch_size_fn_ = [this] { return batch_size(); };
    for (int ni = 0; ni < node_count; ++ni) {
      limits::poll();
      batch_node(ni);
    }
  }

  void batch_node(int ni) {
    const onnx::NodeProto& node = owned_.empty() ? src_graph_->node(ni) : *owned_[static_cast<size_t>(ni)];
    bool any_batched = false;
    const int32_t* input_ids = p_.node_ids.inputs(ni);
    const int32_t* output_ids = p_.node_ids.outputs(ni, node.input_size());
    in_mapped_.assign(static_cast<size_t>(node.input_size()), nullptr);
    for (int i = 0; i < node.input_size(); ++i) {
      Mapped* m = mapped_id(input_ids[i]);
      in_mapped_[static_cast<size_t>(i)] = m;
      if (m && m->batched) any_batched = true;
    }
    // Batched values that the node's subgraphs (If/Loop/Scan bodies) read from this scope.
    std::vector<BatchCtx::Read> reads;
    bool reads_batched = false;
    if (has_subgraphs(node)) {
      std::set<std::string> seen;
      for (const auto& r : outer_scope_reads(node)) {
        const Mapped* m = mapped(r);
        if (!m || !seen.insert(r).second) continue;
        reads_batched = reads_batched || m->batched;
        reads.push_back(BatchCtx::Read{r, m->v, m->batched, &src_facts(r)});
      }
    }
    if (!any_batched && !reads_batched)
      pass_through(ni, node, output_ids, reads);
    else
      batch_by_rule(ni, node, input_ids, output_ids, std::move(reads));
  }

  // Shared computation: the node unchanged. Graph outputs get a private name so the broadcast
  // to the batch can take the output's own name at the end.
  void pass_through(int ni, const onnx::NodeProto& node, const int32_t* output_ids,
                    const std::vector<BatchCtx::Read>& reads) {
    std::vector<std::pair<int, V>> outs;
    NodePtr copy = owned_.empty() ? NodePtr(new onnx::NodeProto(node)) : std::move(owned_[static_cast<size_t>(ni)]);
    for (int oi = 0; oi < copy->output_size(); ++oi) {
      std::string& o = *copy->mutable_output(oi);
      if (o.empty()) continue;
      int name_id = output_ids[oi];
      if (output_position(name_id) >= 0) {
        o = p_.value_names.fresh(o + "_shared");
        name_id = p_.value_names.id(o);
      }
      // Rules read per-example facts from the fact table; shared values need none here.
      outs.emplace_back(output_ids[oi], b().existing_id(name_id, nullptr));
    }
    if (auto t = constant_tensor(*copy)) {
      b().remember_tensor(t->name(), *t);
      if (!outs.empty()) shared_constants_.push_back(outs[0].second);
    }
    // (Reads of adopted nodes count too: a constant only they read is not dead.)
    for (const Mapped* m : in_mapped_)
      if (m) b().count_read(m->v);
    // An unbatched input a rule produced under another name (a constant for static dims, a
    // value computed before) is read by that name: the source's is never defined.
    for (int i = 0; i < copy->input_size(); ++i) {
      const Mapped* m = in_mapped_[static_cast<size_t>(i)];
      if (m && b().name(m->v) != copy->input(i)) copy->set_input(i, std::string(b().name(m->v)));
    }
    // The same for what its subgraphs read from this scope.
    for (const auto& r : reads)
      if (b().name(r.v) != r.name) rename_subgraph_reads(*copy, r.name, std::string(b().name(r.v)));
    for (const auto& r : reads) b().count_read(r.v);
    b().adopt_node(std::move(copy));
    for (auto& [id, v] : outs) bind_id(id, Mapped{v, false});
  }

  // The node's schema at its domain's opset; a diagnostic for an op ONNX does not know.
  const onnx::OpSchema* schema_of(const onnx::NodeProto& node, const std::string& domain, int opset) {
    const onnx::OpSchema* schema = schemas_.find(node.op_type(), domain, opset);
    if (schema) return schema;
    const std::string label = diag::op_at(node, opset);
    if (const std::string advice = unexpanded_contrib_op_advice(node); !advice.empty())
      diag::fail(Error::Kind::kUnsupported, "vmap: cannot batch " + label + ": " + advice);
    std::string batched_inputs;
    for (int i = 0; i < node.input_size(); ++i)
      if (const std::string& in = node.input(i);
          in_mapped_[static_cast<size_t>(i)] && in_mapped_[static_cast<size_t>(i)]->batched)
        batched_inputs += (batched_inputs.empty() ? "'" : ", '") + in + "' (per-example shape " +
                          src_facts(in).shape_string() + ", " + diag::dtype_name(src_facts(in).dtype) + ")";
    diag::fail(
        Error::Kind::kUnsupported,
        "vmap: cannot batch " + label +
            ": ONNX has no schema for this operator at this opset (unknown or custom op), so onnax cannot "
            "tell how it treats the batch axis; batched inputs: " +
            batched_inputs +
            ". Fix: pass None in in_axes for the inputs that reach it, express it with standard ops, or "
            "register its definition (onnax.register_rule(op, domain, body=...); --rules FILE on the command line)");
  }

  // A node a batched value reaches: its batching rule, or the per-example map for nodes with
  // subgraphs reading batched values that their rule does not cover and for ops without a
  // vectorized rule (which gives each example its slice of every captured value).
  void batch_by_rule(int ni, const onnx::NodeProto& node, const int32_t* input_ids, const int32_t* output_ids,
                     std::vector<BatchCtx::Read> reads) {
    const std::string domain = node.domain() == "ai.onnx" ? "" : node.domain();
    // Each domain has its own opset (looked up only off the default domain).
    int opset = static_cast<int>(p_.opset);
    if (!domain.empty())
      if (const auto it = b().opsets().find(domain); it != b().opsets().end()) opset = it->second;
    // Only for diagnostics: built when a rule fails, not for every node.
    auto op_label = [&] { return diag::op_at(node, opset); };
    const onnx::OpSchema* schema = schema_of(node, domain, opset);
    // Rules read the inputs and attributes their schema guarantees.
    {
      const NodeInputFactsOf known(
          [&](int i) { return i < node.input_size() ? p_.facts.at(input_ids[i]).rank() : int64_t{-1}; },
          [&](int i) {
            const Mapped* m = i < node.input_size() ? in_mapped_[static_cast<size_t>(i)] : nullptr;
            return m && !m->batched ? b().known_i64(m->v) : nullptr;
          });
      if (const std::string defect = node_defect(*schema, node, input_ids, known); !defect.empty())
        diag::fail(Error::Kind::kInvalidModel, "vmap: invalid model: " + op_label() + " " + defect);
    }
    const BatchRule* rule = nullptr;
    {
      auto [cached, added] = rule_of_schema_.try_emplace(schema, nullptr);
      if (added) cached->second = rules_.batch_rule_for(domain, node.op_type(), schema->since_version());
      rule = cached->second;
    }
    if (!rule || (!per_example_nodes_.empty() && per_example_nodes_.count(node.name()))) rule = &fallback_;
    BatchCtx ctx{b(),
                 node,
                 p_.opset,
                 std::move(spare_.in),
                 std::move(spare_.batched),
                 std::move(spare_.facts),
                 std::move(spare_.out_facts),
                 batch_size_fn_,
                 false,
                 schema,
                 std::move(reads),
                 batch_dim_,
                 &body_transforms()};
    for (int o = 0; o < node.output_size(); ++o) ctx.out_facts.push_back(&p_.facts.at(output_ids[o]));
    for (int i = 0; i < node.input_size(); ++i) {
      const std::string& in = node.input(i);
      const Mapped* m = in_mapped_[static_cast<size_t>(i)];
      if (in.empty() || !m) {
        if (!in.empty())
          diag::fail(Error::Kind::kInvalidModel, "vmap: " + op_label() + " reads undefined value '" + in + "'");
        ctx.in.push_back(V{});
        ctx.batched.push_back(false);
        ctx.facts.push_back(nullptr);
        continue;
      }
      ctx.in.push_back(m->v);
      ctx.batched.push_back(m->batched);
      ctx.facts.push_back(&p_.facts.at(input_ids[i]));
    }
    b().set_origin(node.output_size() && !node.output(0).empty() ? node.output(0) : node.op_type());
    const int first = b().node_count();
    // Graph outputs may need their names for a final transpose or broadcast, so only other
    // nodes keep their source names in place.
    bool feeds_output = false;
    for (int o = 0; o < node.output_size(); ++o) feeds_output = feeds_output || output_position(output_ids[o]) >= 0;
    b().allow_source_names(feeds_output ? nullptr : &node, owned_.empty() ? nullptr : &owned_[static_cast<size_t>(ni)],
                           output_ids);
    BatchResult res = (*rule)(ctx);
    b().allow_source_names(nullptr);
    if (ctx.used_scan) looped_[(domain.empty() ? "ai.onnx" : domain) + "::" + node.op_type()]++;
    for (int o = 0; o < node.output_size(); ++o) bind_result(node, o, output_ids[o], res, first, op_label);
    // Hand the context's buffers to the next node (their capacity is what is reused).
    spare_.in = std::move(ctx.in);
    spare_.batched = std::move(ctx.batched);
    spare_.facts = std::move(ctx.facts);
    spare_.out_facts = std::move(ctx.out_facts);
    spare_.in.clear();
    spare_.batched.clear();
    spare_.facts.clear();
    spare_.out_facts.clear();
  }

  // Output o of a batched node: its value and batched flag, with the source's readable name
  // when the rule made it and the name is free to take.
  template <typename Label>
  void bind_result(const onnx::NodeProto& node, int o, int output_id, const BatchResult& res, int first,
                   const Label& op_label) {
    const std::string& src_name = node.output(o);
    if (src_name.empty()) return;
    if (o >= static_cast<int>(res.out.size()) || !res.out[o].valid())
      diag::fail(Error::Kind::kUnsupported, "vmap: cannot batch " + op_label() + ": optional output " +
                                                std::to_string(o) +
                                                " is not supported by its batching rule. "
                                                "Fix: remove the use of output '" +
                                                src_name + "'");
    V v = res.out[o];
    const bool bat = res.batched[o];
    // The source's per-example facts, with the batch dim in front when batched (built only
    // if a later rule asks).
    b().share_facts(v, &p_.facts.at(output_id), bat, batch_dim_);
    // (Graph outputs may need one more node to reach their axis; an exact copy of the node
    // already has its name: nothing to look for.)
    const int oi = output_position(output_id);
    bool may_take = oi < 0 || (bat && out_axes_[static_cast<size_t>(oi)] == Axis(0));
    if (may_take && b().name(v) != src_name) {
      bool made_here = false, name_taken = false;
      for (int ni2 = first; ni2 < b().node_count(); ++ni2)
        for (const auto& on : out_->node(ni2).output()) {
          made_here = made_here || on == b().name(v);
          name_taken = name_taken || on == src_name;  // by an intermediate that kept it
        }
      if (made_here && !name_taken) b().rename(v, src_name, first);
    }
    bind_id(output_id, Mapped{v, bat});
  }

  // Outputs: move the batch axis to out_axes; broadcast outputs that never saw the batch.
  void write_outputs() {
    for (int i = 0; i < src_graph_->output_size(); ++i) {
      const auto& o = src_graph_->output(i);
      auto alias = output_alias_.find(o.name());
      Mapped m = *mapped(alias == output_alias_.end() ? o.name() : alias->second);
      const Facts& f = src_facts(o.name());
      const Axis out_axis = out_axes_[static_cast<size_t>(i)];
      const int64_t axis = out_axis.value_or(0);
      b().set_origin(o.name());
      V v = m.v;
      if (!out_axis && m.batched) {
        std::vector<std::string> batched_inputs;
        for (size_t j = 0; j < in_axes_.size(); ++j)
          if (in_axes_[j]) batched_inputs.push_back("'" + p_.runtime_inputs[j]->name() + "'");
        diag::fail(Error::Kind::kSelection,
                   "vmap: out_axes is None for output '" + o.name() + "', but it depends on " +
                       (batched_inputs.size() == 1 ? "the batched input " : "one of the batched inputs ") +
                       diag::join(batched_inputs) +
                       ", so it differs between examples. Fix: give it an axis in out_axes, or pass None in in_axes "
                       "for the inputs it depends on");
      }
      if (!m.batched && out_axis) {
        V x = b().unsqueeze(v, {0});
        V shape = b().concat({batch_size(), b().shape_of(v)}, 0);
        v = b().expand(x, shape);
      }
      if (b().name(v) != o.name()) {
        bool is_input = false;
        for (const auto& vi : src_graph_->input()) is_input = is_input || vi.name() == o.name();
        if (is_input || p_.initializer_names.count(o.name()))
          diag::fail(Error::Kind::kUnsupported,
                     "vmap: graph output '" + o.name() +
                         "' is also a graph input or initializer, so its batched form cannot take its name. Fix: "
                         "route it through an Identity node with a distinct output name");
        if (axis != 0) {
          const int64_t r = f.rank();
          b().op_named("Transpose", {v}, {Attr::ints("perm", move_axis_perm(0, axis, r + 1))}, o.name());
        } else {
          b().op_named("Identity", {v}, {}, o.name());
        }
      } else if (axis != 0) {
        diag::fail(Error::Kind::kInvalidModel, "vmap: internal naming conflict for output '" + o.name() + "'");
      }
      // Declared type from the facts (which include ONNX's inference, so outputs the source
      // left untyped get a type), with the batch dim at the output's axis.
      onnx::ValueInfoProto nvi = o;
      if (f.dtype != 0 && (!o.has_type() || o.type().has_tensor_type()))
        write_type(f.has_shape && out_axis ? f.with_dim(axis, batch_dim_) : f, nvi.mutable_type());
      new_outputs_.push_back(std::move(nvi));
    }
  }

  // Inputs, outputs, unread constants dropped, initializers and the value_info still valid,
  // notices for the per-example maps, the model's own opset and the provenance record.
  void write_result() {
    for (auto& vi : new_inputs_) *out_->add_input() = std::move(vi);
    for (auto& vi : new_outputs_) *out_->add_output() = std::move(vi);
    drop_unread_constants(*out_, b(), shared_constants_);
    *out_->mutable_quantization_annotation() = src_graph_->quantization_annotation();
    take_initializers(p_, *out_);
    // Value info stays valid only for values that kept their name and stayed unbatched.
    for (const auto& vi : src_graph_->value_info()) {
      const Mapped* m = mapped(vi.name());
      if (m && !m->batched && b().name(m->v) == vi.name())
        *out_->add_value_info() = consistent_value_info(vi, src_facts(vi.name()));
    }
    std::vector<std::string> axes_json, out_json;
    size_t ri = 0;
    for (const auto* vi : p_.runtime_inputs) {
      const Axis a = in_axes_[ri++];
      axes_json.push_back(provenance::quote(vi->name()) + ": " + (a ? std::to_string(*a) : std::string("null")));
    }
    for (const Axis& a : out_axes_) out_json.push_back(a ? std::to_string(*a) : std::string("null"));
    const std::string step = "{\"transform\": \"vmap\", \"in_axes\": {" + diag::join(axes_json) +
                             "}, \"out_axes\": " + provenance::list(out_json) +
                             ", \"axis_name\": " + provenance::quote(axis_name_) + "}";
    for (const auto& [op, count] : looped_)
      notice("vmap: " + op + " (" + std::to_string(count) + " node" + (count > 1 ? "s" : "") +
             ") batched by a per-example Scan (or Loop): no vectorized rule covers this case; results are exact, "
             "run time grows with the batch size");
    *p_.model->mutable_graph() = std::move(*out_);
    tidy(*p_.model);
    return_to_source_opset(*p_.model, p_.source_opset, "vmap");
    provenance::record_step(*p_.model, step);
  }

  Prepared& p_;
  const VmapOptions& opt_;
  std::vector<Axis> in_axes_, out_axes_;
  std::unordered_set<std::string> per_example_nodes_;  // run whole by the per-example map
  std::string axis_name_;
  Dim batch_dim_;
  std::unordered_map<std::string, std::string> output_alias_;  // output name -> renamed initializer
  const onnx::GraphProto* src_graph_ = nullptr;
  ProtoPtr<onnx::GraphProto> out_holder_;
  onnx::GraphProto* out_ = nullptr;
  std::optional<Builder> b_;  // (made once the source's names are settled)
  std::vector<Mapped> env_;   // what each source value became, by id
  std::vector<onnx::ValueInfoProto> new_inputs_, new_outputs_;
  std::optional<std::pair<std::string, int64_t>> batch_source_;  // the first batched input, its axis
  std::optional<V> batch_size_;
  std::function<V()> batch_size_fn_;
  std::vector<int> output_pos_;  // by value id
  const OpTable& rules_ = OpTable::instance();
  SchemaCache schemas_;
  std::map<std::string, int> looped_;  // ops mapped per example, for the notice
  std::vector<Mapped*> in_mapped_;     // the current node's inputs
  const BatchRule fallback_ = scan_fallback;
  std::unordered_map<const onnx::OpSchema*, const BatchRule*> rule_of_schema_;
  struct {
    std::vector<V> in;
    std::vector<bool> batched;
    std::vector<const Facts*> facts;
    std::vector<const Facts*> out_facts;
  } spare_;  // per-node context buffers, reused
  std::vector<NodePtr> owned_;
  std::vector<V> shared_constants_;  // outputs of the source's Constant nodes, copied unchanged
};

// Leaves the result in *p.model.
void vmap_prepared(Prepared& p, const VmapOptions& opt) {
  Vectorization(p, opt).run();
}

}  // namespace

onnx::ModelProto vmap(const onnx::ModelProto& source, const VmapOptions& opt) {
  Prepared p = prepare(source, "vmap");
  vmap_prepared(p, opt);
  return std::move(*p.model);
}

onnx::ModelProto vmap(onnx::ModelProto&& source, const VmapOptions& opt) {
  Prepared p = prepare(std::move(source), "vmap");
  vmap_prepared(p, opt);
  return std::move(*p.model);
}

void vmap_in_place(onnx::ModelProto& model, const VmapOptions& opt) {
  Prepared p = prepare_in_place(model, "vmap");
  vmap_prepared(p, opt);
}

std::string vmap_serialized(const std::string& model, const VmapOptions& opt) {
  return transform_serialized(model, "vmap", [&](Prepared& p) { vmap_prepared(p, opt); });
}

}  // namespace onnax
