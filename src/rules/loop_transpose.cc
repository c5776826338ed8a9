// Reverse mode through a Loop (DESIGN.md section 3, linearize then transpose): the JVP loop is
// linear in its tangent state. Its transpose runs a forward loop that computes the primal part
// (replacing the source loop when it can) and stacks what the reverse body reads of it, then a
// loop over the iterations in reverse order whose body is the vjp of the JVP body, reading that
// iteration's primal values from the stacks. Weight products and sums leave the reverse loop
// (rules/loop_products.h), and residuals computed elementwise from others are computed on the
// stacks after the forward loop (rules/loop_residuals.h).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "diagnostics/error.h"
#include "ir/control_flow_outputs.h"
#include "ir/graph_edit.h"
#include "rules/control_flow_parts.h"
#include "rules/derivative.h"
#include "rules/loop_products.h"
#include "rules/loop_residuals.h"
#include "transforms/prepare.h"
#include "transforms/subgraph.h"

namespace onnax {
namespace control_flow {
namespace {

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
    rename_reads(fwd, from_outside);
  }
  add_output(fwd, body.input(0).name(), scalar_info("", onnx::TensorProto::INT64), scope);
  if (stack_cond) add_output(fwd, body.input(1).name(), scalar_info("", onnx::TensorProto::BOOL), scope);
  result.cond_stacks = stack_cond ? 1 : 0;
  for (int k : varying) add_output(fwd, body.input(2 + k).name(), body.input(2 + k), scope);
  for (const auto& r : residuals) add_output(fwd, r.name, typed_value_info(r.name, r.facts), scope);
  for (int j : primal_scans) add_output(fwd, body.output(1 + n + j).name(), body.output(1 + n + j), scope);
  // (Inner loops that compute tangents beside their primal part, a JVP body's, keep the part
  // these outputs need: they no longer read the tangent state.)
  drop_unread_control_flow_outputs(fwd);
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

}  // namespace

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
  std::vector<char> unchanged(static_cast<size_t>(n));  // state the body passes through
  for (int k = 0; k < n; ++k) unchanged[static_cast<size_t>(k)] = invariant_state(*body, k);
  auto constant_state = [&](int k) { return !lin[static_cast<size_t>(k)] && unchanged[static_cast<size_t>(k)]; };
  std::vector<int> varying;  // non-linear state that changes between iterations
  for (int k = 0; k < n; ++k)
    if (!lin[static_cast<size_t>(k)] && !unchanged[static_cast<size_t>(k)]) varying.push_back(k);

  // 1. The vjp of the body on its tangent state (and the tangent scan outputs with a
  //    cotangent), as a model. State the body reads one row of per iteration is differentiated
  //    through that row (a body input in place of the Gather): its cotangent is a row per
  //    iteration, stacked by the reverse loop, not a full-size accumulator that every iteration
  //    would add to (quadratic in the sequence length).
  std::vector<onnx::TensorProto> known_values;
  for (int k = 0; k < n; ++k)
    if (constant_state(k))
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
  onnx::GraphProto g =
      derive_body(*c.bodies, false, standalone_model(vjp_body, input_facts, {}, b.opsets(), known_values, true), sel,
                  tape_label(c), true);
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
  onnx::GraphProto forward_body = *body;  // what the stacking loop runs (hoisted loops in it)
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
      if (!unchanged[static_cast<size_t>(k)]) continue;
      // (A weight of symbolic shape stays accumulated: after zero iterations, the stacks a
      // hoisted term is summed from have no shape to give it.)
      if (!static_dims(b.facts(c.in(2 + k)))) continue;
      accumulated.push_back(static_cast<int>(li));
      into.push_back(g.input(2 + n + n_rows + static_cast<int>(state_out[static_cast<size_t>(k)])).name());
    }
    products = hoist_loop_products(g, accumulated, into, *g_facts, scope);
    sums = hoist_loop_sums(g, accumulated, into, static_cast<int>(linear_states.size()), *g_facts, scope);
    std::unordered_set<std::string> primal_inputs = {g.input(0).name(), g.input(1).name()};
    for (int k = 0; k < n; ++k)
      if (!lin[static_cast<size_t>(k)]) primal_inputs.insert(g.input(2 + k).name());
    const std::unordered_set<std::string> hoisted = hoist_inner_stacking_loops(g, primal_inputs, forward_body);
    // (What g reads of a hoisted loop is its primal part: the rest goes, with the tangent
    // inputs it read.)
    if (!hoisted.empty()) drop_unread_control_flow_outputs(g);
    std::unordered_set<std::string> forward_defined;
    for (const auto& nd : forward_body.node())
      for (const auto& o : nd.output()) forward_defined.insert(o);
    residuals = take_loop_residuals(g, primal_inputs, forward_defined, *g_facts, hoisted);
  }
  const int first_residual = g.input_size() - static_cast<int>(residuals.size());
  rename_definitions(g, scope, b.node_scope());
  // What the reverse body reads of the primal state: only that is stacked.
  std::unordered_set<std::string> g_reads = names_read(g);
  for (const auto& o : g.output()) g_reads.insert(o.name());
  const bool stack_cond = g_reads.count(g.input(1).name()) > 0;
  std::vector<int> stacked_states;
  for (int k : varying)
    if (g_reads.count(g.input(2 + k).name())) stacked_states.push_back(k);

  // 2. The primal part, once more, stacking the state each iteration starts from and the
  //    residuals. It computes what the source loop computes (the JVP loop's primal part is the
  //    source body): when that loop is a node of the model, it also gives the loop's scan outputs
  //    and takes its place, so the forward pass runs once (as JAX's scan saves residuals while
  //    it runs the primal). (scan_jvp's Loop replaces its Scan first.)
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
    if (constant_state(k)) invariant[body->input(2 + k).name()] = b.facts(c.in(2 + k)).rank();
  const DerivedResiduals derived = derivable_residuals(forward_body, residuals, invariant);
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
      outer[static_cast<size_t>(k)] =
          constant_state(k) && !of_source[static_cast<size_t>(k)] && !b.name(c.in(2 + k)).empty();
  }
  const StackingLoop stacks =
      stacking_loop(c, forward_body, lin, outer, stacked_states, stack_cond, stacked_residuals, primal_scans);
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
      if (constant_state(k)) whole[body->input(2 + k).name()] = c.in(2 + k);
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
  rename_reads(g, aliases);
  for (auto& nd : *g.mutable_node()) *rev.add_node() = std::move(nd);
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
    const std::unordered_set<std::string> read = names_read(rev);
    std::unordered_map<std::string, std::string> entering;
    for (size_t li = 0; li < n_lin; ++li)
      if (passed[li] && read.count(ct_state[li])) entering[ct_state[li]] = name_of(entering_ct(li));
    rename_reads(rev, entering);
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

}  // namespace control_flow
}  // namespace onnax
