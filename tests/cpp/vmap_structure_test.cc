// Structural properties of vmap that need no runtime: source isolation, determinism,
// shared values staying shared, symbolic dims, names. (Numbers are checked in tests/python.)
#include <string>
#include <vector>

#include "test_util.h"

namespace onnax {
namespace {
using testing::parse;

const char* kModel = R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[N, 4] x, float[4, 3] w) => (float[N, 3] y, float[3] bias_out) {
  h = MatMul(x, w)
  y = Relu(h)
  bias_out = ReduceSum<keepdims = 0>(w, axes)
}
)";

onnx::ModelProto model_with_axes() {
  auto m = parse(kModel);
  auto* t = m.mutable_graph()->add_initializer();
  t->set_name("axes");
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(1);
  t->add_int64_data(0);
  return m;
}

TEST(VmapStructure, SourceUnchangedAndOutputDeterministic) {
  auto m = model_with_axes();
  const std::string before = m.SerializeAsString();
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
  opt.in_axes = {Axis{0}, std::nullopt};
  std::string a = vmap(m, opt).SerializeAsString();
  std::string b = vmap(m, opt).SerializeAsString();
  EXPECT_EQ(m.SerializeAsString(), before);
  EXPECT_EQ(a, b);
}

TEST(VmapStructure, BatchDimIsSymbolicAndSourceDimsStaySymbolic) {
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
  opt.in_axes = {Axis{1}, std::nullopt};
  opt.axis_name = "examples";
  auto out = vmap(model_with_axes(), opt);
  const auto& x = out.graph().input(0).type().tensor_type().shape();
  ASSERT_EQ(x.dim_size(), 3);
  EXPECT_EQ(x.dim(0).dim_param(), "N");
  EXPECT_EQ(x.dim(1).dim_param(), "examples");
  EXPECT_EQ(x.dim(2).dim_value(), 4);
  const auto& y = out.graph().output(0).type().tensor_type().shape();
  ASSERT_EQ(y.dim_size(), 3);
  EXPECT_EQ(y.dim(0).dim_param(), "examples");
  EXPECT_EQ(y.dim(1).dim_param(), "N");
}

TEST(VmapStructure, SharedComputationIsNotBatchedButSharedOutputIsBroadcast) {
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
  opt.in_axes = {Axis{0}, std::nullopt};
  auto out = vmap(model_with_axes(), opt);
  // The ReduceSum over w is copied unchanged (same op, reads w itself)...
  int reduce_on_w = 0;
  for (const auto& n : out.graph().node())
    if (n.op_type() == "ReduceSum" && n.input(0) == "w") ++reduce_on_w;
  EXPECT_EQ(reduce_on_w, 1);
  // ...and its output gains the batch dim only at the end.
  const auto& b = out.graph().output(1).type().tensor_type().shape();
  ASSERT_EQ(b.dim_size(), 2);
  EXPECT_EQ(b.dim(0).dim_param(), "batch");
  // The weight stays an unbatched input.
  EXPECT_EQ(out.graph().input(1).type().tensor_type().shape().dim_size(), 2);
}

TEST(VmapStructure, DefaultAxisNameAvoidsExistingDimParams) {
  auto m = parse(R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[batch, 4] x) => (float[batch, 4] y) { y = Relu(x) }
)");
  auto out = vmap(m, {});
  EXPECT_EQ(out.graph().input(0).type().tensor_type().shape().dim(0).dim_param(), "batch_1");
}

TEST(VmapStructure, InitializersStayInitializersOrGoWhenReplaced) {
  // The rule reduces over the shifted axes, a constant of its own: the source's `axes`
  // initializer, read by nothing, leaves the result; it never becomes an input.
  auto out = vmap(model_with_axes(), {});
  EXPECT_EQ(out.graph().initializer_size(), 0);
  for (const auto& in : out.graph().input()) EXPECT_NE(in.name(), "axes");
}

TEST(VmapStructure, OldOpsetIsTransformedAt18AndWrittenBack) {
  auto m = parse(R"(
<ir_version: 8, opset_import: ["" : 13]>
g (float[2, 3] x) => (float[2] y) { y = ReduceMean<axes = [1], keepdims = 0>(x) }
)");
  auto out = vmap(m, {});
  int64_t opset = 0;
  for (const auto& o : out.opset_import())
    if (o.domain().empty()) opset = o.version();
  EXPECT_EQ(opset, 13);
  // ReduceMean at 13 takes axes as an attribute, shifted past the batch axis.
  bool found = false;
  for (const auto& n : out.graph().node())
    if (n.op_type() == "ReduceMean" && n.input_size() == 1)
      for (const auto& a : n.attribute())
        if (a.name() == "axes") found = a.ints_size() == 1 && a.ints(0) == 2;
  EXPECT_TRUE(found);
}

// y = If(c) of Relu(x) or Neg(x): both branches read x from the graph.
constexpr const char* kIfOnCapturedX = R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[3] x, bool c) => (float[3] y) {
  y = If(c) <then_branch = t () => (float[3] a) { a = Relu(x) },
             else_branch = e () => (float[3] b) { b = Neg(x) }>
}
)";

// An If whose condition is shared runs once for the batch: its branches are batched in place
// and read the batched value itself.
TEST(VmapStructure, IfWithSharedConditionIsBatchedInPlace) {
  auto m = parse(kIfOnCapturedX);
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
  opt.in_axes = {Axis{0}, std::nullopt};
  auto out = vmap(m, opt);
  const onnx::NodeProto* if_node = nullptr;
  for (const auto& n : out.graph().node()) {
    EXPECT_NE(n.op_type(), "Scan");
    EXPECT_NE(n.op_type(), "Loop");
    if (n.op_type() == "If") if_node = &n;
  }
  ASSERT_NE(if_node, nullptr);
  EXPECT_EQ(if_node->input(0), "c");
  for (const auto& a : if_node->attribute()) {
    bool reads_x = false;
    for (const auto& n : a.g().node())
      for (const auto& i : n.input()) reads_x = reads_x || i == "x";
    EXPECT_TRUE(reads_x) << a.name();
  }
}

// With a batched condition, examples take different branches: a per-example Scan whose body
// gives the subgraph that example's slice under a new name.
TEST(VmapStructure, IfWithBatchedConditionRunsPerExample) {
  auto m = parse(kIfOnCapturedX);
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
  opt.in_axes = {Axis{0}, Axis{0}};
  auto out = vmap(m, opt);
  const onnx::NodeProto* scan = nullptr;
  for (const auto& n : out.graph().node())
    if (n.op_type() == "Scan") scan = &n;
  ASSERT_NE(scan, nullptr);
  const auto& body = scan->attribute(0).g();
  ASSERT_EQ(body.node_size(), 1);
  const auto& if_node = body.node(0);
  EXPECT_EQ(if_node.op_type(), "If");
  std::string slice_x;
  for (int i = 0; i < scan->input_size(); ++i)
    if (scan->input(i) == "x") slice_x = body.input(i).name();
  ASSERT_FALSE(slice_x.empty());
  EXPECT_NE(slice_x, "x");
  for (const auto& a : if_node.attribute()) EXPECT_EQ(a.g().node(0).input(0), slice_x);
}

TEST(VmapStructure, NodesThatBatchInPlaceKeepTheirNodeAndValueNames) {
  auto m = parse(R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[4, 3] x, float[3, 3] w, float[3] b) => (float[4, 3] y) {
  h = MatMul(x, w)
  a = Add(h, b)
  y = Tanh(a)
}
)");
  auto* g = m.mutable_graph();
  g->mutable_node(0)->set_name("layer0/matmul");
  g->mutable_node(1)->set_name("layer0/bias");
  g->mutable_node(2)->set_name("layer0/act");
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
  opt.in_axes = {Axis{0}, std::nullopt, std::nullopt};
  auto out = vmap(m, opt);
  std::vector<std::string> names, outputs;
  for (const auto& n : out.graph().node()) {
    names.push_back(n.name());
    outputs.push_back(n.output(0));
  }
  // MatMul and Add batch in place (the weights broadcast over the batch axis); Tanh feeds the
  // graph output, which takes its name through the rule's own renaming.
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(names[0], "layer0/matmul");
  EXPECT_EQ(names[1], "layer0/bias");
  EXPECT_EQ(outputs[0], "h");
  EXPECT_EQ(outputs[1], "a");
  EXPECT_EQ(outputs.back(), "y");
}

// prepare reads the caller's graph in place (no private copy unless it must sort, inline or
// upgrade); ONNX's inference of subgraph attributes writes value_info into them, which must
// never reach the source.
TEST(VmapStructure, SourceWithSubgraphsIsNeverWritten) {
  auto m = parse(R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[3] x, bool c) => (float[3] y, float[3] z) {
  y = If(c) <then_branch = t () => (float[3] a) { r = Relu(x) a = Neg(r) },
             else_branch = e () => (float[3] b) { b = Neg(x) }>
  z = Tanh(x)
}
)");
  const std::string before = m.SerializeAsString();
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
  opt.in_axes = {Axis{0}, std::nullopt};
  const std::string a = vmap(m, opt).SerializeAsString();
  EXPECT_EQ(m.SerializeAsString(), before);
  EXPECT_EQ(vmap(m, opt).SerializeAsString(), a);
  Selection sel;
  sel.inputs = std::vector<std::string>{"x"};
  sel.outputs = std::vector<std::string>{"z"};
  jvp(m, sel);
  EXPECT_EQ(m.SerializeAsString(), before);
}

}  // namespace
}  // namespace onnax
