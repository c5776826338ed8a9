// jvp, vjp and grad: generic interpreters over the derivative rules. Forward mode runs the
// JVP rules next to the primal nodes. Reverse mode runs the same JVP rules, but the nodes
// that are linear in tangents go to a tape, which is then transposed node by node
// (linearize + transpose), accumulating cotangents where a value fans out.
#include <onnax/onnax.h>
#include <onnx/defs/schema.h>

#include <deque>
#include <set>
#include <unordered_map>
#include <unordered_set>

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
#include "transforms/bodies.h"
#include "transforms/contrib_ops.h"
#include "transforms/lower_opset.h"
#include "transforms/prepare.h"
#include "transforms/provenance.h"
#include "transforms/subgraph.h"
#include "transforms/tidy.h"

namespace onnax {
namespace {

enum class Mode { kJvp, kVjp, kGrad };

const char* mode_name(Mode m) {
  return m == Mode::kJvp ? "jvp" : m == Mode::kVjp ? "vjp" : "grad";
}

std::string quoted_names(const std::vector<std::string>& names) {
  std::vector<std::string> q;
  for (const auto& n : names) q.push_back("'" + n + "'");
  return "[" + diag::join(q) + "]";
}

struct Resolved {
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
};

// The name of a derivative of `base`: base + suffix, or, when earlier transforms took that name,
// the suffix once more per order (grad of grad of grad gives w_grad_grad_grad; jvp of jvp pairs
// the tangent input w_tangent_tangent with the output loss_tangent_tangent); numbered only past
// a few orders.
std::string derived_name(NameScope& names, const std::string& base, std::string_view suffix) {
  std::string name = base + std::string(suffix);
  for (int order = 1; order < 6 && names.contains(name); ++order) name += suffix;
  return names.fresh(name);
}

Resolved resolve(const Prepared& p, Mode mode, const Selection& sel) {
  const std::string m = mode_name(mode);
  const auto& g = *p.graph;
  std::vector<std::string> runtime, float_runtime, float_inits, outputs, float_outputs;
  for (const auto* vi : p.runtime_inputs) {
    runtime.push_back(vi->name());
    if (differentiable_dtype(p.fact(vi->name()).dtype)) float_runtime.push_back(vi->name());
  }
  for (const auto& t : g.initializer())
    if (differentiable_dtype(t.data_type())) float_inits.push_back(t.name());
  for (const auto& o : g.output()) {
    outputs.push_back(o.name());
    if (differentiable_dtype(p.fact(o.name()).dtype)) float_outputs.push_back(o.name());
  }
  Resolved r;
  // The checks every selected name gets, inputs and outputs alike.
  auto check_float_once = [&](const std::string& role, const std::string& name, std::set<std::string>& seen,
                              const std::string& float_choices) {
    const int32_t dt = p.fact(name).dtype;
    if (!differentiable_dtype(dt))
      diag::fail(Error::Kind::kSelection, m + ": " + role + " selects '" + name + "' of dtype " + diag::dtype_name(dt) +
                                              "; derivatives are defined for float32/float64 only. Fix: select one "
                                              "of " +
                                              float_choices);
    if (!seen.insert(name).second)
      diag::fail(Error::Kind::kSelection,
                 m + ": " + role + " selects '" + name + "' twice. Fix: select each name once");
  };
  if (sel.inputs) {
    std::set<std::string> seen;
    for (const auto& name : *sel.inputs) {
      const bool is_runtime = std::find(runtime.begin(), runtime.end(), name) != runtime.end();
      const bool is_init = p.initializer_names.count(name) != 0;
      if (!is_runtime && !is_init)
        diag::fail(Error::Kind::kSelection,
                   m + ": inputs selects '" + name + "', which is neither a graph input nor an initializer; " +
                       "available inputs: " + quoted_names(runtime) + ", initializers: " + quoted_names(float_inits) +
                       ". Fix: select one of these names");
      check_float_once(
          "inputs", name, seen,
          "the float inputs " + quoted_names(float_runtime) + " or initializers " + quoted_names(float_inits));
      r.inputs.push_back(name);
    }
  } else {
    r.inputs = float_runtime;
  }
  if (r.inputs.empty() && sel.inputs)
    diag::fail(Error::Kind::kSelection, m + ": inputs=[] selects nothing to differentiate with respect to. Fix: " +
                                            "select at least one of the float inputs " + quoted_names(float_runtime) +
                                            " or initializers " + quoted_names(float_inits) +
                                            ", or leave inputs unset for the float inputs");
  if (r.inputs.empty())
    diag::fail(Error::Kind::kSelection,
               m + ": no input to differentiate with respect to: the model has no float32/float64 runtime inputs " +
                   "(inputs: " + quoted_names(runtime) + "). Fix: " +
                   (float_inits.empty() ? std::string("add a float32/float64 input")
                                        : "select initializers explicitly, e.g. inputs=" + quoted_names(float_inits)));
  if (sel.outputs) {
    std::set<std::string> seen;
    for (const auto& name : *sel.outputs) {
      if (std::find(outputs.begin(), outputs.end(), name) == outputs.end())
        diag::fail(Error::Kind::kSelection, m + ": outputs selects '" + name + "', which is not a graph output; " +
                                                "available outputs: " + quoted_names(outputs) +
                                                ". Fix: select one of these names");
      check_float_once("outputs", name, seen, quoted_names(float_outputs));
      r.outputs.push_back(name);
    }
  } else if (mode == Mode::kGrad) {
    // The only rank-0 float output, when there is exactly one.
    for (const auto& n : float_outputs)
      if (p.fact(n).rank() == 0) r.outputs.push_back(n);
    if (r.outputs.size() != 1)
      diag::fail(Error::Kind::kSelection, "grad: no output was selected and the model has " +
                                              std::to_string(r.outputs.size()) + " rank-0 float outputs " +
                                              quoted_names(r.outputs) + " (outputs: " + quoted_names(outputs) +
                                              "). Fix: pass output=<name of the scalar loss>");
  } else {
    std::vector<std::string> generated = provenance::derivative_outputs(*p.model);
    if (mode == Mode::kJvp)
      for (const auto& n : generated)
        if (std::find(float_outputs.begin(), float_outputs.end(), n) != float_outputs.end()) r.outputs.push_back(n);
    if (r.outputs.empty()) r.outputs = float_outputs;
  }
  if (r.outputs.empty() && sel.outputs)
    diag::fail(Error::Kind::kSelection, m + ": outputs=[] selects nothing to differentiate. Fix: select at least " +
                                            "one of the float outputs " + quoted_names(float_outputs) +
                                            ", or leave outputs unset for all of them");
  if (r.outputs.empty())
    diag::fail(Error::Kind::kSelection, m + ": the model has no float32/float64 output to differentiate; outputs: " +
                                            quoted_names(outputs) + ". Fix: add a float output");
  if (mode == Mode::kGrad) {
    const Facts f = p.fact(r.outputs[0]);
    if (f.rank() != 0)
      diag::fail(Error::Kind::kSelection,
                 "grad: output '" + r.outputs[0] + "' has shape " + f.shape_string() +
                     "; grad needs a rank-0 (scalar) loss. Fix: reduce it to a scalar (ReduceSum/ReduceMean) or use "
                     "vjp with an explicit cotangent");
  }
  return r;
}

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

// Leaves the result in *p.model.
void differentiate_graph(Prepared& p, Mode mode, const Selection& sel, bool for_reverse_mode) {
  const std::string m = mode_name(mode);
  const Resolved r = resolve(p, mode, sel);

  const onnx::GraphProto* src = p.graph;
  // On the model's arena when it has one, so moving the result into it is a swap.
  const ProtoPtr<onnx::GraphProto> out_graph = make_proto<onnx::GraphProto>(p.model->GetArena());
  onnx::GraphProto& out = *out_graph;
  out.set_name(src->name());
  out.set_doc_string(src->doc_string());
  Builder b(out, p.value_names, p.node_names, p.opset);
  b.enable_inference(model_opsets(p));
  b.set_loop_inference([opsets = model_opsets(p)](const onnx::NodeProto& loop, const std::vector<const Facts*>& in,
                                                  Dim trips,
                                                  const std::function<const Facts*(std::string_view)>& outer) {
    return loop_output_facts(loop, in, trips, opsets, outer);
  });
  // Reverse mode transposes a weight shared by many nodes (an unrolled recurrence) once, not
  // once per use.
  b.enable_reuse();

  // Per source value (by id in p.value_names): its primal value, its tangent (invalid: zero)
  // and the selected input it depends on (for diagnostics).
  const size_t source_values = static_cast<size_t>(p.value_names.size());
  std::vector<V> primal(source_values), tangent(source_values);
  std::vector<int> origin(source_values, -1);
  auto id_of = [&](std::string_view n) { return p.value_names.id(n); };
  auto at = [](std::vector<V>& table, int id) -> V& { return table[static_cast<size_t>(id)]; };
  auto facts = [&](const std::string& n) -> const Facts& { return p.fact(n); };
  for (const auto& t : src->initializer()) {
    at(primal, id_of(t.name())) = b.existing(t.name(), &facts(t.name()));
    b.register_data(t.name(), &t);
    b.remember_tensor(t.name(), t);
  }
  for (const auto& vi : src->input())
    if (!at(primal, id_of(vi.name())).valid()) at(primal, id_of(vi.name())) = b.existing(vi.name(), &facts(vi.name()));

  // Values marked by stop_gradient get no tangent: the nodes reading them see constants.
  std::vector<char> stopped(source_values, 0);
  for (const auto& name : provenance::names_at(*p.model, provenance::kStopGradientKey)) {
    const int id = id_of(name);
    if (id < 0)
      diag::fail(Error::Kind::kInvalidModel, m + ": metadata_props['" + provenance::kStopGradientKey + "'] marks '" +
                                                 name +
                                                 "', which is not a value of the model. Fix: mark values of "
                                                 "the model with onnax.stop_gradient");
    if (std::find(r.inputs.begin(), r.inputs.end(), name) != r.inputs.end())
      diag::fail(Error::Kind::kSelection, m + ": input '" + name +
                                              "' is selected for differentiation but marked "
                                              "by stop_gradient, so its derivative would be cut. Fix: select "
                                              "other inputs, or differentiate the model before marking it");
    stopped[static_cast<size_t>(id)] = 1;
  }

  // Seeds: one tangent per selected input.
  std::vector<onnx::ValueInfoProto> new_inputs;
  Vs seeds;
  for (const auto& name : r.inputs) {
    const Facts f = facts(name);
    const std::string tname = derived_name(p.value_names, name, "_tangent");
    V t = b.existing(tname, f);
    b.mark_tangent(t);
    b.set_witness(t, at(primal, id_of(name)));
    if (mode == Mode::kJvp) new_inputs.push_back(value_info_like(tname, f));
    at(tangent, id_of(name)) = t;
    origin[static_cast<size_t>(id_of(name))] = id_of(name);
    seeds.push_back(t);
  }

  std::deque<Builder::TapeNode> tape;
  if (mode != Mode::kJvp) b.set_tape(&tape);
  const std::vector<char> needed = needed_values(p, r.outputs);
  {
    std::vector<int> seed_ids;
    for (const auto& name : r.inputs) seed_ids.push_back(id_of(name));
    // About three new values and nodes per differentiated node in reverse mode (tangent,
    // primal helper, cotangent), one or two in forward mode.
    const size_t per_node = mode == Mode::kJvp ? 2 : 3;
    const size_t expected = differentiated_nodes(p, seed_ids, needed) * per_node;
    // (Not the node scope: generated nodes take their outputs' names, see Builder::name_node.)
    p.value_names.expect(static_cast<size_t>(p.value_names.size()) + expected);
  }
  const OpTable& rules = OpTable::instance();
  // The user's rules (onnax/rules.h), one snapshot for the whole graph; their JVPs as rules,
  // one per registered function (stable addresses: the schema cache below is keyed by rule).
  const std::shared_ptr<const UserRules> user = user_rules();
  std::unordered_map<const UserRule*, JvpRule> user_jvps;
  const std::unordered_map<std::string, int> opsets = model_opsets(p);
  SchemaCache schemas;
  // Each rule is registered for one domain::op, and a model has one opset per domain: the
  // schema is looked up once per rule (hashing a pointer), not once per node (hashing a name).
  std::unordered_map<const JvpRule*, const onnx::OpSchema*> schema_of_rule;
  // A private graph's nodes are taken out of it and handed to the result by pointer (the same
  // objects, so rules and registered constants keep reading them); others are copied.
  const int node_count = src->node_size();
  // Spikes marked for a surrogate derivative (with_surrogates): their comparisons' operands,
  // read before the nodes move out of the graph.
  std::unordered_map<int, SpikeOperands> spikes;
  {
    std::unordered_map<std::string, const onnx::NodeProto*> producer;
    for (int i = 0; i < node_count; ++i) {
      const auto& n = src->node(i);
      if (n.metadata_props_size() == 0 || !surrogate_mark(n)) continue;
      if (producer.empty())
        for (const auto& m2 : src->node())
          for (const auto& o : m2.output()) producer.emplace(o, &m2);
      auto operands = spike_operands(n, producer);
      if (!operands)
        diag::fail(Error::Kind::kInvalidModel,
                   m + ": " + diag::node_location(n) +
                       " is marked for a surrogate derivative but is not a spike (a "
                       "Cast or Where of a comparison, or a Sign). Fix: mark spikes with onnax.with_surrogates");
      spikes.emplace(i, std::move(*operands));
    }
  }
  std::vector<NodePtr> owned = take_nodes(p);

  for (int ni = 0; ni < node_count; ++ni) {
    limits::poll();
    // Nodes are scattered over the heap: start loading one a few nodes ahead.
    constexpr int kAhead = 4;
    if (ni + kAhead < node_count)
      __builtin_prefetch(owned.empty() ? &src->node(ni + kAhead) : owned[static_cast<size_t>(ni + kAhead)].get());
    const onnx::NodeProto& node = owned.empty() ? src->node(ni) : *owned[static_cast<size_t>(ni)];
    const int32_t* input_ids = p.node_ids.inputs(ni);
    const int32_t* output_ids = p.node_ids.outputs(ni, node.input_size());
    Vs ys;
    for (int k = 0; k < node.output_size(); ++k) {
      if (output_ids[k] < 0) {
        ys.push_back(V{});
        continue;
      }
      V v = b.existing_id(output_ids[k], &p.facts.at(output_ids[k]));
      at(primal, output_ids[k]) = v;
      ys.push_back(v);
    }
    if (node.op_type() == "Constant" && node.domain().empty())
      for (const auto& a : node.attribute())
        if (a.name() == "value" && a.has_t()) b.register_data(node.output(0), &a.t());
    if (auto t = constant_tensor(node)) b.remember_tensor(node.output(0), *t);

    bool active = false, useful = false;
    int from = -1;
    for (int k = 0; k < node.input_size(); ++k)
      if (input_ids[k] >= 0 && at(tangent, input_ids[k]).valid()) {
        active = true;
        from = origin[static_cast<size_t>(input_ids[k])];
      }
    const bool subgraphs = has_subgraphs(node);
    if (subgraphs)
      for (const auto& rd : outer_scope_reads(node)) {
        const int id = id_of(rd);
        if (id >= 0 && at(tangent, id).valid()) {
          active = true;
          from = origin[static_cast<size_t>(id)];
        }
      }
    for (int k = 0; k < node.output_size(); ++k)
      useful = useful || (output_ids[k] >= 0 && needed[static_cast<size_t>(output_ids[k])]);
    bool float_out = false;
    for (int k = 0; k < node.output_size(); ++k) {
      const int32_t dt = output_ids[k] < 0 ? -1 : p.facts.at(output_ids[k]).dtype;
      float_out = float_out || dt == 0 || differentiable_dtype(dt);  // unknown dtype: could be float
    }
    // The primal node itself passes through unchanged. (A loop's, known as its outputs' producer,
    // can give its place to the loop reverse mode runs anyway: Builder::take_place_of.)
    NodePtr adopted = owned.empty() ? NodePtr(new onnx::NodeProto(node)) : std::move(owned[static_cast<size_t>(ni)]);
    if (subgraphs)
      b.adopt_node(std::move(adopted), ys);
    else
      b.adopt_node(std::move(adopted));
    const auto spike = spikes.empty() ? spikes.end() : spikes.find(ni);
    if (spike != spikes.end()) {
      // A spike's derivative comes from its comparison's operands, not its own inputs.
      const SpikeOperands& s = spike->second;
      Vs xs, ts;
      active = false;
      for (const std::string* name : {&s.a, &s.b, &s.v1, &s.v0}) {
        const int id = name->empty() ? -1 : id_of(*name);
        xs.push_back(id < 0 ? V{} : at(primal, id));
        ts.push_back(id < 0 || ts.size() >= 2 ? V{} : at(tangent, id));
        if (ts.back().valid()) {
          active = true;
          from = origin[static_cast<size_t>(id)];
        }
      }
      if (!active || !useful || !float_out || stopped[static_cast<size_t>(output_ids[0])]) continue;
      JvpCtx ctx{b, node, p.opset, xs, ys, ts, {}};
      ctx.bodies = &body_transforms();
      ctx.for_reverse_mode = for_reverse_mode;
      b.set_origin(node.output(0), "_tangent");
      const Vs touts = surrogate_jvp(ctx, s, *surrogate_mark(node));
      if (touts[0].valid()) {
        at(tangent, output_ids[0]) = touts[0];
        origin[static_cast<size_t>(output_ids[0])] = from;
        bind_tangent(b, touts[0], ys[0]);
      }
      continue;
    }
    if (!active || !useful) continue;
    if (!float_out) continue;  // integer/bool results carry no derivative
    bool all_stopped = true;
    for (int k = 0; k < node.output_size(); ++k)
      all_stopped = all_stopped && (output_ids[k] < 0 || stopped[static_cast<size_t>(output_ids[k])]);
    if (all_stopped) continue;
    const bool default_domain = is_default_domain(node);
    const UserRule* custom = user->for_node(node);
    const JvpRule* rule = nullptr;
    if (custom && custom->vjp && b.has_tape()) {
      // (Reverse mode by the user's VJP: one tape node, which user_vjp_transpose expands.)
      auto [it, added] = user_jvps.try_emplace(custom);
      if (added) {
        const int64_t index = custom - user->rules.data();
        it->second = [index](JvpCtx& c) { return user_vjp_tape_node(c, index); };
      }
      rule = &it->second;
    } else if (custom && custom->jvp) {
      auto [it, added] = user_jvps.try_emplace(custom);
      if (added) it->second = [f = &*custom->jvp](JvpCtx& c) { return function_jvp(c, *f); };
      rule = &it->second;
    } else {
      if (rules.zero_for(node)) continue;
      rule = rules.jvp_for(node);
    }
    // The node's domain and its opset, asked for only by diagnostics and a rule's first use (a
    // string hash per node otherwise).
    const std::string_view domain = default_domain ? std::string_view() : std::string_view(node.domain());
    auto opset = [&] {
      const auto it = opsets.find(std::string(domain));
      return it == opsets.end() ? 0 : it->second;
    };
    auto label = [&] { return diag::op_at(node, opset()); };
    if (!rule && custom && custom->vjp)
      diag::fail(Error::Kind::kUnsupported,
                 m + ": cannot differentiate " + label() +
                     " in forward mode: its registered rule gives a VJP (used by reverse mode: vjp, grad, "
                     "jacrev) but no JVP" +
                     (for_reverse_mode ? " (the reverse mode of a Loop or Scan transposes its body's JVP)" : "") +
                     ". Fix: register a jvp (or a body) for it too");
    if (!rule) {
      if (const std::string advice = unexpanded_contrib_op_advice(node); !advice.empty())
        diag::fail(Error::Kind::kUnsupported, m + ": cannot differentiate " + label() + ": " + advice);
      std::string why = node.op_type().rfind("Random", 0) == 0 || node.op_type() == "Bernoulli"
                            ? "random operators have no derivative"
                        : subgraphs ? "no derivative rule for this operator (with subgraphs) yet"
                                    : "no derivative rule for this operator yet";
      diag::fail(Error::Kind::kUnsupported,
                 m + ": cannot differentiate " + label() + ": " + why + "; it lies on the path from input '" +
                     std::string(p.value_names.name(from)) + "' to the selected outputs " + quoted_names(r.outputs) +
                     ". Fix: select inputs/outputs that avoid it, compute it outside the differentiated model, "
                     "or register its JVP or definition (onnax.register_rule; --rules FILE on the command line)");
    }
    // Rules read the inputs and attributes their schema guarantees.
    auto [known_schema, first_use] = schema_of_rule.try_emplace(rule, nullptr);
    if (first_use) known_schema->second = schemas.find(node.op_type(), std::string(domain), opset());
    if (const onnx::OpSchema* schema = known_schema->second) {
      const NodeInputFactsOf known(
          [&](int i) { return i < node.input_size() ? p.facts.at(input_ids[i]).rank() : int64_t{-1}; },
          [&](int i) {
            return i < node.input_size() && input_ids[i] >= 0 ? b.known_i64(at(primal, input_ids[i])) : nullptr;
          });
      if (const std::string defect = node_defect(*schema, node, input_ids, known); !defect.empty())
        diag::fail(Error::Kind::kInvalidModel, m + ": invalid model: " + label() + " " + defect);
    }
    JvpCtx ctx{b, node, p.opset, {}, ys, {}, {}};
    ctx.bodies = &body_transforms();
    ctx.for_reverse_mode = for_reverse_mode;
    for (int k = 0; k < node.input_size(); ++k) {
      ctx.xs.push_back(input_ids[k] < 0 ? V{} : at(primal, input_ids[k]));
      ctx.ts.push_back(input_ids[k] < 0 ? V{} : at(tangent, input_ids[k]));
    }
    if (subgraphs) {
      std::set<std::string, std::less<>> seen;
      for (const auto& rd : outer_scope_reads(node)) {
        const int id = id_of(rd);
        if (id < 0 || !seen.insert(rd).second) continue;
        ctx.captured.push_back(JvpCtx::Captured{rd, at(primal, id), at(tangent, id)});
      }
    }
    b.set_origin(node.output(0), "_tangent");
    Vs touts = (*rule)(ctx);
    for (int k = 0; k < node.output_size() && k < static_cast<int>(touts.size()); ++k) {
      const std::string& o = node.output(k);
      const Facts& of = p.facts.at(output_ids[k]);  // (an empty name has id -1: unknown facts)
      const int32_t dt = o.empty() ? -1 : of.dtype;
      if (o.empty() || !touts[k].valid() || !(dt == 0 || differentiable_dtype(dt))) continue;
      if (stopped[static_cast<size_t>(output_ids[k])]) continue;
      at(tangent, output_ids[k]) = touts[k];
      origin[static_cast<size_t>(output_ids[k])] = from;
      bind_tangent(b, touts[k], ys[k]);
    }
  }

  std::vector<onnx::ValueInfoProto> new_outputs;
  std::vector<std::string> derivative_names;
  // Derivative outputs take their readable names: a value this transform computed is renamed
  // (in one pass at the end); a primal value, a graph input, or a value already renamed gets
  // an Identity instead.
  // Fixed: the names of primal values (source values keep their names) and of new inputs.
  std::set<std::string, std::less<>> fixed_names;
  for (const auto& vi : new_inputs) fixed_names.insert(vi.name());
  auto is_primal_name = [&](std::string_view n) {
    const int id = id_of(n);
    return id >= 0 && static_cast<size_t>(id) < source_values && primal[static_cast<size_t>(id)].valid() &&
           b.name(primal[static_cast<size_t>(id)]) == n;
  };
  std::set<int> renamed;
  std::vector<std::pair<V, std::string>> renames;
  auto emit_named = [&](V v, const std::string& name) {
    if (!is_primal_name(b.name(v)) && !fixed_names.count(b.name(v)) && !renamed.count(v.id)) {
      renamed.insert(v.id);
      renames.emplace_back(v, name);
      return;
    }
    b.op_named("Identity", {v}, {}, name);
  };
  auto zeros_like = [&](const std::string& name) { return b.zeros_like(at(primal, id_of(name)), facts(name).dtype); };

  if (mode == Mode::kJvp) {
    for (const auto& o : r.outputs) {
      const std::string tname = derived_name(p.value_names, o, "_tangent");
      b.set_origin(tname);
      const V t = at(tangent, id_of(o));
      emit_named(t.valid() ? t : zeros_like(o), tname);
      new_outputs.push_back(value_info_like(tname, facts(o)));
      derivative_names.push_back(tname);
    }
  } else {
    // Transpose the tape: cotangents flow from the selected outputs back to the seeds.
    b.set_tape(nullptr);
    b.forbid_tangent_inputs(true);
    std::vector<V> ct;  // cotangent of each builder value, by id (invalid: zero)
    auto ct_of = [&](V v) {
      return v.valid() && static_cast<size_t>(v.id) < ct.size() ? ct[static_cast<size_t>(v.id)] : V{};
    };
    auto accumulate = [&](V t, V c) {
      if (!t.valid() || !c.valid()) return;
      const V sum = b.add(ct_of(t), c);  // add() of a zero (invalid) and c is c
      // A cotangent has the shape of the value it is the cotangent of, whose facts may know dims
      // that the cotangent's own computation lost (a crop by pads computed at run time): it takes
      // those, so unbroadcasting it sees sizes of 1 it would otherwise have to sum over.
      b.learn_dims(sum, b.facts(t));
      if (static_cast<size_t>(t.id) >= ct.size()) ct.resize(static_cast<size_t>(b.value_count()));
      ct[static_cast<size_t>(t.id)] = sum;
    };
    for (const auto& o : r.outputs) {
      V seed;
      if (mode == Mode::kGrad) {
        seed = b.scalar(1.0, facts(o).dtype);
      } else {
        const std::string cname = derived_name(p.value_names, o, "_cotangent");
        seed = b.existing(cname, facts(o));
        new_inputs.push_back(value_info_like(cname, facts(o)));
        fixed_names.insert(cname);
      }
      if (const V t = at(tangent, id_of(o)); t.valid()) accumulate(t, seed);
    }
    for (size_t k = tape.size(); k-- > 0;) {
      Builder::TapeNode& tn = tape[k];
      Vs cts;
      bool any = false;
      for (V o : tn.outputs) {
        const V c = ct_of(o);
        cts.push_back(c);
        any = any || c.valid();
      }
      if (!any) continue;
      const bool by_user_vjp = tn.node->domain() == kUserVjpDomain;
      const TransposeRule* rule = by_user_vjp ? nullptr : rules.transpose_for(tn.node->op_type());
      if (!rule && !by_user_vjp)
        diag::fail(Error::Kind::kUnsupported,
                   m + ": cannot run ai.onnx::" + tn.node->op_type() + " (opset " + std::to_string(p.opset) +
                       ") in reverse: its JVP is linear in the tangent but it has no transpose rule yet (while "
                       "differentiating '" +
                       tn.origin +
                       "'). Fix: use jvp (forward mode) for this model, or select "
                       "inputs/outputs whose path avoids " +
                       tn.node->op_type());
      TransposeCtx tctx{b, *tn.node, p.opset, tn.inputs, {}, cts, tn.outputs, tn.origin, &body_transforms()};
      for (V in : tn.inputs) tctx.lin.push_back(b.tangent(in));
      // Cotangent nodes are named after the source value whose tangent the tape node computed.
      std::string_view base = tn.origin;
      if (base.size() > 8 && base.substr(base.size() - 8) == "_tangent") base.remove_suffix(8);
      b.set_origin(base, "_ct");
      b.set_transposing(&tn);
      Vs in_cts;
      try {
        in_cts = by_user_vjp
                     ? user_vjp_transpose(tctx, *user->rules[static_cast<size_t>(tn.node->attribute(0).i())].vjp)
                     : (*rule)(tctx);
      } catch (const Error& e) {
        rethrow_naming_source(e, m, out, tn.origin);
      }
      b.set_transposing(nullptr);
      for (size_t i = 0; i < tn.inputs.size() && i < in_cts.size(); ++i)
        if (tctx.lin[i]) accumulate(tn.inputs[i], in_cts[i]);
    }
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      const std::string& name = r.inputs[i];
      const std::string oname = derived_name(p.value_names, name, mode == Mode::kGrad ? "_grad" : "_cotangent");
      b.set_origin(oname);
      V c = ct_of(seeds[i]);
      if (!c.valid()) c = zeros_like(name);
      emit_named(c, oname);
      new_outputs.push_back(value_info_like(oname, facts(name)));
      derivative_names.push_back(oname);
    }
  }

  {
    // Subgraphs the transform emitted may read the renamed values by name (a JVP loop's body
    // reads a captured value's tangent from this graph).
    std::unordered_map<std::string, std::string> renamed_reads;
    for (const auto& [v, name] : renames) renamed_reads.emplace(std::string(b.name(v)), name);
    b.rename_all(renames);
    if (!renamed_reads.empty())
      for (int k : b.subgraph_nodes()) rename_outer_reads(*out.mutable_node(k), renamed_reads);
  }
  {
    // Nodes only tape nodes read (a Softmax's axis for its tangent's ReduceSum) are dead in the
    // result; those a graph output or a subgraph names stay.
    std::unordered_set<std::string> still_read;
    for (const auto& o : src->output()) still_read.insert(o.name());
    for (const auto& vi : new_outputs) still_read.insert(vi.name());
    for (int k : b.subgraph_nodes())
      for (auto& read : outer_scope_reads(out.node(k))) still_read.insert(std::move(read));
    b.drop_dead_nodes([&](std::string_view n) { return still_read.count(std::string(n)) > 0; });
  }
  for (const auto& vi : src->input()) *out.add_input() = vi;
  std::vector<std::string> seed_names;  // (recorded below: which input seeds which derivative)
  for (auto& vi : new_inputs) {
    seed_names.push_back(provenance::quote(vi.name()));
    *out.add_input() = std::move(vi);
  }
  for (const auto& o : src->output()) {
    onnx::ValueInfoProto vi = o;
    const Facts f = facts(o.name());
    if (f.dtype && (!o.has_type() || o.type().has_tensor_type())) write_type(f, vi.mutable_type());
    *out.add_output() = vi;
  }
  for (auto& vi : new_outputs) *out.add_output() = std::move(vi);
  take_initializers(p, out);
  for (const auto& vi : src->value_info()) *out.add_value_info() = consistent_value_info(vi, facts(vi.name()));
  for (V v : b.declared())
    if (b.facts(v).dtype && !b.dropped(v)) *out.add_value_info() = value_info_like(std::string(b.name(v)), b.facts(v));
  onnx::ModelProto& result = *p.model;
  *result.mutable_graph() = std::move(out);
  tidy(result);
  return_to_source_opset(result, p.source_opset, m);

  // The generated names in order: the seeds (jvp: one tangent per selected input; vjp: one
  // cotangent per selected output) and the derivatives (jvp: per selected output; vjp, grad:
  // per selected input), so tools can map each to the source value it belongs to.
  std::vector<std::string> qi, qo, qd;
  for (const auto& n : r.inputs) qi.push_back(provenance::quote(n));
  for (const auto& n : r.outputs) qo.push_back(provenance::quote(n));
  for (const auto& n : derivative_names) qd.push_back(provenance::quote(n));
  provenance::record_step(result, "{\"transform\": " + provenance::quote(m) + ", \"inputs\": " + provenance::list(qi) +
                                      ", \"outputs\": " + provenance::list(qo) +
                                      ", \"seeds\": " + provenance::list(seed_names) +
                                      ", \"derivatives\": " + provenance::list(qd) + "}");
  provenance::set_derivative_outputs(result, derivative_names);
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
