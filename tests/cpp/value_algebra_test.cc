// The value algebra rules are written in (emit/value_algebra.h): what an expression emits, in
// which order, and what a symbolic zero saves. The numbers of the rules written in it are
// checked by the Python suite (finite differences, JAX); here, the emitted graphs.
#include "emit/value_algebra.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "emit/builder.h"
#include "facts/facts.h"
#include "ir/names.h"

namespace onnax {
namespace {

class ValueAlgebra : public ::testing::Test {
 protected:
  ValueAlgebra() { b.enable_inference({{"", 18}}); }  // facts for the emitted values

  onnx::GraphProto g;
  NameScope values, nodes;
  Builder b{g, values, nodes, 18};
  const int32_t kFloat = onnx::TensorProto::FLOAT;
  V x = b.existing("x", Facts::of(kFloat, {Dim::of(3)}));
  V t = b.existing("t", Facts::of(kFloat, {Dim::of(3)}));

  std::vector<std::string> ops() const {
    std::vector<std::string> out;
    for (const auto& n : g.node()) out.push_back(n.op_type());
    return out;
  }
  const onnx::NodeProto& last() const { return g.node(g.node_size() - 1); }
};

TEST_F(ValueAlgebra, AZeroTangentTimesAnythingEmitsNothing) {
  const V out = (Expr(V{}) * cos(x)).emit(b, kFloat);
  EXPECT_FALSE(out.valid());
  EXPECT_TRUE(ops().empty());
  // 0 + e is e, e - 0 is e, 0 / e is 0, -0 is 0: no node either.
  EXPECT_EQ((Expr() + t).emit(b, kFloat).id, t.id);
  EXPECT_EQ((Expr(t) - Expr()).emit(b, kFloat).id, t.id);
  EXPECT_FALSE((Expr() / x).emit(b, kFloat).valid());
  EXPECT_FALSE((-Expr()).emit(b, kFloat).valid());
  EXPECT_FALSE(Expr::linear("Cast", {Expr()}, {Attr::i("to", kFloat)}).emit(b, kFloat).valid());
  EXPECT_TRUE(ops().empty());
  // 0 - e is -e.
  (Expr() - t).emit(b, kFloat);
  EXPECT_EQ(ops(), std::vector<std::string>{"Neg"});
}

TEST_F(ValueAlgebra, NodesAreEmittedOperandsFirstLeftToRight) {
  const V out = (sin(x) * cos(x) + t).emit(b, kFloat);
  EXPECT_EQ(ops(), (std::vector<std::string>{"Sin", "Cos", "Mul", "Add"}));
  EXPECT_EQ(b.name(out), last().output(0));
  EXPECT_EQ(last().input(1), "t");
  EXPECT_EQ(g.node(2).input(0), g.node(0).output(0));
  EXPECT_EQ(g.node(2).input(1), g.node(1).output(0));
}

TEST_F(ValueAlgebra, AnExpressionReadTwiceIsEmittedOnce) {
  const Expr s = sin(x);
  (square(s) + s).emit(b, kFloat);
  EXPECT_EQ(ops(), (std::vector<std::string>{"Sin", "Mul", "Add"}));
  EXPECT_EQ(g.node(1).input(0), g.node(0).output(0));
  EXPECT_EQ(g.node(1).input(1), g.node(0).output(0));
  EXPECT_EQ(g.node(2).input(1), g.node(0).output(0));
}

TEST_F(ValueAlgebra, LiteralsAreScalarsOfTheEmittedType) {
  const int32_t kDouble = onnx::TensorProto::DOUBLE;
  const V y = b.existing("y", Facts::of(kDouble, {Dim::of(3)}));
  const V out = (1.0 - square(y)).emit(b, kDouble);
  EXPECT_EQ(b.facts(out).dtype, kDouble);
  const V one = b.scalar(1.0, kDouble);  // the constant the expression used (cached)
  EXPECT_EQ(last().op_type(), "Sub");
  EXPECT_EQ(last().input(0), b.name(one));
  // mask() casts a comparison to the same type.
  const V m = mask(greater(y, 0.0)).emit(b, kDouble);
  EXPECT_EQ(last().op_type(), "Cast");
  EXPECT_EQ(last().attribute(0).i(), kDouble);
  EXPECT_EQ(b.facts(m).dtype, kDouble);
}

TEST_F(ValueAlgebra, AFunctionOfASymbolicZeroIsARuleBug) {
  EXPECT_THROW(cos(Expr()).emit(b, kFloat), std::logic_error);
}

}  // namespace
}  // namespace onnax
