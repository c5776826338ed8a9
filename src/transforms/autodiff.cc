// jvp, vjp and grad: generic interpreters over the derivative rules. Forward mode runs the
// JVP rules next to the primal nodes. Reverse mode runs the same JVP rules, but the nodes
// that are linear in tangents go to a tape, which is then transposed node by node
// (linearize + transpose), accumulating cotangents where a value fans out.
#include <onnax/onnax.h>
#include <onnx/defs/schema.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <set>
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
#include "rules/derivative.h"
#include "rules/op_table.h"
#include "rules/surrogate_jvp.h"
#include "rules/user_rules.h"
#include "transforms/autodiff_selection.h"
#include "transforms/bodies.h"
#include "transforms/contrib_ops.h"
#include "transforms/lower_opset.h"
#include "transforms/prepare.h"
#include "transforms/provenance.h"
#include "transforms/subgraph.h"
#include "transforms/tidy.h"

namespace onnax {
namespace {

using autodiff::derived_name;
using autodiff::Mode;
using autodiff::mode_name;
using autodiff::quoted_names;
using autodiff::resolve;
using autodiff::Resolved;

// A failure while transposing a tape node, named by the source node whose derivative the tape
// node belongs to when the message does not name it (a Loop an LSTM was expanded into, a
// broadcast deep inside a function op): the user can find that node in their model.
[[noreturn]] void rethrow_naming_source(const Error& e, const std::string& mode, const onnx::GraphProto& g,
                                        std::string_view origin) {
  std::string_view value = origin;
  if (value.size() > 8 && value.substr(value.size() - 8) == "_tangent") value.remove_suffix(8);
  const onnx::NodeProto* source = nullptr;
  for (const auto& n : g.node())
    if (n.output_size() > 0 && n.output(0) == value) source = &n;
  const std::string what = e.what();
  if (!source || e.kind() == Error::Kind::kLimit) throw e;
  const std::string op =
      (source->domain().empty() ? std::string("ai.onnx") : source->domain()) + "::" + source->op_type();
  if (what.find(op) != std::string::npos) throw e;
  std::string_view detail = what;
  if (detail.rfind(mode + ": ", 0) == 0) detail.remove_prefix(mode.size() + 2);
  diag::fail(e.kind(), mode + ": in the reverse pass of " + op + " at output '" + std::string(value) +
                           "': " + std::string(detail));
}

// Which values (by id) lie on some path to the selected outputs: only those need derivatives.
// (Reads the index only: touching every node would be a miss to memory per node.)
std::vector<char> needed_values(const Prepared& p, const std::vector<std::string>& outputs) {
  std::vector<char> needed(static_cast<size_t>(p.value_names.size()), 0);
  auto mark = [&](int id) {
    if (id >= 0) needed[static_cast<size_t>(id)] = 1;
  };
  for (const auto& o : outputs) mark(p.value_names.id(o));
  auto nested = p.nodes_with_subgraphs.rbegin();  // ascending indices, walked backwards
  for (int i = p.graph->node_size() - 1; i >= 0; --i) {
    const int32_t* ins = p.node_ids.inputs(i);
    const int32_t* outs = p.node_ids.outputs(i);
    const int input_count = p.node_ids.inputs_of(i), output_count = p.node_ids.outputs_of(i);
    const bool has_bodies = nested != p.nodes_with_subgraphs.rend() && *nested == i;
    if (has_bodies) ++nested;
    bool useful = false;
    for (int k = 0; k < output_count; ++k) useful = useful || (outs[k] >= 0 && needed[static_cast<size_t>(outs[k])]);
    if (!useful) continue;
    for (int k = 0; k < input_count; ++k) mark(ins[k]);
    if (has_bodies)
      for (const auto& r : outer_scope_reads(p.graph->node(i))) mark(p.value_names.id(r));
  }
  return needed;
}

// How many top-level nodes will be differentiated: those reading a value that depends on a seed
// and feeding the selected outputs. Sizes the name tables once (each such node emits a few
// named values and nodes), where growing them step by step rehashes every name each time.
size_t differentiated_nodes(const Prepared& p, const std::vector<int>& seed_ids, const std::vector<char>& needed) {
  std::vector<char> depends(needed.size(), 0);
  for (int id : seed_ids)
    if (id >= 0) depends[static_cast<size_t>(id)] = 1;
  size_t count = 0;
  for (int i = 0; i < p.graph->node_size(); ++i) {
    const int32_t* ins = p.node_ids.inputs(i);
    const int32_t* outs = p.node_ids.outputs(i);
    const int input_count = p.node_ids.inputs_of(i), output_count = p.node_ids.outputs_of(i);
    bool active = false, useful = false;
    for (int k = 0; k < input_count; ++k) active = active || (ins[k] >= 0 && depends[static_cast<size_t>(ins[k])]);
    if (!active) continue;
    for (int k = 0; k < output_count; ++k)
      if (outs[k] >= 0) {
        depends[static_cast<size_t>(outs[k])] = 1;
        useful = useful || needed[static_cast<size_t>(outs[k])];
      }
    count += useful ? 1 : 0;
  }
  return count;
}

onnx::ValueInfoProto value_info_like(const std::string& name, const Facts& f) {
  onnx::ValueInfoProto vi;
  vi.set_name(name);
  write_type(f, vi.mutable_type());
  return vi;
}

// One differentiation of a graph (jvp, vjp or grad), as named steps over shared state:
// bind the source's values, cut its stop_gradient marks, make the seeds, sweep forward running
// each node's JVP rule next to the node (reverse mode records the nodes linear in tangents on a
// tape), then name the output tangents (jvp), or transpose the tape and name the input
// cotangents (vjp, grad), and write the result into *p.model.
class Differentiation {
 public:
  Differentiation(Prepared& p, Mode mode, const Selection& sel, bool for_reverse_mode)
      : p_(p),
        mode_(mode),
        m_(mode_name(mode)),
        r_(resolve(p, mode, sel)),
        for_reverse_mode_(for_reverse_mode),
        src_(p.graph),
        out_graph_(make_proto<onnx::GraphProto>(p.model->GetArena())),
        out_(*out_graph_),
        b_(out_, p.value_names, p.node_names, p.opset),
        source_values_(static_cast<size_t>(p.value_names.size())),
        primal_(source_values_),
        tangent_(source_values_),
        origin_(source_values_, -1),
        stopped_(source_values_, 0),
        rules_(OpTable::instance()),
        user_(user_rules()),
        opsets_(model_opsets(p)) {}

  void run() {
    start_result();
    bind_sources();
    mark_stop_gradients();
    make_seeds();
    if (mode_ != Mode::kJvp) b_.set_tape(&tape_);
    needed_ = needed_values(p_, r_.outputs);
    size_name_tables();
    find_spikes();
    forward_sweep();
    if (mode_ == Mode::kJvp) {
      name_tangents();
    } else {
      transpose_tape();
      name_cotangents();
    }
    write_result();
  }

 private:
  int id_of(std::string_view n) const { return p_.value_names.id(n); }
  V& primal(int id) { return primal_[static_cast<size_t>(id)]; }
  V& tangent(int id) { return tangent_[static_cast<size_t>(id)]; }
  const Facts& facts(const std::string& n) const { return p_.fact(n); }

  // The result graph's builder: ONNX inference for emitted nodes, loop facts, reuse.
  void start_result() {
    out_.set_name(src_->name());
    out_.set_doc_string(src_->doc_string());
    b_.enable_inference(opsets_);
    b_.set_loop_inference([opsets = opsets_](const onnx::NodeProto& loop, const std::vector<const Facts*>& in,
                                             Dim trips, const std::function<const Facts*(std::string_view)>& outer) {
      return loop_output_facts(loop, in, trips, opsets, outer);
    });
    // Reverse mode transposes a weight shared by many nodes (an unrolled recurrence) once, not
    // once per use.
    b_.enable_reuse();
  }

  // The source's initializers and inputs as primal values.
  void bind_sources() {
    for (const auto& t : src_->initializer()) {
      primal(id_of(t.name())) = b_.existing(t.name(), &facts(t.name()));
      b_.register_data(t.name(), &t);
      b_.remember_tensor(t.name(), t);
    }
    for (const auto& vi : src_->input())
      if (!primal(id_of(vi.name())).valid()) primal(id_of(vi.name())) = b_.existing(vi.name(), &facts(vi.name()));
  }

  // Values marked by stop_gradient get no tangent: the nodes reading them see constants.
  void mark_stop_gradients() {
    for (const auto& name : provenance::names_at(*p_.model, provenance::kStopGradientKey)) {
      const int id = id_of(name);
      if (id < 0)
        diag::fail(Error::Kind::kInvalidModel, m_ + ": metadata_props['" + provenance::kStopGradientKey + "'] marks '" +
                                                   name +
                                                   "', which is not a value of the model. Fix: mark values of "
                                                   "the model with onnax.stop_gradient");
      if (std::find(r_.inputs.begin(), r_.inputs.end(), name) != r_.inputs.end())
        diag::fail(Error::Kind::kSelection, m_ + ": input '" + name +
                                                "' is selected for differentiation but marked "
                                                "by stop_gradient, so its derivative would be cut. Fix: select "
                                                "other inputs, or differentiate the model before marking it");
      stopped_[static_cast<size_t>(id)] = 1;
    }
  }

  // One tangent per selected input (a new graph input in forward mode).
  void make_seeds() {
    for (const auto& name : r_.inputs) {
      const Facts f = facts(name);
      const std::string tname = derived_name(p_.value_names, name, "_tangent");
      V t = b_.existing(tname, f);
      b_.mark_tangent(t);
      b_.set_witness(t, primal(id_of(name)));
      if (mode_ == Mode::kJvp) new_inputs_.push_back(value_info_like(tname, f));
      tangent(id_of(name)) = t;
      origin_[static_cast<size_t>(id_of(name))] = id_of(name);
      seeds_.push_back(t);
    }
  }

  // Sizes the name tables once for the values the sweep will make.
  void size_name_tables() {
    std::vector<int> seed_ids;
    for (const auto& name : r_.inputs) seed_ids.push_back(id_of(name));
    // About three new values and nodes per differentiated node in reverse mode (tangent,
    // primal helper, cotangent), one or two in forward mode.
    const size_t per_node = mode_ == Mode::kJvp ? 2 : 3;
    const size_t expected = differentiated_nodes(p_, seed_ids, needed_) * per_node;
    // (Not the node scope: generated nodes take their outputs' names, see Builder::name_node.)
    p_.value_names.expect(static_cast<size_t>(p_.value_names.size()) + expected);
  }

  // Spikes marked for a surrogate derivative (with_surrogates): their comparisons' operands,
  // read before the nodes move out of the graph.
  void find_spikes() {
    std::unordered_map<std::string, const onnx::NodeProto*> producer;
    for (int i = 0; i < src_->node_size(); ++i) {
      const auto& n = src_->node(i);
      if (n.metadata_props_size() == 0 || !surrogate_mark(n)) continue;
      if (producer.empty())
        for (const auto& m2 : src_->node())
          for (const auto& o : m2.output()) producer.emplace(o, &m2);
      auto operands = spike_operands(n, producer);
      if (!operands)
        diag::fail(Error::Kind::kInvalidModel,
                   m_ + ": " + diag::node_location(n) +
                       " is marked for a surrogate derivative but is not a spike (a "
                       "Cast or Where of a comparison, or a Sign). Fix: mark spikes with onnax.with_surrogates");
      spikes_.emplace(i, std::move(*operands));
    }
  }

  // Every node in order: the node itself, then its JVP where it reads a tangent and feeds a
  // selected output. A private graph's nodes are taken out of it and handed to the result by
  // pointer (the same objects, so rules and registered constants keep reading them); others
  // are copied.
  void forward_sweep() {
    const int node_count = src_->node_size();
    owned_ = take_nodes(p_);
    for (int ni = 0; ni < node_count; ++ni) {
      limits::poll();
      // Nodes are scattered over the heap: start loading one a few nodes ahead.
      constexpr int kAhead = 4;
      if (ni + kAhead < node_count)
        __builtin_prefetch(owned_.empty() ? &src_->node(ni + kAhead) : owned_[static_cast<size_t>(ni + kAhead)].get());
      differentiate_node(ni);
    }
  }

  void differentiate_node(int ni) {
    const onnx::NodeProto& node = owned_.empty() ? src_->node(ni) : *owned_[static_cast<size_t>(ni)];
    const int32_t* input_ids = p_.node_ids.inputs(ni);
    const int32_t* output_ids = p_.node_ids.outputs(ni, node.input_size());
    Vs ys;
    for (int k = 0; k < node.output_size(); ++k) {
      if (output_ids[k] < 0) {
        ys.push_back(V{});
        continue;
      }
      V v = b_.existing_id(output_ids[k], &p_.facts.at(output_ids[k]));
      primal(output_ids[k]) = v;
      ys.push_back(v);
    }
    if (node.op_type() == "Constant" && node.domain().empty())
      for (const auto& a : node.attribute())
        if (a.name() == "value" && a.has_t()) b_.register_data(node.output(0), &a.t());
    if (auto t = constant_tensor(node)) b_.remember_tensor(node.output(0), *t);

    bool active = false, useful = false;
    int from = -1;
    for (int k = 0; k < node.input_size(); ++k)
      if (input_ids[k] >= 0 && tangent(input_ids[k]).valid()) {
        active = true;
        from = origin_[static_cast<size_t>(input_ids[k])];
      }
    const bool subgraphs = has_subgraphs(node);
    if (subgraphs)
      for (const auto& rd : outer_scope_reads(node)) {
        const int id = id_of(rd);
        if (id >= 0 && tangent(id).valid()) {
          active = true;
          from = origin_[static_cast<size_t>(id)];
        }
      }
    for (int k = 0; k < node.output_size(); ++k)
      useful = useful || (output_ids[k] >= 0 && needed_[static_cast<size_t>(output_ids[k])]);
    bool float_out = false;
    for (int k = 0; k < node.output_size(); ++k) {
      const int32_t dt = output_ids[k] < 0 ? -1 : p_.facts.at(output_ids[k]).dtype;
      float_out = float_out || dt == 0 || differentiable_dtype(dt);  // unknown dtype: could be float
    }
    // The primal node itself passes through unchanged. (A loop's, known as its outputs' producer,
    // can give its place to the loop reverse mode runs anyway: Builder::take_place_of.)
    NodePtr adopted = owned_.empty() ? NodePtr(new onnx::NodeProto(node)) : std::move(owned_[static_cast<size_t>(ni)]);
    if (subgraphs)
      b_.adopt_node(std::move(adopted), ys);
    else
      b_.adopt_node(std::move(adopted));
    const auto spike = spikes_.empty() ? spikes_.end() : spikes_.find(ni);
    if (spike != spikes_.end()) {
      if (useful && float_out) spike_jvp(node, spike->second, ys, output_ids[0]);
      return;
    }
    if (!active || !useful) return;
    if (!float_out) return;  // integer/bool results carry no derivative
    bool all_stopped = true;
    for (int k = 0; k < node.output_size(); ++k)
      all_stopped = all_stopped && (output_ids[k] < 0 || stopped_[static_cast<size_t>(output_ids[k])]);
    if (all_stopped) return;
    const JvpRule* rule = rule_for(node, input_ids, from);
    if (!rule) return;  // (a zero rule: piecewise constant)
    JvpCtx ctx{b_, node, p_.opset, {}, ys, {}, {}};
    ctx.bodies = &body_transforms();
    ctx.for_reverse_mode = for_reverse_mode_;
    for (int k = 0; k < node.input_size(); ++k) {
      ctx.xs.push_back(input_ids[k] < 0 ? V{} : primal(input_ids[k]));
      ctx.ts.push_back(input_ids[k] < 0 ? V{} : tangent(input_ids[k]));
    }
    if (subgraphs) {
      std::set<std::string, std::less<>> seen;
      for (const auto& rd : outer_scope_reads(node)) {
        const int id = id_of(rd);
        if (id < 0 || !seen.insert(rd).second) continue;
        ctx.captured.push_back(JvpCtx::Captured{rd, primal(id), tangent(id)});
      }
    }
    b_.set_origin(node.output(0), "_tangent");
    Vs touts = (*rule)(ctx);
    for (int k = 0; k < node.output_size() && k < static_cast<int>(touts.size()); ++k) {
      const std::string& o = node.output(k);
      const Facts& of = p_.facts.at(output_ids[k]);  // (an empty name has id -1: unknown facts)
      const int32_t dt = o.empty() ? -1 : of.dtype;
      if (o.empty() || !touts[k].valid() || !(dt == 0 || differentiable_dtype(dt))) continue;
      if (stopped_[static_cast<size_t>(output_ids[k])]) continue;
      set_tangent(output_ids[k], touts[k], from, ys[k]);
    }
  }

  void set_tangent(int id, V t, int from, V y) {
    tangent(id) = t;
    origin_[static_cast<size_t>(id)] = from;
    bind_tangent(b_, t, y);
  }

  // A spike's derivative comes from its comparison's operands, not its own inputs.
  void spike_jvp(const onnx::NodeProto& node, const SpikeOperands& s, const Vs& ys, int output_id) {
    Vs xs, ts;
    bool active = false;
    int from = -1;
    for (const std::string* name : {&s.a, &s.b, &s.v1, &s.v0}) {
      const int id = name->empty() ? -1 : id_of(*name);
      xs.push_back(id < 0 ? V{} : primal(id));
      ts.push_back(id < 0 || ts.size() >= 2 ? V{} : tangent(id));
      if (ts.back().valid()) {
        active = true;
        from = origin_[static_cast<size_t>(id)];
      }
    }
    if (!active || stopped_[static_cast<size_t>(output_id)]) return;
    JvpCtx ctx{b_, node, p_.opset, xs, ys, ts, {}};
    ctx.bodies = &body_transforms();
    ctx.for_reverse_mode = for_reverse_mode_;
    b_.set_origin(node.output(0), "_tangent");
    const Vs touts = surrogate_jvp(ctx, s, *surrogate_mark(node));
    if (touts[0].valid()) set_tangent(output_id, touts[0], from, ys[0]);
  }

  // The node's JVP rule: the user's (a JVP, or a VJP's tape node in reverse mode), else the op
  // table's; nullptr for a piecewise-constant op. A node without one, or whose schema rules it
  // out, is a diagnostic naming it and the seed it depends on (`from`).
  const JvpRule* rule_for(const onnx::NodeProto& node, const int32_t* input_ids, int from) {
    const bool default_domain = is_default_domain(node);
    const UserRule* custom = user_->for_node(node);
    const JvpRule* rule = nullptr;
    if (custom && custom->vjp && b_.has_tape()) {
      // (Reverse mode by the user's VJP: one tape node, which user_vjp_transpose expands.)
      auto [it, added] = user_jvps_.try_emplace(custom);
      if (added) {
        const int64_t index = custom - user_->rules.data();
        it->second = [index](JvpCtx& c) { return user_vjp_tape_node(c, index); };
      }
      rule = &it->second;
    } else if (custom && custom->jvp) {
      auto [it, added] = user_jvps_.try_emplace(custom);
      if (added) it->second = [f = &*custom->jvp](JvpCtx& c) { return function_jvp(c, *f); };
      rule = &it->second;
    } else {
      if (rules_.zero_for(node)) return nullptr;
      rule = rules_.jvp_for(node);
    }
    // The node's domain and its opset, asked for only by diagnostics and a rule's first use (a
    // string hash per node otherwise).
    const std::string_view domain = default_domain ? std::string_view() : std::string_view(node.domain());
    auto opset = [&] {
      const auto it = opsets_.find(std::string(domain));
      return it == opsets_.end() ? 0 : it->second;
    };
    auto label = [&] { return diag::op_at(node, opset()); };
    if (!rule && custom && custom->vjp)
      diag::fail(Error::Kind::kUnsupported,
                 m_ + ": cannot differentiate " + label() +
                     " in forward mode: its registered rule gives a VJP (used by reverse mode: vjp, grad, "
                     "jacrev) but no JVP" +
                     (for_reverse_mode_ ? " (the reverse mode of a Loop or Scan transposes its body's JVP)" : "") +
                     ". Fix: register a jvp (or a body) for it too");
    if (!rule) {
      if (const std::string advice = unexpanded_contrib_op_advice(node); !advice.empty())
        diag::fail(Error::Kind::kUnsupported, m_ + ": cannot differentiate " + label() + ": " + advice);
      std::string why = node.op_type().rfind("Random", 0) == 0 || node.op_type() == "Bernoulli"
                            ? "random operators have no derivative"
                        : has_subgraphs(node) ? "no derivative rule for this operator (with subgraphs) yet"
                                              : "no derivative rule for this operator yet";
      diag::fail(Error::Kind::kUnsupported,
                 m_ + ": cannot differentiate " + label() + ": " + why + "; it lies on the path from input '" +
                     std::string(p_.value_names.name(from)) + "' to the selected outputs " + quoted_names(r_.outputs) +
                     ". Fix: select inputs/outputs that avoid it, compute it outside the differentiated model, "
                     "or register its JVP or definition (onnax.register_rule; --rules FILE on the command line)");
    }
    // Rules read the inputs and attributes their schema guarantees.
    auto [known_schema, first_use] = schema_of_rule_.try_emplace(rule, nullptr);
    if (first_use) known_schema->second = schemas_.find(node.op_type(), std::string(domain), opset());
    if (const onnx::OpSchema* schema = known_schema->second) {
      const NodeInputFactsOf known(
          [&](int i) { return i < node.input_size() ? p_.facts.at(input_ids[i]).rank() : int64_t{-1}; },
          [&](int i) {
            return i < node.input_size() && input_ids[i] >= 0 ? b_.known_i64(primal(input_ids[i])) : nullptr;
          });
      if (const std::string defect = node_defect(*schema, node, input_ids, known); !defect.empty())
        diag::fail(Error::Kind::kInvalidModel, m_ + ": invalid model: " + label() + " " + defect);
    }
    return rule;
  }

  // Derivative outputs take their readable names: a value this transform computed is renamed
  // (in one pass at the end); a primal value, a graph input, or a value already renamed gets
  // an Identity instead.
  void emit_named(V v, const std::string& name) {
    const std::string_view n = b_.name(v);
    const int id = id_of(n);
    const bool primal_name = id >= 0 && static_cast<size_t>(id) < source_values_ &&
                             primal_[static_cast<size_t>(id)].valid() && b_.name(primal_[static_cast<size_t>(id)]) == n;
    if (!primal_name && !fixed_names_.count(n) && !renamed_.count(v.id)) {
      renamed_.insert(v.id);
      renames_.emplace_back(v, name);
      return;
    }
    b_.op_named("Identity", {v}, {}, name);
  }
  V zeros_like(const std::string& name) { return b_.zeros_like(primal(id_of(name)), facts(name).dtype); }
  void add_derivative_output(V v, const std::string& name, const Facts& f) {
    emit_named(v, name);
    new_outputs_.push_back(value_info_like(name, f));
    derivative_names_.push_back(name);
  }

  // jvp: one `<output>_tangent` per selected output (zeros where it has none).
  void name_tangents() {
    for (const auto& vi : new_inputs_) fixed_names_.insert(vi.name());
    for (const auto& o : r_.outputs) {
      const std::string tname = derived_name(p_.value_names, o, "_tangent");
      b_.set_origin(tname);
      const V t = tangent(id_of(o));
      add_derivative_output(t.valid() ? t : zeros_like(o), tname, facts(o));
    }
  }

  V ct_of(V v) const {
    return v.valid() && static_cast<size_t>(v.id) < ct_.size() ? ct_[static_cast<size_t>(v.id)] : V{};
  }
  void accumulate(V t, V c) {
    if (!t.valid() || !c.valid()) return;
    const V sum = b_.add(ct_of(t), c);  // add() of a zero (invalid) and c is c
    // A cotangent has the shape of the value it is the cotangent of, whose facts may know dims
    // that the cotangent's own computation lost (a crop by pads computed at run time): it takes
    // those, so unbroadcasting it sees sizes of 1 it would otherwise have to sum over.
    b_.learn_dims(sum, b_.facts(t));
    if (static_cast<size_t>(t.id) >= ct_.size()) ct_.resize(static_cast<size_t>(b_.value_count()));
    ct_[static_cast<size_t>(t.id)] = sum;
  }

  // Cotangents flow from the selected outputs (grad: 1; vjp: `<output>_cotangent` inputs) back
  // through the tape, node by node in reverse.
  void transpose_tape() {
    for (const auto& vi : new_inputs_) fixed_names_.insert(vi.name());
    b_.set_tape(nullptr);
    b_.forbid_tangent_inputs(true);
    for (const auto& o : r_.outputs) {
      V seed;
      if (mode_ == Mode::kGrad) {
        seed = b_.scalar(1.0, facts(o).dtype);
      } else {
        const std::string cname = derived_name(p_.value_names, o, "_cotangent");
        seed = b_.existing(cname, facts(o));
        new_inputs_.push_back(value_info_like(cname, facts(o)));
        fixed_names_.insert(cname);
      }
      if (const V t = tangent(id_of(o)); t.valid()) accumulate(t, seed);
    }
    for (size_t k = tape_.size(); k-- > 0;) transpose_node(tape_[k]);
  }

  void transpose_node(Builder::TapeNode& tn) {
    Vs cts;
    bool any = false;
    for (V o : tn.outputs) {
      const V c = ct_of(o);
      cts.push_back(c);
      any = any || c.valid();
    }
    if (!any) return;
    const bool by_user_vjp = tn.node->domain() == kUserVjpDomain;
    const TransposeRule* rule = by_user_vjp ? nullptr : rules_.transpose_for(tn.node->op_type());
    if (!rule && !by_user_vjp)
      diag::fail(Error::Kind::kUnsupported,
                 m_ + ": cannot run ai.onnx::" + tn.node->op_type() + " (opset " + std::to_string(p_.opset) +
                     ") in reverse: its JVP is linear in the tangent but it has no transpose rule yet (while "
                     "differentiating '" +
                     tn.origin +
                     "'). Fix: use jvp (forward mode) for this model, or select "
                     "inputs/outputs whose path avoids " +
                     tn.node->op_type());
    TransposeCtx tctx{b_, *tn.node, p_.opset, tn.inputs, {}, cts, tn.outputs, tn.origin, &body_transforms()};
    for (V in : tn.inputs) tctx.lin.push_back(b_.tangent(in));
    // Cotangent nodes are named after the source value whose tangent the tape node computed.
    std::string_view base = tn.origin;
    if (base.size() > 8 && base.substr(base.size() - 8) == "_tangent") base.remove_suffix(8);
    b_.set_origin(base, "_ct");
    b_.set_transposing(&tn);
    Vs in_cts;
    try {
      in_cts = by_user_vjp ? user_vjp_transpose(tctx, *user_->rules[static_cast<size_t>(tn.node->attribute(0).i())].vjp)
                           : (*rule)(tctx);
    } catch (const Error& e) {
      rethrow_naming_source(e, m_, out_, tn.origin);
    }
    b_.set_transposing(nullptr);
    for (size_t i = 0; i < tn.inputs.size() && i < in_cts.size(); ++i)
      if (tctx.lin[i]) accumulate(tn.inputs[i], in_cts[i]);
  }

  // vjp, grad: one `<input>_cotangent` / `<input>_grad` per selected input (zeros where it has
  // none).
  void name_cotangents() {
    for (size_t i = 0; i < r_.inputs.size(); ++i) {
      const std::string& name = r_.inputs[i];
      const std::string oname = derived_name(p_.value_names, name, mode_ == Mode::kGrad ? "_grad" : "_cotangent");
      b_.set_origin(oname);
      V c = ct_of(seeds_[i]);
      if (!c.valid()) c = zeros_like(name);
      add_derivative_output(c, oname, facts(name));
    }
  }

  // The renames, dead tape-only nodes dropped, inputs, outputs, initializers and value_info,
  // the model's own opset, and the provenance record.
  void write_result() {
    {
      // Subgraphs the transform emitted may read the renamed values by name (a JVP loop's body
      // reads a captured value's tangent from this graph).
      std::unordered_map<std::string, std::string> renamed_reads;
      for (const auto& [v, name] : renames_) renamed_reads.emplace(std::string(b_.name(v)), name);
      b_.rename_all(renames_);
      if (!renamed_reads.empty())
        for (int k : b_.subgraph_nodes()) rename_outer_reads(*out_.mutable_node(k), renamed_reads);
    }
    {
      // Nodes only tape nodes read (a Softmax's axis for its tangent's ReduceSum) are dead in the
      // result; those a graph output or a subgraph names stay.
      std::unordered_set<std::string> still_read;
      for (const auto& o : src_->output()) still_read.insert(o.name());
      for (const auto& vi : new_outputs_) still_read.insert(vi.name());
      for (int k : b_.subgraph_nodes())
        for (auto& read : outer_scope_reads(out_.node(k))) still_read.insert(std::move(read));
      b_.drop_dead_nodes([&](std::string_view n) { return still_read.count(std::string(n)) > 0; });
    }
    for (const auto& vi : src_->input()) *out_.add_input() = vi;
    std::vector<std::string> seed_names;  // (recorded below: which input seeds which derivative)
    for (auto& vi : new_inputs_) {
      seed_names.push_back(provenance::quote(vi.name()));
      *out_.add_input() = std::move(vi);
    }
    for (const auto& o : src_->output()) {
      onnx::ValueInfoProto vi = o;
      const Facts f = facts(o.name());
      if (f.dtype && (!o.has_type() || o.type().has_tensor_type())) write_type(f, vi.mutable_type());
      *out_.add_output() = vi;
    }
    for (auto& vi : new_outputs_) *out_.add_output() = std::move(vi);
    take_initializers(p_, out_);
    for (const auto& vi : src_->value_info()) *out_.add_value_info() = consistent_value_info(vi, facts(vi.name()));
    for (V v : b_.declared())
      if (b_.facts(v).dtype && !b_.dropped(v))
        *out_.add_value_info() = value_info_like(std::string(b_.name(v)), b_.facts(v));
    onnx::ModelProto& result = *p_.model;
    *result.mutable_graph() = std::move(out_);
    tidy(result);
    return_to_source_opset(result, p_.source_opset, m_);

    // The generated names in order: the seeds (jvp: one tangent per selected input; vjp: one
    // cotangent per selected output) and the derivatives (jvp: per selected output; vjp, grad:
    // per selected input), so tools can map each to the source value it belongs to.
    std::vector<std::string> qi, qo, qd;
    for (const auto& n : r_.inputs) qi.push_back(provenance::quote(n));
    for (const auto& n : r_.outputs) qo.push_back(provenance::quote(n));
    for (const auto& n : derivative_names_) qd.push_back(provenance::quote(n));
    provenance::record_step(
        result, "{\"transform\": " + provenance::quote(m_) + ", \"inputs\": " + provenance::list(qi) +
                    ", \"outputs\": " + provenance::list(qo) + ", \"seeds\": " + provenance::list(seed_names) +
                    ", \"derivatives\": " + provenance::list(qd) + "}");
    provenance::set_derivative_outputs(result, derivative_names_);
  }

  Prepared& p_;
  const Mode mode_;
  const std::string m_;
  const Resolved r_;
  const bool for_reverse_mode_;
  const onnx::GraphProto* src_;
  // On the model's arena when it has one, so moving the result into it is a swap.
  const ProtoPtr<onnx::GraphProto> out_graph_;
  onnx::GraphProto& out_;
  Builder b_;
  // Per source value (by id in p.value_names): its primal value, its tangent (invalid: zero),
  // the selected input it depends on (for diagnostics) and whether stop_gradient cuts it.
  const size_t source_values_;
  std::vector<V> primal_, tangent_;
  std::vector<int> origin_;
  std::vector<char> stopped_;
  std::vector<char> needed_;  // on a path to a selected output
  Vs seeds_;
  std::vector<onnx::ValueInfoProto> new_inputs_, new_outputs_;
  std::deque<Builder::TapeNode> tape_;
  std::vector<NodePtr> owned_;
  std::unordered_map<int, SpikeOperands> spikes_;
  const OpTable& rules_;
  // The user's rules (onnax/rules.h), one snapshot for the whole graph; their JVPs as rules,
  // one per registered function (stable addresses: the schema cache is keyed by rule).
  const std::shared_ptr<const UserRules> user_;
  std::unordered_map<const UserRule*, JvpRule> user_jvps_;
  const std::unordered_map<std::string, int> opsets_;
  SchemaCache schemas_;
  // Each rule is registered for one domain::op, and a model has one opset per domain: the
  // schema is looked up once per rule (hashing a pointer), not once per node (hashing a name).
  std::unordered_map<const JvpRule*, const onnx::OpSchema*> schema_of_rule_;
  std::vector<V> ct_;  // reverse mode: the cotangent of each builder value, by id (invalid: zero)
  // Naming the derivatives: names that must not be renamed (new inputs), and the renames.
  std::set<std::string, std::less<>> fixed_names_;
  std::set<int> renamed_;
  std::vector<std::pair<V, std::string>> renames_;
  std::vector<std::string> derivative_names_;
};

// Leaves the result in *p.model.
void differentiate_graph(Prepared& p, Mode mode, const Selection& sel, bool for_reverse_mode) {
  Differentiation(p, mode, sel, for_reverse_mode).run();
}

// Errors name the transform the user called. Rules report under the mode that raised them:
// JVP rules as "jvp: ", transpose rules as "vjp: ", and a control-flow body, differentiated as
// a model of its own, as the transform it was given.
void differentiate(Prepared& p, Mode mode, const Selection& sel, bool for_reverse_mode = false) {
  const std::string m = mode_name(mode);
  try {
    differentiate_graph(p, mode, sel, for_reverse_mode);
  } catch (const Error& e) {
    const std::string_view what = e.what();
    for (const std::string_view raised : {"jvp: ", "vjp: "})
      if (what.starts_with(raised) && raised.substr(0, 3) != m)
        diag::fail(e.kind(), m + ": " + std::string(what.substr(raised.size())));
    throw;
  }
}

}  // namespace

namespace {
Selection grad_selection(const std::optional<std::vector<std::string>>& inputs,
                         const std::optional<std::string>& output) {
  Selection s;
  s.inputs = inputs;
  if (output) s.outputs = std::vector<std::string>{*output};
  return s;
}
// The heap entry points: the result moves out of p's private model.
onnx::ModelProto differentiated(Prepared p, Mode mode, const Selection& selection) {
  differentiate(p, mode, selection);
  return std::move(*p.model);
}
}  // namespace

onnx::ModelProto jvp(const onnx::ModelProto& model, const Selection& selection) {
  return differentiated(prepare(model, "jvp"), Mode::kJvp, selection);
}
onnx::ModelProto jvp(onnx::ModelProto&& model, const Selection& selection) {
  return differentiated(prepare(std::move(model), "jvp"), Mode::kJvp, selection);
}
std::string jvp_serialized(const std::string& model, const Selection& selection) {
  return transform_serialized(model, "jvp", [&](Prepared& p) { differentiate(p, Mode::kJvp, selection); });
}

onnx::ModelProto vjp(const onnx::ModelProto& model, const Selection& selection) {
  return differentiated(prepare(model, "vjp"), Mode::kVjp, selection);
}
onnx::ModelProto vjp(onnx::ModelProto&& model, const Selection& selection) {
  return differentiated(prepare(std::move(model), "vjp"), Mode::kVjp, selection);
}
std::string vjp_serialized(const std::string& model, const Selection& selection) {
  return transform_serialized(model, "vjp", [&](Prepared& p) { differentiate(p, Mode::kVjp, selection); });
}

onnx::ModelProto grad(const onnx::ModelProto& model, const std::optional<std::vector<std::string>>& inputs,
                      const std::optional<std::string>& output) {
  return differentiated(prepare(model, "grad"), Mode::kGrad, grad_selection(inputs, output));
}
onnx::ModelProto grad(onnx::ModelProto&& model, const std::optional<std::vector<std::string>>& inputs,
                      const std::optional<std::string>& output) {
  return differentiated(prepare(std::move(model), "grad"), Mode::kGrad, grad_selection(inputs, output));
}
void jvp_in_place(onnx::ModelProto& model, const Selection& selection) {
  Prepared p = prepare_in_place(model, "jvp");
  differentiate(p, Mode::kJvp, selection);
}
void vjp_in_place(onnx::ModelProto& model, const Selection& selection) {
  Prepared p = prepare_in_place(model, "vjp");
  differentiate(p, Mode::kVjp, selection);
}
void grad_in_place(onnx::ModelProto& model, const std::optional<std::vector<std::string>>& inputs,
                   const std::optional<std::string>& output) {
  Prepared p = prepare_in_place(model, "grad");
  differentiate(p, Mode::kGrad, grad_selection(inputs, output));
}

std::string grad_serialized(const std::string& model, const std::optional<std::vector<std::string>>& inputs,
                            const std::optional<std::string>& output) {
  return transform_serialized(model, "grad",
                              [&](Prepared& p) { differentiate(p, Mode::kGrad, grad_selection(inputs, output)); });
}

const BodyTransforms& body_transforms() {
  static const BodyTransforms transforms{
      [](onnx::ModelProto model, const VmapOptions& options) { return vmap(std::move(model), options); },
      [](bool forward, onnx::ModelProto model, const Selection& selection, bool for_reverse_mode) {
        const Mode mode = forward ? Mode::kJvp : Mode::kVjp;
        Prepared p = prepare(std::move(model), mode_name(mode));
        differentiate(p, mode, selection, for_reverse_mode);
        return std::move(*p.model);
      }};
  return transforms;
}

}  // namespace onnax
