// Transforms of a model the caller gives away (rvalue overloads) move its nodes and
// initializers into the result instead of copying them. They must give exactly the bytes the
// const overloads give, on every path that treats a private graph differently: nodes copied
// unchanged, nodes batched in place, initializers that are outputs, unsorted graphs,
// subgraphs and opset upgrades. The serialized entry points (parse onto an arena, transform
// there, serialize) and the in-place ones (on a model the caller keeps, here on an arena, as
// the onnax command does) must give those bytes too.
#include <google/protobuf/arena.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace onnax {
namespace {
using testing::parse;

// `transform` applied in place to a copy of `m` on an arena, serialized.
template <typename Fn>
std::string in_place_on_arena(const onnx::ModelProto& m, Fn transform) {
  google::protobuf::Arena arena;
  onnx::ModelProto& copy = *google::protobuf::Arena::CreateMessage<onnx::ModelProto>(&arena);
  copy = m;
  transform(copy);
  return copy.SerializeAsString();
}

const std::vector<std::string>& vmap_models() {
  static const std::vector<std::string> models = {
      // Shared computation, a batched chain and a shared output broadcast to the batch.
      R"(<ir_version: 10, opset_import: ["" : 18]>
g (float[N, 4] x, float[4, 3] w) => (float[N, 3] y, float[3] s) {
  h = MatMul(x, w)
  r = Relu(h)
  y = Tanh(r)
  s = ReduceSum<keepdims = 0>(w)
})",
      // An initializer that is also a graph output (renamed in a private graph).
      R"(<ir_version: 10, opset_import: ["" : 18]>
g (float[3] x) => (float[3] y, float[3] c) <float[3] c = {1.0, 2.0, 3.0}> {
  y = Add(x, c)
})",
      // Nodes out of topological order (sorted into a private graph).
      R"(<ir_version: 10, opset_import: ["" : 18]>
g (float[3] x) => (float[3] y) {
  y = Neg(a)
  a = Exp(x)
})",
      // A subgraph reading a batched value (per-example Scan).
      R"(<ir_version: 10, opset_import: ["" : 18]>
g (float[3] x, bool c) => (float[3] y) {
  y = If(c) <then_branch = t () => (float[3] a) { a = Relu(x) },
             else_branch = e () => (float[3] b) { b = Neg(x) }>
})",
      // Opset 17: upgraded by the version converter first.
      R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3] x) => (float[2] y) {
  e = Exp(x)
  y = ReduceSum<keepdims = 0>(e, axes)
  axes = Constant<value = int64[1] {1}>()
})",
  };
  return models;
}

TEST(RvalueTransforms, VmapGivesTheSameBytesAsTheConstOverload) {
  VmapOptions opt;  // every runtime input batched at axis 0
  for (const std::string& text : vmap_models()) {
    const onnx::ModelProto m = parse(text);
    const std::string expected = vmap(m, opt).SerializeAsString();
    onnx::ModelProto given = m;
    EXPECT_EQ(vmap(std::move(given), opt).SerializeAsString(), expected) << text;
    EXPECT_EQ(vmap_serialized(m.SerializeAsString(), opt), expected) << text;
    EXPECT_EQ(in_place_on_arena(m, [&](onnx::ModelProto& x) { vmap_in_place(x, opt); }), expected) << text;
  }
}

TEST(RvalueTransforms, DerivativesGiveTheSameBytesAsTheConstOverloads) {
  const onnx::ModelProto m = parse(R"(<ir_version: 10, opset_import: ["" : 18]>
g (float[4] x, float[4] w, int64[4] k, float[2] unused) => (float loss, int64[4] k2) {
  h = Mul(x, w)
  t = Tanh(h)
  m = MatMul(t, w)
  loss = ReduceSum<keepdims = 0>(m)
  k2 = Add(k, k)
})");
  const std::string g = grad(m, std::vector<std::string>{"x", "w"}, "loss").SerializeAsString();
  onnx::ModelProto g_in = m;
  EXPECT_EQ(grad(std::move(g_in), std::vector<std::string>{"x", "w"}, "loss").SerializeAsString(), g);
  EXPECT_EQ(grad_serialized(m.SerializeAsString(), std::vector<std::string>{"x", "w"}, "loss"), g);
  EXPECT_EQ(in_place_on_arena(m,
                              [](onnx::ModelProto& x) {
                                grad_in_place(x, std::vector<std::string>{"x", "w"}, "loss");
                              }),
            g);
  const Selection sel{std::vector<std::string>{"w"}, std::vector<std::string>{"loss"}};
  const std::string j = jvp(m, sel).SerializeAsString();
  onnx::ModelProto j_in = m;
  EXPECT_EQ(jvp(std::move(j_in), sel).SerializeAsString(), j);
  EXPECT_EQ(jvp_serialized(m.SerializeAsString(), sel), j);
  EXPECT_EQ(in_place_on_arena(m, [&](onnx::ModelProto& x) { jvp_in_place(x, sel); }), j);
  const std::string v = vjp(m, sel).SerializeAsString();
  onnx::ModelProto v_in = m;
  EXPECT_EQ(vjp(std::move(v_in), sel).SerializeAsString(), v);
  EXPECT_EQ(vjp_serialized(m.SerializeAsString(), sel), v);
  EXPECT_EQ(in_place_on_arena(m, [&](onnx::ModelProto& x) { vjp_in_place(x, sel); }), v);
  // Composition on a consumed intermediate: jvp(grad(f)) appends a Hessian-vector product.
  onnx::ModelProto gm = grad(m, std::vector<std::string>{"w"}, "loss");
  const std::string hvp = jvp(gm, Selection{std::vector<std::string>{"w"}, std::nullopt}).SerializeAsString();
  EXPECT_EQ(jvp_serialized(gm.SerializeAsString(), Selection{std::vector<std::string>{"w"}, std::nullopt}), hvp);
  EXPECT_EQ(jvp(std::move(gm), Selection{std::vector<std::string>{"w"}, std::nullopt}).SerializeAsString(), hvp);
}

}  // namespace
}  // namespace onnax
