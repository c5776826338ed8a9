#include "rules/batching.h"

#include "diagnostics/error.h"

namespace onnax {

bool BatchCtx::any_batched() const {
  for (bool x : batched)
    if (x) return true;
  return false;
}

std::string BatchCtx::describe_input(int i) const {
  std::string name = i < node.input_size() ? node.input(i) : std::string("?");
  std::string s = "input " + std::to_string(i) + " '" + name + "' (per-example shape ";
  s += facts[i] ? facts[i]->shape_string() : std::string("unknown");
  s += ", " + diag::dtype_name(dtype(i));
  s += batched[i] ? ", batched at axis 0)" : ", not batched)";
  return s;
}

void BatchCtx::unsupported(const std::string& what, const std::string& fix) const {
  std::string domain = node.domain().empty() ? "ai.onnx" : node.domain();
  std::string where = node.name().empty() ? "output '" + (node.output_size() ? node.output(0) : "") + "'"
                                          : "node '" + node.name() + "'";
  diag::fail(Error::Kind::kUnsupported, "vmap: cannot batch " + domain + "::" + node.op_type() + " (opset " +
                                            std::to_string(opset) + ") at " + where + ": " + what +
                                            ". Fix: " + fix);
}

int64_t BatchCtx::rank(int i) const {
  if (!facts[i] || !facts[i]->has_shape)
    unsupported("the rank of " + describe_input(i) + " is unknown and this rule needs it",
                "give the model static ranks: add value_info for '" + node.input(i) +
                    "' or run `onnax check` to see where shape inference stops");
  return facts[i]->rank();
}

const onnx::AttributeProto* BatchCtx::attr(const std::string& name) const {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t BatchCtx::attr_i(const std::string& name, int64_t fallback) const {
  const auto* a = attr(name);
  return a ? a->i() : fallback;
}

std::vector<int64_t> BatchCtx::attr_ints(const std::string& name) const {
  const auto* a = attr(name);
  if (!a) return {};
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

V BatchCtx::materialize(int i) {
  if (batched[i]) return in[i];
  // Expand(Unsqueeze(x, 0), [B, 1, ..., 1]) broadcasts along the new axis without copying
  // shape information we might not know statically.
  V x = b.unsqueeze(in[i], {0});
  int64_t r = rank(i);
  std::vector<V> parts{batch_size()};
  if (r > 0) parts.push_back(b.i64s(std::vector<int64_t>(r, 1)));
  V y = b.expand(x, b.concat(parts, 0));
  Facts f = facts[i]->with_dim(0, Dim{});
  b.set_facts(y, f);
  return y;
}

V BatchCtx::pad_rank(int i, int64_t r) {
  int64_t own = rank(i);
  if (!batched[i] || own >= r) return in[i];
  std::vector<int64_t> axes;
  for (int64_t k = 1; k <= r - own; ++k) axes.push_back(k);
  return b.unsqueeze(in[i], axes);
}

BatchResult all_batched(std::vector<V> outs) {
  BatchResult r;
  r.batched.assign(outs.size(), true);
  for (size_t i = 0; i < outs.size(); ++i)
    if (!outs[i].valid()) r.batched[i] = false;
  r.out = std::move(outs);
  return r;
}

std::vector<int64_t> shift_axes(const std::vector<int64_t>& axes) {
  std::vector<int64_t> out;
  out.reserve(axes.size());
  for (int64_t a : axes) out.push_back(shift_axis(a));
  return out;
}

void BatchRules::add(const std::string& domain, const std::string& op, int since, BatchRule rule) {
  auto& list = rules_[domain + "::" + op];
  list.emplace_back(since, std::move(rule));
  std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
}

const BatchRule* BatchRules::find(const std::string& domain, const std::string& op, int since_version) const {
  std::string d = domain == "ai.onnx" ? "" : domain;
  auto it = rules_.find(d + "::" + op);
  if (it == rules_.end()) return nullptr;
  const BatchRule* best = nullptr;
  for (const auto& [since, rule] : it->second)
    if (since <= since_version) best = &rule;
  return best;
}

std::vector<std::string> BatchRules::ops() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : rules_) out.push_back(k);
  return out;
}

const BatchRules& BatchRules::instance() {
  static const BatchRules rules = [] {
    BatchRules r;
    register_elementwise_rules(r);
    register_reduce_rules(r);
    register_matmul_rules(r);
    register_shape_rules(r);
    register_index_rules(r);
    register_nn_rules(r);
    return r;
  }();
  return rules;
}

}  // namespace onnax
