// with_surrogates: marks a model's spikes for the surrogate JVP (include/onnax/surrogate.h).
#include <onnax/surrogate.h>

#include <functional>
#include <set>
#include <unordered_map>

#include "diagnostics/error.h"
#include "ir/graph_edit.h"
#include "rules/surrogate_jvp.h"

namespace onnax {

onnx::ModelProto with_surrogates(const onnx::ModelProto& model, const std::vector<Surrogate>& surrogates) {
  const Surrogate* every = nullptr;
  std::unordered_map<std::string, const Surrogate*> by_value;
  for (const auto& s : surrogates) {
    if (s.value.empty()) {
      if (every)
        diag::fail(Error::Kind::kSelection, "surrogates: two surrogates for every spike ('" + surrogate_text(*every) +
                                                "' and '" + surrogate_text(s) +
                                                "'). Fix: give one, and name values for the others");
      every = &s;
    } else if (!by_value.emplace(s.value, &s).second) {
      diag::fail(Error::Kind::kSelection,
                 "surrogates: two surrogates for the spike '" + s.value + "'. Fix: give one per value");
    }
  }
  onnx::ModelProto out = model;
  std::vector<std::string> spikes;
  std::set<std::string> marked_values;
  std::function<void(onnx::GraphProto&)> mark = [&](onnx::GraphProto& g) {
    std::unordered_map<std::string, const onnx::NodeProto*> producer;
    for (const auto& n : g.node())
      for (const auto& o : n.output()) producer.emplace(o, &n);
    for (auto& n : *g.mutable_node()) {
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_g()) mark(*a.mutable_g());
        for (auto& sg : *a.mutable_graphs()) mark(sg);
      }
      if (n.output_size() == 0 || !spike_operands(n, producer)) continue;
      spikes.push_back(n.output(0));
      auto it = by_value.find(n.output(0));
      const Surrogate* s = it != by_value.end() ? it->second : every;
      if (!s) continue;
      marked_values.insert(n.output(0));
      const std::string text = surrogate_text(*s);
      bool replaced = false;
      for (auto& e : *n.mutable_metadata_props())
        if (e.key() == kSurrogateKey) e.set_value(text), replaced = true;
      if (!replaced) {
        auto* e = n.add_metadata_props();
        e->set_key(kSurrogateKey);
        e->set_value(text);
      }
    }
  };
  mark(*out.mutable_graph());
  for (const auto& [value, s] : by_value)
    if (!marked_values.count(value))
      diag::fail(Error::Kind::kSelection,
                 "surrogates: '" + value + "' is not a spike (spikes found: [" +
                     (spikes.empty() ? std::string() : diag::join(spikes)) +
                     "]). Fix: name the output of a Cast/Where of a comparison (Greater, GreaterOrEqual, Less, "
                     "LessOrEqual) or of a Sign");
  if (marked_values.empty())
    diag::fail(Error::Kind::kSelection,
               "surrogates: the model has no spike (a Cast or Where of a comparison Greater/GreaterOrEqual/Less/"
               "LessOrEqual, or a Sign), so a surrogate would change nothing. Fix: drop the surrogate, or check "
               "that the step function is written with those operators");
  if (out.ir_version() < 10) out.set_ir_version(10);  // node metadata_props are IR 10
  return out;
}

}  // namespace onnax
