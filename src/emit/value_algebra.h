// A value algebra for rules: expressions over builder values with + - * /, elementary
// functions, comparisons and symbolic zeros, so a derivative rule reads like the math
// (`t * cos(x)`, `t * (1.0 - square(y))`) instead of string-typed node calls.
//
// Expressions are lazy: building one emits nothing, `emit` writes its nodes. Two reasons:
//   - Order. C++ leaves the evaluation order of an operator's operands unspecified, so eager
//     operators would emit `sin(x) * cos(x)`'s two nodes in a compiler-dependent order (and
//     name them accordingly). `emit` walks the tree depth first, operands left to right, so the
//     nodes and their names are the same whatever the compiler, and the same as the equivalent
//     `b.op1("Mul", {b.op1("Sin", ...), b.op1("Cos", ...)})`.
//   - Zeros. An invalid V is a symbolic zero. Arithmetic on zeros simplifies when the
//     expression is built (0 * e = 0, 0 + e = e, e - 0 = e, 0 - e = -e, 0 / e = 0, -0 = 0), so
//     `t * f'(x)` with a zero tangent emits nothing at all, not even f'(x), and a rule needs no
//     test for a missing tangent. These are exactly Builder::add/sub/mul/div/neg's rules.
// An expression emits each of its nodes once, however often the tree reads it (`square(e)`
// is one Mul reading e's value twice).
// Literal numbers are scalar constants of the float type `emit` is given (a rule's input
// type), as Builder::scalar makes them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string_view>

#include "emit/builder.h"

namespace onnax {

class Expr {
 public:
  Expr() = default;       // the symbolic zero
  Expr(V v);              // a value; an invalid V is the symbolic zero (implicit: rules mix V and Expr)
  Expr(double constant);  // a scalar constant (implicit: `1.0 - y`)

  bool is_zero() const { return node_ == nullptr; }
  // Writes the expression's nodes through `b`, constants of element type `dtype`; returns its
  // value (invalid for the symbolic zero).
  V emit(Builder& b, int32_t dtype) const;

  // Node `type` (one output) on `args`, none of them a symbolic zero: a function of zero is not
  // zero in general, so a rule applies functions to primal values only (emit refuses a zero
  // operand as an internal error).
  static Expr apply(std::string_view type, std::initializer_list<Expr> args, Attrs attrs = {});
  // Node `type` on `args` for an op linear in its first input (Cast, Transpose, ...): the
  // symbolic zero when that input is.
  static Expr linear(std::string_view type, std::initializer_list<Expr> args, Attrs attrs = {});

 private:
  struct Node;
  explicit Expr(std::shared_ptr<Node> node) : node_(std::move(node)) {}
  static Expr make(std::string_view type, std::initializer_list<Expr> args, Attrs attrs, bool cast_to_float);
  friend Expr mask(const Expr& boolean);
  std::shared_ptr<Node> node_;
};

Expr operator+(const Expr& a, const Expr& b);
Expr operator-(const Expr& a, const Expr& b);
Expr operator*(const Expr& a, const Expr& b);
Expr operator/(const Expr& a, const Expr& b);
Expr operator-(const Expr& a);

// a * a (one Mul reading a's value twice).
Expr square(const Expr& a);
// Elementary functions: the ONNX op of the same name.
Expr exp(const Expr& a);
Expr log(const Expr& a);
Expr sqrt(const Expr& a);
Expr reciprocal(const Expr& a);
Expr abs(const Expr& a);
Expr sin(const Expr& a);
Expr cos(const Expr& a);
Expr sinh(const Expr& a);
Expr cosh(const Expr& a);
Expr tanh(const Expr& a);
Expr sigmoid(const Expr& a);
Expr softplus(const Expr& a);
Expr erf(const Expr& a);
// Comparisons and logic: bool-valued.
Expr greater(const Expr& a, const Expr& b);
Expr greater_or_equal(const Expr& a, const Expr& b);
Expr less(const Expr& a, const Expr& b);
Expr equal(const Expr& a, const Expr& b);
Expr logical_and(const Expr& a, const Expr& b);
Expr logical_or(const Expr& a, const Expr& b);
// cond ? a : b, elementwise (Where).
Expr where(const Expr& cond, const Expr& a, const Expr& b);
// A bool expression as 1/0 of emit's float type (Cast).
Expr mask(const Expr& boolean);

}  // namespace onnax
