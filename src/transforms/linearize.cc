// linearize, as JAX's: the JVP model split in two. The primal model computes the outputs and
// the residuals (the primal values the derivative reads); the linear model maps the residuals
// and input tangents to output tangents, with nothing of the primal computation left in it. A
// caller evaluates the primal model once and the linear model for as many tangents as it likes
// (Jacobian-vector products at one point, a Gauss-Newton or Krylov solver's inner loop).
//
// The split follows the dependence on the tangent inputs (values_depending_on, which judges a
// loop's outputs one by one): nodes reading a tangent go to the linear model, the rest to the
// primal model. A JVP loop, which carries primal and tangent state side by side, goes to both:
// the primal model keeps its primal states, the linear model runs it whole from the residuals
// its initial states are, and its primal outputs there are renamed apart and dropped.
#include <onnax/onnax.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "diagnostics/error.h"
#include "ir/control_flow_outputs.h"
#include "ir/graph_edit.h"
#include "transforms/prepare.h"
#include "transforms/subgraph.h"
#include "transforms/tidy.h"

namespace onnax {
namespace {

std::vector<std::string> reads_of(const onnx::NodeProto& n) {
  std::vector<std::string> r;
  for (const auto& in : n.input())
    if (!in.empty()) r.push_back(in);
  if (has_subgraphs(n))
    for (auto& o : outer_scope_reads(n)) r.push_back(std::move(o));
  return r;
}

}  // namespace

Linearized linearize(const onnx::ModelProto& model, const Selection& selection) {
  const onnx::ModelProto j = jvp(model, selection);
  const onnx::GraphProto& g = j.graph();
  std::unordered_set<std::string> source_inputs;
  for (const auto& vi : model.graph().input()) source_inputs.insert(vi.name());
  std::unordered_set<std::string> seeds;  // the tangent inputs jvp added
  for (const auto& vi : g.input())
    if (!source_inputs.count(vi.name())) seeds.insert(vi.name());
  const int n_primal = model.graph().output_size();
  const std::unordered_set<std::string> linear_values = values_depending_on(g, seeds);

  // What the linear part reads of the primal part: residuals, unless it can hold them itself
  // (initializers, constants).
  std::unordered_map<std::string, const onnx::NodeProto*> constant_node;
  std::unordered_set<std::string> initializers;
  for (const auto& t : g.initializer()) initializers.insert(t.name());
  for (const auto& n : g.node())
    if (n.op_type() == "Constant" && n.input_size() == 0 && n.output_size() == 1 && !has_subgraphs(n))
      constant_node[n.output(0)] = &n;
  std::vector<char> linear_node(static_cast<size_t>(g.node_size()), 0);
  std::vector<std::string> residuals;
  std::unordered_set<std::string> seen, copied_constants, copied_initializers;
  auto primal_read = [&](const std::string& r) {
    if (linear_values.count(r) || seeds.count(r) || !seen.insert(r).second) return;
    if (initializers.count(r) && !source_inputs.count(r))
      copied_initializers.insert(r);
    else if (constant_node.count(r))
      copied_constants.insert(r);
    else
      residuals.push_back(r);
  };
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    bool linear = false;
    for (const auto& o : n.output()) linear = linear || (!o.empty() && linear_values.count(o));
    if (!linear) continue;
    linear_node[static_cast<size_t>(i)] = 1;
    for (const auto& r : reads_of(n)) primal_read(r);
  }
  // (A tangent that does not depend on the input tangents, a zero one, is a residual the linear
  // model passes on.)
  for (int o = n_primal; o < g.output_size(); ++o) primal_read(g.output(o).name());

  Prepared facts = prepare(j, "linearize");
  Linearized out;
  out.residuals = residuals;

  // The primal model: the source's inputs, its outputs, then the residuals.
  {
    onnx::ModelProto& a = out.primal;
    copy_model_fields(j, a);
    onnx::GraphProto& ag = *a.mutable_graph();
    ag = g;
    ag.clear_input();
    for (const auto& vi : g.input())
      if (!seeds.count(vi.name())) *ag.add_input() = vi;
    ag.clear_output();
    for (int o = 0; o < n_primal; ++o) *ag.add_output() = g.output(o);
    std::unordered_set<std::string> given;  // (a residual that is an output is given once)
    for (const auto& o : ag.output()) given.insert(o.name());
    for (const auto& r : residuals)
      if (given.insert(r).second) *ag.add_output() = typed_value_info(r, facts.fact(r));
    drop_unread_control_flow_outputs(ag);
    for (const auto& r : names_read(ag))
      if (seeds.count(r))
        diag::fail(Error::Kind::kUnsupported,
                   "linearize: the primal part of the derivative still reads the tangent '" + r +
                       "' after the split, so it cannot be computed without tangents. Fix: use jvp, which "
                       "computes both together");
    tidy(a);
  }
  // The linear model: the residuals and the tangent inputs in, the output tangents out.
  {
    onnx::ModelProto& b = out.linear;
    copy_model_fields(j, b);
    onnx::GraphProto& bg = *b.mutable_graph();
    bg.set_name(g.name() + "_linear");
    for (const auto& r : residuals) *bg.add_input() = typed_value_info(r, facts.fact(r));
    for (const auto& vi : g.input())
      if (seeds.count(vi.name())) *bg.add_input() = vi;
    for (const auto& t : g.initializer())
      if (copied_initializers.count(t.name())) *bg.add_initializer() = t;
    const std::unordered_set<std::string> residual_set(residuals.begin(), residuals.end());
    NameScope scope;
    for (const auto& n : g.node())
      for (const auto& o : n.output()) scope.reserve(o);
    for (const auto& vi : g.input()) scope.reserve(vi.name());
    for (int i = 0; i < g.node_size(); ++i) {
      const auto& n = g.node(i);
      if (n.output_size() == 1 && copied_constants.count(n.output(0))) {
        *bg.add_node() = n;
        continue;
      }
      if (!linear_node[static_cast<size_t>(i)]) continue;
      onnx::NodeProto& copy = *bg.add_node() = n;
      // (A loop's primal outputs are residuals here, given as inputs: its own copies are
      // renamed apart, unread, and dropped below.)
      for (auto& o : *copy.mutable_output())
        if (residual_set.count(o)) o = scope.fresh(o + "_recomputed");
    }
    for (int o = n_primal; o < g.output_size(); ++o) *bg.add_output() = g.output(o);
    for (const auto& vi : g.value_info())
      if (linear_values.count(vi.name())) *bg.add_value_info() = vi;
    drop_unread_control_flow_outputs(bg);
    tidy(b);
  }
  return out;
}

std::string linearize_serialized(const std::string& model, const Selection& selection, bool primal) {
  Linearized parts = linearize(parse_model(model), selection);
  onnx::ModelProto& part = primal ? parts.primal : parts.linear;
  std::string out;
  if (!part.SerializeToString(&out))
    diag::fail(Error::Kind::kUnsupported,
               "linearize: the result exceeds protobuf's 2 GB limit and cannot be serialized as one message. Fix: "
               "use the onnax command line, which writes external data files");
  return out;
}

}  // namespace onnax
