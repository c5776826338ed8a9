#include "ir/graph_edit.h"

#include <algorithm>
#include <functional>
#include <queue>

#include "diagnostics/error.h"

namespace onnax {
namespace {

std::string node_label(const onnx::NodeProto& n) {
  if (!n.name().empty()) return "node '" + n.name() + "'";
  return "the node producing '" + (n.output_size() ? n.output(0) : std::string()) + "'";
}

void collect_reads(const onnx::GraphProto& g, std::unordered_set<std::string>& defined,
                   std::vector<std::string>& reads) {
  std::unordered_set<std::string> local = defined;
  for (const auto& vi : g.input()) local.insert(vi.name());
  for (const auto& t : g.initializer()) local.insert(t.name());
  for (const auto& s : g.sparse_initializer()) local.insert(s.values().name());
  for (const auto& n : g.node()) {
    for (const auto& in : n.input())
      if (!in.empty() && !local.count(in)) reads.push_back(in);
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_reads(a.g(), local, reads);
      for (const auto& sg : a.graphs()) collect_reads(sg, local, reads);
    }
    for (const auto& o : n.output()) local.insert(o);
  }
  for (const auto& o : g.output())
    if (!local.count(o.name())) reads.push_back(o.name());
}

void collect_outer_reads(const onnx::GraphProto& g, std::unordered_set<std::string> defined,
                         std::unordered_set<std::string>& seen, std::vector<std::string>& reads) {
  for (const auto& vi : g.input()) defined.insert(vi.name());
  for (const auto& t : g.initializer()) defined.insert(t.name());
  auto read = [&](const std::string& n) {
    if (!n.empty() && !defined.count(n) && seen.insert(n).second) reads.push_back(n);
  };
  for (const auto& n : g.node()) {
    for (const auto& in : n.input()) read(in);
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_outer_reads(a.g(), defined, seen, reads);
      for (const auto& sg : a.graphs()) collect_outer_reads(sg, defined, seen, reads);
    }
    for (const auto& o : n.output()) defined.insert(o);
  }
  for (const auto& o : g.output()) read(o.name());
}

// Applies `fn` to every graph nested in `n`'s attributes.
void for_each_subgraph(onnx::NodeProto& n, const std::function<void(onnx::GraphProto&)>& fn) {
  for (auto& a : *n.mutable_attribute()) {
    if (a.has_g()) fn(*a.mutable_g());
    for (auto& sg : *a.mutable_graphs()) fn(sg);
  }
}

}  // namespace

// Orders the graph's nodes topologically (stable: keeps the given order where it is valid),
// reporting cycles and inputs that nothing defines.
void sort_nodes(onnx::GraphProto& g) {
  std::unordered_set<std::string> available;
  for (const auto& vi : g.input()) available.insert(vi.name());
  for (const auto& t : g.initializer()) available.insert(t.name());
  for (const auto& s : g.sparse_initializer()) available.insert(s.values().name());
  const int n = g.node_size();
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < n; ++i)
    for (const auto& o : g.node(i).output())
      if (!o.empty()) {
        if (producer.count(o) || available.count(o))
          diag::fail(Error::Kind::kInvalidModel,
                     "invalid model: value '" + o + "' is defined more than once (" + node_label(g.node(i)) + ", op " +
                         g.node(i).op_type() +
                         "). Fix: give every node output a unique name (ONNX graphs are in SSA form)");
        producer[o] = i;
      }
  std::vector<std::vector<std::string>> deps(n);
  bool sorted = true;
  std::unordered_set<std::string> seen = available;
  for (int i = 0; i < n; ++i) {
    const auto& node = g.node(i);
    std::vector<std::string> reads(node.input().begin(), node.input().end());
    for (const auto& a : node.attribute()) {
      std::unordered_set<std::string> none;
      if (a.has_g()) collect_reads(a.g(), none, reads);
      for (const auto& sg : a.graphs()) collect_reads(sg, none, reads);
    }
    for (const auto& r : reads) {
      if (r.empty()) continue;
      if (!available.count(r) && !producer.count(r))
        diag::fail(Error::Kind::kInvalidModel,
                   "invalid model: " + node_label(node) + " (op " + node.op_type() + ") reads '" + r +
                       "', which no node, graph input or initializer defines. Fix: add '" + r +
                       "' as a graph input or initializer, or correct the node's input name");
      if (!seen.count(r)) sorted = false;
      deps[i].push_back(r);
    }
    for (const auto& o : node.output()) seen.insert(o);
  }
  for (const auto& o : g.output())
    if (!available.count(o.name()) && !producer.count(o.name()))
      diag::fail(Error::Kind::kInvalidModel, "invalid model: graph output '" + o.name() +
                                                 "' is not produced by any node, input or initializer. "
                                                 "Fix: remove the output or connect it to a value");
  if (sorted) return;
  // Kahn's algorithm, always taking the lowest-index ready node so the order is stable.
  std::vector<int> missing(n, 0);
  std::vector<std::vector<int>> users(n);
  for (int i = 0; i < n; ++i)
    for (const auto& r : deps[i]) {
      auto it = producer.find(r);
      if (it == producer.end()) continue;
      ++missing[i];
      users[it->second].push_back(i);
    }
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  for (int i = 0; i < n; ++i)
    if (!missing[i]) ready.push(i);
  std::vector<int> order;
  while (!ready.empty()) {
    int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int u : users[i])
      if (--missing[u] == 0) ready.push(u);
  }
  if (static_cast<int>(order.size()) != n) {
    for (int i = 0; i < n; ++i)
      if (missing[i])
        diag::fail(Error::Kind::kInvalidModel,
                   "invalid model: the graph has a cycle through " + node_label(g.node(i)) + " (op " +
                       g.node(i).op_type() + "). Fix: ONNX graphs must be acyclic; use Loop or Scan for recurrence");
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  nodes.Swap(g.mutable_node());
  for (int i : order) *g.add_node() = std::move(*nodes.Mutable(i));
}

void rename_subgraph_reads(onnx::NodeProto& n, const std::string& from, const std::string& to) {
  for (auto& a : *n.mutable_attribute()) {
    if (a.has_g()) rename_reads(*a.mutable_g(), from, to);
    for (auto& sg : *a.mutable_graphs()) rename_reads(sg, from, to);
  }
}

void rename_reads(onnx::GraphProto& g, const std::string& from, const std::string& to) {
  for (auto& n : *g.mutable_node()) {
    for (auto& in : *n.mutable_input())
      if (in == from) in = to;
    rename_subgraph_reads(n, from, to);
  }
  for (auto& o : *g.mutable_output())
    if (o.name() == from) o.set_name(to);
}

std::vector<std::string> outer_scope_reads(const onnx::NodeProto& node) {
  std::vector<std::string> reads;
  for (const auto& a : node.attribute()) {
    std::unordered_set<std::string> none;
    if (a.has_g()) collect_reads(a.g(), none, reads);
    for (const auto& sg : a.graphs()) collect_reads(sg, none, reads);
  }
  return reads;
}

const onnx::GraphProto* graph_attribute(const onnx::NodeProto& node, const char* name) {
  for (const auto& a : node.attribute())
    if (a.name() == name && a.has_g()) return &a.g();
  return nullptr;
}

std::vector<std::string> graph_outer_reads(const onnx::GraphProto& g) {
  std::unordered_set<std::string> seen;
  std::vector<std::string> reads;
  collect_outer_reads(g, {}, seen, reads);
  return reads;
}

void strip_known_values(onnx::GraphProto& g) {
  if (g.initializer_size() == 0) return;
  std::unordered_set<std::string> inputs;
  for (const auto& vi : g.input()) inputs.insert(vi.name());
  auto* inits = g.mutable_initializer();
  inits->erase(std::remove_if(inits->begin(), inits->end(),
                              [&](const onnx::TensorProto& t) { return inputs.count(t.name()) > 0; }),
               inits->end());
}

std::vector<char> outputs_depending_on(const onnx::GraphProto& g, const std::unordered_set<std::string>& active) {
  const std::unordered_set<std::string> live = values_depending_on(g, active);
  std::vector<char> out;
  for (const auto& o : g.output()) out.push_back(live.count(o.name()) ? 1 : 0);
  return out;
}

namespace {

// Per Loop node and pattern of live reads (its inputs, then its body's outer reads: '1' live),
// which outputs are live: a nested loop is asked again in each round of its enclosing loop's
// fixed point, mostly with the same pattern, and would otherwise cost rounds^depth.
using LiveMemo = std::unordered_map<const onnx::NodeProto*, std::unordered_map<std::string, std::vector<char>>>;

void depending_on(const onnx::GraphProto& g, std::unordered_set<std::string>& live, LiveMemo& memo);

bool any_outer_read_live(const onnx::NodeProto& n, const std::unordered_set<std::string>& live) {
  for (const auto& a : n.attribute()) {
    if (a.has_g())
      for (const auto& r : graph_outer_reads(a.g()))
        if (live.count(r)) return true;
    for (const auto& sg : a.graphs())
      for (const auto& r : graph_outer_reads(sg))
        if (live.count(r)) return true;
  }
  return false;
}

// Which outputs of Loop `n` (with `body`) depend on `live` values, output by output: a state's
// final value when its initial value or a live value the body reads from outside reaches it
// over any number of iterations (a fixed point over the states), a scan output likewise. So a
// loop computing a primal state and its tangent side by side (jvp's) keeps the primal state
// independent of the tangents. Empty when the loop is not well formed or its trip count or
// condition is live (then every output is).
std::vector<char> live_loop_outputs(const onnx::NodeProto& n, const onnx::GraphProto& body,
                                    const std::unordered_set<std::string>& live, LiveMemo& memo) {
  const int states = n.input_size() - 2;
  const int scans = n.output_size() - states;
  if (states < 0 || scans < 0 || body.input_size() != n.input_size() || body.output_size() != 1 + n.output_size())
    return {};
  for (int i = 0; i < 2; ++i)
    if (!n.input(i).empty() && live.count(n.input(i))) return {};
  const std::vector<std::string> outer = graph_outer_reads(body);
  std::string pattern;
  for (const auto& in : n.input()) pattern += live.count(in) ? '1' : '0';
  for (const auto& r : outer) pattern += live.count(r) ? '1' : '0';
  if (auto node = memo.find(&n); node != memo.end())
    if (auto hit = node->second.find(pattern); hit != node->second.end()) return hit->second;
  std::unordered_set<std::string> outer_live;
  for (const auto& r : outer)
    if (live.count(r)) outer_live.insert(r);
  std::vector<char> state_live(static_cast<size_t>(states), 0);
  for (int k = 0; k < states; ++k) state_live[static_cast<size_t>(k)] = live.count(n.input(2 + k)) ? 1 : 0;
  std::unordered_set<std::string> body_live;
  for (bool changed = true; changed;) {
    changed = false;
    body_live = outer_live;
    for (int k = 0; k < states; ++k)
      if (state_live[static_cast<size_t>(k)]) body_live.insert(body.input(2 + k).name());
    depending_on(body, body_live, memo);
    for (int k = 0; k < states; ++k)
      if (!state_live[static_cast<size_t>(k)] && body_live.count(body.output(1 + k).name())) {
        state_live[static_cast<size_t>(k)] = 1;
        changed = true;
      }
  }
  std::vector<char> out(static_cast<size_t>(n.output_size()), 0);
  for (int k = 0; k < states; ++k) out[static_cast<size_t>(k)] = state_live[static_cast<size_t>(k)];
  for (int j = 0; j < scans; ++j)
    out[static_cast<size_t>(states + j)] = body_live.count(body.output(1 + states + j).name()) ? 1 : 0;
  memo[&n][pattern] = out;
  return out;
}

void depending_on(const onnx::GraphProto& g, std::unordered_set<std::string>& live, LiveMemo& memo) {
  for (const auto& n : g.node()) {
    bool hit = false;
    for (const auto& in : n.input()) hit = hit || (!in.empty() && live.count(in));
    const bool subgraphs = has_subgraphs(n);
    if (!hit && subgraphs) hit = any_outer_read_live(n, live);
    if (!hit) continue;
    const onnx::GraphProto* body =
        subgraphs && n.op_type() == "Loop" && is_default_domain(n) ? graph_attribute(n, "body") : nullptr;
    const std::vector<char> per_output = body ? live_loop_outputs(n, *body, live, memo) : std::vector<char>{};
    for (int o = 0; o < n.output_size(); ++o)
      if (!n.output(o).empty() && (per_output.empty() || per_output[static_cast<size_t>(o)])) live.insert(n.output(o));
  }
}

}  // namespace

std::unordered_set<std::string> values_depending_on(const onnx::GraphProto& g,
                                                    const std::unordered_set<std::string>& active) {
  std::unordered_set<std::string> live = active;
  LiveMemo memo;
  depending_on(g, live, memo);
  return live;
}

void prune(onnx::GraphProto& g) {
  std::unordered_set<std::string> needed;
  for (const auto& o : g.output()) needed.insert(o.name());
  std::vector<char> keep(static_cast<size_t>(g.node_size()), 0);
  for (int i = g.node_size() - 1; i >= 0; --i) {
    const auto& n = g.node(i);
    bool used = false;
    for (const auto& o : n.output()) used = used || (!o.empty() && needed.count(o));
    if (!used) continue;
    keep[static_cast<size_t>(i)] = 1;
    for (const auto& in : n.input()) needed.insert(in);
    for (const auto& a : n.attribute()) {
      if (a.has_g())
        for (auto& r : graph_outer_reads(a.g())) needed.insert(r);
      for (const auto& sg : a.graphs())
        for (auto& r : graph_outer_reads(sg)) needed.insert(r);
    }
  }
  onnx::GraphProto kept;
  for (int i = 0; i < g.node_size(); ++i)
    if (keep[static_cast<size_t>(i)]) *kept.add_node() = std::move(*g.mutable_node(i));
  g.mutable_node()->Swap(kept.mutable_node());
  // value_info of dropped values would describe nothing.
  onnx::GraphProto infos;
  std::unordered_set<std::string> defined;
  for (const auto& n : g.node())
    for (const auto& o : n.output()) defined.insert(o);
  for (auto& vi : *g.mutable_value_info())
    if (defined.count(vi.name())) *infos.add_value_info() = std::move(vi);
  g.mutable_value_info()->Swap(infos.mutable_value_info());
  // Initializers nothing reads any more (runtimes warn about them).
  onnx::GraphProto inits;
  for (auto& t : *g.mutable_initializer())
    if (needed.count(t.name())) *inits.add_initializer() = std::move(t);
  g.mutable_initializer()->Swap(inits.mutable_initializer());
}

void rename_definitions(onnx::GraphProto& g, NameScope& scope, NameScope& node_scope) {
  std::unordered_map<std::string, std::string> map;
  std::function<void(onnx::GraphProto&)> define = [&](onnx::GraphProto& sg) {
    auto def = [&](const std::string& n) {
      if (!n.empty() && !map.count(n)) map.emplace(n, scope.fresh(n));
    };
    for (const auto& vi : sg.input()) def(vi.name());
    for (const auto& t : sg.initializer()) def(t.name());
    for (auto& n : *sg.mutable_node()) {
      for (const auto& o : n.output()) def(o);
      for_each_subgraph(n, define);
    }
  };
  define(g);
  auto re = [&](std::string* n) {
    if (auto it = map.find(*n); it != map.end()) *n = it->second;
  };
  std::function<void(onnx::GraphProto&)> apply = [&](onnx::GraphProto& sg) {
    for (auto& vi : *sg.mutable_input()) re(vi.mutable_name());
    for (auto& t : *sg.mutable_initializer()) re(t.mutable_name());
    for (auto& vi : *sg.mutable_output()) re(vi.mutable_name());
    for (auto& vi : *sg.mutable_value_info()) re(vi.mutable_name());
    for (auto& n : *sg.mutable_node()) {
      for (auto& in : *n.mutable_input()) re(&in);
      for (auto& o : *n.mutable_output()) re(&o);
      if (!n.name().empty()) n.set_name(node_scope.fresh(n.name(), &scope));
      for_each_subgraph(n, apply);
    }
  };
  apply(g);
}

void rename_reads(onnx::GraphProto& g, const std::unordered_map<std::string, std::string>& map) {
  if (map.empty()) return;
  for (auto& nd : *g.mutable_node()) {
    for (auto& i : *nd.mutable_input())
      if (auto it = map.find(i); it != map.end()) i = it->second;
    rename_outer_reads(nd, map);
  }
}

std::unordered_set<std::string> names_read(const onnx::GraphProto& g) {
  std::unordered_set<std::string> read;
  for (const auto& nd : g.node()) {
    for (const auto& i : nd.input()) read.insert(i);
    if (has_subgraphs(nd))
      for (auto& r : outer_scope_reads(nd)) read.insert(std::move(r));
  }
  return read;
}

void rename_outer_reads(onnx::NodeProto& node, const std::unordered_map<std::string, std::string>& map) {
  std::unordered_set<std::string> defined;  // anywhere inside: such a name is not an outer read
  std::function<void(onnx::GraphProto&)> define = [&](onnx::GraphProto& sg) {
    for (const auto& vi : sg.input()) defined.insert(vi.name());
    for (const auto& t : sg.initializer()) defined.insert(t.name());
    for (auto& n : *sg.mutable_node()) {
      for (const auto& o : n.output()) defined.insert(o);
      for_each_subgraph(n, define);
    }
  };
  for_each_subgraph(node, define);
  std::function<void(onnx::GraphProto&)> apply = [&](onnx::GraphProto& sg) {
    auto re = [&](std::string* n) {
      if (defined.count(*n)) return;
      if (auto it = map.find(*n); it != map.end()) *n = it->second;
    };
    for (auto& vi : *sg.mutable_output()) re(vi.mutable_name());
    for (auto& n : *sg.mutable_node()) {
      for (auto& in : *n.mutable_input()) re(&in);
      for_each_subgraph(n, apply);
    }
  };
  for_each_subgraph(node, apply);
}

onnx::NodeProto make_node(const char* type, std::vector<std::string> inputs, const std::string& output) {
  onnx::NodeProto nd;
  nd.set_op_type(type);
  for (auto& i : inputs) nd.add_input(std::move(i));
  nd.add_output(output);
  return nd;
}

const onnx::ValueInfoProto* find_value_info(const onnx::GraphProto& g, const std::string& name) {
  for (const auto& vi : g.output())
    if (vi.name() == name) return &vi;
  for (const auto& vi : g.input())
    if (vi.name() == name) return &vi;
  return nullptr;
}

void add_output(onnx::GraphProto& g, const std::string& name, const onnx::ValueInfoProto& type_of, NameScope& scope) {
  bool taken = false, defined = false;
  for (const auto& vi : g.output()) taken = taken || vi.name() == name;
  for (const auto& vi : g.input()) taken = taken || vi.name() == name;
  for (const auto& t : g.initializer()) defined = defined || t.name() == name;
  for (const auto& n : g.node())
    for (const auto& o : n.output()) defined = defined || o == name;
  onnx::ValueInfoProto vi = type_of;
  vi.set_name(name);
  if (taken || !defined) {
    vi.set_name(scope.fresh(name + "_out"));
    *g.add_node() = make_node("Identity", {name}, vi.name());
  }
  *g.add_output() = std::move(vi);
}

void copy_model_fields(const onnx::ModelProto& from, onnx::ModelProto& to) {
  to.set_ir_version(from.ir_version());
  *to.mutable_opset_import() = from.opset_import();
  *to.mutable_functions() = from.functions();
  *to.mutable_metadata_props() = from.metadata_props();
  to.set_producer_name(from.producer_name());
  to.set_producer_version(from.producer_version());
  to.set_domain(from.domain());
  to.set_model_version(from.model_version());
  to.set_doc_string(from.doc_string());
}

}  // namespace onnax
