// Derivative rules: JVP rules (forward mode) for every differentiable op, and transpose rules
// for the linear ops that JVP rules emit on tangents. Reverse mode is linearize-then-
// transpose, so vjp/grad need no per-op backward rules (DESIGN.md section 3).
#pragma once

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "emit/builder.h"
#include "emit/value_algebra.h"
#include "facts/facts.h"
#include "rules/body_transforms.h"

namespace onnax {

// Inputs to a JVP rule. Tangents t(i) may be symbolic zeros (invalid V); the value algebra
// (emit/value_algebra.h, c.emit) and the Builder's add/mul/... treat them as such, so rules read
// like the math. A rule runs only when some input (or a value its bodies read) has a tangent, so
// the rule of an op with one differentiable input never sees that tangent zero.
class JvpCtx {
 public:
  Builder& b;
  const onnx::NodeProto& node;
  int64_t opset;
  Vs xs;  // primal inputs (invalid = absent)
  Vs ys;  // primal outputs (already computed)
  Vs ts;  // input tangents (invalid = zero)
  // For a node with subgraphs (Loop, Scan, If): each value its bodies read from this graph,
  // once, with its primal value and tangent (invalid = zero).
  struct Captured {
    std::string name;
    V x;
    V t;
  };
  std::vector<Captured> captured;
  // How control-flow rules have bodies differentiated (given by the transform), and whether a
  // tape is recorded around this JVP (reverse mode of an enclosing body).
  const BodyTransforms* bodies = nullptr;
  bool for_reverse_mode = false;

  V x(int i) const { return i < static_cast<int>(xs.size()) ? xs[i] : V{}; }
  V y(int i = 0) const { return ys[i]; }
  V t(int i) const { return i < static_cast<int>(ts.size()) ? ts[i] : V{}; }
  bool has(int i) const { return x(i).valid(); }
  int32_t dtype(int i) const { return b.facts(xs[i]).dtype; }
  int64_t rank(int i) const;

  const onnx::AttributeProto* attr(const std::string& name) const;
  int64_t attr_i(const std::string& name, int64_t fallback) const;
  float attr_f(const std::string& name, float fallback) const;
  std::vector<int64_t> attr_ints(const std::string& name) const;

  V scalar(double v) const { return b.scalar(v, dtype(0)); }
  // Emits an expression of the value algebra (emit/value_algebra.h), its constants of input
  // 0's type as scalar() makes them.
  V emit(const Expr& e) const { return e.emit(b, dtype(0)); }
  // Tangent `t` broadcast to primal output k's shape (tangents always have their primal's
  // shape; a tangent of a broadcast operand must be expanded).
  V like_out(V t, int k = 0) const;
  // Marks `t`, a term of the tangent that already has primal output k's shape (the op on one
  // operand's tangent and the others' primals: ta * b, conv(tx, W), ...), with output k as its
  // primal twin, so reverse mode reads its run-time shape where facts do not tell it. Returns t.
  V term(V t, int k = 0) const;
  // Re-emits the node itself on new inputs (for ops linear in some inputs).
  V same_op(const Vs& inputs) const { return b.clone(node, inputs)[0]; }
  Vs same_op_all(const Vs& inputs) const { return b.clone(node, inputs); }

  [[noreturn]] void unsupported(const std::string& what, const std::string& fix) const;
};

using JvpRule = std::function<Vs(JvpCtx&)>;
// A JVP rule for a one-output op given as its tangent's expression: `t(0) * cos(x(0))`.
JvpRule expr_jvp(std::function<Expr(JvpCtx&)> tangent);

// Inputs to a transpose rule: a linear node from the tape, the cotangents of its outputs
// (invalid = zero) and which of its inputs are tangents. Returns cotangents for the inputs
// (only tangent inputs' entries are used).
class TransposeCtx {
 public:
  Builder& b;
  const onnx::NodeProto& node;
  int64_t opset;
  Vs ins;                                  // inputs (tangent or primal)
  SmallVec<bool, 8> lin;                   // which inputs are tangents
  Vs cts;                                  // output cotangents
  Vs outs;                                 // the tape node's outputs (tangents; use only for witnesses/shapes)
  std::string_view origin;                 // the tangent the tape node computed (for diagnostics)
  const BodyTransforms* bodies = nullptr;  // how control-flow rules have bodies differentiated

  V in(int i) const { return i < static_cast<int>(ins.size()) ? ins[i] : V{}; }
  bool linear(int i) const { return i < static_cast<int>(lin.size()) && lin[i]; }
  V ct(int k = 0) const { return cts[k]; }
  const onnx::AttributeProto* attr(const std::string& name) const;
  int64_t attr_i(const std::string& name, int64_t fallback) const;
  std::vector<int64_t> attr_ints(const std::string& name) const;
  int64_t rank(V v) const;
  // `what` failed; the default fix suggests static shapes or forward mode (for rules that
  // need shapes), the two-argument form states its own.
  [[noreturn]] void unsupported(const std::string& what) const;
  [[noreturn]] void unsupported(const std::string& what, const std::string& fix) const;
};

using TransposeRule = std::function<Vs(TransposeCtx&)>;

// `tangent` is the tangent of `primal` (a primal value, not itself a tangent): it takes
// `primal` as its witness (unless it has one) and its facts, which may know more than the
// tangent's inference did (data propagation; static dims where the tangent's are unknown, which
// unbroadcasting would otherwise test at run time).
void bind_tangent(Builder& b, V tangent, V primal);

// Sums `ct` down to the shape of `target` (numpy broadcasting in reverse), deciding axes from
// static facts where possible and from `witness` (a primal value of target's shape) at run
// time otherwise.
V unbroadcast(Builder& b, V ct, V target, V witness = V{});
// The run-time shape (1-D int64) of `t`: a primal's own, a tangent's primal twin's, else built
// from the tape nodes that made it (elementwise ops broadcast their inputs' shapes); invalid
// when none of these tells it.
V runtime_shape(Builder& b, V t, int depth = 0);
// The facts of `v`, or of its primal twin when v's own facts have no rank (a tangent's facts
// are its primal's).
const Facts& facts_or_twin(const Builder& b, V v);
// unbroadcast with the target tangent's recorded witness.
inline V unbroadcast_to(Builder& b, V ct, V target) {
  return unbroadcast(b, ct, target, b.witness(target));
}

// JVP of an op linear in input 0 alone (the others are shapes, indices or parameters it is
// not differentiated in): the op itself on input 0's tangent.
Vs linear_in_first_jvp(JvpCtx& c);

// The run-time shape (1-D int64) of tangent `t`: runtime_shape, else from fully static
// facts; fails with a diagnostic naming `who` otherwise.
V tangent_shape(TransposeCtx& c, V t);
// Transpose of any linear op that copies elements of its single tangent input `i` (Gather,
// Slice, Tile, Pad, ...): apply the op to an index tensor to learn where each output element
// came from, then scatter-add the cotangent there. When the op copies each element at most once
// (Slice, Compress, ReverseSequence: `each_once`), a plain scatter does (no reduction: the form
// older opsets have, and no accumulation).
Vs selection_transpose(TransposeCtx& c, int i = 0, bool each_once = false);

// Element types that carry derivatives: FLOAT and DOUBLE.
bool differentiable_dtype(int32_t dtype);
// JVP of a function op through its ONNX function body (each body node by its own rule).
Vs expand_jvp(JvpCtx& c);
// JVP of `c.node` through `expansion`: nodes computing the node's outputs (by their names) from
// its inputs (by their names), each differentiated with its own rule. Each expansion node is
// emitted again for the primal values its rule needs, except a node whose every output is in
// `known`: the primal values the caller already has (by value, or as another expansion value
// of the same value, by name). The expansion may also read the values in `known` as inputs
// (e.g. the shape of the op's output).
struct KnownPrimal {
  std::unordered_map<std::string, V> values;
  std::unordered_map<std::string, std::string> same_as;
};
// (`primal_outputs`, when given, gets the expansion's values of the node's outputs.)
Vs expansion_jvp(JvpCtx& c, const onnx::GraphProto& expansion, const KnownPrimal* known = nullptr,
                 Vs* primal_outputs = nullptr);

}  // namespace onnax
