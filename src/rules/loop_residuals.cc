#include "rules/loop_residuals.h"

#include "rules/derivative.h"
#include "transforms/prepare.h"
#include "transforms/subgraph.h"

namespace onnax {

std::vector<LoopResidual> take_loop_residuals(onnx::GraphProto& g, const std::unordered_set<std::string>& primal_inputs,
                                              const std::unordered_set<std::string>& forward_defined,
                                              const Prepared& facts) {
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
  std::unordered_set<std::string> wanted;
  for (int i = 0; i < g.node_size(); ++i)
    if (!primal_node[static_cast<size_t>(i)])
      for (const auto& in : g.node(i).input()) wanted.insert(in);
  for (const auto& o : g.output()) wanted.insert(o.name());
  std::unordered_set<std::string> read;  // by any node or output
  for (const auto& n : g.node())
    for (const auto& in : n.input()) read.insert(in);
  for (const auto& o : g.output()) read.insert(o.name());
  std::unordered_set<std::string> taken;
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    if (!primal_node[static_cast<size_t>(i)] || n.op_type() == "Constant" || n.input_size() == 0) continue;
    // A node's outputs are taken together (its definition goes): each one read must be takeable.
    bool any = false, all = true;
    for (const auto& o : n.output()) {
      if (o.empty() || !read.count(o)) continue;
      const Facts& f = facts.fact(o);
      const bool takeable =
          forward_defined.count(o) && !primal_inputs.count(o) && differentiable_dtype(f.dtype) && f.has_shape;
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

}  // namespace onnax
