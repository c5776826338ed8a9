#include "rules/user_rules.h"

#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "diagnostics/error.h"
#include "ir/graph_edit.h"

namespace onnax {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::shared_ptr<const UserRules>& registry() {
  static std::shared_ptr<const UserRules> current = std::make_shared<const UserRules>();
  return current;
}

bool same_target(const UserRule& a, const UserRule& b) {
  if (!a.node.empty() || !b.node.empty()) return a.node == b.node;
  return a.op == b.op && (a.domain == b.domain || (is_default_domain(a.domain) && is_default_domain(b.domain)));
}

std::string label(const UserRule& r) {
  if (!r.node.empty()) return "the rule for node '" + r.node + "'";
  return "the rule for " + (is_default_domain(r.domain) ? std::string("ai.onnx") : r.domain) + "::" + r.op;
}

}  // namespace

void register_rule(const UserRule& rule) {
  if (!rule.body && !rule.jvp && !rule.vjp)
    diag::fail(
        Error::Kind::kSelection,
        "register_rule: " + label(rule) + " gives neither a body nor a jvp nor a vjp. Fix: pass at least one function");
  if (rule.node.empty() && rule.op.empty())
    diag::fail(Error::Kind::kSelection,
               "register_rule: the rule names neither an operator nor a node. Fix: give the operator's type (and "
               "domain), or a node name");
  if (!rule.node.empty() && rule.body)
    diag::fail(Error::Kind::kSelection,
               "register_rule: " + label(rule) +
                   " gives a body; a node's definition is its operator's. Fix: register the body for the operator");
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto next = std::make_shared<UserRules>(*registry());
  std::erase_if(next->rules, [&](const UserRule& r) { return same_target(r, rule); });
  next->rules.push_back(rule);
  registry() = std::move(next);
}

void clear_rules() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry() = std::make_shared<const UserRules>();
}

std::shared_ptr<const UserRules> user_rules() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry();
}

void restore_rules(std::shared_ptr<const UserRules> rules) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry() = std::move(rules);
}

std::vector<UserRule> rules_of_model(const onnx::ModelProto& model, const std::string& path) {
  static constexpr std::string_view kJvp = ".jvp", kVjp = ".vjp", kNodeDomain = "onnax.node";
  std::vector<UserRule> rules;
  auto rule_for = [&](const std::string& domain, const std::string& op, const std::string& node) -> UserRule& {
    for (auto& r : rules)
      if (r.domain == domain && r.op == op && r.node == node) return r;
    rules.push_back(UserRule{domain, op, node, std::nullopt, std::nullopt, std::nullopt});
    return rules.back();
  };
  for (const auto& f : model.functions()) {
    const std::string& name = f.name();
    auto ends_with = [&](std::string_view suffix) {
      return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const bool jvp = ends_with(kJvp), vjp = ends_with(kVjp);
    const std::string target = jvp || vjp ? name.substr(0, name.size() - kJvp.size()) : name;
    if (f.domain() == kNodeDomain) {
      if (!jvp && !vjp)
        diag::fail(Error::Kind::kInvalidModel,
                   "--rules '" + path + "': function onnax.node::" + name +
                       " names a node but is no JVP or VJP (a node's definition is its operator's). Fix: name it " +
                       name + ".jvp or " + name + ".vjp, or register a body for the operator as D::Op");
      UserRule& r = rule_for("", "", target);
      (jvp ? r.jvp : r.vjp) = f;
    } else {
      UserRule& r = rule_for(f.domain(), target, "");
      (jvp ? r.jvp : vjp ? r.vjp : r.body) = f;
    }
  }
  if (rules.empty())
    diag::fail(Error::Kind::kInvalidModel,
               "--rules '" + path +
                   "' defines no functions, so no rules. Fix: save a model whose functions are the rules: D::Op "
                   "(a definition), D::Op.jvp (a JVP), onnax.node::NAME.jvp (the JVP of node NAME)");
  return rules;
}

const UserRule* UserRules::for_node(const onnx::NodeProto& node) const {
  if (rules.empty()) return nullptr;
  const UserRule* by_op = nullptr;
  for (const auto& r : rules) {
    if (!r.node.empty()) {
      if (!node.name().empty() && r.node == node.name()) return &r;
    } else if (r.op == node.op_type() &&
               (r.domain == node.domain() || (is_default_domain(r.domain) && is_default_domain(node.domain())))) {
      by_op = &r;
    }
  }
  return by_op;
}

std::vector<const UserRule*> UserRules::bodies() const {
  std::vector<const UserRule*> out;
  for (const auto& r : rules)
    if (r.node.empty() && r.body) out.push_back(&r);
  return out;
}

namespace {

// The nodes of function `f` emitted on the values `env` gives its inputs; returns its outputs.
// `which` names the function in messages; `unsupported` is the rule context's.
template <typename Ctx>
Vs emit_function(Ctx& c, const onnx::FunctionProto& f, std::unordered_map<std::string, V>& env,
                 const std::string& which) {
  for (const auto& fn : f.node()) {
    for (const auto& a : fn.attribute())
      if (!a.ref_attr_name().empty() || a.has_g() || a.graphs_size() > 0)
        c.unsupported(which + " has a node (" + fn.op_type() + ") with an attribute reference or a subgraph",
                      "write it with plain attribute values and without control flow");
    Vs ins;
    for (const auto& in : fn.input()) {
      if (in.empty()) {
        ins.push_back(V{});
        continue;
      }
      const auto it = env.find(in);
      if (it == env.end() || !it->second.valid())
        c.unsupported(which + " reads '" + in +
                          "', which it neither takes nor computes (or a tangent of an input "
                          "without derivative)",
                      "read only its inputs and values its nodes compute");
      ins.push_back(it->second);
    }
    const Vs outs = c.b.clone(fn, ins);
    for (int k = 0; k < fn.output_size(); ++k)
      if (!fn.output(k).empty()) env[fn.output(k)] = outs[static_cast<size_t>(k)];
  }
  Vs result;
  for (const auto& o : f.output()) {
    const auto it = env.find(o);
    if (it == env.end())
      c.unsupported(which + " does not compute its output '" + o + "'", "compute every output it declares");
    result.push_back(it->second);
  }
  return result;
}

}  // namespace

Vs function_jvp(JvpCtx& c, const onnx::FunctionProto& f) {
  const int n = c.node.input_size();
  const std::string which = "the registered JVP function '" + f.name() + "'";
  if (f.input_size() != 2 * n || f.output_size() != c.node.output_size())
    c.unsupported(which + " has " + std::to_string(f.input_size()) + " inputs and " + std::to_string(f.output_size()) +
                      " outputs, but this node has " + std::to_string(n) + " inputs and " +
                      std::to_string(c.node.output_size()) + " outputs",
                  "give it the node's inputs, then one tangent per input (" + std::to_string(2 * n) +
                      " inputs), and one output per node output");
  std::unordered_map<std::string, V> env;
  for (int i = 0; i < n; ++i) {
    env[f.input(i)] = c.x(i);
    V t = c.t(i);
    // A zero tangent is fed as zeros (the function reads every input); inputs without derivative
    // (integers) have none.
    if (!t.valid() && c.x(i).valid() && differentiable_dtype(c.dtype(i))) t = c.b.zeros_like(c.x(i), c.dtype(i));
    env[f.input(n + i)] = t;
  }
  return emit_function(c, f, env, which);
}

Vs user_vjp_tape_node(JvpCtx& c, int64_t rule_index) {
  const int n = c.node.input_size(), m = c.node.output_size();
  onnx::NodeProto node;
  node.set_op_type("Vjp");
  node.set_domain(kUserVjpDomain);
  auto* a = node.add_attribute();
  a->set_name("rule");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(rule_index);
  Vs ins;
  for (int i = 0; i < n; ++i) ins.push_back(c.x(i));
  for (int i = 0; i < n; ++i) ins.push_back(c.t(i));
  for (size_t i = 0; i < ins.size(); ++i) node.add_input("");
  const Vs outs = c.b.clone(node, ins, {}, {}, m);
  for (int k = 0; k < m; ++k)
    if (c.y(k).valid() && outs[static_cast<size_t>(k)].valid()) {
      c.b.set_facts(outs[static_cast<size_t>(k)], c.b.facts(c.y(k)));
      c.b.set_witness(outs[static_cast<size_t>(k)], c.y(k));
    }
  return outs;
}

Vs user_vjp_transpose(TransposeCtx& c, const onnx::FunctionProto& f) {
  const int m = static_cast<int>(c.outs.size());
  const int n = static_cast<int>(c.ins.size()) / 2;
  const std::string which = "the registered VJP function '" + f.name() + "'";
  if (f.input_size() != n + m || f.output_size() != n)
    c.unsupported(which + " has " + std::to_string(f.input_size()) + " inputs and " + std::to_string(f.output_size()) +
                      " outputs, but this node has " + std::to_string(n) + " inputs and " + std::to_string(m) +
                      " outputs",
                  "give it the node's inputs, then one cotangent per output (" + std::to_string(n + m) +
                      " inputs), and one cotangent per input as outputs (" + std::to_string(n) + ")");
  std::unordered_map<std::string, V> env;
  for (int i = 0; i < n; ++i) env[f.input(i)] = c.in(i);
  for (int k = 0; k < m; ++k) {
    V ct = c.ct(k);
    // (A zero cotangent is fed as zeros shaped like the output, the tangent's primal twin.)
    if (!ct.valid()) {
      const V w = c.b.witness(c.outs[static_cast<size_t>(k)]);
      if (!w.valid()) c.unsupported(which + ": the shape of output " + std::to_string(k) + " is unknown");
      ct = c.b.zeros_like(w);
    }
    env[f.input(n + k)] = ct;
  }
  const Vs cts = emit_function(c, f, env, which);
  Vs res(c.ins.size(), V{});
  for (int i = 0; i < n; ++i)
    if (c.linear(n + i)) res[static_cast<size_t>(n + i)] = cts[static_cast<size_t>(i)];
  return res;
}

}  // namespace onnax
