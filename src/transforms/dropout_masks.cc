#include "transforms/dropout_masks.h"

#include <unordered_set>

namespace onnax {
namespace {

bool is_false_scalar(const onnx::TensorProto& t) {
  if (t.dims_size() > 1 || (t.dims_size() == 1 && t.dims(0) != 1)) return false;
  if (t.data_type() != onnx::TensorProto::BOOL) return false;
  return t.int32_data_size() == 1 ? t.int32_data(0) == 0 : t.raw_data() == std::string(1, '\0');
}

bool needs_mask(const onnx::NodeProto& n, const std::unordered_set<std::string>& falses) {
  return n.op_type() == "Dropout" && (n.domain().empty() || n.domain() == "ai.onnx") && n.input_size() >= 3 &&
         !n.input(2).empty() && !falses.count(n.input(2)) && (n.output_size() < 2 || n.output(1).empty());
}

}  // namespace

bool name_dropout_masks(Prepared& p, const std::string& mode) {
  if (mode != "jvp" && mode != "vjp" && mode != "grad") return false;
  // Constant false flags: Constant nodes and initializers no input overrides.
  std::unordered_set<std::string> falses, fed;
  const onnx::GraphProto& source = *p.graph;
  for (const auto& vi : source.input()) fed.insert(vi.name());
  for (const auto& t : source.initializer())
    if (!fed.count(t.name()) && is_false_scalar(t)) falses.insert(t.name());
  for (const auto& n : source.node())
    if (n.op_type() == "Constant" && n.output_size() == 1)
      if (const auto t = constant_tensor(n); t && is_false_scalar(*t)) falses.insert(n.output(0));
  bool any = false;
  for (const auto& n : source.node()) any = any || needs_mask(n, falses);
  if (!any) return false;
  onnx::GraphProto& g = mutable_graph(p);
  for (auto& n : *g.mutable_node()) {
    if (!needs_mask(n, falses)) continue;
    const std::string mask = p.value_names.fresh(n.output(0) + "_mask");
    if (n.output_size() < 2)
      n.add_output(mask);
    else
      n.set_output(1, mask);
  }
  return true;
}

}  // namespace onnax
