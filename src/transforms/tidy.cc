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

// Keeps the elements of `field` for which `keep` holds, in order.
template <typename T, typename Keep>
void keep_if(google::protobuf::RepeatedPtrField<T>& field, Keep keep) {
  int kept = 0;
  for (int i = 0; i < field.size(); ++i) {
    if (!keep(field.Get(i))) continue;
    if (kept != i) field.SwapElements(kept, i);
    ++kept;
  }
  field.DeleteSubrange(kept, field.size() - kept);
}

void drop_value_info(onnx::GraphProto& g, const std::unordered_set<std::string>& defined) {
  keep_if(*g.mutable_value_info(), [&](const onnx::ValueInfoProto& vi) { return defined.count(vi.name()) > 0; });
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
  auto used = [&](const std::string& name) { return read.count(name) > 0 || inputs.count(name) > 0; };
  keep_if(*g.mutable_initializer(), [&](const onnx::TensorProto& t) { return used(t.name()); });
  keep_if(*g.mutable_sparse_initializer(), [&](const onnx::SparseTensorProto& t) { return used(t.values().name()); });

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
  keep_if(*model.mutable_functions(),
          [&](const onnx::FunctionProto& f) { return called.count(f.domain() + "\n" + f.name()) > 0; });
  keep_if(*model.mutable_opset_import(), [&](const onnx::OperatorSetIdProto& o) {
    return o.domain().empty() || o.domain() == "ai.onnx" || domains.count(o.domain()) > 0;
  });
}

}  // namespace onnax
