// vmap of Loop, Scan and If whose trip count and condition are shared: the body is batched by vmap
// itself, as a model of its own (transforms/subgraph.h), so the loop runs once for the whole
// batch instead of once per example. A batched trip count or condition means examples take
// different paths: those nodes keep the per-example map (scan_fallback).

#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "diagnostics/error.h"
#include "ir/graph_edit.h"
#include "rules/batching.h"
#include "rules/op_table.h"
#include "transforms/subgraph.h"

namespace onnax {
namespace {

// The outer values a body reads, as extra inputs of its model (per-example facts), and the
// names of the batched ones.
struct BodyReads {
  std::vector<std::pair<std::string, Facts>> extra;
  std::unordered_set<std::string> batched;
};

BodyReads body_reads(const BatchCtx& c, const onnx::GraphProto& body) {
  std::unordered_map<std::string, const BatchCtx::Read*> by_name;
  for (const auto& r : c.reads) by_name.emplace(r.name, &r);
  BodyReads out;
  for (const auto& name : graph_outer_reads(body)) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      c.unsupported("its body reads '" + name + "', which is not defined before it",
                    "check the model with onnx.checker");
    out.extra.emplace_back(name, it->second->facts ? *it->second->facts : Facts{});
    if (it->second->batched) out.batched.insert(name);
  }
  return out;
}

// vmap of `model` with the named inputs batched at axis 0 (the rest shared); the graph, or
// nothing when vmap cannot batch the body as a whole (e.g. a rank it needs is unknown there):
// the per-example map, which needs no rule for what the body does, still can.
std::optional<onnx::GraphProto> batched_body(const BatchCtx& c, onnx::ModelProto model,
                                             const std::unordered_set<std::string>& batched) {
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kByName;
  for (const auto& n : batched) opt.in_axes_by_name[n] = 0;
  if (c.batch_dim.symbolic() && !c.batch_dim.internal()) opt.axis_name = std::string(c.batch_dim.param());
  try {
    onnx::ModelProto r = c.bodies->vmap(std::move(model), opt);
    return std::move(*r.mutable_graph());
  } catch (const Error&) {
    return std::nullopt;
  }
}

// A body batched in place: made a model (`input_facts` type its own inputs, the outer values it
// reads are extra inputs), vmapped with the `batched` inputs at axis 0 and only the outputs
// marked in `out_batched` batched (vmap would broadcast a shared output, and a condition or
// shared state must stay shared: those keep their names), then put back under this graph (reads
// of batched outer values renamed to the batched values, every definition a fresh name).
// Nothing when vmap cannot batch it as a whole.
std::optional<onnx::GraphProto> batch_in_place(BatchCtx& c, const onnx::GraphProto& body, const BodyReads& reads,
                                               const std::vector<const Facts*>& input_facts,
                                               const std::unordered_set<std::string>& batched,
                                               const std::vector<char>& out_batched) {
  onnx::ModelProto model = standalone_model(body, input_facts, reads.extra, c.b.opsets());
  onnx::GraphProto outs;
  for (int i = 0; i < body.output_size(); ++i)
    if (out_batched[static_cast<size_t>(i)]) *outs.add_output() = body.output(i);
  model.mutable_graph()->mutable_output()->Swap(outs.mutable_output());
  std::optional<onnx::GraphProto> g = batched_body(c, std::move(model), batched);
  if (!g) return g;
  const onnx::GraphProto vm = *g;
  g->clear_output();
  for (int i = 0, next = 0; i < body.output_size(); ++i)
    *g->add_output() = out_batched[static_cast<size_t>(i)] ? vm.output(next++) : body.output(i);
  onnx::GraphProto own;
  for (int i = 0; i < body.input_size(); ++i) *own.add_input() = g->input(i);
  g->mutable_input()->Swap(own.mutable_input());
  for (const auto& r : c.reads)
    if (std::string(c.b.name(r.v)) != r.name) rename_reads(*g, r.name, std::string(c.b.name(r.v)));
  rename_definitions(*g, c.b.value_scope(), c.b.node_scope());
  return g;
}

}  // namespace

BatchResult loop_batch(BatchCtx& c) {
  const onnx::GraphProto* body = graph_attribute(c.node, "body");
  const int n = c.num_inputs() - 2;
  const int k_scan = c.node.output_size() - n;
  if (!body || n < 0 || k_scan < 0 || body->input_size() != n + 2 || body->output_size() != 1 + n + k_scan)
    return scan_fallback(c);
  if ((c.has(0) && c.batched[0]) || (c.has(1) && c.batched[1])) return scan_fallback(c);
  const BodyReads reads = body_reads(c, *body);
  std::vector<char> bat(static_cast<size_t>(n), 0);
  for (int k = 0; k < n; ++k) bat[static_cast<size_t>(k)] = c.batched[static_cast<size_t>(2 + k)];
  const std::vector<char> dep = loop_batched_state(*body, bat, reads.batched);
  if (dep[0]) return scan_fallback(c);
  for (int j = 0; j < k_scan; ++j)
    if (dep[static_cast<size_t>(1 + n + j)] && !c.node.output(n + j).empty() && c.out_facts[n + j]->rank() < 0)
      return scan_fallback(c);  // (its stack must be transposed to put the batch first)

  std::vector<const Facts*> input_facts;
  const Facts iter_facts = Facts::of(onnx::TensorProto::INT64, {}), cond_facts = Facts::of(onnx::TensorProto::BOOL, {});
  input_facts = {&iter_facts, &cond_facts};
  for (int k = 0; k < n; ++k) input_facts.push_back(c.facts[static_cast<size_t>(2 + k)]);
  std::vector<char> out_batched(static_cast<size_t>(body->output_size()), 0);
  for (int k = 0; k < n; ++k) out_batched[static_cast<size_t>(1 + k)] = bat[static_cast<size_t>(k)];
  for (int j = 0; j < k_scan; ++j) out_batched[static_cast<size_t>(1 + n + j)] = dep[static_cast<size_t>(1 + n + j)];
  std::unordered_set<std::string> batched_inputs = reads.batched;
  for (int k = 0; k < n; ++k)
    if (bat[static_cast<size_t>(k)]) batched_inputs.insert(body->input(2 + k).name());
  std::optional<onnx::GraphProto> g = batch_in_place(c, *body, reads, input_facts, batched_inputs, out_batched);
  if (!g) return scan_fallback(c);

  Vs ins = {c.in[0], c.in[1]};
  for (int k = 0; k < n; ++k)
    ins.push_back(bat[static_cast<size_t>(k)] ? c.materialize(2 + k) : c.in[static_cast<size_t>(2 + k)]);
  Vs res = c.b.op("Loop", ins, {Attr::graph("body", std::move(*g))}, n + k_scan);
  BatchResult r;
  for (int k = 0; k < n; ++k) {
    r.out.push_back(res[k]);
    r.batched.push_back(bat[static_cast<size_t>(k)] != 0);
  }
  for (int j = 0; j < k_scan; ++j) {
    V o = res[n + j];
    const bool b = dep[static_cast<size_t>(1 + n + j)] != 0;
    if (b && !c.node.output(n + j).empty()) {
      // The loop stacks [batch, ...] per iteration into [iterations, batch, ...]. After zero
      // iterations a runtime cannot know the per-iteration shape (it contains the batch size):
      // the static per-example dims and the batch size restore it.
      const Facts& f = *c.out_facts[n + j];  // per example: [iterations, per-iteration dims...]
      bool all_static = f.has_shape && !f.dims.empty();
      std::vector<int64_t> dims;
      for (size_t d = 1; d < f.dims.size(); ++d) {
        all_static = all_static && f.dims[d].known();
        dims.push_back(f.dims[d].value());
      }
      if (all_static) {
        V shape = c.b.concat({c.b.shape_of(o, 0, 1), c.batch_size(), c.b.i64s(dims)}, 0);
        o = c.b.reshape(o, shape);
      }
      const int64_t rank = c.out_facts[n + j]->rank() + 1;
      std::vector<int64_t> perm = {1, 0};
      for (int64_t i = 2; i < rank; ++i) perm.push_back(i);
      o = c.b.transpose(o, perm);
    }
    r.out.push_back(o);
    r.batched.push_back(b);
  }
  return r;
}

namespace {

std::vector<int64_t> ints_of(const BatchCtx& c, const char* name, size_t count) {
  std::vector<int64_t> v = c.attr_ints(name);
  v.resize(count, 0);
  return v;
}

// Scan: state and scan inputs batched at 0 (scan inputs scanned along their per-example axis,
// one further in), the body batched by vmap; batched scan outputs are stacked one axis further
// in, behind the batch.
}  // namespace

BatchResult scan_batch(BatchCtx& c) {
  const onnx::GraphProto* body = graph_attribute(c.node, "body");
  const int m = static_cast<int>(c.attr_i("num_scan_inputs", 0));
  const int n = c.num_inputs() - m;
  const int k_scan = c.node.output_size() - n;
  if (!body || m < 1 || n < 0 || k_scan < 0 || body->input_size() != n + m || body->output_size() != n + k_scan)
    return scan_fallback(c);
  const BodyReads reads = body_reads(c, *body);
  std::vector<char> bat(static_cast<size_t>(n), 0);
  for (int k = 0; k < n; ++k) bat[static_cast<size_t>(k)] = c.batched[static_cast<size_t>(k)];
  std::vector<char> dep;
  for (bool changed = true; changed;) {
    changed = false;
    std::unordered_set<std::string> live = reads.batched;
    for (int k = 0; k < n; ++k)
      if (bat[static_cast<size_t>(k)]) live.insert(body->input(k).name());
    for (int j = 0; j < m; ++j)
      if (c.batched[static_cast<size_t>(n + j)]) live.insert(body->input(n + j).name());
    dep = outputs_depending_on(*body, live);
    for (int k = 0; k < n; ++k)
      if (!bat[static_cast<size_t>(k)] && dep[static_cast<size_t>(k)]) {
        bat[static_cast<size_t>(k)] = 1;
        changed = true;
      }
  }
  // Axes: per-example scan input/output axes, non-negative (the ranks must be known).
  auto in_axes = ints_of(c, "scan_input_axes", static_cast<size_t>(m));
  auto out_axes = ints_of(c, "scan_output_axes", static_cast<size_t>(k_scan));
  std::vector<Facts> elem_facts(static_cast<size_t>(m));
  for (int j = 0; j < m; ++j) {
    const Facts* f = c.facts[static_cast<size_t>(n + j)];
    const int64_t rank = f ? f->rank() : -1;
    int64_t& a = in_axes[static_cast<size_t>(j)];
    if (a < 0 && rank < 0) return scan_fallback(c);
    if (a < 0) a += rank;
    if (f && f->has_shape && a < rank) {
      elem_facts[static_cast<size_t>(j)] = *f;
      elem_facts[static_cast<size_t>(j)].dims.erase(elem_facts[static_cast<size_t>(j)].dims.begin() + a);
    } else if (f) {
      elem_facts[static_cast<size_t>(j)].dtype = f->dtype;
    }
  }
  for (int j = 0; j < k_scan; ++j) {
    int64_t& a = out_axes[static_cast<size_t>(j)];
    const int64_t rank = c.out_facts[static_cast<size_t>(n + j)]->rank();
    if (a < 0 && rank < 0) return scan_fallback(c);
    if (a < 0) a += rank;
  }

  std::vector<const Facts*> input_facts;
  for (int k = 0; k < n; ++k) input_facts.push_back(c.facts[static_cast<size_t>(k)]);
  for (int j = 0; j < m; ++j) input_facts.push_back(&elem_facts[static_cast<size_t>(j)]);
  std::vector<char> out_batched(static_cast<size_t>(body->output_size()), 0);
  for (int k = 0; k < n; ++k) out_batched[static_cast<size_t>(k)] = bat[static_cast<size_t>(k)];
  for (int j = 0; j < k_scan; ++j) out_batched[static_cast<size_t>(n + j)] = dep[static_cast<size_t>(n + j)];
  std::unordered_set<std::string> batched_inputs = reads.batched;
  for (int k = 0; k < n; ++k)
    if (bat[static_cast<size_t>(k)]) batched_inputs.insert(body->input(k).name());
  for (int j = 0; j < m; ++j)
    if (c.batched[static_cast<size_t>(n + j)]) batched_inputs.insert(body->input(n + j).name());
  std::optional<onnx::GraphProto> g = batch_in_place(c, *body, reads, input_facts, batched_inputs, out_batched);
  if (!g) return scan_fallback(c);

  Vs ins;
  for (int k = 0; k < n; ++k)
    ins.push_back(bat[static_cast<size_t>(k)] ? c.materialize(k) : c.in[static_cast<size_t>(k)]);
  for (int j = 0; j < m; ++j) {
    ins.push_back(c.in[static_cast<size_t>(n + j)]);
    if (c.batched[static_cast<size_t>(n + j)]) ++in_axes[static_cast<size_t>(j)];
  }
  for (int j = 0; j < k_scan; ++j)
    if (dep[static_cast<size_t>(n + j)]) ++out_axes[static_cast<size_t>(j)];
  Attrs attrs = {Attr::graph("body", std::move(*g)), Attr::i("num_scan_inputs", m),
                 Attr::ints("scan_input_axes", in_axes), Attr::ints("scan_output_axes", out_axes)};
  for (const char* dirs : {"scan_input_directions", "scan_output_directions"})
    if (const auto* a = c.attr(dirs)) attrs.push_back(Attr{*a});
  Vs res = c.b.op("Scan", ins, attrs, n + k_scan);
  BatchResult r;
  for (int k = 0; k < n; ++k) {
    r.out.push_back(res[k]);
    r.batched.push_back(bat[static_cast<size_t>(k)] != 0);
  }
  for (int j = 0; j < k_scan; ++j) {
    r.out.push_back(res[n + j]);
    r.batched.push_back(dep[static_cast<size_t>(n + j)] != 0);
  }
  return r;
}

BatchResult if_batch(BatchCtx& c) {
  if (c.has(0) && c.batched[0]) return scan_fallback(c);  // examples take different branches
  const char* names[2] = {"then_branch", "else_branch"};
  Attrs attrs;
  for (const char* name : names) {
    const onnx::GraphProto* br = graph_attribute(c.node, name);
    if (!br || br->output_size() != c.node.output_size()) return scan_fallback(c);
    const BodyReads reads = body_reads(c, *br);
    onnx::GraphProto g;
    if (reads.batched.empty()) {
      // Nothing batched in this branch: its results are broadcast to the batch.
      g = *br;
      g.clear_output();
      const std::string size = std::string(c.b.name(c.batch_size()));
      for (int o = 0; o < br->output_size(); ++o) {
        const std::string& out = br->output(o).name();
        NameScope& scope = c.b.value_scope();
        const std::string shape = scope.fresh(out + "_shape"), full = scope.fresh(out + "_batched_shape"),
                          lead = scope.fresh(out + "_lead"), wide = scope.fresh(out + "_batched");
        *g.add_node() = make_node("Shape", {out}, shape);
        *g.add_node() = make_node("Concat", {size, shape}, full);
        *g.mutable_node(g.node_size() - 1)->add_attribute() = Attr::i("axis", 0).proto;
        *g.add_node() = make_node("Unsqueeze", {out, std::string(c.b.name(c.b.i64s({0})))}, lead);
        *g.add_node() = make_node("Expand", {lead, full}, wide);
        onnx::ValueInfoProto vi;
        vi.set_name(wide);
        if (o < static_cast<int>(c.out_facts.size()) && c.out_facts[o]->dtype)
          write_type(c.out_facts[o]->has_shape ? c.out_facts[o]->with_dim(0, c.batch_dim) : *c.out_facts[o],
                     vi.mutable_type());
        *g.add_output() = vi;
      }
      rename_definitions(g, c.b.value_scope(), c.b.node_scope());
    } else {
      std::optional<onnx::GraphProto> batched_g = batch_in_place(
          c, *br, reads, {}, reads.batched, std::vector<char>(static_cast<size_t>(br->output_size()), 1));
      if (!batched_g) return scan_fallback(c);
      g = std::move(*batched_g);
    }
    attrs.push_back(Attr::graph(name, std::move(g)));
  }
  return all_batched(c.b.op("If", {c.in[0]}, attrs, c.node.output_size()));
}

std::vector<char> loop_batched_state(const onnx::GraphProto& body, std::vector<char>& state_batched,
                                     const std::unordered_set<std::string>& batched_reads) {
  // Batched state: batched at entry, or made to depend on a batched value by the body (a
  // fixed point).
  const int n = static_cast<int>(state_batched.size());
  std::vector<char> dep;
  for (bool changed = true; changed;) {
    changed = false;
    std::unordered_set<std::string> live = batched_reads;
    for (int k = 0; k < n; ++k)
      if (state_batched[static_cast<size_t>(k)]) live.insert(body.input(2 + k).name());
    dep = outputs_depending_on(body, live);
    for (int k = 0; k < n; ++k)
      if (!state_batched[static_cast<size_t>(k)] && dep[static_cast<size_t>(1 + k)]) {
        state_batched[static_cast<size_t>(k)] = 1;
        changed = true;
      }
  }
  return dep;
}

}  // namespace onnax
