#include "ir/control_flow_outputs.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ir/graph_edit.h"

namespace onnax {
namespace {

// What node `n` reads: its inputs and what its subgraphs read from enclosing scopes.
std::vector<std::string> reads_of(const onnx::NodeProto& n) {
  std::vector<std::string> r(n.input().begin(), n.input().end());
  if (has_subgraphs(n))
    for (auto& o : outer_scope_reads(n)) r.push_back(std::move(o));
  return r;
}

struct LoopNeeds {
  std::vector<char> keep;                // per output of the loop: kept (the used ones, the states they need)
  std::unordered_set<std::string> body;  // the body's values the kept outputs need
};
// Per Loop node and pattern of used outputs: a nested loop is asked again in each round of its
// enclosing loop's fixed point, mostly with the same pattern, and would otherwise cost
// rounds^depth.
using NeedsMemo = std::unordered_map<const onnx::NodeProto*, std::unordered_map<std::string, LoopNeeds>>;

std::unordered_set<std::string> needed_values(const onnx::GraphProto& g, std::unordered_set<std::string> roots,
                                              NeedsMemo& memo);

// A well-formed Loop's body (nullptr otherwise).
const onnx::GraphProto* loop_body(const onnx::NodeProto& n) {
  const onnx::GraphProto* body = graph_attribute(n, "body");
  const int states = n.input_size() - 2;
  if (!body || states < 0 || n.output_size() < states || body->input_size() != n.input_size() ||
      body->output_size() != 1 + n.output_size())
    return nullptr;
  return body;
}

// What Loop `n` needs to give the outputs `used` marks: a state stays when a needed output reaches
// back to it (in any later iteration), a fixed point, since keeping a state makes its next value
// needed.
const LoopNeeds& loop_needs(const onnx::NodeProto& n, const onnx::GraphProto& body, const std::vector<char>& used,
                            NeedsMemo& memo) {
  const std::string pattern(used.begin(), used.end());
  if (auto node = memo.find(&n); node != memo.end())
    if (auto hit = node->second.find(pattern); hit != node->second.end()) return hit->second;
  const int states = n.input_size() - 2;
  LoopNeeds r{std::vector<char>(used.begin(), used.end()), {}};
  for (bool changed = true; changed;) {
    changed = false;
    std::unordered_set<std::string> roots = {body.output(0).name()};
    for (int o = 0; o < n.output_size(); ++o)
      if (r.keep[static_cast<size_t>(o)]) roots.insert(body.output(1 + o).name());
    r.body = needed_values(body, std::move(roots), memo);
    for (int k = 0; k < states; ++k)
      if (!r.keep[static_cast<size_t>(k)] && r.body.count(body.input(2 + k).name())) {
        r.keep[static_cast<size_t>(k)] = 1;
        changed = true;
      }
  }
  return memo[&n][pattern] = std::move(r);
}

// The values of `g` that `roots` need, through its nodes: a Loop's kept states and what its
// body needs from outside, any other node's inputs and subgraph reads.
std::unordered_set<std::string> needed_values(const onnx::GraphProto& g, std::unordered_set<std::string> roots,
                                              NeedsMemo& memo) {
  for (int i = g.node_size() - 1; i >= 0; --i) {
    const auto& n = g.node(i);
    std::vector<char> used(static_cast<size_t>(n.output_size()), 0);
    bool any = false;
    for (int o = 0; o < n.output_size(); ++o) {
      used[static_cast<size_t>(o)] = !n.output(o).empty() && roots.count(n.output(o)) ? 1 : 0;
      any = any || used[static_cast<size_t>(o)];
    }
    if (!any) continue;
    const onnx::GraphProto* body = n.op_type() == "Loop" && is_default_domain(n) ? loop_body(n) : nullptr;
    if (!body) {
      for (auto& r : reads_of(n)) roots.insert(std::move(r));
      continue;
    }
    const LoopNeeds& needs = loop_needs(n, *body, used, memo);
    roots.insert(n.input(0));
    roots.insert(n.input(1));
    for (int k = 0; k + 2 < n.input_size(); ++k)
      if (needs.keep[static_cast<size_t>(k)]) roots.insert(n.input(2 + k));
    // (What the body reads from outside: the needed names it does not define.)
    for (const auto& r : outer_scope_reads(n))
      if (needs.body.count(r)) roots.insert(r);
  }
  return roots;
}

// Loop `n` cut down to the outputs `used` marks and the states those need.
void shrink_loop(onnx::NodeProto& n, const std::vector<char>& used) {
  if (!loop_body(n)) return;
  onnx::GraphProto* body = nullptr;
  for (auto& a : *n.mutable_attribute())
    if (a.name() == "body") body = a.mutable_g();
  const int states = n.input_size() - 2;
  NeedsMemo memo;
  const std::vector<char> keep = loop_needs(n, *body, used, memo).keep;
  bool all = true;
  for (char k : keep) all = all && k;
  if (!all) {
    onnx::NodeProto kept_node;
    onnx::GraphProto kept_body;
    for (int i = 0; i < 2; ++i) {
      kept_node.add_input(n.input(i));
      *kept_body.add_input() = body->input(i);
    }
    *kept_body.add_output() = body->output(0);
    for (int k = 0; k < states; ++k)
      if (keep[static_cast<size_t>(k)]) {
        kept_node.add_input(n.input(2 + k));
        *kept_body.add_input() = body->input(2 + k);
      }
    for (int o = 0; o < n.output_size(); ++o)
      if (keep[static_cast<size_t>(o)]) {
        kept_node.add_output(n.output(o));
        *kept_body.add_output() = body->output(1 + o);
      }
    n.mutable_input()->Swap(kept_node.mutable_input());
    n.mutable_output()->Swap(kept_node.mutable_output());
    body->mutable_input()->Swap(kept_body.mutable_input());
    body->mutable_output()->Swap(kept_body.mutable_output());
  }
  drop_unread_control_flow_outputs(*body);
}

// If `n` cut down to the outputs `used` marks (its branches give only those).
void shrink_if(onnx::NodeProto& n, const std::vector<char>& used) {
  std::vector<onnx::GraphProto*> branches;
  for (auto& a : *n.mutable_attribute())
    if ((a.name() == "then_branch" || a.name() == "else_branch") && a.has_g()) branches.push_back(a.mutable_g());
  bool fits = branches.size() == 2;
  for (const auto* br : branches) fits = fits && br->output_size() == n.output_size();
  if (!fits) return;
  if (std::find(used.begin(), used.end(), 0) != used.end()) {
    onnx::NodeProto kept_node;
    for (int o = 0; o < n.output_size(); ++o)
      if (used[static_cast<size_t>(o)]) kept_node.add_output(n.output(o));
    n.mutable_output()->Swap(kept_node.mutable_output());
    for (auto* br : branches) {
      onnx::GraphProto kept;
      for (int o = 0; o < br->output_size(); ++o)
        if (used[static_cast<size_t>(o)]) *kept.add_output() = br->output(o);
      br->mutable_output()->Swap(kept.mutable_output());
    }
  }
  for (auto* br : branches) drop_unread_control_flow_outputs(*br);
}

}  // namespace

void drop_unread_control_flow_outputs(onnx::GraphProto& g) {
  std::unordered_map<std::string, int> readers;
  for (const auto& o : g.output()) ++readers[o.name()];
  for (const auto& n : g.node())
    for (const auto& r : reads_of(n)) ++readers[r];
  auto read = [&](const std::string& v) {
    const auto it = readers.find(v);
    return !v.empty() && it != readers.end() && it->second > 0;
  };
  // From the last node back: a node's readers have been cut down before it is looked at.
  for (int i = g.node_size() - 1; i >= 0; --i) {
    onnx::NodeProto& n = *g.mutable_node(i);
    std::vector<char> used(static_cast<size_t>(n.output_size()), 0);
    bool any = false;
    for (int o = 0; o < n.output_size(); ++o) {
      used[static_cast<size_t>(o)] = read(n.output(o)) ? 1 : 0;
      any = any || used[static_cast<size_t>(o)];
    }
    const std::vector<std::string> before = reads_of(n);
    if (!any) {  // (prune removes it below)
      for (const auto& r : before) --readers[r];
      continue;
    }
    if (!has_subgraphs(n)) continue;
    if (n.op_type() == "Loop" && is_default_domain(n)) {
      shrink_loop(n, used);
    } else if (n.op_type() == "If" && is_default_domain(n)) {
      shrink_if(n, used);
    } else {
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_g()) drop_unread_control_flow_outputs(*a.mutable_g());
        for (auto& sg : *a.mutable_graphs()) drop_unread_control_flow_outputs(sg);
      }
    }
    for (const auto& r : before) --readers[r];
    for (const auto& r : reads_of(n)) ++readers[r];
  }
  prune(g);
}

bool passes_condition_along(const onnx::GraphProto& body) {
  if (body.input_size() < 2 || body.output_size() < 1) return false;
  const std::string& in = body.input(1).name();
  const std::string& out = body.output(0).name();
  bool passed_along = out == in;
  for (const auto& n : body.node())
    if (n.output_size() == 1 && n.output(0) == out)
      passed_along = n.op_type() == "Identity" && n.input_size() == 1 && n.input(0) == in;
  return passed_along;
}

}  // namespace onnax
