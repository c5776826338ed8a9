// The checks behind `onnax check`: checker and strict shape inference failures come back as
// one-line diagnostics with a fix; symbolic-length and embedded-weight problems name the value,
// the axis, what was found and what was expected.
#include "check/model_check.h"

#include "test_util.h"

namespace onnax {
namespace {
using testing::parse;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

constexpr const char* kGood = R"(
  <ir_version: 10, opset_import: ["" : 18]>
  g (float[N, 2] x) => (float[N, 2] y)
  <float[2] w = {1.0, 2.0}>
  { y = Mul(x, w) }
)";

TEST(ModelCheck, GoodModelPasses) {
  const onnx::ModelProto m = parse(kGood);
  EXPECT_EQ(check::checker(m), "");
  EXPECT_EQ(check::strict_shape_inference(m), "");
  EXPECT_TRUE(check::symbolic_lengths(m, {{"x", {0}}, {"y", {-2}}}).empty());
  EXPECT_TRUE(check::embedded_weights(m, {"w"}).empty());
}

TEST(ModelCheck, CheckerNamesTheUndefinedValue) {
  const onnx::ModelProto m = parse(R"(
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[2] x) => (float[2] y) { y = Relu(undefined_value) }
  )");
  const std::string msg = check::checker(m);
  EXPECT_TRUE(contains(msg, "the ONNX checker rejects the model")) << msg;
  EXPECT_TRUE(contains(msg, "undefined_value")) << msg;
  EXPECT_TRUE(contains(msg, "Fix:")) << msg;
  EXPECT_FALSE(contains(msg, "\n")) << msg;
}

TEST(ModelCheck, StrictInferenceCatchesAWrongDeclaredShape) {
  const onnx::ModelProto m = parse(R"(
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[2] x) => (float[3] y) { y = Relu(x) }
  )");
  EXPECT_EQ(check::checker(m), "");
  const std::string msg = check::strict_shape_inference(m);
  EXPECT_TRUE(contains(msg, "strict ONNX shape inference fails")) << msg;
  EXPECT_TRUE(contains(msg, "(2) vs (3)")) << msg;
  EXPECT_TRUE(contains(msg, "Fix:")) << msg;
}

TEST(ModelCheck, BakedLengthAndBadAxes) {
  const onnx::ModelProto m = parse(kGood);
  auto problems = check::symbolic_lengths(m, {{"x", {1, 2}}, {"z", {0}}});
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_TRUE(contains(problems[0], "axis 1 of 'x' is baked to 2 (shape [N, 2])")) << problems[0];
  EXPECT_TRUE(contains(problems[1], "axis 2 of 'x' is out of range for rank 2")) << problems[1];
  EXPECT_TRUE(contains(problems[2], "'z' is not a graph input or output; available: [x, y]")) << problems[2];
}

TEST(ModelCheck, WeightsMustBeInitializersOnly) {
  const onnx::ModelProto m = parse(R"(
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[2] x, float[2] w, float[2] b) => (float[2] y)
    <float[2] b = {1.0, 2.0}, float[2] c = {0.0, 1.0}>
    { t = Mul(x, w)  u = Add(t, b)  y = Add(u, c) }
  )");
  auto problems = check::embedded_weights(m, {"w", "b", "c", "d"});
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_TRUE(contains(problems[0], "'w' is a runtime graph input, expected an initializer")) << problems[0];
  EXPECT_TRUE(contains(problems[1], "'b' is an initializer but also a graph input")) << problems[1];
  EXPECT_TRUE(contains(problems[2], "'d' is neither an initializer nor a graph input; initializers: [b, c]"))
      << problems[2];
}

}  // namespace
}  // namespace onnax
