#include "transforms/inline_size.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace onnax {
namespace {

class InlineCount {
 public:
  explicit InlineCount(const onnx::ModelProto& model) {
    for (const auto& f : model.functions()) functions_.emplace(key(f.domain(), f.name(), f.overload()), &f);
  }

  // Nodes of `g` once its calls are inlined (saturating at the limit + 1).
  uint64_t graph(const onnx::GraphProto& g) {
    uint64_t total = 0;
    for (const auto& n : g.node()) total = add(total, node(n));
    return total;
  }

  std::string cycle;  // a function that calls itself, directly or not

 private:
  static std::string key(const std::string& domain, const std::string& name, const std::string& overload) {
    std::string k = domain;
    k.append(1, '\0').append(name).append(1, '\0').append(overload);
    return k;
  }
  static uint64_t add(uint64_t a, uint64_t b) { return std::min(a + b, kMaxInlinedNodes + 1); }

  uint64_t node(const onnx::NodeProto& n) {
    uint64_t total = 0;
    for (const auto& a : n.attribute()) {
      if (a.has_g()) total = add(total, graph(a.g()));
      for (const auto& sub : a.graphs()) total = add(total, graph(sub));
    }
    const auto it = functions_.find(key(n.domain(), n.op_type(), n.overload()));
    return add(total, it == functions_.end() ? 1 : function(it->first, *it->second));
  }

  uint64_t function(const std::string& k, const onnx::FunctionProto& f) {
    if (const auto done = size_.find(k); done != size_.end()) return done->second;
    if (!visiting_.insert(k).second) {
      if (cycle.empty()) cycle = (f.domain().empty() ? "" : f.domain() + "::") + f.name();
      return kMaxInlinedNodes + 1;
    }
    uint64_t total = 0;
    for (const auto& n : f.node()) total = add(total, node(n));
    visiting_.erase(k);
    size_.emplace(k, total);
    return total;
  }

  std::unordered_map<std::string, const onnx::FunctionProto*> functions_;
  std::unordered_map<std::string, uint64_t> size_;
  std::unordered_set<std::string> visiting_;  // functions being counted (a repeat is a cycle)
};

}  // namespace

std::optional<std::pair<Error::Kind, std::string>> inline_size_problem(const onnx::ModelProto& model,
                                                                       const std::string& mode) {
  InlineCount count(model);
  const uint64_t nodes = count.graph(model.graph());
  if (!count.cycle.empty())
    return std::pair{
        Error::Kind::kInvalidModel,
        mode + ": invalid model: local function " + count.cycle +
            " calls itself (directly or through other functions), so inlining it never ends. Fix: break the "
            "recursion (ONNX functions cannot recurse)"};
  if (nodes <= kMaxInlinedNodes) return std::nullopt;
  return std::pair{
      Error::Kind::kUnsupported,
      mode + ": inlining the model's local functions would write more than " + std::to_string(kMaxInlinedNodes) +
          " nodes (functions that call other functions several times expand exponentially); onnax stops here. Fix: "
          "if the model is trusted and this large, inline it with onnx.inliner and transform the result"};
}

}  // namespace onnax
