// The op table: every operator onnax knows registers here once, keyed by (domain, op), with
// its batching rules (each from the since-version of the schema it handles), its JVP rule and,
// for ops that JVP rules emit on tangents, its transpose rule, side by side:
//
//   table.op("MatMul").batch(matmul_rule, /*since=*/13).jvp(matmul_jvp).transpose(matmul_transpose);
//
// vmap asks for the batching rule of a node's schema version (none: a per-example Scan), jvp
// and vjp/grad for the JVP rule (reverse mode transposes the linear nodes that rule emitted).
// docs/ops.md is generated from it (scripts/ops_doc.py) and the rule tests walk it. Rules users
// register (onnax/rules.h) are consulted first (rules/user_rules.h).
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rules/batching.h"
#include "rules/derivative.h"

namespace onnax {

// What the table holds for one (domain, op).
struct OpRules {
  std::string domain;  // "" for the default domain
  std::string op;
  // Batching rules by the since-version of the first schema each handles, ascending.
  std::vector<std::pair<int, BatchRule>> batch_rules;
  bool batch_refused = false;  // the batching rule refuses with a diagnostic (ragged or random)
  JvpRule jvp_rule;
  bool jvp_from_body = false;  // the JVP differentiates the op's ONNX function body
  TransposeRule transpose_rule;
  bool zero_derivative = false;  // outputs carry no derivative (integer, boolean, piecewise constant)

  // Registration, chained: t.op("Mul").batch(broadcast_rule).jvp(mul_jvp).transpose(mul_transpose).
  OpRules& batch(BatchRule rule, int since = 1);
  OpRules& refuse_batch(BatchRule rule);
  OpRules& jvp(JvpRule rule);
  OpRules& jvp_via_body();
  OpRules& transpose(TransposeRule rule);
  OpRules& zero();
};

class OpTable {
 public:
  static const OpTable& instance();

  // The entry of a default-domain op (created on first use).
  OpRules& op(std::string_view op) { return op_in("", op); }
  OpRules& op_in(std::string_view domain, std::string_view op);

  // The batching rule for a node whose schema resolves to `since_version`, or nullptr.
  const BatchRule* batch_rule_for(std::string_view domain, std::string_view op, int since_version) const;
  const JvpRule* jvp_for(const onnx::NodeProto& node) const;
  bool zero_for(const onnx::NodeProto& node) const;
  // The transpose of a default-domain linear op (tape nodes are onnax's own, all default domain).
  const TransposeRule* transpose_for(std::string_view op) const;

  // Every entry, sorted by (domain, op).
  std::vector<const OpRules*> entries() const;

 private:
  const OpRules* find(std::string_view domain, std::string_view op) const;
  // Hashed by "op" (default domain) or "domain::op", and looked up by string_view: every
  // differentiated node and every tape node asks, so a default-domain lookup neither allocates
  // nor walks a tree of string comparisons.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // (References to elements stay valid as the map grows: registration chains hold them.)
  std::unordered_map<std::string, OpRules, NameHash, std::equal_to<>> entries_;
};

// Registration, one function per op family (rules/*.cc), each listing its ops' rules together.
void register_elementwise(OpTable& table);
void register_reduce(OpTable& table);
void register_matmul(OpTable& table);
void register_shape(OpTable& table);
void register_slice(OpTable& table);  // Slice and Range, also with per-example bounds
void register_index(OpTable& table);
void register_nn(OpTable& table);
void register_pool(OpTable& table);
void register_attention(OpTable& table);
void register_recurrent(OpTable& table);  // RNN, GRU, LSTM, ReverseSequence
void register_refusals(OpTable& table);
void register_control_flow(OpTable& table);
void register_expanded(OpTable& table);  // function ops differentiated through their bodies
void register_linear_ops(OpTable& table);
void register_grid_sample(OpTable& table);
void register_resize(OpTable& table);
void register_deform_conv(OpTable& table);
void register_roi_align(OpTable& table);

}  // namespace onnax
