// fast_infer must agree with ONNX's own per-node inference wherever it answers: it replaces
// that inference for speed, so ONNX is the oracle here.
#include "facts/fast_shapes.h"

#include <gtest/gtest.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace onnax {
namespace {

// What ONNX's inference gives for `node` (nullopt when it throws).
std::optional<onnx::TypeProto> onnx_infer(onnx::NodeProto& node, int opset,
                                          std::unordered_map<std::string, onnx::TypeProto*>& types) {
  const auto* schema = onnx::OpSchemaRegistry::Schema(node.op_type(), opset, "");
  if (!schema) return std::nullopt;
  std::unordered_map<std::string, const onnx::TensorProto*> data;
  std::unordered_map<std::string, const onnx::SparseTensorProto*> sparse;
  onnx::shape_inference::DataValueMap generated;
  const onnx::ShapeInferenceOptions options(false, 0, true);
  try {
    onnx::shape_inference::InferenceContextImpl ctx(node, types, data, sparse, options, &generated);
    schema->GetTypeAndShapeInferenceFunction()(ctx);
    return *ctx.getOutputType(0);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// fast_infer over the facts of `types` (missing names are unknown), written back as a type.
bool fast_types(const onnx::NodeProto& node, int opset, const std::unordered_map<std::string, onnx::TypeProto*>& types,
                onnx::TypeProto* out) {
  std::vector<Facts> facts(static_cast<size_t>(node.input_size()));
  std::vector<const Facts*> inputs(static_cast<size_t>(node.input_size()), nullptr);
  for (int i = 0; i < node.input_size(); ++i) {
    auto it = types.find(node.input(i));
    if (it == types.end()) continue;
    facts[static_cast<size_t>(i)] = facts_from_type(*it->second);
    inputs[static_cast<size_t>(i)] = &facts[static_cast<size_t>(i)];
  }
  Facts result;
  if (!fast_infer(node, node.input_size(), node.output_size(), opset, inputs.data(), result)) return false;
  write_type(result, out);
  return true;
}

onnx::TypeProto random_type(std::mt19937& rng, int32_t dtype) {
  onnx::TypeProto t;
  auto* tt = t.mutable_tensor_type();
  tt->set_elem_type(dtype);
  if (rng() % 8 == 0) return t;  // no shape
  const int rank = static_cast<int>(rng() % 5);
  auto* shape = tt->mutable_shape();
  for (int i = 0; i < rank; ++i) {
    auto* d = shape->add_dim();
    switch (rng() % 6) {
      case 0: d->set_dim_value(1); break;
      case 1: d->set_dim_value(3); break;
      case 2: d->set_dim_value(4); break;
      case 3: d->set_dim_param("N"); break;
      case 4: d->set_dim_param("M"); break;
      default: break;  // unknown
    }
  }
  return t;
}

TEST(FastShapes, AgreesWithOnnxInference) {
  const std::vector<std::pair<std::string, int>> ops = {{"Abs", 1},
                                                        {"Relu", 1},
                                                        {"Tanh", 1},
                                                        {"Sigmoid", 1},
                                                        {"Identity", 1},
                                                        {"Gelu", 1},
                                                        {"HardSwish", 1},
                                                        {"Mish", 1},
                                                        {"Celu", 1},
                                                        {"Erf", 1},
                                                        {"Softplus", 1},
                                                        {"Round", 1},
                                                        {"ThresholdedRelu", 1},
                                                        {"LeakyRelu", 1},
                                                        {"Add", 2},
                                                        {"Sub", 2},
                                                        {"Mul", 2},
                                                        {"Div", 2},
                                                        {"Pow", 2},
                                                        {"Max", 3},
                                                        {"Min", 1},
                                                        {"Sum", 3},
                                                        {"Mean", 2},
                                                        {"MatMul", 2},
                                                        {"Transpose", 1}};
  const std::vector<int32_t> dtypes = {onnx::TensorProto::FLOAT, onnx::TensorProto::DOUBLE, onnx::TensorProto::FLOAT16,
                                       onnx::TensorProto::INT64};
  onnx::NodeProto node_template;
  node_template.add_output()->assign("y");
  std::mt19937 rng(7);
  int answered = 0;
  for (int opset : {18, 20, 24, 28}) {
    for (const auto& [op, arity] : ops) {
      for (int trial = 0; trial < 300; ++trial) {
        onnx::NodeProto node = node_template;
        node.set_op_type(op);
        std::vector<onnx::TypeProto> storage(arity);
        std::unordered_map<std::string, onnx::TypeProto*> types;
        const int32_t dtype = dtypes[rng() % dtypes.size()];
        static const char* const kNames[] = {"x0", "x1", "x2"};
        for (int i = 0; i < arity; ++i) {
          const std::string name = kNames[i];
          node.add_input(name);
          storage[i] = random_type(rng, dtype);
          types[name] = &storage[i];
        }
        onnx::TypeProto fast;
        if (!fast_types(node, opset, types, &fast)) continue;
        ++answered;
        auto want = onnx_infer(node, opset, types);
        ASSERT_TRUE(want.has_value()) << op << " opset " << opset << ": ONNX fails where fast_infer answers "
                                      << fast.ShortDebugString() << " for " << storage[0].ShortDebugString();
        EXPECT_EQ(fast.SerializeAsString(), want->SerializeAsString())
            << op << " opset " << opset << "\n fast: " << fast.ShortDebugString()
            << "\n onnx: " << want->ShortDebugString() << "\n x0: " << storage[0].ShortDebugString()
            << (arity > 1 ? "\n x1: " + storage[1].ShortDebugString() : std::string());
      }
    }
  }
  EXPECT_GT(answered, 10000);  // the fast path really ran on most cases
}

// Transpose with explicit permutations (valid and invalid) against ONNX's inference.
TEST(FastShapes, TransposeAgreesWithOnnxInference) {
  std::mt19937 rng(11);
  int answered = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    onnx::TypeProto x = random_type(rng, onnx::TensorProto::FLOAT);
    std::unordered_map<std::string, onnx::TypeProto*> types{{"x", &x}};
    onnx::NodeProto node;
    node.set_op_type("Transpose");
    node.add_input("x");
    node.add_output("y");
    const int rank = x.tensor_type().has_shape() ? x.tensor_type().shape().dim_size() : 3;
    std::vector<int64_t> perm(static_cast<size_t>(rank));
    for (int i = 0; i < rank; ++i) perm[static_cast<size_t>(i)] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    if (rng() % 5 == 0 && rank > 0) perm[0] = rng() % 2 ? rank : perm.back();  // out of range or repeated
    if (rng() % 7 == 0) perm.push_back(0);                                     // wrong length
    auto* a = node.add_attribute();
    a->set_name("perm");
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t v : perm) a->add_ints(v);
    onnx::TypeProto fast;
    if (!fast_types(node, 18, types, &fast)) continue;
    ++answered;
    auto want = onnx_infer(node, 18, types);
    ASSERT_TRUE(want.has_value()) << "ONNX fails where fast_infer answers " << fast.ShortDebugString();
    EXPECT_EQ(fast.SerializeAsString(), want->SerializeAsString())
        << "\n fast: " << fast.ShortDebugString() << "\n onnx: " << want->ShortDebugString()
        << "\n x: " << x.ShortDebugString() << "\n node: " << node.ShortDebugString();
  }
  EXPECT_GT(answered, 1000);
}

TEST(FastShapes, DeclinesWhatItDoesNotCover) {
  std::unordered_map<std::string, onnx::TypeProto*> types;
  onnx::TypeProto f;
  f.mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  f.mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(3);
  onnx::TypeProto i = f;
  i.mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
  types["f"] = &f;
  types["i"] = &i;
  onnx::TypeProto out;
  onnx::NodeProto node;
  node.add_output("y");
  node.set_op_type("Add");
  node.add_input("i");
  node.add_input("i");
  EXPECT_FALSE(fast_types(node, 18, types, &out));  // int64: ONNX's data propagation matters
  node.set_op_type("Gelu");
  node.clear_input();
  node.add_input("f");
  EXPECT_FALSE(fast_types(node, 18, types, &out));  // no Gelu before opset 20
  EXPECT_TRUE(fast_types(node, 20, types, &out));
  node.set_op_type("MatMul");
  node.add_input("f");
  EXPECT_FALSE(fast_types(node, 18, types, &out));  // rank-1 promotion is left to ONNX
  node.set_op_type("Relu");
  node.set_domain("com.example");
  node.clear_input();
  node.add_input("f");
  EXPECT_FALSE(fast_types(node, 18, types, &out));  // custom domains are never guessed
  node.set_domain("");
  node.clear_input();
  node.add_input("missing");
  EXPECT_FALSE(fast_types(node, 18, types, &out));
}

}  // namespace
}  // namespace onnax
