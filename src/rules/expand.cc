// JVPs of function ops (Attention, RotaryEmbedding, CenterCropPad, ...) by expansion: the op's
// ONNX function body (context-dependent ones built for this node's input types) is emitted
// node by node, each body node differentiated with its own rule. Reverse mode then needs only
// the transposes of the body ops' JVPs. The body recomputes the primal intermediates the
// tangents need (the op's own primal outputs stay as they were).
#include <onnx/defs/function.h>
#include <onnx/defs/schema.h>

#include <string>
#include <unordered_map>

#include "check/node_check.h"
#include "diagnostics/error.h"
#include "ir/graph_edit.h"
#include "rules/derivative.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

bool float_dtype(int32_t dt) {
  return dt == onnx::TensorProto::FLOAT || dt == onnx::TensorProto::DOUBLE || dt == onnx::TensorProto::FLOAT16 ||
         dt == onnx::TensorProto::BFLOAT16;
}

onnx::TypeProto type_of(const Facts& f) {
  onnx::TypeProto t;
  write_type(f, &t);
  return t;
}

// The function body of `c.node` at the model's opset, or nullopt-like false.
bool function_body(JvpCtx& c, onnx::FunctionProto& fp) {
  // (An op of another domain, e.g. ai.onnx.preview, at the model's opset for that domain.)
  const bool default_domain = is_default_domain(c.node);
  const auto imported = c.b.opsets().find(default_domain ? std::string() : c.node.domain());
  const int version = default_domain || imported == c.b.opsets().end() ? static_cast<int>(c.opset) : imported->second;
  const auto* schema = onnx::OpSchemaRegistry::Schema(c.node.op_type(), version, c.node.domain());
  if (schema == nullptr) return false;
  if (schema->HasContextDependentFunction()) {
    std::vector<onnx::TypeProto> types;
    for (int i = 0; i < c.node.input_size(); ++i)
      types.push_back(c.has(i) ? type_of(c.b.facts(c.xs[i])) : onnx::TypeProto{});
    onnx::FunctionBodyBuildContextImpl ctx(c.node, types);
    if (schema->BuildContextDependentFunction(ctx, fp, version)) return true;
  }
  if (schema->HasFunction()) {
    const onnx::FunctionProto* f = schema->GetFunction(version);
    if (f != nullptr) {
      fp = *f;
      return true;
    }
  }
  return false;
}

}  // namespace

Vs expand_jvp(JvpCtx& c) {
  onnx::FunctionProto fp;
  if (!function_body(c, fp))
    c.unsupported("it has no derivative rule and ONNX defines no function body for it at this opset",
                  "select inputs/outputs that avoid it, or compute it outside the differentiated model");
  onnx::GraphProto g;
  onnx::FunctionExpandHelper(c.node, fp, g, c.node.name().empty() ? c.node.output(0) : c.node.name());
  // The expansion renames the body's values but leaves the reads inside subgraphs (a Scan's
  // body reading a constant of the function) under their names in the function: node i of the
  // expansion is node i of the function, which pairs the names up.
  std::unordered_map<std::string, std::string> expanded_name;
  for (int i = 0; i < fp.node_size() && i < g.node_size(); ++i) {
    const auto &from = fp.node(i), &to = g.node(i);
    for (int k = 0; k < from.input_size() && k < to.input_size(); ++k) expanded_name[from.input(k)] = to.input(k);
    for (int k = 0; k < from.output_size() && k < to.output_size(); ++k) expanded_name[from.output(k)] = to.output(k);
  }
  for (auto& n : *g.mutable_node())
    if (has_subgraphs(n)) rename_outer_reads(n, expanded_name);
  // An attribute the body refers to (ref_attr_name) but the node does not set is left
  // unresolved by the expansion; the op's default then applies, so drop it.
  for (auto& n : *g.mutable_node())
    for (int k = n.attribute_size() - 1; k >= 0; --k)
      if (!n.attribute(k).ref_attr_name().empty() || n.attribute(k).type() == onnx::AttributeProto::UNDEFINED)
        n.mutable_attribute()->DeleteSubrange(k, 1);
  return expansion_jvp(c, g);
}

// Fails (the diagnostic contract) when a node of an expanded function body misses an input
// its schema requires: the function op left out an optional input this body needs.
void check_body_node(const JvpCtx& c, const onnx::NodeProto& n, const Vs& xs) {
  if (!n.domain().empty() && n.domain() != "ai.onnx") return;
  const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(n.op_type(), static_cast<int>(c.opset), "");
  if (!schema) return;
  std::vector<int32_t> ids;  // (as the index has them: inputs, then outputs)
  for (const V& x : xs) ids.push_back(x.valid() ? 0 : -1);
  for (const auto& out : n.output()) ids.push_back(out.empty() ? -1 : 0);
  const NodeInputFactsOf known(
      [&](int k) { return xs[static_cast<size_t>(k)].valid() ? c.b.rank(xs[static_cast<size_t>(k)]) : -1; },
      [&](int k) { return xs[static_cast<size_t>(k)].valid() ? c.b.known_i64(xs[static_cast<size_t>(k)]) : nullptr; });
  const std::string defect = node_defect(*schema, n, ids.data(), known);
  if (defect.empty()) return;
  std::string inputs_left_out;
  for (int k = 0; k < c.node.input_size(); ++k)
    if (c.node.input(k).empty()) inputs_left_out += (inputs_left_out.empty() ? "" : ", ") + std::to_string(k);
  c.unsupported("its function body's " + n.op_type() + " at " + diag::node_location(n) + " " +
                    defect.substr(0, defect.find(". Fix:")) +
                    (inputs_left_out.empty() ? "" : " (the node leaves out its input(s) " + inputs_left_out + ")"),
                "give the node the optional inputs this configuration of its operator needs");
}

Vs expansion_jvp(JvpCtx& c, const onnx::GraphProto& g, const KnownPrimal* known, Vs* primal_outputs) {
  const OpTable& rules = OpTable::instance();
  std::unordered_map<std::string, V> primal, tangent;
  for (int i = 0; i < c.node.input_size(); ++i) {
    if (c.node.input(i).empty()) continue;
    primal[c.node.input(i)] = c.xs[i];
    if (c.t(i).valid()) tangent[c.node.input(i)] = c.ts[i];
  }
  if (known)
    for (const auto& [name, v] : known->values) primal[name] = v;
  auto lookup = [](const std::unordered_map<std::string, V>& m, const std::string& n) {
    auto it = m.find(n);
    return it == m.end() ? V{} : it->second;
  };
  for (const auto& node : g.node()) {
    // A node with subgraphs reads values of the expansion by name: its clone reads them under
    // the names the builder gave them, and its rule sees them as captured values.
    const onnx::NodeProto* np = &node;
    onnx::NodeProto renamed;
    std::vector<JvpCtx::Captured> captured;
    bool active = false;
    if (has_subgraphs(node)) {
      std::unordered_map<std::string, std::string> names;
      for (const auto& r : outer_scope_reads(node)) {
        const V x = lookup(primal, r);
        if (!x.valid() || names.count(r)) continue;
        names.emplace(r, std::string(c.b.name(x)));
        captured.push_back(JvpCtx::Captured{names[r], x, lookup(tangent, r)});
        active = active || captured.back().t.valid();
      }
      renamed = node;
      rename_outer_reads(renamed, names);
      np = &renamed;
    }
    const onnx::NodeProto& n = *np;
    Vs xs, ts;
    for (const auto& in : n.input()) {
      xs.push_back(in.empty() ? V{} : lookup(primal, in));
      ts.push_back(in.empty() ? V{} : lookup(tangent, in));
      active = active || ts.back().valid();
    }
    // A body reading an input the node left out sees it absent: fine where the body's node takes
    // it as optional, a defect of this configuration where it requires it.
    check_body_node(c, n, xs);
    bool all_known = known != nullptr && n.output_size() > 0;
    for (const auto& o : n.output()) all_known = all_known && (known->values.count(o) || known->same_as.count(o));
    Vs ys;
    if (all_known)
      for (const auto& o : n.output())
        ys.push_back(known->values.count(o) ? known->values.at(o) : lookup(primal, known->same_as.at(o)));
    else
      ys = c.b.clone(n, xs);
    for (int k = 0; k < n.output_size() && k < static_cast<int>(ys.size()); ++k)
      if (!n.output(k).empty()) primal[n.output(k)] = ys[k];
    if (!active || rules.zero_for(n)) continue;
    bool float_out = false;
    for (const V& y : ys)  // (an unknown dtype could be float)
      float_out = float_out || (y.valid() && (c.b.facts(y).dtype == 0 || float_dtype(c.b.facts(y).dtype)));
    if (!float_out) continue;
    const JvpRule* rule = rules.jvp_for(n);
    Vs rule_ys = ys;
    if (n.op_type() == "Softmax") {
      // Function bodies (Attention) softmax fully masked rows (NaN) and then replace them by
      // zeros with a Where. The op itself is finite there, so its derivative must be too:
      // a zero in place of the NaN keeps 0 * NaN out of the tangent and the transposed graph.
      V nan = c.b.op1("IsNaN", {ys[0]});
      rule_ys[0] = c.b.op1("Where", {nan, c.b.scalar(0.0, c.b.facts(ys[0]).dtype), ys[0]});
    }
    JvpCtx inner{c.b, n, c.opset, xs, rule_ys, ts, std::move(captured), c.bodies, c.for_reverse_mode};
    Vs touts;
    if (rule != nullptr)
      touts = (*rule)(inner);
    else if (n.domain().empty() || n.domain() == "ai.onnx")
      touts = expand_jvp(inner);
    else
      c.unsupported("its function body uses " + n.domain() + "::" + n.op_type() + ", which has no derivative rule",
                    "select inputs/outputs that avoid it");
    for (int k = 0; k < n.output_size() && k < static_cast<int>(touts.size()); ++k) {
      if (n.output(k).empty() || !touts[k].valid() ||
          (c.b.facts(ys[k]).dtype != 0 && !float_dtype(c.b.facts(ys[k]).dtype)))
        continue;
      bind_tangent(c.b, touts[k], ys[k]);
      tangent[n.output(k)] = touts[k];
    }
  }
  Vs out;
  for (const auto& o : c.node.output()) out.push_back(o.empty() ? V{} : lookup(tangent, o));
  if (primal_outputs)
    for (const auto& o : c.node.output()) primal_outputs->push_back(o.empty() ? V{} : lookup(primal, o));
  return out;
}

void register_expanded(OpTable& table) {
  // Function ops whose math is easiest read from (and kept consistent with) ONNX's own body.
  for (const char* op : {"Attention", "RotaryEmbedding", "CenterCropPad", "Swish", "SwiGLU", "CausalConvWithState",
                         "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "MeanVarianceNormalization",
                         "LinearAttention", "DynamicQuantizeLinear"})
    table.op(op).jvp_via_body();
  table.op_in("ai.onnx.preview", "FlexAttention").jvp_via_body();
}

}  // namespace onnax
