#include "transforms/ragged_loops.h"

#include <onnx/onnx_pb.h>

#include "notice.h"
#include "rules/batching.h"
#include "transforms/subgraph.h"

namespace onnax {
namespace {

bool is_default_domain_op(const onnx::NodeProto& n, const char* type) {
  return n.op_type() == type && is_default_domain(n);
}

// The names a node reads: its inputs and what its subgraphs read from enclosing scopes.
std::vector<std::string> reads_of(const onnx::NodeProto& n) {
  std::vector<std::string> out(n.input().begin(), n.input().end());
  if (has_subgraphs(n))
    for (auto& r : outer_scope_reads(n)) out.push_back(std::move(r));
  return out;
}

// Whether Loop `n` stacks values that may have a different length per example: a scan output is
// used and examples may stop at different iterations (`batched`: the values carrying the batch).
bool stacks_ragged(const onnx::NodeProto& n, const std::unordered_set<std::string>& batched,
                   const std::unordered_set<std::string>& used) {
  const onnx::GraphProto* body = graph_attribute(n, "body");
  const int states = n.input_size() - 2;
  if (!body || states < 0 || body->input_size() != states + 2 || body->output_size() != n.output_size() + 1)
    return false;
  bool stacks = false;
  for (int j = states; j < n.output_size(); ++j) stacks = stacks || (!n.output(j).empty() && used.count(n.output(j)));
  if (!stacks) return false;
  auto is_batched = [&](int i) { return i < n.input_size() && !n.input(i).empty() && batched.count(n.input(i)); };
  if (is_batched(0) || is_batched(1)) return true;
  std::vector<char> state_batched(static_cast<size_t>(states));
  for (int k = 0; k < states; ++k) state_batched[static_cast<size_t>(k)] = is_batched(2 + k) ? 1 : 0;
  std::unordered_set<std::string> batched_reads;
  for (const auto& r : outer_scope_reads(n))
    if (batched.count(r)) batched_reads.insert(r);
  return loop_batched_state(*body, state_batched, batched_reads)[0] != 0;
}

// The first node from `start` on that is such a Loop, or -1. Batched values as vmap's rules make
// them: whatever is computed from a batched value, except shapes and sizes (the same for every
// example; a ragged stack's is not, which is why everything computed from the Loop goes with it).
int first_ragged_loop(const onnx::GraphProto& g, int start, std::unordered_set<std::string> batched) {
  std::unordered_set<std::string> used;
  for (const auto& n : g.node())
    for (auto& r : reads_of(n)) used.insert(std::move(r));
  for (const auto& o : g.output()) used.insert(o.name());
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    bool any = false;
    for (const auto& r : reads_of(n)) any = any || batched.count(r) > 0;
    if (!any) continue;
    if (i >= start && is_default_domain_op(n, "Loop") && stacks_ragged(n, batched, used)) return i;
    if (is_default_domain_op(n, "Shape") || is_default_domain_op(n, "Size")) continue;
    for (const auto& o : n.output())
      if (!o.empty()) batched.insert(o);
  }
  return -1;
}

}  // namespace

std::unordered_set<std::string> wrap_ragged_loops(Prepared& p, const std::unordered_set<std::string>& batched_inputs) {
  std::unordered_set<std::string> wrappers;
  for (int start = 0;;) {
    const int root = first_ragged_loop(*p.graph, start, batched_inputs);
    if (root < 0) break;
    start = root + 1;
    const onnx::GraphProto& g = *p.graph;
    // The Loop and every node computed from it, in order.
    std::vector<int> region{root};
    std::unordered_set<std::string> defined;
    for (const auto& o : g.node(root).output()) defined.insert(o);
    for (int j = root + 1; j < g.node_size(); ++j) {
      bool reads = false;
      for (const auto& r : reads_of(g.node(j))) reads = reads || defined.count(r) > 0;
      if (!reads) continue;
      region.push_back(j);
      for (const auto& o : g.node(j).output()) defined.insert(o);
    }
    std::vector<std::string> results;  // what leaves the region: graph outputs only, by construction
    for (const auto& o : g.output())
      if (defined.count(o.name())) results.push_back(o.name());
    if (results.empty()) continue;  // (nothing reads it)

    onnx::GraphProto branch;
    branch.set_name(p.value_names.fresh(g.node(root).output(0) + "_per_example"));
    for (int j : region) *branch.add_node() = g.node(j);
    for (const auto& r : results) *branch.add_output() = typed_value_info(r, p.fact(r));
    // Fresh names inside both branches: the If's outputs take the region's results' names.
    onnx::GraphProto other = branch;
    rename_definitions(branch, p.value_names, p.node_names);
    rename_definitions(other, p.value_names, p.node_names);
    other.set_name(p.value_names.fresh(branch.name() + "_unused"));

    onnx::NodeProto truth = make_node("Constant", {}, p.value_names.fresh("always_true"));
    truth.set_name(p.node_names.fresh(truth.output(0)));
    auto* value = truth.add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    value->mutable_t()->set_data_type(onnx::TensorProto::BOOL);
    value->mutable_t()->add_int32_data(1);
    onnx::NodeProto wrapper;
    wrapper.set_op_type("If");
    wrapper.set_name(p.node_names.fresh(branch.name()));
    wrappers.insert(wrapper.name());
    wrapper.add_input(truth.output(0));
    for (const auto& r : results) wrapper.add_output(r);
    for (auto [name, graph] : {std::pair{"then_branch", &branch}, std::pair{"else_branch", &other}}) {
      auto* a = wrapper.add_attribute();
      a->set_name(name);
      a->set_type(onnx::AttributeProto::GRAPH);
      *a->mutable_g() = std::move(*graph);
    }
    const std::string loop_name = g.node(root).name().empty() ? g.node(root).output(0) : g.node(root).name();
    notice("vmap: Loop '" + loop_name +
           "' may run a different number of iterations per example and stacks per-iteration values; it and the " +
           std::to_string(region.size() - 1) +
           " nodes computed from it run example by example (a per-example Scan), so each example's stacks keep "
           "their own length");

    // The wrapper goes where the region's last node was: everything the region reads from
    // outside is defined by then, and nothing outside reads the region.
    onnx::GraphProto& mg = mutable_graph(p);
    std::vector<char> in_region(static_cast<size_t>(mg.node_size()), 0);
    for (int j : region) in_region[static_cast<size_t>(j)] = 1;
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    for (int j = 0; j < mg.node_size(); ++j) {
      if (!in_region[static_cast<size_t>(j)]) {
        *nodes.Add() = std::move(*mg.mutable_node(j));
        continue;
      }
      if (j != region.back()) continue;
      *nodes.Add() = std::move(truth);
      *nodes.Add() = std::move(wrapper);
    }
    mg.mutable_node()->Swap(&nodes);
    start = root;  // (the nodes before the Loop did not move)
  }
  if (!wrappers.empty()) reindex(p);
  return wrappers;
}

}  // namespace onnax
