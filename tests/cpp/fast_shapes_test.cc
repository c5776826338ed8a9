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

// What ONNX's inference gives for `node` (nullopt when it throws); `data` holds constant inputs.
std::optional<onnx::TypeProto> onnx_infer(onnx::NodeProto& node, int opset,
                                          std::unordered_map<std::string, onnx::TypeProto*>& types,
                                          const std::unordered_map<std::string, const onnx::TensorProto*>& data = {}) {
  const auto* schema = onnx::OpSchemaRegistry::Schema(node.op_type(), opset, "");
  if (!schema) return std::nullopt;
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

// Constant inputs for fast_infer, by the node's input names.
struct NamedConstants final : ConstantInputs {
  const onnx::NodeProto* node = nullptr;
  std::unordered_map<std::string, std::vector<int64_t>> values_by_name;
  const std::vector<int64_t>* values(int i) const override {
    auto it = values_by_name.find(node->input(i));
    return it == values_by_name.end() ? nullptr : &it->second;
  }
};

// fast_infer over the facts of `types` (missing names are unknown), written back as a type.
bool fast_types(const onnx::NodeProto& node, int opset, const std::unordered_map<std::string, onnx::TypeProto*>& types,
                onnx::TypeProto* out, const NamedConstants* constants = nullptr) {
  std::vector<Facts> facts(static_cast<size_t>(node.input_size()));
  std::vector<const Facts*> inputs(static_cast<size_t>(node.input_size()), nullptr);
  for (int i = 0; i < node.input_size(); ++i) {
    auto it = types.find(node.input(i));
    if (it == types.end()) continue;
    facts[static_cast<size_t>(i)] = facts_from_type(*it->second);
    inputs[static_cast<size_t>(i)] = &facts[static_cast<size_t>(i)];
  }
  Facts result;
  if (!fast_infer(node, node.input_size(), node.output_size(), opset, inputs.data(), result, constants)) return false;
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
    node.add_input(std::string("x"));  // (a const char* here trips GCC 12's -Wrestrict false positive)
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

// Reductions, Reshape and Expand over random constant axes / target shapes (valid and invalid), and
// Softmax / LayerNormalization over random axes, against ONNX's inference given the same
// constants as initializer data.
TEST(FastShapes, ConstantOperandsAgreeWithOnnxInference) {
  std::mt19937 rng(13);
  const std::vector<std::string> ops = {"ReduceMean", "ReduceSum", "ReduceMax",  "ReduceL2",          "Reshape",
                                        "Expand",     "Softmax",   "LogSoftmax", "LayerNormalization"};
  int answered = 0;
  std::unordered_map<std::string, int> answered_by_op;
  for (int trial = 0; trial < 12000; ++trial) {
    const std::string& op = ops[rng() % ops.size()];
    const int opset = rng() % 2 ? 18 : 24;
    onnx::TypeProto x = random_type(rng, rng() % 4 ? onnx::TensorProto::FLOAT : onnx::TensorProto::DOUBLE);
    onnx::NodeProto node;
    node.set_op_type(op);
    node.add_input("x");
    node.add_output("y");
    std::unordered_map<std::string, onnx::TypeProto*> types{{"x", &x}};
    onnx::TypeProto i64_type;
    i64_type.mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
    onnx::TensorProto constant;
    constant.set_name("c");
    constant.set_data_type(onnx::TensorProto::INT64);
    std::vector<int64_t> values;
    auto add_int = [&](const char* name, int64_t v) {
      auto* a = node.add_attribute();
      a->set_name(name);
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(v);
    };
    if (op.rfind("Reduce", 0) == 0) {
      const int count = static_cast<int>(rng() % 3);
      for (int k = 0; k < count; ++k) values.push_back(static_cast<int64_t>(rng() % 9) - 4);  // some out of range
      if (rng() % 2) add_int("keepdims", rng() % 2);
      if (rng() % 3 == 0) add_int("noop_with_empty_axes", rng() % 2);
      if (rng() % 4 == 0)
        node.add_input("c");  // else no axes input: reduce all (or noop)
      else
        values.clear();
      if (node.input_size() == 1 && rng() % 2 == 0) values.clear();
    } else if (op == "Reshape") {
      node.add_input("c");
      const int count = static_cast<int>(rng() % 4);
      for (int k = 0; k < count; ++k) {
        const int pick = static_cast<int>(rng() % 6);
        values.push_back(pick == 0 ? 0 : pick == 1 ? -1 : pick == 2 ? 12 : pick == 3 ? 1 : pick == 4 ? 3 : 4);
      }
      if (rng() % 3 == 0) add_int("allowzero", rng() % 2);
    } else if (op == "Expand") {
      node.add_input("c");
      const int count = static_cast<int>(rng() % 5);
      static const int64_t kDims[] = {1, 3, 4, 2, 0, -1};
      for (int k = 0; k < count; ++k) values.push_back(kDims[rng() % 6]);
    } else {
      if (op == "LayerNormalization") {
        node.add_input("x");  // scale
        if (rng() % 2) node.add_input("x");
      }
      if (rng() % 2) add_int("axis", static_cast<int64_t>(rng() % 9) - 4);
    }
    const bool with_constant = node.input_size() > 1 && node.input(1) == "c";
    if (op.rfind("Reduce", 0) == 0 && !with_constant && !values.empty()) {
      auto* a = node.add_attribute();  // opset-18 style was input, older was the attribute
      a->set_name("axes");
      a->set_type(onnx::AttributeProto::INTS);
      for (int64_t v : values) a->add_ints(v);
    }
    NamedConstants constants;
    constants.node = &node;
    std::unordered_map<std::string, const onnx::TensorProto*> data;
    if (with_constant) {
      constant.add_dims(static_cast<int64_t>(values.size()));
      for (int64_t v : values) constant.add_int64_data(v);
      i64_type.mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(static_cast<int64_t>(values.size()));
      types["c"] = &i64_type;
      data["c"] = &constant;
      constants.values_by_name["c"] = values;
    }
    onnx::TypeProto fast;
    if (!fast_types(node, opset, types, &fast, &constants)) continue;
    ++answered;
    ++answered_by_op[op];
    auto want = onnx_infer(node, opset, types, data);
    ASSERT_TRUE(want.has_value()) << "ONNX fails where fast_infer answers " << fast.ShortDebugString()
                                  << "\n node: " << node.ShortDebugString() << "\n x: " << x.ShortDebugString();
    // A reduction of every axis without keepdims is a scalar whatever the input's rank; ONNX
    // leaves it unknown when the input has none.
    if (!x.tensor_type().has_shape() && !want->tensor_type().has_shape() && op.rfind("Reduce", 0) == 0) {
      EXPECT_EQ(fast.tensor_type().elem_type(), want->tensor_type().elem_type());
      EXPECT_TRUE(fast.tensor_type().has_shape() && fast.tensor_type().shape().dim_size() == 0)
          << fast.ShortDebugString();
      continue;
    }
    EXPECT_EQ(fast.SerializeAsString(), want->SerializeAsString())
        << "\n fast: " << fast.ShortDebugString() << "\n onnx: " << want->ShortDebugString()
        << "\n x: " << x.ShortDebugString() << "\n node: " << node.ShortDebugString();
  }
  EXPECT_GT(answered, 3000);
  for (const auto& op : ops) EXPECT_GT(answered_by_op[op], 150) << op;  // every kind really ran
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
