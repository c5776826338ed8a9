// Elementwise operators: one broadcast-aware rule for all of them. Batched operands get
// size-1 axes after the batch axis so that numpy-style right alignment keeps the batch axis
// in front of every per-example axis.
#include "rules/batching.h"

namespace onnax {
namespace {

BatchResult broadcast_rule(BatchCtx& c) {
  int64_t out_rank = 0;
  for (int i = 0; i < c.num_inputs(); ++i)
    if (c.has(i)) out_rank = std::max(out_rank, c.rank(i));
  std::vector<V> ins;
  for (int i = 0; i < c.num_inputs(); ++i) ins.push_back(c.has(i) ? c.pad_rank(i, out_rank) : V{});
  return all_batched(c.b.clone(c.node, ins));
}

// Ops whose first input fixes the output shape and whose other inputs broadcast to it
// unidirectionally (PRelu's slope, Clip's scalar bounds): batch the first input if any
// other input is batched, then apply the broadcast rule.
BatchResult unidirectional_rule(BatchCtx& c) {
  bool others = false;
  for (int i = 1; i < c.num_inputs(); ++i) others = others || (c.has(i) && c.batched[i]);
  if (others && !c.batched[0]) {
    c.in[0] = c.materialize(0);
    c.batched[0] = true;
  }
  return broadcast_rule(c);
}

// Clip's min/max must be scalars; batched bounds become elementwise Max/Min.
BatchResult clip_rule(BatchCtx& c) {
  bool bounds_batched = (c.has(1) && c.batched[1]) || (c.has(2) && c.batched[2]);
  if (!bounds_batched) return all_batched(c.b.clone(c.node, c.in));
  V x = c.pad_rank(0, 0);
  if (c.has(1)) x = c.b.op1("Max", {x, c.pad_rank(1, c.rank(0))});
  if (c.has(2)) x = c.b.op1("Min", {x, c.pad_rank(2, c.rank(0))});
  return all_batched({x});
}

// Unary ops (and ops whose extra inputs only carry a dtype or scalar settings).
BatchResult unary_rule(BatchCtx& c) {
  for (int i = 1; i < c.num_inputs(); ++i)
    if (c.has(i) && c.batched[i]) {
      if (c.node.op_type() == "CastLike") break;  // only the target's dtype matters
      c.unsupported(c.describe_input(i) + " is batched, but it must be shared by all examples",
                    "pass None in in_axes for the inputs that reach '" + c.node.input(i) + "'");
    }
  BatchResult r = all_batched(c.b.clone(c.node, c.in));
  r.batched[0] = c.batched[0];  // CastLike with only the target batched stays shared
  return r;
}

BatchResult dropout_rule(BatchCtx& c) {
  // Inference only: training_mode must be absent or a known false constant.
  if (c.has(2)) {
    const auto* k = c.known_i64(2);
    bool known_false = k && k->size() == 1 && (*k)[0] == 0;
    if (!known_false)
      c.unsupported("training_mode is set or not a constant; only inference-mode Dropout is supported",
                    "export the model in inference mode (training_mode absent or false)");
  }
  if (c.has(1) && c.batched[1])
    c.unsupported(c.describe_input(1) + " (ratio) is batched", "pass None for the ratio's source in in_axes");
  return all_batched(c.b.clone(c.node, c.in));
}

}  // namespace

void register_elementwise_rules(BatchRules& r) {
  for (const char* op :
       {"Abs",      "Neg",         "Exp",        "Log",      "Sqrt",        "Reciprocal", "Floor",     "Ceil",
        "Round",    "Sign",        "Sin",        "Cos",      "Tan",         "Asin",       "Acos",      "Atan",
        "Sinh",     "Cosh",        "Asinh",      "Acosh",    "Atanh",       "Erf",        "IsNaN",     "IsInf",
        "Not",      "BitwiseNot",  "Relu",       "LeakyRelu", "Elu",        "Selu",       "Celu",      "Gelu",
        "Sigmoid",  "HardSigmoid", "HardSwish",  "Softplus", "Softsign",    "Mish",       "Tanh",      "ThresholdedRelu",
        "Shrink",   "Cast",        "CastLike",   "Identity", "Swish", "RegexFullMatch"}) {
    r.add("", op, 1, unary_rule);
  }
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "BitShift", "And", "Or", "Xor", "Equal", "Less",
                         "Greater", "LessOrEqual", "GreaterOrEqual", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
                         "Where", "Sum", "Mean", "Max", "Min", "StringConcat"}) {
    r.add("", op, 1, broadcast_rule);
  }
  r.add("", "PRelu", 1, unidirectional_rule);
  r.add("", "Clip", 11, clip_rule);
  r.add("", "Dropout", 12, dropout_rule);
}

}  // namespace onnax
