#include "transforms/tidy.h"

#include <functional>
#include <string>
#include <unordered_set>

namespace onnax {
namespace {

// Every name a node of `g` (or of its subgraphs, which may read `g`'s values) reads or defines,
// and every domain those nodes use.
void collect(const onnx::GraphProto& g, std::unordered_set<std::string>& read, std::unordered_set<std::string>& defined,
             std::unordered_set<std::string>& domains) {
  for (const auto& vi : g.input()) defined.insert(vi.name());
  for (const auto& t : g.initializer()) defined.insert(t.name());
  for (const auto& s : g.sparse_initializer()) defined.insert(s.values().name());
  for (const auto& n : g.node()) {
    domains.insert(n.domain() == "ai.onnx" ? std::string() : n.domain());
    for (const auto& i : n.input())
      if (!i.empty()) read.insert(i);
    for (const auto& o : n.output())
      if (!o.empty()) defined.insert(o);
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect(a.g(), read, defined, domains);
      for (const auto& sg : a.graphs()) collect(sg, read, defined, domains);
    }
  }
}

void drop_value_info(onnx::GraphProto& g, const std::unordered_set<std::string>& defined) {
  auto* infos = g.mutable_value_info();
  int kept = 0;
  for (int i = 0; i < infos->size(); ++i) {
    if (!defined.count(infos->Get(i).name())) continue;
    if (kept != i) infos->SwapElements(kept, i);
    ++kept;
  }
  infos->DeleteSubrange(kept, infos->size() - kept);
  for (auto& n : *g.mutable_node())
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) drop_value_info(*a.mutable_g(), defined);
      for (auto& sg : *a.mutable_graphs()) drop_value_info(sg, defined);
    }
}

}  // namespace

void tidy(onnx::ModelProto& model) {
  onnx::GraphProto& g = *model.mutable_graph();
  std::unordered_set<std::string> read, defined, domains;
  collect(g, read, defined, domains);
  for (const auto& o : g.output()) read.insert(o.name());
  std::unordered_set<std::string> inputs;
  for (const auto& vi : g.input()) inputs.insert(vi.name());

  // (An initializer that is also a graph input is an input with a default: part of the interface.)
  auto* inits = g.mutable_initializer();
  int kept = 0;
  for (int i = 0; i < inits->size(); ++i) {
    const std::string& name = inits->Get(i).name();
    if (!read.count(name) && !inputs.count(name)) continue;
    if (kept != i) inits->SwapElements(kept, i);
    ++kept;
  }
  inits->DeleteSubrange(kept, inits->size() - kept);
  auto* sparse = g.mutable_sparse_initializer();
  kept = 0;
  for (int i = 0; i < sparse->size(); ++i) {
    const std::string& name = sparse->Get(i).values().name();
    if (!read.count(name) && !inputs.count(name)) continue;
    if (kept != i) sparse->SwapElements(kept, i);
    ++kept;
  }
  sparse->DeleteSubrange(kept, sparse->size() - kept);

  defined.clear();
  std::unordered_set<std::string> unused_reads;
  collect(g, unused_reads, defined, domains);
  drop_value_info(g, defined);

  // Model-local functions stay when called (by the graph, or by a function that stays), with
  // the domains their bodies use.
  std::unordered_set<std::string> called;
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& f : model.functions()) {
      const std::string key = f.domain() + "\n" + f.name();
      if (called.count(key)) continue;
      bool calls = false;
      auto is_call = [&](const onnx::NodeProto& n) { return n.domain() == f.domain() && n.op_type() == f.name(); };
      std::function<void(const onnx::GraphProto&)> scan = [&](const onnx::GraphProto& sg) {
        for (const auto& n : sg.node()) {
          calls = calls || is_call(n);
          for (const auto& a : n.attribute()) {
            if (a.has_g()) scan(a.g());
            for (const auto& gg : a.graphs()) scan(gg);
          }
        }
      };
      scan(g);
      for (const auto& other : model.functions())
        if (called.count(other.domain() + "\n" + other.name()))
          for (const auto& n : other.node()) calls = calls || is_call(n);
      if (!calls) continue;
      called.insert(key);
      for (const auto& n : f.node()) domains.insert(n.domain() == "ai.onnx" ? std::string() : n.domain());
      grew = true;
    }
  }
  auto* functions = model.mutable_functions();
  kept = 0;
  for (int i = 0; i < functions->size(); ++i) {
    if (!called.count(functions->Get(i).domain() + "\n" + functions->Get(i).name())) continue;
    if (kept != i) functions->SwapElements(kept, i);
    ++kept;
  }
  functions->DeleteSubrange(kept, functions->size() - kept);
  auto* opsets = model.mutable_opset_import();
  kept = 0;
  for (int i = 0; i < opsets->size(); ++i) {
    const std::string& d = opsets->Get(i).domain();
    if (!(d.empty() || d == "ai.onnx" || domains.count(d))) continue;
    if (kept != i) opsets->SwapElements(kept, i);
    ++kept;
  }
  opsets->DeleteSubrange(kept, opsets->size() - kept);
}

}  // namespace onnax
