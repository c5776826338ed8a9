#include "rules/op_table.h"

#include <algorithm>
#include <stdexcept>

#include "ir/graph_edit.h"

namespace onnax {
namespace {

// A second rule of one kind for one op is a registration mistake (one would silently win).
[[noreturn]] void registered_twice(const OpRules& r, const char* kind) {
  throw std::logic_error("op table: a second " + std::string(kind) + " rule for " +
                         (r.domain.empty() ? r.op : r.domain + "::" + r.op));
}

std::string key_of(std::string_view domain, std::string_view op) {
  return domain.empty() ? std::string(op) : std::string(domain) + "::" + std::string(op);
}

}  // namespace

OpRules& OpRules::batch(BatchRule rule, int since) {
  for (const auto& [s, r] : batch_rules)
    if (s == since) registered_twice(*this, "batching");
  batch_rules.emplace_back(since, std::move(rule));
  std::sort(batch_rules.begin(), batch_rules.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return *this;
}

OpRules& OpRules::refuse_batch(BatchRule rule) {
  batch_refused = true;
  return batch(std::move(rule));
}

OpRules& OpRules::jvp(JvpRule rule) {
  if (jvp_rule || zero_derivative) registered_twice(*this, "JVP");
  jvp_rule = std::move(rule);
  return *this;
}

OpRules& OpRules::jvp_via_body() {
  jvp_from_body = true;
  return jvp(expand_jvp);
}

OpRules& OpRules::transpose(TransposeRule rule) {
  if (transpose_rule) registered_twice(*this, "transpose");
  transpose_rule = std::move(rule);
  return *this;
}

OpRules& OpRules::zero() {
  if (jvp_rule || zero_derivative) registered_twice(*this, "JVP");
  zero_derivative = true;
  return *this;
}

OpRules& OpTable::op_in(std::string_view domain, std::string_view op) {
  if (is_default_domain(domain)) domain = {};
  auto [it, added] = entries_.try_emplace(key_of(domain, op));
  if (added) {
    it->second.domain = std::string(domain);
    it->second.op = std::string(op);
  }
  return it->second;
}

const OpRules* OpTable::find(std::string_view domain, std::string_view op) const {
  const auto it = is_default_domain(domain) ? entries_.find(op) : entries_.find(key_of(domain, op));
  return it == entries_.end() ? nullptr : &it->second;
}

const BatchRule* OpTable::batch_rule_for(std::string_view domain, std::string_view op, int since_version) const {
  const OpRules* r = find(domain, op);
  if (!r) return nullptr;
  const BatchRule* best = nullptr;
  for (const auto& [since, rule] : r->batch_rules)
    if (since <= since_version) best = &rule;
  return best;
}

const JvpRule* OpTable::jvp_for(const onnx::NodeProto& node) const {
  const OpRules* r = find(node.domain(), node.op_type());
  return r && r->jvp_rule ? &r->jvp_rule : nullptr;
}

bool OpTable::zero_for(const onnx::NodeProto& node) const {
  const OpRules* r = find(node.domain(), node.op_type());
  return r && r->zero_derivative;
}

const TransposeRule* OpTable::transpose_for(std::string_view op) const {
  const OpRules* r = find({}, op);
  return r && r->transpose_rule ? &r->transpose_rule : nullptr;
}

std::vector<const OpRules*> OpTable::entries() const {
  std::vector<const OpRules*> out;
  out.reserve(entries_.size());
  for (const auto& [key, rules] : entries_) out.push_back(&rules);
  std::sort(out.begin(), out.end(),
            [](const OpRules* a, const OpRules* b) { return std::tie(a->domain, a->op) < std::tie(b->domain, b->op); });
  return out;
}

const OpTable& OpTable::instance() {
  static const OpTable built = [] {
    OpTable table;
    register_elementwise(table);
    register_reduce(table);
    register_matmul(table);
    register_shape(table);
    register_slice(table);
    register_index(table);
    register_nn(table);
    register_pool(table);
    register_attention(table);
    register_recurrent(table);
    register_refusals(table);
    register_control_flow(table);
    register_expanded(table);
    register_linear_ops(table);
    register_grid_sample(table);
    register_resize(table);
    register_deform_conv(table);
    register_roi_align(table);
    return table;
  }();
  return built;
}

}  // namespace onnax
