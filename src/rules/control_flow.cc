// Derivatives through control flow: JVP rules for Loop, Scan and If, and the transpose of the
// Loops that JVP puts on the tape in reverse mode.
//
// A body is differentiated as a model of its own (transforms/subgraph.h) by the same jvp and
// vjp that differentiate whole models, so every op with a rule works inside bodies, nested
// control flow included. Values a body reads from the enclosing graph become loop-carried
// constants of the JVP loop (as exporters such as jax2onnx write them): the body is then closed,
// and in reverse mode every tangent it needs is an input of the node on the tape, which the
// transpose can account for.
//
// Reverse mode through a Loop (DESIGN.md section 3, linearize then transpose): the JVP loop is
// linear in its tangent state. Its transpose runs a forward loop that stacks the primal state
// of every iteration, then a loop over the iterations in reverse order whose body is the vjp of
// the JVP body, reading that iteration's primal state from the stacks.
#include <onnax/onnax.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "diagnostics/error.h"
#include "rules/derivative.h"
#include "rules/loop_products.h"
#include "rules/loop_residuals.h"
#include "transforms/prepare.h"
#include "transforms/subgraph.h"

namespace onnax {
namespace {

// "Loop 'name'" or "Loop producing 'output'" (a node differentiated as another, as a Scan is as
// a Loop, keeps its own op type in doc_string).
std::string node_label(const onnx::NodeProto& node) {
  std::string produced;
  for (const auto& o : node.output())
    if (produced.empty()) produced = o;
  const std::string& type = node.doc_string().empty() ? node.op_type() : node.doc_string();
  return type + " " + (node.name().empty() ? "producing '" + produced + "'" : "'" + node.name() + "'");
}

// Set while a JVP body is derived for reverse mode (a tape is being recorded around it): the
// body must keep its primal part apart from its tangent part, since the loop reverse mode makes
// of it reruns the primal part alone; so no loop inside it may compute its primal outputs in
// its JVP loop (see the end of loop_jvp).
thread_local bool jvp_for_reverse_mode = false;

// jvp or vjp of a body as a model of its own; failures name the node whose body it is.
// (`where` names the node whose body it is; `for_reverse_mode`: the enclosing transform records
// a tape.)
onnx::GraphProto derive_body(bool forward, onnx::ModelProto model, const Selection& selection, const std::string& where,
                             bool for_reverse_mode) {
  struct Restore {
    bool saved = jvp_for_reverse_mode;
    ~Restore() { jvp_for_reverse_mode = saved; }
  } restore;
  jvp_for_reverse_mode = jvp_for_reverse_mode || for_reverse_mode;
  try {
    onnx::ModelProto r = forward ? jvp(std::move(model), selection) : vjp(std::move(model), selection);
    strip_known_values(*r.mutable_graph());
    return std::move(*r.mutable_graph());
  } catch (const Error& e) {
    diag::fail(e.kind(), "in the body of " + where + ": " + e.what());
  }
}

// A loop-carried value the body passes through unchanged (directly or by an Identity).
bool invariant_state(const onnx::GraphProto& body, int k) {
  const std::string& in = body.input(2 + k).name();
  const std::string& out = body.output(1 + k).name();
  if (in == out) return true;
  for (const auto& nd : body.node())
    if (nd.output_size() == 1 && nd.output(0) == out)
      return nd.op_type() == "Identity" && nd.domain().empty() && nd.input_size() == 1 && nd.input(0) == in;
  return false;
}

// `v` as a tensor named `name` when the builder knows its value (a small integer or bool
// constant of static shape: axes, shapes, flags); nullopt otherwise.
std::optional<onnx::TensorProto> known_constant(const Builder& b, V v, const std::string& name) {
  const std::vector<int64_t>* values = b.known_i64(v);
  const Facts& f = b.facts(v);
  if (!values || !f.has_shape || f.rank() > 1) return std::nullopt;
  if (f.dtype != onnx::TensorProto::INT64 && f.dtype != onnx::TensorProto::INT32 && f.dtype != onnx::TensorProto::BOOL)
    return std::nullopt;
  const size_t count = f.rank() == 0 ? 1 : f.dims[0].known() ? static_cast<size_t>(f.dims[0].value()) : SIZE_MAX;
  if (count != values->size()) return std::nullopt;
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(f.dtype);
  if (f.rank() == 1) t.add_dims(static_cast<int64_t>(count));
  for (int64_t x : *values) {
    if (f.dtype == onnx::TensorProto::INT64)
      t.add_int64_data(x);
    else
      t.add_int32_data(static_cast<int32_t>(x));
  }
  return t;
}

// A tape node has no names: transposes name the tangent it computed.
std::string tape_label(const TransposeCtx& c) {
  return "the " + c.node.op_type() + " emitted for the tangent '" + std::string(c.origin) + "'";
}

// The distinct names in `names`, and for each name its position in that list.
struct Distinct {
  std::vector<std::string> names;
  std::unordered_map<std::string, size_t> index;
  size_t add(const std::string& n) {
    auto [it, added] = index.emplace(n, names.size());
    if (added) names.push_back(n);
    return it->second;
  }
};

Facts scalar_facts(int32_t dtype) {
  return Facts::of(dtype, {});
}

bool maybe_differentiable(int32_t dtype) {
  return dtype == 0 || differentiable_dtype(dtype);  // unknown: could be float
}

// ------------------------------------------------------------------------------------------
// Loop

// The element type of loop-carried value k: its initial value's, else the body's declaration.
int32_t state_dtype(const JvpCtx& c, const onnx::GraphProto& body, int k) {
  if (const int32_t dt = c.b.facts(c.x(2 + k)).dtype) return dt;
  const auto& t = body.input(2 + k).type();
  return t.has_tensor_type() ? t.tensor_type().elem_type() : 0;
}

Vs loop_jvp(JvpCtx& c) {
  Builder& b = c.b;
  // (The node emitted last is the loop itself when this rule runs for a node the transform
  // copied: see take_over_outputs at the end.)
  const int source_index = b.node_count() - 1;
  const onnx::NodeProto& node = c.node;
  const onnx::GraphProto* body = graph_attribute(node, "body");
  const int n = node.input_size() - 2;  // loop-carried values
  const int k_scan = node.output_size() - n;
  if (!body || n < 0 || k_scan < 0 || body->input_size() != n + 2 || body->output_size() != 1 + n + k_scan)
    c.unsupported("its body does not match its inputs and outputs (" + std::to_string(n) +
                      " loop-carried values expect a body with " + std::to_string(n + 2) + " inputs and " +
                      std::to_string(1 + n + std::max(k_scan, 0)) + " outputs)",
                  "check the model with onnx.checker");
  // Which state carries a derivative: those with a tangent at entry, and those the body makes
  // depend on an active value (a fixed point: activity spreads through the state).
  std::vector<char> act(static_cast<size_t>(n), 0);
  std::unordered_set<std::string> active_captured;
  for (const auto& cap : c.captured)
    if (cap.t.valid()) active_captured.insert(cap.name);
  for (int k = 0; k < n; ++k) act[static_cast<size_t>(k)] = c.t(2 + k).valid();
  std::vector<char> dep;
  for (bool changed = true; changed;) {
    changed = false;
    std::unordered_set<std::string> live = active_captured;
    for (int k = 0; k < n; ++k)
      if (act[static_cast<size_t>(k)]) live.insert(body->input(2 + k).name());
    dep = outputs_depending_on(*body, live);
    for (int k = 0; k < n; ++k) {
      if (act[static_cast<size_t>(k)] || !dep[static_cast<size_t>(1 + k)]) continue;
      const int32_t dt = state_dtype(c, *body, k);
      if (dt == 0)
        c.unsupported("the element type of loop-carried value " + std::to_string(k) + " ('" + node.input(2 + k) +
                          "') is unknown, and it depends on a differentiated value",
                      "declare the type of '" + node.input(2 + k) + "' or of the body's input '" +
                          body->input(2 + k).name() + "'");
      if (!differentiable_dtype(dt)) continue;
      act[static_cast<size_t>(k)] = 1;
      changed = true;
    }
  }
  auto scan_dtype = [&](int j) {
    const auto& t = body->output(1 + n + j).type();
    return t.has_tensor_type() ? t.tensor_type().elem_type() : 0;
  };
  std::vector<char> sact(static_cast<size_t>(k_scan), 0);
  for (int j = 0; j < k_scan; ++j)
    sact[static_cast<size_t>(j)] = dep[static_cast<size_t>(1 + n + j)] && maybe_differentiable(scan_dtype(j));
  const bool any = std::any_of(act.begin(), act.end(), [](char a) { return a; }) ||
                   std::any_of(sact.begin(), sact.end(), [](char a) { return a; });
  if (!any) return Vs(static_cast<size_t>(node.output_size()), V{});

  // The body as a model: iteration number, condition, state, then the captured values.
  std::vector<const Facts*> input_facts;
  const Facts iter_facts = scalar_facts(onnx::TensorProto::INT64), cond_facts = scalar_facts(onnx::TensorProto::BOOL);
  input_facts = {&iter_facts, &cond_facts};
  for (int k = 0; k < n; ++k) input_facts.push_back(&b.facts(c.x(2 + k)));
  std::vector<std::pair<std::string, Facts>> extra;
  std::vector<onnx::TensorProto> known_values;
  for (const auto& cap : c.captured) {
    extra.emplace_back(cap.name, b.facts(cap.x));
    if (auto t = known_constant(b, cap.x, cap.name)) known_values.push_back(std::move(*t));
  }
  for (int k = 0; k < n; ++k)
    if (invariant_state(*body, k))
      if (auto t = known_constant(b, c.x(2 + k), body->input(2 + k).name())) known_values.push_back(std::move(*t));
  Selection sel;
  sel.inputs.emplace();
  for (int k = 0; k < n; ++k)
    if (act[static_cast<size_t>(k)]) sel.inputs->push_back(body->input(2 + k).name());
  std::vector<const JvpCtx::Captured*> tcaps;  // captured values with a tangent
  for (const auto& cap : c.captured)
    if (cap.t.valid()) {
      sel.inputs->push_back(cap.name);
      tcaps.push_back(&cap);
    }
  Distinct outs;
  std::vector<size_t> state_out(static_cast<size_t>(n)), scan_out(static_cast<size_t>(k_scan));
  for (int k = 0; k < n; ++k)
    if (act[static_cast<size_t>(k)]) state_out[static_cast<size_t>(k)] = outs.add(body->output(1 + k).name());
  for (int j = 0; j < k_scan; ++j)
    if (sact[static_cast<size_t>(j)]) scan_out[static_cast<size_t>(j)] = outs.add(body->output(1 + n + j).name());
  sel.outputs = outs.names;
  // Inside the body, the state has the dims it keeps in every iteration (the rules then see
  // static shapes where the loop keeps them).
  const std::vector<Facts> carried = loop_carried_facts(*body, n, input_facts, extra, b.opsets(), known_values);
  std::vector<const Facts*> carried_facts;
  for (const Facts& f : carried) carried_facts.push_back(&f);
  onnx::GraphProto g = derive_body(true, standalone_model(*body, carried_facts, extra, b.opsets(), known_values, true),
                                   sel, node_label(node), b.has_tape());

  // g: inputs [iter, cond, state, captured, tangents of the selected inputs]; outputs [cond,
  // state, scan outputs, tangents of the selected outputs]. The JVP body carries the captured
  // values and their tangents as constant state.
  const int n_cap = static_cast<int>(c.captured.size());
  const int n_sel = static_cast<int>(sel.inputs->size());
  const onnx::GraphProto derived = g;
  auto out_info = [&](int i) -> const onnx::ValueInfoProto& { return derived.output(i); };
  auto in_info = [&](int i) -> const onnx::ValueInfoProto& { return derived.input(i); };
  NameScope& scope = b.value_scope();
  // Forward mode proper: the JVP body reads the captured values and their tangents from the
  // enclosing graph, as the source body did (no constant state, no Identity per iteration).
  // Reverse mode's tape needs the body closed.
  const bool outside = !b.has_tape() && !jvp_for_reverse_mode;
  const int first_tcap = n_sel - static_cast<int>(tcaps.size());
  g.clear_output();
  for (int i = 0; i <= n; ++i) *g.add_output() = out_info(i);  // cond, state
  if (!outside)
    for (int i = 0; i < n_cap; ++i) add_output(g, in_info(2 + n + i).name(), in_info(2 + n + i), scope);
  for (int k = 0; k < n; ++k)
    if (act[static_cast<size_t>(k)]) {  // the tangent of state k
      const int o = 1 + n + k_scan + static_cast<int>(state_out[static_cast<size_t>(k)]);
      add_output(g, out_info(o).name(), out_info(o), scope);
    }
  if (!outside)
    for (int i = first_tcap; i < n_sel; ++i) {
      const int input = 2 + n + n_cap + i;
      add_output(g, in_info(input).name(), in_info(input), scope);  // a captured tangent, unchanged
    }
  for (int j = 0; j < k_scan; ++j) *g.add_output() = out_info(1 + n + j);
  for (int j = 0; j < k_scan; ++j)
    if (sact[static_cast<size_t>(j)]) {
      const int o = 1 + n + k_scan + static_cast<int>(scan_out[static_cast<size_t>(j)]);
      add_output(g, out_info(o).name(), out_info(o), scope);
    }
  if (outside) {
    std::unordered_map<std::string, std::string> from_outside;
    for (int i = 0; i < n_cap; ++i)
      from_outside[in_info(2 + n + i).name()] = std::string(b.name(c.captured[static_cast<size_t>(i)].x));
    for (int i = first_tcap; i < n_sel; ++i)
      from_outside[in_info(2 + n + n_cap + i).name()] =
          std::string(b.name(tcaps[static_cast<size_t>(i - first_tcap)]->t));
    for (auto& nd : *g.mutable_node()) {
      for (auto& i : *nd.mutable_input())
        if (auto it = from_outside.find(i); it != from_outside.end()) i = it->second;
      rename_outer_reads(nd, from_outside);
    }
    onnx::GraphProto kept;
    for (int i = 0; i < g.input_size(); ++i) {
      const bool captured = i >= 2 + n && (i < 2 + n + n_cap || i >= 2 + n + n_cap + first_tcap);
      if (!captured) *kept.add_input() = g.input(i);
    }
    g.mutable_input()->Swap(kept.mutable_input());
  }
  rename_definitions(g, scope, b.node_scope());

  Vs ins = {c.x(0), c.x(1)};
  for (int k = 0; k < n; ++k) ins.push_back(c.x(2 + k));
  if (!outside)
    for (const auto& cap : c.captured) ins.push_back(cap.x);
  for (int k = 0; k < n; ++k) {
    if (!act[static_cast<size_t>(k)]) continue;
    V t = c.t(2 + k);
    if (!t.valid()) {
      // A state that becomes active inside the loop starts from a zero tangent.
      t = b.zeros_like(c.x(2 + k), state_dtype(c, *body, k));
      b.mark_tangent(t);
      b.set_witness(t, c.x(2 + k));
    }
    ins.push_back(t);
  }
  if (!outside)
    for (const auto* cap : tcaps) ins.push_back(cap->t);
  const int n_constant = outside ? 0 : n_cap + static_cast<int>(tcaps.size());  // constant state carried
  const int n_out = n + n_constant + first_tcap + k_scan + static_cast<int>(std::count(sact.begin(), sact.end(), 1));
  Vs res = b.op("Loop", ins, {Attr::graph("body", std::move(g))}, n_out);

  // Facts and witnesses: every output has the shape of a primal value here.
  auto known = [&](V out, V like) {
    if (!like.valid()) return;
    b.set_facts(out, b.facts(like));
    b.set_witness(out, like);
  };
  Vs tangents(static_cast<size_t>(node.output_size()), V{});
  int pos = 0;
  for (int k = 0; k < n; ++k) known(res[pos++], c.y(k));
  if (!outside)
    for (const auto& cap : c.captured) known(res[pos++], cap.x);
  for (int k = 0; k < n; ++k)
    if (act[static_cast<size_t>(k)]) {
      known(res[pos], c.y(k).valid() ? c.y(k) : c.x(2 + k));
      tangents[static_cast<size_t>(k)] = res[pos++];
    }
  if (!outside)
    for (const auto* cap : tcaps) known(res[pos++], cap->x);
  for (int j = 0; j < k_scan; ++j) known(res[pos++], c.y(n + j));
  for (int j = 0; j < k_scan; ++j)
    if (sact[static_cast<size_t>(j)]) {
      known(res[pos], c.y(n + j));
      tangents[static_cast<size_t>(n + j)] = res[pos++];
    }
  // Forward mode: the JVP loop computes the primal outputs too, so the source loop need not run
  // (reverse mode keeps it: the JVP loop goes to the tape).
  // (take_over_outputs checks that the node at source_index is the one defining them.)
  if (outside) {
    Vs source_outputs, same;
    const int scans_at = n + static_cast<int>(std::count(act.begin(), act.end(), 1));
    for (int k = 0; k < n; ++k) {
      source_outputs.push_back(c.y(k));
      same.push_back(res[static_cast<size_t>(k)]);
    }
    for (int j = 0; j < k_scan; ++j) {
      source_outputs.push_back(c.y(n + j));
      same.push_back(res[static_cast<size_t>(scans_at + j)]);
    }
    Vs source_inputs;
    for (int i = 0; i < node.input_size(); ++i) source_inputs.push_back(c.x(i));
    b.take_over_outputs(source_index, source_inputs, source_outputs, same);
  }
  return tangents;
}

onnx::ValueInfoProto scalar_info(const std::string& name, int32_t dtype) {
  return typed_value_info(name, scalar_facts(dtype));
}

// Linear state the body passes through unchanged and otherwise reads only as
// Gather(state, iteration number, axis 0): a sequence the loop scans one row per iteration (as
// exporters and the recurrent-op expansion write it).
std::vector<int> scanned_states(const onnx::GraphProto& body, const std::vector<char>& lin) {
  std::unordered_set<std::string> nested;  // names read inside nested subgraphs
  for (const auto& nd : body.node())
    for (const auto& a : nd.attribute()) {
      if (a.has_g())
        for (const auto& r : graph_outer_reads(a.g())) nested.insert(r);
      for (const auto& sg : a.graphs())
        for (const auto& r : graph_outer_reads(sg)) nested.insert(r);
    }
  const std::string& it = body.input(0).name();
  std::vector<int> out;
  for (int k = 0; k < static_cast<int>(lin.size()); ++k) {
    if (!lin[static_cast<size_t>(k)] || !invariant_state(body, k)) continue;
    const std::string& in = body.input(2 + k).name();
    const std::string& passthrough = body.output(1 + k).name();
    bool ok = nested.count(in) == 0;
    for (int o = 0; o < body.output_size(); ++o)
      if (o != 1 + k && body.output(o).name() == in) ok = false;
    int gathers = 0;
    for (const auto& nd : body.node()) {
      if (std::find(nd.input().begin(), nd.input().end(), in) == nd.input().end()) continue;
      if (nd.op_type() == "Identity" && nd.output(0) == passthrough) continue;
      int64_t axis = 0;
      for (const auto& a : nd.attribute())
        if (a.name() == "axis") axis = a.i();
      const bool row = nd.op_type() == "Gather" && nd.domain().empty() && nd.input_size() == 2 && nd.input(0) == in &&
                       nd.input(1) == it && axis == 0;
      ok = ok && row;
      gathers += row ? 1 : 0;
    }
    if (ok && gathers > 0) out.push_back(k);
  }
  return out;
}

// The loop reverse mode runs before the reverse loop: the primal part of the JVP loop `body`
// (its non-linear state), once more, stacking as scan outputs the iteration number, the
// condition (when `stack_cond`), the state each iteration starts from (`varying`; the state the
// body passes through unchanged is read from the loop's inputs instead) and the `residuals` the
// reverse body reads.
// Outputs: the final non-linear states (n_primal of them), then those stacks in that order, then
// the JVP loop's `primal_scans` (scan outputs computed by the primal part).
struct StackingLoop {
  Vs outputs;
  int n_primal = 0;
  int scans_at = 0;     // where the primal scan outputs start
  int cond_stacks = 0;  // 1 when the condition is stacked (after the iteration number)
};
StackingLoop stacking_loop(TransposeCtx& c, const onnx::GraphProto& body, const std::vector<char>& lin,
                           const std::vector<char>& outer, const std::vector<int>& varying, bool stack_cond,
                           const std::vector<LoopResidual>& residuals, const std::vector<int>& primal_scans) {
  Builder& b = c.b;
  const int n = static_cast<int>(lin.size());
  NameScope& scope = b.value_scope();
  onnx::GraphProto fwd = body;
  fwd.clear_output();
  *fwd.add_output() = body.output(0);
  StackingLoop result;
  int& n_primal = result.n_primal;
  auto carried = [&](int k) { return !lin[static_cast<size_t>(k)] && !outer[static_cast<size_t>(k)]; };
  for (int k = 0; k < n; ++k)
    if (carried(k)) {
      *fwd.add_output() = body.output(1 + k);
      ++n_primal;
    }
  {
    // State read from the enclosing graph: the body reads the loop's input for it by name.
    std::unordered_map<std::string, std::string> from_outside;
    for (int k = 0; k < n; ++k)
      if (outer[static_cast<size_t>(k)]) from_outside[body.input(2 + k).name()] = std::string(b.name(c.in(2 + k)));
    if (!from_outside.empty())
      for (auto& nd : *fwd.mutable_node()) {
        for (auto& i : *nd.mutable_input())
          if (auto it = from_outside.find(i); it != from_outside.end()) i = it->second;
        rename_outer_reads(nd, from_outside);
      }
  }
  add_output(fwd, body.input(0).name(), scalar_info("", onnx::TensorProto::INT64), scope);
  if (stack_cond) add_output(fwd, body.input(1).name(), scalar_info("", onnx::TensorProto::BOOL), scope);
  result.cond_stacks = stack_cond ? 1 : 0;
  for (int k : varying) add_output(fwd, body.input(2 + k).name(), body.input(2 + k), scope);
  for (const auto& r : residuals) add_output(fwd, r.name, typed_value_info(r.name, r.facts), scope);
  for (int j : primal_scans) add_output(fwd, body.output(1 + n + j).name(), body.output(1 + n + j), scope);
  prune(fwd);
  {
    std::unordered_set<std::string> read;
    for (const auto& nd : fwd.node())
      for (const auto& i : nd.input()) read.insert(i);
    for (const auto& o : fwd.output()) read.insert(o.name());
    onnx::GraphProto inputs;
    for (int i = 0; i < body.input_size(); ++i) {
      const bool tangent_state = i >= 2 && lin[static_cast<size_t>(i - 2)];
      if (tangent_state && read.count(body.input(i).name()))
        c.unsupported("the primal part of the loop reads its tangent state",
                      "differentiate the model that contains the original loop instead");
      if (i < 2 || carried(i - 2)) *inputs.add_input() = body.input(i);
    }
    fwd.mutable_input()->Swap(inputs.mutable_input());
  }
  rename_definitions(fwd, scope, b.node_scope());
  Vs fins = {c.in(0), c.in(1)};
  for (int k = 0; k < n; ++k)
    if (carried(k)) fins.push_back(c.in(2 + k));
  result.scans_at = n_primal + 1 + result.cond_stacks + static_cast<int>(varying.size() + residuals.size());
  const int f_out = result.scans_at + static_cast<int>(primal_scans.size());
  Vs& f = result.outputs;
  f = b.op("Loop", fins, {Attr::graph("body", std::move(fwd))}, f_out);
  {
    // What the builder inferred for the loop (the body's dims, the trip count when it is known)
    // fills in the dims these facts leave unknown.
    auto settle = [&](V v, Facts given) {
      const Facts inferred = b.facts(v);
      b.set_facts(v, std::move(given));
      b.learn_dims(v, inferred);
    };
    // (The builder cannot infer a body that reads the enclosing graph: the stacks' length is
    // the trip count when it is certain.)
    const Dim trips = b.exact_trips(c.node, Vs{c.in(0), c.in(1)});
    int pos = 0;
    for (int k = 0; k < n; ++k)
      if (carried(k)) settle(f[pos++], b.facts(c.in(2 + k)));
    auto stacked = [&](const Facts& per_iteration) {
      Facts s = per_iteration;
      if (s.has_shape)
        for (auto& d : s.dims) d = Dim{};
      if (s.has_shape) s.dims.insert(s.dims.begin(), trips);
      return s;
    };
    settle(f[pos++], stacked(scalar_facts(onnx::TensorProto::INT64)));
    if (stack_cond) settle(f[pos++], stacked(scalar_facts(onnx::TensorProto::BOOL)));
    for (int k : varying) settle(f[pos++], stacked(b.facts(c.in(2 + k))));
    for (const auto& r : residuals) settle(f[pos++], r.facts.with_dim(0, trips));
    for (int j : primal_scans) settle(f[pos++], b.facts(c.outs[static_cast<size_t>(n + j)]));
  }
  return result;
}

Vs loop_transpose(TransposeCtx& c) {
  Builder& b = c.b;
  const onnx::GraphProto* body = graph_attribute(c.node, "body");
  const int n = static_cast<int>(c.ins.size()) - 2;
  const int k_scan = static_cast<int>(c.outs.size()) - n;
  if (!body || n < 0 || k_scan < 0 || c.linear(0) || c.linear(1) || !graph_outer_reads(*body).empty())
    c.unsupported("only the loops jvp writes (a closed body, linear in part of its state) can be transposed",
                  "differentiate the model that contains the original loop instead");
  std::vector<char> lin(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) lin[static_cast<size_t>(k)] = c.linear(2 + k);
  NameScope& scope = b.value_scope();
  auto name_of = [&](V v) { return std::string(b.name(v)); };
  std::vector<int> varying;  // non-linear state that changes between iterations
  for (int k = 0; k < n; ++k)
    if (!lin[static_cast<size_t>(k)] && !invariant_state(*body, k)) varying.push_back(k);

  // 1. The vjp of the body on its tangent state (and the tangent scan outputs with a
  //    cotangent), as a model. State the body reads one row of per iteration is differentiated
  //    through that row (a body input in place of the Gather): its cotangent is a row per
  //    iteration, stacked by the reverse loop, not a full-size accumulator that every iteration
  //    would add to (quadratic in the sequence length).
  std::vector<onnx::TensorProto> known_values;
  for (int k = 0; k < n; ++k)
    if (!lin[static_cast<size_t>(k)] && invariant_state(*body, k))
      if (auto t = known_constant(b, c.in(2 + k), body->input(2 + k).name())) known_values.push_back(std::move(*t));
  // The dims the state keeps in every iteration: with them, the vjp's rules see static shapes
  // (a weight's cotangent then needs no run-time test for broadcasting at every step).
  const Facts iter_facts = scalar_facts(onnx::TensorProto::INT64), cond_facts = scalar_facts(onnx::TensorProto::BOOL);
  std::vector<Facts> carried;
  {
    std::vector<const Facts*> entering = {&iter_facts, &cond_facts};
    for (int k = 0; k < n; ++k) entering.push_back(&b.facts(c.in(2 + k)));
    std::vector<std::string> grows;
    carried = loop_carried_facts(*body, n, entering, {}, b.opsets(), known_values, &grows);
    for (int k : varying)
      if (!grows[static_cast<size_t>(k)].empty())
        c.unsupported("loop-carried value " + std::to_string(k) + " ('" + body->input(2 + k).name() +
                          "' in the body) changes shape from one iteration to the next (from " +
                          grows[static_cast<size_t>(k)] +
                          "), and reverse mode stacks the value of every iteration, which needs one shape",
                      "use jvp (forward mode), or carry a fixed-size buffer (e.g. preallocated and written "
                      "with ScatterND) instead of concatenating to the state");
  }
  std::vector<int> scanned;
  for (int k : scanned_states(*body, lin)) {
    if (b.witness(c.in(2 + k)).valid() && b.facts(c.in(2 + k)).rank() >= 1) scanned.push_back(k);
  }
  onnx::GraphProto vjp_body = *body;
  std::vector<Facts> row_facts;
  std::vector<std::string> row_names;
  for (int k : scanned) {
    const std::string& in = body->input(2 + k).name();
    row_names.push_back(scope.fresh(in + "_row"));
    for (auto& nd : *vjp_body.mutable_node())
      if (nd.op_type() == "Gather" && nd.input_size() == 2 && nd.input(0) == in) {
        const std::string out = nd.output(0);
        nd = make_node("Identity", {row_names.back()}, out);
      }
    // (The sequence is passed along unchanged: a row has its dims after the first.)
    const Facts& whole = carried[static_cast<size_t>(2 + k)];
    Facts row = Facts::of(whole.dtype, Dims(static_cast<size_t>(whole.rank() - 1), Dim{}));
    for (size_t d = 1; d < whole.dims.size(); ++d) row.dims[d - 1] = whole.dims[d];
    row_facts.push_back(std::move(row));
  }
  for (size_t q = 0; q < scanned.size(); ++q) *vjp_body.add_input() = typed_value_info(row_names[q], row_facts[q]);
  std::vector<const Facts*> input_facts;
  for (size_t i = 0; i < 2 + static_cast<size_t>(n); ++i) input_facts.push_back(&carried[i]);
  for (const Facts& rf : row_facts) input_facts.push_back(&rf);
  const int n_rows = static_cast<int>(scanned.size());
  Selection sel;
  sel.inputs.emplace();
  std::vector<int> linear_states;
  for (int k = 0; k < n; ++k)
    if (lin[static_cast<size_t>(k)] && std::find(scanned.begin(), scanned.end(), k) == scanned.end()) {
      sel.inputs->push_back(body->input(2 + k).name());
      linear_states.push_back(k);
    }
  for (const auto& row : row_names) sel.inputs->push_back(row);
  Distinct outs;
  std::vector<size_t> state_out(static_cast<size_t>(n)), scan_out(static_cast<size_t>(k_scan));
  for (int k : linear_states) state_out[static_cast<size_t>(k)] = outs.add(body->output(1 + k).name());
  for (int j = 0; j < k_scan; ++j)
    if (c.ct(n + j).valid()) scan_out[static_cast<size_t>(j)] = outs.add(body->output(1 + n + j).name());
  sel.outputs = outs.names;
  onnx::GraphProto g = derive_body(false, standalone_model(vjp_body, input_facts, {}, b.opsets(), known_values, true),
                                   sel, tape_label(c), true);
  // g: inputs [iter, cond, state, rows, cotangents of the selected outputs]; outputs [cond,
  // state, scan outputs, cotangents of the tangent state, then of the rows]. Keep the
  // cotangents only.
  {
    onnx::GraphProto cts;
    for (size_t i = 0; i < linear_states.size() + scanned.size(); ++i)
      *cts.add_output() = g.output(1 + n + k_scan + static_cast<int>(i));
    g.mutable_output()->Swap(cts.mutable_output());
  }
  prune(g);
  // The weights' cotangents: their per-iteration products leave the loop (rules/loop_products.h);
  // the primal values the reverse body reads are stacked by the forward loop (which computes
  // them under the same names) instead of recomputed (rules/loop_residuals.h). Both read g's
  // facts (the values they look at keep them through the first's rewriting).
  std::vector<LoopProduct> products;
  std::vector<LoopSum> sums;
  std::vector<LoopResidual> residuals;
  std::optional<Prepared> g_facts;
  try {
    g_facts.emplace(prepare(standalone_model(g, {}, {}, b.opsets()), "vjp"));
  } catch (const std::exception&) {
    // (then the reverse loop accumulates and recomputes, as it did)
  }
  if (g_facts) {
    std::vector<int> accumulated;
    std::vector<std::string> into;
    for (size_t li = 0; li < linear_states.size(); ++li) {
      const int k = linear_states[li];
      if (!invariant_state(*body, k)) continue;
      accumulated.push_back(static_cast<int>(li));
      into.push_back(g.input(2 + n + n_rows + static_cast<int>(state_out[static_cast<size_t>(k)])).name());
    }
    products = hoist_loop_products(g, accumulated, into, *g_facts, scope);
    sums = hoist_loop_sums(g, accumulated, into, static_cast<int>(linear_states.size()), *g_facts, scope);
    std::unordered_set<std::string> primal_inputs = {g.input(0).name(), g.input(1).name()};
    for (int k = 0; k < n; ++k)
      if (!lin[static_cast<size_t>(k)]) primal_inputs.insert(g.input(2 + k).name());
    std::unordered_set<std::string> forward_defined;
    for (const auto& nd : body->node())
      for (const auto& o : nd.output()) forward_defined.insert(o);
    residuals = take_loop_residuals(g, primal_inputs, forward_defined, *g_facts);
  }
  const int first_residual = g.input_size() - static_cast<int>(residuals.size());
  rename_definitions(g, scope, b.node_scope());
  // What the reverse body reads of the primal state: only that is stacked.
  std::unordered_set<std::string> g_reads;
  for (const auto& nd : g.node()) {
    for (const auto& i : nd.input()) g_reads.insert(i);
    for (auto& r : outer_scope_reads(nd)) g_reads.insert(std::move(r));  // (an If's branches)
  }
  for (const auto& o : g.output()) g_reads.insert(o.name());
  const bool stack_cond = g_reads.count(g.input(1).name()) > 0;
  std::vector<int> stacked_states;
  for (int k : varying)
    if (g_reads.count(g.input(2 + k).name())) stacked_states.push_back(k);

  // 2. The primal part, once more, stacking the state each iteration starts from and the
  //    residuals. It computes what the source loop computes (the JVP loop's primal part is the
  //    source body): when that loop is a node of the model, it also gives the loop's scan outputs
  //    and takes its place, so the forward pass runs once (as JAX's scan saves residuals while
  //    it runs the primal). (A Scan's Loop reads a trip count computed after it: both run.)
  // loop_jvp gives each output of the JVP loop the source output it stands for as witness, a
  // primal output before its tangent (so the first twin of a source output is the primal one).
  std::vector<int> primal_scans;
  Vs source_outputs, reads = {c.in(0), c.in(1)};
  for (int k = 0; k < n; ++k)
    if (!lin[static_cast<size_t>(k)]) {
      source_outputs.push_back(b.witness(c.outs[static_cast<size_t>(k)]));
      reads.push_back(c.in(2 + k));
    }
  {
    std::unordered_set<std::string> linear_inputs;
    for (int k = 0; k < n; ++k)
      if (lin[static_cast<size_t>(k)]) linear_inputs.insert(body->input(2 + k).name());
    const std::vector<char> dep = outputs_depending_on(*body, linear_inputs);
    for (int j = 0; j < k_scan; ++j)
      if (!dep[static_cast<size_t>(1 + n + j)] && b.witness(c.outs[static_cast<size_t>(n + j)]).valid()) {
        primal_scans.push_back(j);
        source_outputs.push_back(b.witness(c.outs[static_cast<size_t>(n + j)]));
      }
  }
  const int source_loop = b.defining_node(source_outputs, reads, "Loop");
  if (source_loop < 0) primal_scans.clear();
  // Residuals computed elementwise from other residuals (an activation's derivative from the
  // activation) are computed from the stacks after the loop (rules/loop_residuals.h).
  std::unordered_map<std::string, int64_t> invariant;
  for (int k = 0; k < n; ++k)
    if (!lin[static_cast<size_t>(k)] && invariant_state(*body, k))
      invariant[body->input(2 + k).name()] = b.facts(c.in(2 + k)).rank();
  const DerivedResiduals derived = derivable_residuals(*body, residuals, invariant);
  std::vector<LoopResidual> stacked_residuals;
  for (size_t q = 0; q < residuals.size(); ++q)
    if (!derived.derived[q]) stacked_residuals.push_back(residuals[q]);
  for (const auto& r : derived.stacked) stacked_residuals.push_back(r);
  // State the body passes through unchanged that no output of the source loop stands for (a
  // value the source body read from the enclosing graph, which the JVP loop carries) is read
  // from the enclosing graph again: no Identity per iteration.
  std::vector<char> outer(static_cast<size_t>(n), 0);
  {
    Vs witnesses;
    for (int k = 0; k < n; ++k) witnesses.push_back(b.witness(c.outs[static_cast<size_t>(k)]));
    const std::vector<char> of_source = b.made_by(source_loop, witnesses);
    for (int k = 0; k < n; ++k)
      outer[static_cast<size_t>(k)] = !lin[static_cast<size_t>(k)] && invariant_state(*body, k) &&
                                      !of_source[static_cast<size_t>(k)] && !b.name(c.in(2 + k)).empty();
  }
  const StackingLoop stacks =
      stacking_loop(c, *body, lin, outer, stacked_states, stack_cond, stacked_residuals, primal_scans);
  const Vs& f = stacks.outputs;
  const int n_primal = stacks.n_primal;
  if (source_loop >= 0) {
    Vs same;
    for (int k = 0, pos = 0; k < n; ++k)
      if (!lin[static_cast<size_t>(k)])
        same.push_back(outer[static_cast<size_t>(k)] ? V{} : f[static_cast<size_t>(pos++)]);
    for (size_t q = 0; q < primal_scans.size(); ++q) same.push_back(f[static_cast<size_t>(stacks.scans_at) + q]);
    b.take_place_of(source_loop, source_outputs, same);
  }
  Vs residual_stacks(residuals.size(), V{});
  {
    std::unordered_map<std::string, V> whole;  // forward body value -> its stack (or invariant value)
    size_t pos = static_cast<size_t>(n_primal + 1 + stacks.cond_stacks) + stacked_states.size();
    for (size_t q = 0; q < residuals.size(); ++q)
      if (!derived.derived[q]) whole[residuals[q].name] = residual_stacks[q] = f[pos++];
    for (const auto& r : derived.stacked) whole[r.name] = f[pos++];
    for (int k = 0; k < n; ++k)
      if (!lin[static_cast<size_t>(k)] && invariant_state(*body, k)) whole[body->input(2 + k).name()] = c.in(2 + k);
    for (const onnx::NodeProto* nd : derived.nodes) {
      Vs xs;
      for (const auto& in : nd->input()) xs.push_back(in.empty() ? V{} : whole.at(in));
      const Vs ys = b.clone(*nd, xs);
      for (int o = 0; o < nd->output_size() && o < static_cast<int>(ys.size()); ++o) whole[nd->output(o)] = ys[o];
    }
    for (size_t q = 0; q < residuals.size(); ++q)
      if (derived.derived[q]) residual_stacks[q] = whole.at(residuals[q].name);
  }
  const V iterations = b.squeeze(b.shape_of(f[n_primal], 0, 1), {0});
  const V last = b.sub(iterations, b.i64(1));

  // 3. The reverse loop: iteration j of T runs the body's vjp at iteration T-1-j, the state
  //    taken from the stacks; its state is the cotangent of the tangent state.
  onnx::GraphProto rev;
  rev.set_name(scope.fresh("reverse_loop"));
  const std::string j_name = scope.fresh("reverse_iteration"), cond_name = scope.fresh("reverse_cond");
  *rev.add_input() = scalar_info(j_name, onnx::TensorProto::INT64);
  *rev.add_input() = scalar_info(cond_name, onnx::TensorProto::BOOL);
  std::vector<std::string> ct_state;
  for (int k : linear_states) {
    ct_state.push_back(scope.fresh(std::string(b.name(c.outs[k]).empty() ? "state" : b.name(c.outs[k])) + "_ct"));
    *rev.add_input() = typed_value_info(ct_state.back(), b.facts(c.in(2 + k)), true);
  }
  const std::string& i_name = g.input(0).name();
  auto gather = [&](const std::string& stack, const std::string& out) {
    *rev.add_node() = make_node("Gather", {stack, i_name}, out);
  };
  // g's inputs that are another value of the reverse body or of the enclosing graph: g's nodes
  // read that value (no Identity per iteration), unless the input is also one of g's outputs.
  std::unordered_map<std::string, std::string> aliases;
  std::unordered_set<std::string> g_outputs;
  for (const auto& o : g.output()) g_outputs.insert(o.name());
  auto alias = [&](const std::string& target, const std::string& value) {
    if (g_outputs.count(target))
      *rev.add_node() = make_node("Identity", {value}, target);
    else
      aliases[target] = value;
  };
  *rev.add_node() = make_node("Sub", {name_of(last), j_name}, i_name);
  if (stack_cond) gather(name_of(f[n_primal + 1]), g.input(1).name());
  {
    int stack = n_primal + 1 + stacks.cond_stacks, lin_pos = 0;
    for (int k = 0; k < n; ++k) {
      const std::string& target = g.input(2 + k).name();
      if (std::find(scanned.begin(), scanned.end(), k) != scanned.end()) continue;  // (read through its row)
      if (lin[static_cast<size_t>(k)])
        alias(target, ct_state[static_cast<size_t>(lin_pos++)]);  // (shape only)
      else if (std::find(stacked_states.begin(), stacked_states.end(), k) != stacked_states.end())
        gather(name_of(f[stack++]), target);
      else if (std::find(varying.begin(), varying.end(), k) == varying.end())
        alias(target, name_of(c.in(2 + k)));
    }
  }
  for (size_t q = 0; q < residuals.size(); ++q)
    gather(name_of(residual_stacks[q]), g.input(first_residual + static_cast<int>(q)).name());
  // A row's value does not matter (it is a tangent), only its shape: the primal twin's row.
  for (size_t q = 0; q < scanned.size(); ++q)
    gather(name_of(b.witness(c.in(2 + scanned[q]))), g.input(2 + n + static_cast<int>(q)).name());
  for (size_t u = 0; u < outs.names.size(); ++u) {
    std::vector<std::string> parts;
    for (size_t li = 0; li < linear_states.size(); ++li)
      if (state_out[static_cast<size_t>(linear_states[li])] == u) parts.push_back(ct_state[li]);
    for (int j = 0; j < k_scan; ++j)
      if (c.ct(n + j).valid() && scan_out[static_cast<size_t>(j)] == u) {
        const std::string slice = scope.fresh(name_of(c.ct(n + j)) + "_step");
        gather(name_of(c.ct(n + j)), slice);
        parts.push_back(slice);
      }
    const std::string& target = g.input(2 + n + n_rows + static_cast<int>(u)).name();
    std::string sum = parts[0];
    for (size_t p = 1; p < parts.size(); ++p) {
      const std::string next = p + 1 == parts.size() ? target : scope.fresh(target + "_part");
      *rev.add_node() = make_node("Add", {sum, parts[p]}, next);
      sum = next;
    }
    if (parts.size() == 1) alias(target, sum);
  }
  for (auto& nd : *g.mutable_node()) {
    for (auto& i : *nd.mutable_input())
      if (auto it = aliases.find(i); it != aliases.end()) i = it->second;
    if (!aliases.empty()) rename_outer_reads(nd, aliases);
    *rev.add_node() = std::move(nd);
  }
  for (auto& vi : *g.mutable_value_info()) *rev.add_value_info() = std::move(vi);
  for (auto& t : *g.mutable_initializer()) *rev.add_initializer() = std::move(t);
  for (auto& t : *g.mutable_sparse_initializer()) *rev.add_sparse_initializer() = std::move(t);
  add_output(rev, cond_name, scalar_info("", onnx::TensorProto::BOOL), scope);
  for (int i = 0; i < g.output_size(); ++i) add_output(rev, g.output(i).name(), g.output(i), scope);
  prune(rev);  // (the inputs of g it does not read, the shapes only a rule needed)

  // Cotangent state the reverse body gives back unchanged (a weight's, whose products left the
  // loop) is not carried: the body reads the cotangent entering the loop instead, and that is
  // the loop's result for it (also after zero iterations or an early exit).
  const size_t n_lin = linear_states.size();
  std::vector<char> passed(n_lin, 0);
  {
    std::unordered_map<std::string, std::string> identity_input;
    for (const auto& nd : rev.node())
      if (nd.op_type() == "Identity" && nd.domain().empty() && nd.input_size() == 1 && nd.output_size() == 1)
        identity_input[nd.output(0)] = nd.input(0);
    for (size_t li = 0; li < n_lin; ++li) {
      std::string v = rev.output(1 + static_cast<int>(li)).name();
      for (auto it = identity_input.find(v); it != identity_input.end(); it = identity_input.find(v)) v = it->second;
      passed[li] = v == ct_state[li] ? 1 : 0;
    }
  }
  auto entering_ct = [&](size_t li) {
    const int k = linear_states[li];
    V ct = c.ct(k);
    if (!ct.valid()) {
      const V w = b.witness(c.outs[k]);
      if (!w.valid()) c.unsupported("the shape of a tangent the loop carries is unknown");
      ct = b.zeros_like(w);
    }
    return ct;
  };
  Vs rins = {iterations, b.scalar(1.0, onnx::TensorProto::BOOL)};
  if (std::find(passed.begin(), passed.end(), 1) != passed.end()) {
    onnx::GraphProto kept;
    *kept.add_input() = rev.input(0);
    *kept.add_input() = rev.input(1);
    *kept.add_output() = rev.output(0);
    for (size_t li = 0; li < n_lin; ++li)
      if (!passed[li]) {
        *kept.add_input() = rev.input(2 + static_cast<int>(li));
        *kept.add_output() = rev.output(1 + static_cast<int>(li));
      }
    for (int o = 1 + static_cast<int>(n_lin); o < rev.output_size(); ++o) *kept.add_output() = rev.output(o);
    rev.mutable_input()->Swap(kept.mutable_input());
    rev.mutable_output()->Swap(kept.mutable_output());
    prune(rev);
    std::unordered_set<std::string> read;
    for (const auto& nd : rev.node()) {
      for (const auto& i : nd.input()) read.insert(i);
      for (auto& r : outer_scope_reads(nd)) read.insert(std::move(r));
    }
    std::unordered_map<std::string, std::string> entering;
    for (size_t li = 0; li < n_lin; ++li)
      if (passed[li] && read.count(ct_state[li])) entering[ct_state[li]] = name_of(entering_ct(li));
    if (!entering.empty())
      for (auto& nd : *rev.mutable_node()) {
        for (auto& i : *nd.mutable_input())
          if (auto it = entering.find(i); it != entering.end()) i = it->second;
        rename_outer_reads(nd, entering);
      }
  }
  for (size_t li = 0; li < n_lin; ++li)
    if (!passed[li]) rins.push_back(entering_ct(li));
  const size_t n_carried = n_lin - static_cast<size_t>(std::count(passed.begin(), passed.end(), 1));
  const int n_products = static_cast<int>(products.size());
  const int n_sums = static_cast<int>(
      std::count_if(sums.begin(), sums.end(), [](const LoopSum& sm) { return sm.stacked_output < 0; }));
  Vs r = b.op("Loop", rins, {Attr::graph("body", std::move(rev))},
              static_cast<int>(n_carried) + n_rows + 2 * n_products + n_sums);
  Vs res(c.ins.size(), V{});
  for (size_t li = 0, pos = 0; li < n_lin; ++li) {
    const int k = linear_states[li];
    if (passed[li]) {
      res[static_cast<size_t>(2 + k)] = c.ct(k);  // (invalid: zero)
      continue;
    }
    b.set_facts(r[pos], b.facts(c.in(2 + k)));
    res[static_cast<size_t>(2 + k)] = r[pos++];
  }
  auto stacked_facts = [](const Facts& per_iteration) {
    Facts s = per_iteration;
    if (s.has_shape) s.dims.insert(s.dims.begin(), Dim{});
    return s;
  };
  auto add_to = [&](int output, V term) {
    const int k = linear_states[static_cast<size_t>(output)];
    const V sum = b.add(res[static_cast<size_t>(2 + k)], term);
    b.set_facts(sum, b.facts(c.in(2 + k)));
    res[static_cast<size_t>(2 + k)] = sum;
  };
  for (int q = 0; q < n_products; ++q) {
    const LoopProduct& p = products[static_cast<size_t>(q)];
    const size_t at = n_carried + static_cast<size_t>(n_rows + 2 * q);
    b.set_facts(r[at], stacked_facts(p.left_facts));
    b.set_facts(r[at + 1], stacked_facts(p.right_facts));
    add_to(p.output, sum_of_loop_product(b, p, r[at], r[at + 1]));
  }
  for (size_t q = 0, own = 0; q < sums.size(); ++q) {
    const LoopSum& sm = sums[q];
    // (g's outputs after the cotangent state are the loop's after the carried ones.)
    const size_t at = sm.stacked_output >= 0 ? n_carried + static_cast<size_t>(sm.stacked_output) - n_lin
                                             : n_carried + static_cast<size_t>(n_rows + 2 * n_products) + own++;
    if (sm.stacked_output < 0) b.set_facts(r[at], stacked_facts(sm.facts));
    add_to(sm.output, sum_of_loop_sum(b, sm, r[at]));
  }
  // The rows' cotangents, stacked from the last iteration to the first: reversed, reshaped
  // (zero iterations stack nothing), and padded with zero rows the loop did not reach.
  const V trips = b.reshape(iterations, b.i64s({1}));
  for (size_t q = 0; q < scanned.size(); ++q) {
    const int k = scanned[q];
    const V twin = b.witness(c.in(2 + k));
    const V rest = b.shape_of(twin, 1);
    const V stacked = r[n_carried + q];
    const V in_order = b.reverse_first_axis(stacked);
    const V rows = b.reshape(in_order, b.concat({trips, rest}, 0));
    const V missing = b.sub(b.shape_of(twin, 0, 1), trips);
    const int32_t dtype = b.facts(c.in(2 + k)).dtype;
    V full = b.concat({rows, b.expand(b.scalar(0.0, dtype), b.concat({missing, rest}, 0))}, 0);
    if (c.ct(k).valid()) full = b.add(full, c.ct(k));
    b.set_facts(full, b.facts(c.in(2 + k)));
    res[static_cast<size_t>(2 + k)] = full;
  }
  return res;
}

// ------------------------------------------------------------------------------------------
// Scan: differentiated as the Loop that computes it. Iteration `it` gathers each scan input at
// `it` (or T-1-it when scanned backwards) along its axis and runs the Scan's body; the Loop
// stacks the scan outputs along axis 0, and the tangents of the Scan's outputs are those stacks
// reversed and moved to their axes. One Loop construction serves both modes: reverse mode
// transposes it like any Loop, and nothing in its body is a Scan again.

std::vector<int64_t> ints_attr(const onnx::NodeProto& node, const char* name, size_t count, int64_t fallback) {
  std::vector<int64_t> v(count, fallback);
  for (const auto& a : node.attribute())
    if (a.name() == name)
      for (int i = 0; i < a.ints_size() && static_cast<size_t>(i) < count; ++i) v[static_cast<size_t>(i)] = a.ints(i);
  return v;
}

// Adds `cap` unless a value of that name is captured already (a body may also read a scan input).
void add_captured(std::vector<JvpCtx::Captured>& captured, JvpCtx::Captured cap) {
  for (const auto& k : captured)
    if (k.name == cap.name) return;
  captured.push_back(std::move(cap));
}

Vs scan_jvp(JvpCtx& c) {
  Builder& b = c.b;
  const int scan_index = b.node_count() - 1;  // (the Scan itself, when the transform copied it)
  const onnx::NodeProto& node = c.node;
  const onnx::GraphProto* body = graph_attribute(node, "body");
  int64_t m = 0;
  for (const auto& a : node.attribute())
    if (a.name() == "num_scan_inputs") m = a.i();
  const int n = node.input_size() - static_cast<int>(m);  // states
  const int k_scan = node.output_size() - n;
  if (!body || m < 1 || n < 0 || k_scan < 0 || body->input_size() != node.input_size() ||
      body->output_size() != node.output_size())
    c.unsupported("its body does not match its inputs and outputs", "check the model with onnx.checker");
  const auto in_axes = ints_attr(node, "scan_input_axes", static_cast<size_t>(m), 0);
  const auto in_dirs = ints_attr(node, "scan_input_directions", static_cast<size_t>(m), 0);
  const auto out_axes = ints_attr(node, "scan_output_axes", static_cast<size_t>(k_scan), 0);
  const auto out_dirs = ints_attr(node, "scan_output_directions", static_cast<size_t>(k_scan), 0);
  auto axis_of = [&](int64_t axis, int64_t rank, const std::string& what) {
    if (axis < 0 && rank < 0)
      c.unsupported("the rank of " + what + " is unknown, so its negative scan axis cannot be resolved",
                    "declare the shapes of the Scan's inputs (value_info), or use a non-negative axis");
    return axis < 0 ? axis + rank : axis;
  };
  // The trip count: the length of the first scan input along its axis.
  const V first = c.x(n);
  const int64_t a0 = axis_of(in_axes[0], b.rank(first), "scan input '" + node.input(n) + "'");
  const V trips = b.squeeze(b.shape_of(first, a0, a0 + 1), {0});
  const V last = b.sub(trips, b.i64(1));
  NameScope& scope = b.value_scope();

  onnx::GraphProto lb;
  lb.set_name(body->name());
  const std::string it = scope.fresh("scan_iteration"), cond = scope.fresh("scan_cond");
  *lb.add_input() = scalar_info(it, onnx::TensorProto::INT64);
  *lb.add_input() = scalar_info(cond, onnx::TensorProto::BOOL);
  for (int k = 0; k < n; ++k) *lb.add_input() = body->input(k);
  const std::string reversed = scope.fresh("scan_reversed_iteration");
  bool any_backward = false;
  for (int64_t d : in_dirs) any_backward = any_backward || d != 0;
  if (any_backward) *lb.add_node() = make_node("Sub", {std::string(b.name(last)), it}, reversed);
  std::vector<JvpCtx::Captured> captured = c.captured;
  for (int j = 0; j < m; ++j) {
    const std::string& x = node.input(n + j);
    const int64_t axis = axis_of(in_axes[static_cast<size_t>(j)], b.rank(c.x(n + j)), "scan input '" + x + "'");
    onnx::NodeProto g =
        make_node("Gather", {x, in_dirs[static_cast<size_t>(j)] ? reversed : it}, body->input(n + j).name());
    auto* a = g.add_attribute();
    a->set_name("axis");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(axis);
    *lb.add_node() = std::move(g);
    add_captured(captured, JvpCtx::Captured{x, c.x(n + j), c.t(n + j)});
  }
  if (any_backward) add_captured(captured, JvpCtx::Captured{std::string(b.name(last)), last, V{}});
  for (const auto& nd : body->node()) *lb.add_node() = nd;
  for (const auto& t : body->initializer()) *lb.add_initializer() = t;
  for (const auto& vi : body->value_info()) *lb.add_value_info() = vi;
  add_output(lb, cond, scalar_info("", onnx::TensorProto::BOOL), scope);
  for (int i = 0; i < body->output_size(); ++i) add_output(lb, body->output(i).name(), body->output(i), scope);

  // The Scan's own computation as that Loop (its body's names made fresh): it replaces the Scan
  // (take_over_outputs below), so forward mode's JVP loop, which takes the place of this one,
  // and reverse mode's stacking loop, which takes its place too, run the primal once.
  onnx::GraphProto primal_body = lb;
  rename_definitions(primal_body, scope, b.node_scope());
  onnx::NodeProto loop;
  loop.set_op_type("Loop");
  loop.set_name(node.name());
  loop.set_doc_string(node.op_type());  // (diagnostics name the Scan)
  *loop.add_attribute() = Attr::graph("body", std::move(lb)).proto;
  loop.add_input();
  loop.add_input();
  for (int k = 0; k < n; ++k) loop.add_input(node.input(k));
  for (int o = 0; o < node.output_size(); ++o) loop.add_output(node.output(o));
  Vs xs = {trips, b.scalar(1.0, onnx::TensorProto::BOOL)}, ts = {V{}, V{}};
  for (int k = 0; k < n; ++k) {
    xs.push_back(c.x(k));
    ts.push_back(c.t(k));
  }
  // A scan output's stack (axis 0, in iteration order) and the Scan's layout of it.
  struct Layout {
    int64_t axis = 0;
    std::vector<int64_t> to_front, to_axis;
    bool known = false;  // the rank is known
  };
  std::vector<Layout> layouts(static_cast<size_t>(k_scan));
  for (int j = 0; j < k_scan; ++j) {
    Layout& l = layouts[static_cast<size_t>(j)];
    const V y = c.y(n + j);
    const int64_t rank = b.rank(y);
    l.axis = axis_of(out_axes[static_cast<size_t>(j)], rank, "scan output '" + node.output(n + j) + "'");
    if (l.axis != 0 && rank < 0)
      c.unsupported("the rank of scan output '" + node.output(n + j) + "' is unknown",
                    "declare the Scan's output shapes (value_info)");
    l.known = rank >= 0;
    l.to_front = {l.axis};
    for (int64_t i = 0; i < rank; ++i)
      if (i != l.axis) l.to_front.push_back(i);
    for (int64_t i = 1; i <= l.axis; ++i) l.to_axis.push_back(i);
    l.to_axis.push_back(0);
    for (int64_t i = l.axis + 1; i < rank; ++i) l.to_axis.push_back(i);
  }
  auto stacked_facts = [&](int j) {
    const V y = c.y(n + j);
    const Layout& l = layouts[static_cast<size_t>(j)];
    Facts f = b.facts(y);
    if (y.valid() && l.known)
      for (size_t i = 0; i < l.to_front.size(); ++i) f.dims[i] = b.facts(y).dims[static_cast<size_t>(l.to_front[i])];
    return f;
  };
  auto in_scan_layout = [&](V stacked, int j) {
    const Layout& l = layouts[static_cast<size_t>(j)];
    V v = stacked;
    if (out_dirs[static_cast<size_t>(j)]) {
      const V w = b.witness(v);
      v = b.reverse_first_axis(v);
      if (w.valid()) b.set_witness(v, w);
    }
    if (l.axis != 0) v = b.transpose(v, l.to_axis);
    if (c.y(n + j).valid()) b.set_facts(v, b.facts(c.y(n + j)));
    return v;
  };
  const Vs primal = b.op("Loop", xs, {Attr::graph("body", std::move(primal_body))}, n + k_scan);
  for (int k = 0; k < n; ++k)
    if (c.y(k).valid()) b.set_facts(primal[static_cast<size_t>(k)], b.facts(c.y(k)));
  for (int j = 0; j < k_scan; ++j) b.set_facts(primal[static_cast<size_t>(n + j)], stacked_facts(j));
  Vs scan_inputs;
  for (int i = 0; i < node.input_size(); ++i) scan_inputs.push_back(c.x(i));
  Vs same;  // the primal loop's values of the Scan's outputs
  auto replace_scan = [&] {
    for (int k = 0; k < n; ++k) same.push_back(primal[static_cast<size_t>(k)]);
    for (int j = 0; j < k_scan; ++j) same.push_back(in_scan_layout(primal[static_cast<size_t>(n + j)], j));
    return b.take_over_outputs(scan_index, scan_inputs, c.ys, same);
  };
  // Forward mode: the JVP loop takes the primal loop's place first (it must be the node emitted
  // last), then the Scan's outputs are taken from it. Reverse mode: the JVP loop goes to the
  // tape, reading the Scan's outputs (now the primal loop's) as its primal twins.
  const bool forward = !b.has_tape() && !jvp_for_reverse_mode;
  const bool replaced = !forward && replace_scan();
  // The JVP loop's primal twins: the primal loop's outputs. (Where the Scan's output is a loop
  // output as is, the two values traded names and makers: the Scan's value is the loop's now.
  // Unless the primal loop replaced the Scan, nothing may read it: it is dropped.)
  Vs ys;
  for (int k = 0; k < n; ++k) ys.push_back(forward ? primal[static_cast<size_t>(k)] : c.y(k));
  for (int j = 0; j < k_scan; ++j) {
    const V stack = primal[static_cast<size_t>(n + j)];
    const bool traded = replaced && same[static_cast<size_t>(n + j)].id == stack.id;
    ys.push_back(forward ? stack : !replaced ? V{} : traded ? c.y(n + j) : stack);
  }
  JvpCtx lc{b, loop, c.opset, xs, ys, ts, std::move(captured)};
  Vs t = loop_jvp(lc);
  if (forward) replace_scan();
  for (int j = 0; j < k_scan; ++j) {
    V& tj = t[static_cast<size_t>(n + j)];
    if (!tj.valid()) continue;
    const V y = c.y(n + j);
    const Layout& l = layouts[static_cast<size_t>(j)];
    if (y.valid() && l.known) {
      const Facts f = stacked_facts(j);
      b.set_facts(tj, f);
      bool all_static = true;
      for (const Dim& d : f.dims) all_static = all_static && d.known();
      // Reverse mode transposes the reversal below by the stack's run-time shape: a primal
      // value of that shape, unless the facts give it.
      if (!all_static && b.has_tape() && out_dirs[static_cast<size_t>(j)])
        b.set_witness(tj, b.transpose(y, l.to_front));
    }
    tj = in_scan_layout(tj, j);
  }
  return t;
}

// ------------------------------------------------------------------------------------------
// If: each branch is differentiated as a model of its own. The JVP If reads the tangents of the
// values its branches read from this graph by name; in reverse mode those are tape values, so
// they get names for the branches and go on the tape as the node's reads (op_reading), and the
// transpose is an If whose branches are the vjps of the JVP branches.

// Appends zeros shaped like `of` to `g`; returns their name.
std::string append_zeros_like(onnx::GraphProto& g, const std::string& of, int32_t dtype, NameScope& scope) {
  const std::string zero = scope.fresh(of + "_zero"), shape = scope.fresh(of + "_shape"),
                    out = scope.fresh(of + "_zeros");
  onnx::NodeProto k;
  k.set_op_type("Constant");
  k.add_output(zero);
  auto* a = k.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(dtype);
  if (dtype == onnx::TensorProto::DOUBLE)
    a->mutable_t()->add_double_data(0.0);
  else
    a->mutable_t()->add_float_data(0.0f);
  *g.add_node() = std::move(k);
  *g.add_node() = make_node("Shape", {of}, shape);
  *g.add_node() = make_node("Expand", {zero, shape}, out);
  return out;
}

Vs if_jvp(JvpCtx& c) {
  Builder& b = c.b;
  const onnx::NodeProto& node = c.node;
  const onnx::GraphProto* branches[2] = {graph_attribute(node, "then_branch"), graph_attribute(node, "else_branch")};
  const int n_out = node.output_size();
  if (!branches[0] || !branches[1] || branches[0]->output_size() != n_out || branches[1]->output_size() != n_out)
    c.unsupported("its branches do not match its outputs", "check the model with onnx.checker");
  std::unordered_set<std::string> active;
  std::unordered_map<std::string, const JvpCtx::Captured*> by_name;
  for (const auto& cap : c.captured) {
    by_name.emplace(cap.name, &cap);
    if (cap.t.valid()) active.insert(cap.name);
  }
  if (active.empty()) return Vs(static_cast<size_t>(n_out), V{});
  std::vector<char> out_active(static_cast<size_t>(n_out), 0);
  for (const auto* br : branches) {
    const auto dep = outputs_depending_on(*br, active);
    for (int j = 0; j < n_out; ++j) {
      const int32_t dt = c.y(j).valid() ? b.facts(c.y(j)).dtype : 0;
      if (dep[static_cast<size_t>(j)] && maybe_differentiable(dt)) out_active[static_cast<size_t>(j)] = 1;
    }
  }
  std::vector<int> outs_active;
  for (int j = 0; j < n_out; ++j)
    if (out_active[static_cast<size_t>(j)]) outs_active.push_back(j);
  if (outs_active.empty()) return Vs(static_cast<size_t>(n_out), V{});

  NameScope& scope = b.value_scope();
  Vs reads;  // the captured values, then the tangents the branches read
  for (const auto& cap : c.captured) reads.push_back(cap.x);
  std::unordered_map<std::string, std::string> tangent_name;  // captured name -> its tangent's name
  for (const auto& cap : c.captured)
    if (cap.t.valid()) {
      tangent_name[cap.name] = std::string(b.name_for_read(cap.t));
      reads.push_back(cap.t);
    }
  Attrs attrs;
  const char* attr_names[2] = {"then_branch", "else_branch"};
  for (int bi = 0; bi < 2; ++bi) {
    const onnx::GraphProto& br = *branches[bi];
    const auto outer = graph_outer_reads(br);
    std::vector<std::pair<std::string, Facts>> extra;
    std::vector<onnx::TensorProto> known_values;
    Selection sel;
    sel.inputs.emplace();
    for (const auto& r : outer) {
      auto it = by_name.find(r);
      if (it == by_name.end())
        c.unsupported("its branch reads '" + r + "', which is not defined before it",
                      "check the model with onnx.checker");
      extra.emplace_back(r, b.facts(it->second->x));
      if (auto t = known_constant(b, it->second->x, r)) known_values.push_back(std::move(*t));
      if (it->second->t.valid()) sel.inputs->push_back(r);
    }
    onnx::GraphProto g;
    std::vector<std::string> tangent_outs;  // per active output
    if (sel.inputs->empty()) {
      g = br;
      for (int j : outs_active) {
        const int32_t dt = b.facts(c.y(j)).dtype;
        tangent_outs.push_back(append_zeros_like(g, br.output(j).name(), dt ? dt : onnx::TensorProto::FLOAT, scope));
      }
    } else {
      Distinct outs;
      std::vector<size_t> index;
      for (int j : outs_active) index.push_back(outs.add(br.output(j).name()));
      sel.outputs = outs.names;
      g = derive_body(true, standalone_model(br, {}, extra, b.opsets(), known_values), sel, node_label(node),
                      b.has_tape());
      // g: inputs [reads, tangents of the selected]; outputs [branch outputs, tangents].
      const int n_reads = static_cast<int>(outer.size());
      for (size_t i = 0; i < sel.inputs->size(); ++i)
        rename_reads(g, g.input(n_reads + static_cast<int>(i)).name(), tangent_name.at((*sel.inputs)[i]));
      for (size_t a = 0; a < outs_active.size(); ++a)
        tangent_outs.push_back(g.output(n_out + static_cast<int>(index[a])).name());
      g.clear_input();
    }
    const onnx::GraphProto derived = g;
    g.clear_output();
    for (int j = 0; j < n_out; ++j) *g.add_output() = br.output(j);
    for (size_t a = 0; a < outs_active.size(); ++a) {
      const onnx::ValueInfoProto* info = find_value_info(derived, tangent_outs[a]);
      add_output(g, tangent_outs[a], info ? *info : br.output(outs_active[a]), scope);
    }
    rename_definitions(g, scope, b.node_scope());
    attrs.push_back(Attr::graph(attr_names[bi], std::move(g)));
  }
  Vs res = b.op_reading("If", {c.x(0)}, reads, attrs, n_out + static_cast<int>(outs_active.size()));
  Vs tangents(static_cast<size_t>(n_out), V{});
  for (size_t a = 0; a < outs_active.size(); ++a) {
    const int j = outs_active[a];
    V t = res[static_cast<size_t>(n_out) + a];
    if (c.y(j).valid()) {
      b.set_facts(t, b.facts(c.y(j)));
      b.set_witness(t, c.y(j));
    }
    tangents[static_cast<size_t>(j)] = t;
  }
  return tangents;
}

Vs if_transpose(TransposeCtx& c) {
  Builder& b = c.b;
  const onnx::GraphProto* branches[2] = {graph_attribute(c.node, "then_branch"),
                                         graph_attribute(c.node, "else_branch")};
  if (!branches[0] || !branches[1] || c.linear(0))
    c.unsupported("only the Ifs jvp writes can be transposed", "differentiate the model that contains the original If");
  const int n_out = static_cast<int>(c.outs.size());
  NameScope& scope = b.value_scope();
  std::unordered_map<std::string, int> read_index;  // name -> position in c.ins
  for (int i = 1; i < static_cast<int>(c.ins.size()); ++i) read_index.emplace(std::string(b.name(c.in(i))), i);
  std::vector<int> lin_reads;
  for (int i = 1; i < static_cast<int>(c.ins.size()); ++i)
    if (c.linear(i)) lin_reads.push_back(i);
  Vs res(c.ins.size(), V{});
  bool any_ct = false;
  for (int j = 0; j < n_out; ++j) any_ct = any_ct || c.ct(j).valid();
  if (!any_ct || lin_reads.empty()) return res;
  // Zeros for a tangent a branch does not read, made before the If from its primal twin.
  std::unordered_map<int, std::string> zeros;
  auto zeros_for = [&](int i) -> const std::string& {
    auto it = zeros.find(i);
    if (it != zeros.end()) return it->second;
    const V w = b.witness(c.in(i));
    if (!w.valid()) c.unsupported("the shape of a tangent the If reads is unknown");
    return zeros.emplace(i, std::string(b.name(b.zeros_like(w)))).first->second;
  };
  Attrs attrs;
  const char* attr_names[2] = {"then_branch", "else_branch"};
  for (int bi = 0; bi < 2; ++bi) {
    const onnx::GraphProto& br = *branches[bi];
    const auto outer = graph_outer_reads(br);
    std::vector<std::pair<std::string, Facts>> extra;
    std::vector<onnx::TensorProto> known_values;
    Selection sel;
    sel.inputs.emplace();
    std::vector<int> selected;  // positions in c.ins of the selected tangents
    for (const auto& r : outer) {
      auto it = read_index.find(r);
      if (it == read_index.end())
        c.unsupported("its branch reads '" + r + "', which it does not list",
                      "differentiate the model that contains the original If");
      extra.emplace_back(r, b.facts(c.in(it->second)));
      if (auto t = known_constant(b, c.in(it->second), r)) known_values.push_back(std::move(*t));
      if (c.linear(it->second)) {
        sel.inputs->push_back(r);
        selected.push_back(it->second);
      }
    }
    Distinct outs;
    std::vector<std::vector<int>> positions;
    for (int j = 0; j < n_out; ++j)
      if (c.ct(j).valid()) {
        const size_t u = outs.add(br.output(j).name());
        if (u == positions.size()) positions.emplace_back();
        positions[u].push_back(j);
      }
    onnx::GraphProto g;
    std::unordered_map<int, std::string> ct_out;  // position in c.ins -> output name in g
    if (!sel.inputs->empty()) {
      sel.outputs = outs.names;
      g = derive_body(false, standalone_model(br, {}, extra, b.opsets(), known_values), sel, tape_label(c), true);
      // g: inputs [reads, cotangents of the selected outputs]; outputs [branch outputs,
      // cotangents of the selected tangents].
      const int n_reads = static_cast<int>(outer.size());
      for (size_t u = 0; u < outs.names.size(); ++u) {
        V sum;
        for (int j : positions[u]) sum = b.add(sum, c.ct(j));
        rename_reads(g, g.input(n_reads + static_cast<int>(u)).name(), std::string(b.name(sum)));
      }
      for (size_t i = 0; i < selected.size(); ++i) ct_out[selected[i]] = g.output(n_out + static_cast<int>(i)).name();
      onnx::GraphProto kept;
      for (size_t i = 0; i < selected.size(); ++i) *kept.add_output() = g.output(n_out + static_cast<int>(i));
      g.mutable_output()->Swap(kept.mutable_output());
      prune(g);
      g.clear_input();  // (the branch reads these from the enclosing graph)
      // A linear map's transpose needs its input's shape at most: read it from the primal twin.
      const std::vector<std::string> reads = graph_outer_reads(g);
      for (size_t i = 0; i < selected.size(); ++i) {
        const std::string& tname = (*sel.inputs)[i];
        const V w = b.witness(c.in(selected[i]));
        if (std::find(reads.begin(), reads.end(), tname) == reads.end()) continue;
        if (!w.valid()) c.unsupported("the transpose of a branch reads the shape of a tangent with no primal twin");
        rename_reads(g, tname, std::string(b.name(w)));
      }
    }
    const onnx::GraphProto derived = g;
    g.clear_output();
    g.set_name(br.name());
    for (int i : lin_reads) {
      auto it = ct_out.find(i);
      const onnx::ValueInfoProto type_of = typed_value_info("", b.facts(c.in(i)), true);
      if (it != ct_out.end()) {
        const onnx::ValueInfoProto* info = find_value_info(derived, it->second);
        add_output(g, it->second, info ? *info : type_of, scope);
      } else {
        add_output(g, zeros_for(i), type_of, scope);
      }
    }
    rename_definitions(g, scope, b.node_scope());
    attrs.push_back(Attr::graph(attr_names[bi], std::move(g)));
  }
  Vs r = b.op("If", {c.in(0)}, attrs, static_cast<int>(lin_reads.size()));
  for (size_t a = 0; a < lin_reads.size(); ++a) {
    b.set_facts(r[a], b.facts(c.in(lin_reads[a])));
    res[static_cast<size_t>(lin_reads[a])] = r[a];
  }
  return res;
}

}  // namespace

void register_control_flow_derivatives(DerivativeRules& r) {
  r.jvp("If", if_jvp);
  r.transpose("If", if_transpose);
  r.jvp("Loop", loop_jvp);
  r.transpose("Loop", loop_transpose);
  r.jvp("Scan", scan_jvp);
}

}  // namespace onnax
