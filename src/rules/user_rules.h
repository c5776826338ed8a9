// The rules users register (include/onnax/rules.h): a process-wide registry read through
// snapshots, so a transform sees one set of rules from start to end while another thread
// registers, and the JVP of a node from a user's JVP function.
#pragma once

#include <onnax/rules.h>
#include <onnx/onnx_pb.h>

#include <memory>
#include <string>
#include <vector>

#include "rules/derivative.h"

namespace onnax {

struct UserRules {
  std::vector<UserRule> rules;
  // The rule for `node`: its own (by name) first, then its operator's; nullptr: none.
  const UserRule* for_node(const onnx::NodeProto& node) const;
  // Operator-level rules with a body (node-level ones never have one).
  std::vector<const UserRule*> bodies() const;
};

// The registered rules now (never null; empty when none).
std::shared_ptr<const UserRules> user_rules();
// Makes `rules` (a snapshot user_rules gave) the registered rules again: for a scope that
// registers rules for one command only.
void restore_rules(std::shared_ptr<const UserRules> rules);

// The rules a file defines (the command line's --rules): an ONNX model whose functions are
// rules by name. A function D::Op is the definition (body) of operator D::Op; D::Op.jvp its JVP;
// onnax.node::NAME.jvp the JVP of the node named NAME. `path` names the file in messages.
std::vector<UserRule> rules_of_model(const onnx::ModelProto& model, const std::string& path);

// The JVP of `c.node` by the function `jvp` (see UserRule::jvp): its nodes are emitted on the
// node's primal inputs and tangents, each with its own rules (the linear ones go on the tape).
Vs function_jvp(JvpCtx& c, const onnx::FunctionProto& jvp);

// Reverse mode by a user's VJP (UserRule::vjp): `c.node`'s linear map goes on the tape as one
// node of this domain (the node's inputs, then their tangents, in; its outputs' tangents out;
// attribute "rule": the rule's index in the transform's UserRules), which user_vjp_transpose
// turns into the VJP function's nodes on the primal inputs and the output cotangents.
inline constexpr const char* kUserVjpDomain = "onnax.user_vjp";
Vs user_vjp_tape_node(JvpCtx& c, int64_t rule_index);
Vs user_vjp_transpose(TransposeCtx& c, const onnx::FunctionProto& vjp);

}  // namespace onnax
