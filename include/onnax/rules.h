// Rules the user gives: definitions of operators onnax does not know (a custom domain, a contrib
// op it lacks) and JVPs that replace onnax's own, for an operator or for one node (JAX's
// custom_jvp). Both are ONNX functions, so they run in the C++ core; reverse mode transposes a
// JVP's linear part, and vmap batches a definition's nodes, each with its own rule.
#pragma once

#include <onnx/onnx_pb.h>

#include <optional>
#include <string>

namespace onnax {

struct UserRule {
  std::string domain;  // the operator's domain ("" for ai.onnx)
  std::string op;      // its type (ignored when `node` is set)
  std::string node;    // set: the rule applies to the node of this name only
  // The operator's definition in operators onnax has rules for: inputs and outputs are the
  // operator's, in order. Every transform runs through it (as through a model-local function),
  // except that jvp/vjp/grad keep the operator itself when `jvp` is given too.
  std::optional<onnx::FunctionProto> body;
  // The JVP: inputs are the operator's inputs, then one tangent per input (zeros where an input
  // has none); outputs are the tangents of the operator's outputs, linear in the input tangents
  // (reverse mode transposes them). The node itself stays in the result.
  std::optional<onnx::FunctionProto> jvp;
  // The VJP (JAX's custom_vjp): inputs are the operator's inputs, then one cotangent per output
  // (zeros where an output has none); outputs are the cotangents of its inputs, one per input.
  // Reverse mode (vjp, grad, jacrev) uses it in place of transposing a JVP and keeps the node;
  // forward mode uses `jvp` or `body`. Not inside Loop/Scan bodies, whose reverse mode
  // transposes a JVP body: give a JVP there.
  std::optional<onnx::FunctionProto> vjp;
};

// Registers `rule` for every later transform in this process, replacing one registered for the
// same (domain, op) or node. Fails (onnax::Error) when it gives no function.
void register_rule(const UserRule& rule);
// Forgets every registered rule.
void clear_rules();

}  // namespace onnax
