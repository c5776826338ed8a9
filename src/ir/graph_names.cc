#include "ir/graph_names.h"

namespace onnax {

void collect_names(const onnx::GraphProto& g, NameScope& values) {
  for (const auto& vi : g.input()) values.reserve(vi.name());
  for (const auto& vi : g.output()) values.reserve(vi.name());
  for (const auto& vi : g.value_info()) values.reserve(vi.name());
  for (const auto& t : g.initializer()) values.reserve(t.name());
  for (const auto& s : g.sparse_initializer()) values.reserve(s.values().name());
  for (const auto& n : g.node()) {
    for (const auto& o : n.output())
      if (!o.empty()) values.reserve(o);
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_names(a.g(), values);
      for (const auto& sg : a.graphs()) collect_names(sg, values);
    }
  }
}

}  // namespace onnax
