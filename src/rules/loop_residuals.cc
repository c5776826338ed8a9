#include "rules/loop_residuals.h"

#include <functional>

#include "ir/graph_edit.h"
#include "rules/derivative.h"
#include "transforms/prepare.h"
#include "transforms/subgraph.h"

namespace onnax {

IterationShapes::IterationShapes(const onnx::GraphProto& g, const Prepared& facts) {
  for (const auto& in : g.input())
    for (const Dim& d : facts.fact(in.name()).dims)
      if (d.internal()) invariant_.insert(d.param());
}

bool IterationShapes::same_every_iteration(const Facts& f) const {
  if (!f.has_shape) return false;
  for (const Dim& d : f.dims)
    if (!d.known() && !(d.symbolic() && (!d.internal() || invariant_.count(d.param())))) return false;
  return true;
}

std::vector<LoopResidual> take_loop_residuals(onnx::GraphProto& g, const std::unordered_set<std::string>& primal_inputs,
                                              const std::unordered_set<std::string>& forward_defined,
                                              const Prepared& facts, const std::unordered_set<std::string>& any_type) {
  std::vector<LoopResidual> residuals;
  // Nodes that compute from the primal inputs alone (constants and initializers included):
  // those depending on none of g's other inputs.
  std::unordered_set<std::string> others;
  for (const auto& vi : g.input())
    if (!primal_inputs.count(vi.name())) others.insert(vi.name());
  const std::unordered_set<std::string> linear = values_depending_on(g, others);
  std::vector<char> primal_node(static_cast<size_t>(g.node_size()), 0);
  for (int i = 0; i < g.node_size(); ++i) {
    bool p = true;
    for (const auto& o : g.node(i).output()) p = p && !linear.count(o);
    primal_node[static_cast<size_t>(i)] = p ? 1 : 0;
  }
  // Read by the linear part (or an output): worth stacking when the forward body computes it
  // and it is floating point (shape arithmetic and constants are cheap to recompute).
  // (A node's reads include its subgraphs' reads of g: an inner reverse loop reads the stacks
  // of the inner stacking loop there.)
  auto reads_of = [](const onnx::NodeProto& n) {
    std::vector<std::string> r(n.input().begin(), n.input().end());
    if (has_subgraphs(n))
      for (auto& o : outer_scope_reads(n)) r.push_back(std::move(o));
    return r;
  };
  std::unordered_set<std::string> wanted;
  for (int i = 0; i < g.node_size(); ++i)
    if (!primal_node[static_cast<size_t>(i)])
      for (auto& in : reads_of(g.node(i))) wanted.insert(std::move(in));
  for (const auto& o : g.output()) wanted.insert(o.name());
  std::unordered_set<std::string> read;  // by any node or output
  for (const auto& n : g.node())
    for (auto& in : reads_of(n)) read.insert(std::move(in));
  for (const auto& o : g.output()) read.insert(o.name());
  std::unordered_set<std::string> taken;
  const IterationShapes shapes(g, facts);
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    if (!primal_node[static_cast<size_t>(i)] || n.op_type() == "Constant" || n.input_size() == 0) continue;
    // A node's outputs are taken together (its definition goes): each one read must be takeable.
    bool any = false, all = true;
    for (const auto& o : n.output()) {
      if (o.empty() || !read.count(o)) continue;
      const Facts& f = facts.fact(o);
      const bool takeable = forward_defined.count(o) && !primal_inputs.count(o) &&
                            (differentiable_dtype(f.dtype) || (any_type.count(o) && f.dtype != 0)) &&
                            shapes.same_every_iteration(f);
      all = all && takeable;
      any = any || wanted.count(o) > 0;
    }
    if (!any || !all) continue;
    for (const auto& o : n.output()) {
      if (o.empty() || !read.count(o)) continue;
      residuals.push_back(LoopResidual{o, facts.fact(o)});
      taken.insert(o);
    }
  }
  if (residuals.empty()) return residuals;
  // The residuals become inputs: their definitions go (a node defining one and other values
  // still needed stays out: it would define a name twice).
  auto* nodes = g.mutable_node();
  for (int i = nodes->size(); i-- > 0;) {
    bool defines = false;
    for (const auto& o : nodes->Get(i).output()) defines = defines || taken.count(o) > 0;
    if (defines) nodes->DeleteSubrange(i, 1);
  }
  for (const auto& r : residuals) *g.add_input() = typed_value_info(r.name, r.facts);
  prune(g);
  return residuals;
}

std::unordered_set<std::string> hoist_inner_stacking_loops(const onnx::GraphProto& g,
                                                           const std::unordered_set<std::string>& primal_inputs,
                                                           onnx::GraphProto& forward_body) {
  std::unordered_set<std::string> hoisted;
  std::unordered_map<std::string, int> producer;  // in forward_body
  for (int i = 0; i < forward_body.node_size(); ++i)
    for (const auto& o : forward_body.node(i).output())
      if (!o.empty()) producer[o] = i;
  std::unordered_set<std::string> available;  // values forward_body has (inputs, initializers)
  for (const auto& vi : forward_body.input()) available.insert(vi.name());
  for (const auto& t : forward_body.initializer()) available.insert(t.name());
  std::unordered_map<std::string, const onnx::NodeProto*> g_constants;
  for (const auto& n : g.node())
    if (n.op_type() == "Constant" && n.output_size() == 1) g_constants[n.output(0)] = &n;
  std::unordered_set<int> replaced;
  for (const auto& h : g.node()) {
    if (h.op_type() != "Loop" || !is_default_domain(h)) continue;
    // The forward loop whose outputs h took: each of them must be one of h's.
    int d = -1;
    for (const auto& o : h.output())
      if (auto it = producer.find(o); d < 0 && it != producer.end()) d = it->second;
    if (d < 0 || replaced.count(d) || forward_body.node(d).op_type() != "Loop") continue;
    const std::unordered_set<std::string> outs(h.output().begin(), h.output().end());
    bool covers = true;
    for (const auto& o : forward_body.node(d).output()) covers = covers && (o.empty() || outs.count(o));
    // h must read only what forward_body defines before d (or its inputs).
    auto defined_before_d = [&](const std::string& r) {
      const auto it = producer.find(r);
      return r.empty() || available.count(r) || (it != producer.end() && it->second < d);
    };
    bool reads_ok = true;
    for (const auto& r : h.input()) reads_ok = reads_ok && defined_before_d(r);
    for (const auto& r : outer_scope_reads(h)) reads_ok = reads_ok && defined_before_d(r);
    if (!covers || !reads_ok) continue;
    *forward_body.mutable_node(d) = h;
    replaced.insert(d);
    for (const auto& o : h.output())
      if (!o.empty()) {
        producer[o] = d;
        hoisted.insert(o);
      }
  }
  if (hoisted.empty()) return hoisted;
  // The primal nodes of g computing from a hoisted loop's outputs (a tanh's derivative 1 - y^2
  // of the stacked y): after it in forward_body, so their results are residuals too.
  std::unordered_set<std::string> others;
  for (const auto& vi : g.input())
    if (!primal_inputs.count(vi.name())) others.insert(vi.name());
  const std::unordered_set<std::string> linear = values_depending_on(g, others);
  for (const auto& n : g.node()) {
    if (has_subgraphs(n) || n.op_type() == "Constant") continue;
    bool reads_hoisted = false, ok = true;
    for (const auto& o : n.output()) ok = ok && !linear.count(o) && !producer.count(o);
    for (const auto& r : n.input()) {
      if (r.empty() || available.count(r) || producer.count(r)) {
        reads_hoisted = reads_hoisted || hoisted.count(r) > 0;
        continue;
      }
      ok = ok && g_constants.count(r) > 0;
    }
    if (!ok || !reads_hoisted) continue;
    for (const auto& r : n.input())
      if (!r.empty() && !available.count(r) && !producer.count(r)) {
        *forward_body.add_node() = *g_constants.at(r);
        producer[r] = forward_body.node_size() - 1;
      }
    *forward_body.add_node() = n;
    for (const auto& o : n.output())
      if (!o.empty()) {
        producer[o] = forward_body.node_size() - 1;
        hoisted.insert(o);
      }
  }
  return hoisted;
}

namespace {

// Ops whose output element i depends on the inputs' elements i alone (numpy broadcasting), so
// they give the same values on stacks as per iteration.
bool elementwise(const onnx::NodeProto& n) {
  static const std::unordered_set<std::string> kOps = {
      "Neg",      "Abs",  "Exp", "Log",      "Tanh",     "Sigmoid",     "Relu",      "Sqrt", "Reciprocal",
      "Sin",      "Cos",  "Erf", "Softplus", "Softsign", "HardSigmoid", "LeakyRelu", "Elu",  "Selu",
      "Identity", "Cast", "Add", "Sub",      "Mul",      "Div",         "Pow",       "Max",  "Min",
      "Where",    "Not",  "And", "Or",       "Equal",    "Less",        "Greater"};
  return (n.domain().empty() || n.domain() == "ai.onnx") && n.output_size() == 1 && kOps.count(n.op_type()) > 0;
}

}  // namespace

DerivedResiduals derivable_residuals(const onnx::GraphProto& forward_body, const std::vector<LoopResidual>& residuals,
                                     const std::unordered_map<std::string, int64_t>& invariant) {
  DerivedResiduals out;
  out.derived.assign(residuals.size(), 0);
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < forward_body.node_size(); ++i)
    for (const auto& o : forward_body.node(i).output()) producer[o] = i;
  std::unordered_map<std::string, size_t> residual_index;
  for (size_t q = 0; q < residuals.size(); ++q) residual_index[residuals[q].name] = q;
  // What a value is when computed from stacks: varying (a stack) or invariant, of a rank per
  // iteration; or not computable.
  struct Kind {
    bool ok = false;
    bool varying = false;
    int64_t rank = -1;
  };
  std::unordered_map<std::string, Kind> memo;
  std::vector<char> used(static_cast<size_t>(forward_body.node_size()), 0);
  std::function<Kind(const std::string&, bool)> kind = [&](const std::string& v, bool top) -> Kind {
    if (auto it = invariant.find(v); it != invariant.end()) return Kind{it->second >= 0, false, it->second};
    if (auto q = residual_index.find(v); q != residual_index.end() && !top && !out.derived[q->second]) {
      const Facts& f = residuals[q->second].facts;
      return Kind{f.has_shape, true, f.rank()};
    }
    if (auto it = memo.find(v); it != memo.end()) return it->second;
    memo[v] = Kind{};  // (while deciding)
    const auto p = producer.find(v);
    if (p == producer.end()) return Kind{};
    const onnx::NodeProto& n = forward_body.node(p->second);
    Kind k;
    if (n.op_type() == "Constant" && n.domain().empty()) {
      for (const auto& a : n.attribute())
        if (a.name() == "value" && a.has_t()) k = Kind{true, false, a.t().dims_size()};
    } else if (elementwise(n)) {
      // Varying operands must have the output's rank and invariant ones no more than it, so
      // broadcasting against a stack (one more leading axis) lines up as it did per iteration.
      k = Kind{true, false, -1};
      int64_t most_invariant = -1;
      for (const auto& in : n.input()) {
        if (in.empty()) continue;
        const Kind o = kind(in, false);
        if (!o.ok) return Kind{};
        if (o.varying) {
          if (k.varying && o.rank != k.rank) return Kind{};
          k.varying = true;
          k.rank = o.rank;
        } else {
          most_invariant = std::max(most_invariant, o.rank);
        }
      }
      // (All-invariant values are left to the loop: nothing to gain.)
      if (!k.varying || most_invariant > k.rank) return Kind{};
    }
    if (k.ok) used[static_cast<size_t>(p->second)] = 1;
    return memo[v] = k;
  };
  for (size_t q = 0; q < residuals.size(); ++q) {
    const auto memo_before = memo;
    const std::vector<char> used_before = used;
    const Kind k = kind(residuals[q].name, true);
    if (k.ok && k.varying) {
      out.derived[q] = 1;
    } else {
      memo = memo_before;
      used = used_before;
    }
  }
  // A residual computed per iteration from one value the body computes anyway (a tanh's
  // derivative 1 - y^2 from y, which the state carries on): that value is stacked instead (the
  // same size: the chain's other operands are scalars and its ops keep the type) and the
  // residual derived from it.
  std::unordered_map<std::string, int> readers;
  for (const auto& n : forward_body.node())
    for (const auto& in : n.input()) ++readers[in];
  for (const auto& o : forward_body.output()) ++readers[o.name()];
  std::unordered_set<std::string> body_inputs;
  for (const auto& vi : forward_body.input()) body_inputs.insert(vi.name());
  static const std::unordered_set<std::string> kSameType = {"Neg",  "Abs",        "Exp", "Log", "Tanh", "Sigmoid",
                                                            "Sqrt", "Reciprocal", "Add", "Sub", "Mul",  "Div"};
  for (size_t q = 0; q < residuals.size(); ++q) {
    if (out.derived[q] || !residuals[q].facts.has_shape) continue;
    const auto memo_before = memo;  // (the walk's failed lookups must not stay)
    const std::vector<char> used_before = used;
    std::string v = residuals[q].name, source;
    for (int steps = 0; steps < 8 && source.empty(); ++steps) {
      const auto p = producer.find(v);
      if (p == producer.end()) break;
      const onnx::NodeProto& n = forward_body.node(p->second);
      if (!(n.domain().empty() || n.domain() == "ai.onnx") || n.output_size() != 1 || !kSameType.count(n.op_type()))
        break;
      std::string unknown;
      bool fits = true;
      for (const auto& in : n.input()) {
        const Kind k = kind(in, false);
        if (k.ok && !k.varying && k.rank == 0) continue;
        if (k.ok || (!unknown.empty() && unknown != in)) fits = false;
        unknown = in;
      }
      if (!fits || unknown.empty() || body_inputs.count(unknown) || residual_index.count(unknown)) break;
      int own_reads = 0;
      for (const auto& in : n.input()) own_reads += in == unknown ? 1 : 0;
      if (readers[unknown] > own_reads)
        source = unknown;  // (computed anyway: read beyond this chain)
      else
        v = unknown;
    }
    memo = memo_before;
    if (source.empty()) {
      used = used_before;
      continue;
    }
    const Facts& f = residuals[q].facts;
    memo[source] = Kind{true, true, f.rank()};
    if (kind(residuals[q].name, true).varying) {
      out.derived[q] = 1;
      if (std::none_of(out.stacked.begin(), out.stacked.end(), [&](const auto& r) { return r.name == source; }))
        out.stacked.push_back(LoopResidual{source, f});
    } else {
      memo = memo_before;
      used = used_before;
    }
  }
  for (int i = 0; i < forward_body.node_size(); ++i)
    if (used[static_cast<size_t>(i)]) out.nodes.push_back(&forward_body.node(i));
  return out;
}

}  // namespace onnax
