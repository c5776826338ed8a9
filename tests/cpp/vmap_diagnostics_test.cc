// Diagnostics of vmap: each message names what failed, actual vs expected, and a fix.
#include "test_util.h"

namespace onnax {
namespace {
using testing::error_of;
using testing::parse;

const char* kLinear = R"(
<ir_version: 10, opset_import: ["" : 18]>
linear (float[2] x, float[2] weight) => (float loss) {
  prediction = Mul(x, weight)
  squared = Mul(prediction, prediction)
  loss = ReduceSum<keepdims = 0>(squared)
}
)";

TEST(VmapDiagnostics, AxisOutOfRangeNamesInputRankAndRange) {
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
  opt.in_axes = {Axis{2}, std::nullopt};
  Error::Kind kind{};
  std::string msg = error_of([&] { vmap(parse(kLinear), opt); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kSelection);
  EXPECT_NE(msg.find("input 'x'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[-2, 1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Fix:"), std::string::npos) << msg;
}

TEST(VmapDiagnostics, WrongCountListsInputs) {
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
  opt.in_axes = {Axis{0}, std::nullopt, Axis{0}};
  std::string msg = error_of([&] { vmap(parse(kLinear), opt); });
  EXPECT_NE(msg.find("3 entries"), std::string::npos) << msg;
  EXPECT_NE(msg.find("['x', 'weight']"), std::string::npos) << msg;
}

TEST(VmapDiagnostics, UnknownNameListsAvailableNames) {
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kByName;
  opt.in_axes_by_name = {{"inputs", Axis{0}}};
  std::string msg = error_of([&] { vmap(parse(kLinear), opt); });
  EXPECT_NE(msg.find("'inputs'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("['x', 'weight']"), std::string::npos) << msg;
}

TEST(VmapDiagnostics, AllNoneIsRejected) {
  VmapOptions opt;
  opt.in_axis = std::nullopt;
  std::string msg = error_of([&] { vmap(parse(kLinear), opt); });
  EXPECT_NE(msg.find("batches no input"), std::string::npos) << msg;
}

TEST(VmapDiagnostics, UnsupportedOpNamesModeOpOpsetNodeAndInput) {
  auto m = parse(R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[3] x) => (float[3] y) {
  y = RandomNormalLike(x)
}
)");
  m.mutable_graph()->mutable_node(0)->set_name("noise");
  Error::Kind kind{};
  std::string msg = error_of([&] { vmap(m, {}); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kUnsupported);
  EXPECT_NE(msg.find("vmap"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ai.onnx::RandomNormalLike"), std::string::npos) << msg;
  EXPECT_NE(msg.find("opset 18"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 'noise'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("random"), std::string::npos) << msg;
}

TEST(VmapDiagnostics, BatchedShapeArgumentNamesTheInput) {
  auto m = parse(R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[6] x, int64[2] s) => (float[2, 3] y) {
  y = Reshape(x, s)
}
)");
  std::string msg = error_of([&] { vmap(m, {}); });
  EXPECT_NE(msg.find("input 1 's'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("int64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("batched"), std::string::npos) << msg;
}

TEST(VmapDiagnostics, OpsetOutsideIntervalGivesVersionAndInterval) {
  auto m = parse(R"(
<ir_version: 3, opset_import: ["" : 6]>
g (float[3] x) => (float[3] y) { y = Relu(x) }
)");
  Error::Kind kind{};
  std::string msg = error_of([&] { vmap(m, {}); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kVersion);
  EXPECT_NE(msg.find("opset is 6"), std::string::npos) << msg;
  EXPECT_NE(msg.find("18-28"), std::string::npos) << msg;
  EXPECT_NE(msg.find("7-17 are upgraded"), std::string::npos) << msg;
}

TEST(VmapDiagnostics, OldOpsetComesBackAtItsOpset) {
  auto m = parse(R"(
<ir_version: 7, opset_import: ["" : 11]>
g (float[3] x) => (float[3] y) { y = Relu(x) }
)");
  onnx::ModelProto out = vmap(m, {});
  int64_t version = -1;
  for (const auto& o : out.opset_import())
    if (o.domain().empty()) version = o.version();
  EXPECT_EQ(version, 11);  // transformed at 18, written back at 11 (every node has a form there)
}

TEST(VmapDiagnostics, CycleAndDanglingInputAreInvalidModels) {
  auto cyc = parse(R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[3] x) => (float[3] y) {
  a = Add(x, b)
  b = Relu(a)
  y = Identity(b)
}
)");
  Error::Kind kind{};
  std::string msg = error_of([&] { vmap(cyc, {}); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kInvalidModel);
  EXPECT_NE(msg.find("cycle"), std::string::npos) << msg;

  auto dangling = parse(R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[3] x) => (float[3] y) { y = Add(x, ghost) }
)");
  msg = error_of([&] { vmap(dangling, {}); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kInvalidModel);
  EXPECT_NE(msg.find("'ghost'"), std::string::npos) << msg;
}

TEST(VmapDiagnostics, CustomOpNamesBatchedInputs) {
  auto m = parse(R"(
<ir_version: 10, opset_import: ["" : 18, "com.example" : 1]>
g (float[2, 5] feature_x) => (float[2, 5] y) { y = com.example.Foo(feature_x) }
)");
  Error::Kind kind{};
  std::string msg = error_of([&] { vmap(m, {}); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kUnsupported);
  EXPECT_NE(msg.find("com.example::Foo"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'feature_x' (per-example shape [2, 5], float32)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace onnax
