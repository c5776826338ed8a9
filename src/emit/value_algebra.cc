#include "emit/value_algebra.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace onnax {

struct Expr::Node {
  enum class Kind { kValue, kConstant, kOp };
  Kind kind = Kind::kValue;
  V value;                              // kValue
  double constant = 0;                  // kConstant
  std::string type;                     // kOp: the node's op type
  std::vector<Expr> args;               // kOp: its inputs
  Attrs attrs;                          // kOp: its attributes
  bool to_emit_dtype = false;           // kOp: a Cast whose `to` is emit's dtype
  const Builder* emitted_by = nullptr;  // the builder and dtype of the one emission (memo)
  int32_t emitted_dtype = 0;
  V emitted;
};

Expr::Expr(V v) {
  if (!v.valid()) return;
  node_ = std::make_shared<Node>();
  node_->value = v;
}

Expr::Expr(double constant) : node_(std::make_shared<Node>()) {
  node_->kind = Node::Kind::kConstant;
  node_->constant = constant;
}

Expr Expr::make(std::string_view type, std::initializer_list<Expr> args, Attrs attrs, bool cast_to_float) {
  auto node = std::make_shared<Node>();
  node->kind = Node::Kind::kOp;
  node->type = type;
  node->args.assign(args.begin(), args.end());
  node->attrs = std::move(attrs);
  node->to_emit_dtype = cast_to_float;
  return Expr(std::move(node));
}

Expr Expr::apply(std::string_view type, std::initializer_list<Expr> args, Attrs attrs) {
  return make(type, args, std::move(attrs), false);
}

Expr Expr::linear(std::string_view type, std::initializer_list<Expr> args, Attrs attrs) {
  if (args.size() == 0 || args.begin()->is_zero()) return Expr();
  return make(type, args, std::move(attrs), false);
}

V Expr::emit(Builder& b, int32_t dtype) const {
  if (!node_) return V{};
  Node& n = *node_;
  switch (n.kind) {
    case Node::Kind::kValue: return n.value;
    case Node::Kind::kConstant: return b.scalar(n.constant, dtype);
    case Node::Kind::kOp: break;
  }
  if (n.emitted_by == &b && n.emitted_dtype == dtype) return n.emitted;
  Vs inputs;
  for (const Expr& arg : n.args) {
    // A bug in a rule, not in the model: say which op got the zero.
    if (arg.is_zero()) throw std::logic_error("value algebra: " + n.type + " of a symbolic zero");
    inputs.push_back(arg.emit(b, dtype));
  }
  Attrs attrs = n.attrs;
  if (n.to_emit_dtype) attrs.push_back(Attr::i("to", dtype));
  n.emitted = b.op1(n.type, inputs, attrs);
  n.emitted_by = &b;
  n.emitted_dtype = dtype;
  return n.emitted;
}

// The symbolic-zero rules are Builder::add/sub/mul/div/neg's, applied as the tree is built.
Expr operator+(const Expr& a, const Expr& b) {
  if (a.is_zero()) return b;
  if (b.is_zero()) return a;
  return Expr::apply("Add", {a, b});
}
Expr operator-(const Expr& a, const Expr& b) {
  if (b.is_zero()) return a;
  if (a.is_zero()) return -b;
  return Expr::apply("Sub", {a, b});
}
Expr operator*(const Expr& a, const Expr& b) {
  if (a.is_zero() || b.is_zero()) return Expr();
  return Expr::apply("Mul", {a, b});
}
Expr operator/(const Expr& a, const Expr& b) {
  if (a.is_zero()) return Expr();
  return Expr::apply("Div", {a, b});
}
Expr operator-(const Expr& a) {
  if (a.is_zero()) return Expr();
  return Expr::apply("Neg", {a});
}

Expr square(const Expr& a) {
  return a * a;
}
Expr exp(const Expr& a) {
  return Expr::apply("Exp", {a});
}
Expr log(const Expr& a) {
  return Expr::apply("Log", {a});
}
Expr sqrt(const Expr& a) {
  return Expr::apply("Sqrt", {a});
}
Expr reciprocal(const Expr& a) {
  return Expr::apply("Reciprocal", {a});
}
Expr abs(const Expr& a) {
  return Expr::apply("Abs", {a});
}
Expr sin(const Expr& a) {
  return Expr::apply("Sin", {a});
}
Expr cos(const Expr& a) {
  return Expr::apply("Cos", {a});
}
Expr sinh(const Expr& a) {
  return Expr::apply("Sinh", {a});
}
Expr cosh(const Expr& a) {
  return Expr::apply("Cosh", {a});
}
Expr tanh(const Expr& a) {
  return Expr::apply("Tanh", {a});
}
Expr sigmoid(const Expr& a) {
  return Expr::apply("Sigmoid", {a});
}
Expr softplus(const Expr& a) {
  return Expr::apply("Softplus", {a});
}
Expr erf(const Expr& a) {
  return Expr::apply("Erf", {a});
}
Expr greater(const Expr& a, const Expr& b) {
  return Expr::apply("Greater", {a, b});
}
Expr greater_or_equal(const Expr& a, const Expr& b) {
  return Expr::apply("GreaterOrEqual", {a, b});
}
Expr less(const Expr& a, const Expr& b) {
  return Expr::apply("Less", {a, b});
}
Expr equal(const Expr& a, const Expr& b) {
  return Expr::apply("Equal", {a, b});
}
Expr logical_and(const Expr& a, const Expr& b) {
  return Expr::apply("And", {a, b});
}
Expr logical_or(const Expr& a, const Expr& b) {
  return Expr::apply("Or", {a, b});
}
Expr where(const Expr& cond, const Expr& a, const Expr& b) {
  return Expr::apply("Where", {cond, a, b});
}
Expr mask(const Expr& boolean) {
  return Expr::make("Cast", {boolean}, {}, true);
}

}  // namespace onnax
