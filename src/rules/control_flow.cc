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
// Reverse mode through a Loop transposes the JVP loop: loop_transpose.cc.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "diagnostics/error.h"
#include "diagnostics/limits.h"
#include "ir/control_flow_outputs.h"
#include "ir/graph_edit.h"
#include "rules/control_flow_parts.h"
#include "rules/derivative.h"
#include "rules/op_table.h"
#include "transforms/subgraph.h"

namespace onnax {
namespace control_flow {

// "Loop 'name'" or "Loop producing 'output'" (a node differentiated as another, as a Scan is as
// a Loop, keeps its own op type in doc_string).
std::string node_label(const onnx::NodeProto& node) {
  std::string produced;
  for (const auto& o : node.output())
    if (produced.empty()) produced = o;
  const std::string& type = node.doc_string().empty() ? node.op_type() : node.doc_string();
  return type + " " + (node.name().empty() ? "producing '" + produced + "'" : "'" + node.name() + "'");
}

// jvp or vjp of a body as a model of its own, by the transform's `bodies`; failures name the
// node whose body it is (`where`). `for_reverse_mode`: a tape is recorded around it (an
// enclosing reverse mode), which transposes the result: its loops carry the values they read
// from the enclosing graph as state, so their bodies are closed.
onnx::GraphProto derive_body(const BodyTransforms& bodies, bool forward, onnx::ModelProto model,
                             const Selection& selection, const std::string& where, bool for_reverse_mode) {
  try {
    limits::poll();
    onnx::ModelProto r = bodies.derive(forward, std::move(model), selection, for_reverse_mode);
    strip_known_values(*r.mutable_graph());
    return std::move(*r.mutable_graph());
  } catch (const Error& e) {
    if (e.kind() == Error::Kind::kLimit) throw;  // (about the whole transform, not this body)
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

Facts scalar_facts(int32_t dtype) {
  return Facts::of(dtype, {});
}

bool maybe_differentiable(int32_t dtype) {
  return dtype == 0 || differentiable_dtype(dtype);  // unknown: could be float
}

onnx::ValueInfoProto scalar_info(const std::string& name, int32_t dtype) {
  return typed_value_info(name, scalar_facts(dtype));
}

}  // namespace control_flow

namespace {

using namespace control_flow;  // (the helpers this file shares with loop_transpose.cc)

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
  onnx::GraphProto g =
      derive_body(*c.bodies, true, standalone_model(*body, carried_facts, extra, b.opsets(), known_values, true), sel,
                  node_label(node), b.has_tape() || c.for_reverse_mode);

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
  const bool outside = !b.has_tape() && !c.for_reverse_mode;
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
    rename_reads(g, from_outside);
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
  const int scans_at = pos;
  for (int j = 0; j < k_scan; ++j) known(res[pos++], c.y(n + j));
  for (int j = 0; j < k_scan; ++j)
    if (sact[static_cast<size_t>(j)]) {
      known(res[pos], c.y(n + j));
      tangents[static_cast<size_t>(n + j)] = res[pos++];
    }
  // The JVP loop computes the primal outputs too, so the source loop need not run: in forward
  // mode, and in a JVP body that reverse mode transposes (the enclosing loop's stacking loop then
  // runs this loop's forward part once, stacking what its reverse reads: rules/loop_transpose.cc).
  // Reverse mode's own tape keeps the source loop: the JVP loop goes to the tape.
  // (take_over_outputs checks that the node at source_index is the one defining them.)
  if (!b.has_tape()) {
    Vs source_outputs, same;
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
  const bool forward = !b.has_tape() && !c.for_reverse_mode;
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
  JvpCtx lc{b, loop, c.opset, xs, ys, ts, std::move(captured), c.bodies, c.for_reverse_mode};
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
      g = derive_body(*c.bodies, true, standalone_model(br, {}, extra, b.opsets(), known_values), sel, node_label(node),
                      b.has_tape() || c.for_reverse_mode);
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
      // Only the outputs with a cotangent are differentiated: the branch gives just those (a
      // JVP branch's primal outputs and lower-order tangents go, with the inner Ifs' and Loops'
      // outputs only they read), or each nesting level would linearize every order below it
      // again.
      onnx::GraphProto trimmed = br;
      trimmed.clear_output();
      for (const auto& name : outs.names)
        for (const auto& o : br.output())
          if (o.name() == name) {
            *trimmed.add_output() = o;
            break;
          }
      drop_unread_control_flow_outputs(trimmed);
      g = derive_body(*c.bodies, false, standalone_model(trimmed, {}, extra, b.opsets(), known_values), sel,
                      tape_label(c), true);
      // g: inputs [reads, cotangents of the selected outputs]; outputs [the selected outputs,
      // cotangents of the selected tangents].
      const int n_reads = static_cast<int>(outer.size());
      const int n_given = trimmed.output_size();
      for (size_t u = 0; u < outs.names.size(); ++u) {
        V sum;
        for (int j : positions[u]) sum = b.add(sum, c.ct(j));
        rename_reads(g, g.input(n_reads + static_cast<int>(u)).name(), std::string(b.name(sum)));
      }
      for (size_t i = 0; i < selected.size(); ++i) ct_out[selected[i]] = g.output(n_given + static_cast<int>(i)).name();
      onnx::GraphProto kept;
      for (size_t i = 0; i < selected.size(); ++i) *kept.add_output() = g.output(n_given + static_cast<int>(i));
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

void register_control_flow(OpTable& table) {
  // Batching from opset 16, where bodies may be typed by their outer scope; the bodies are
  // batched, differentiated and transposed by the transforms themselves (subgraph.h).
  table.op("Loop").batch(loop_batch, 16).jvp(loop_jvp).transpose(loop_transpose);
  table.op("Scan").batch(scan_batch, 16).jvp(scan_jvp);
  table.op("If").batch(if_batch, 16).jvp(if_jvp).transpose(if_transpose);
}

}  // namespace onnax
