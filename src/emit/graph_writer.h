// Writes ONNX nodes by name into a GraphProto: for whole subgraphs written at once (op
// expansions, Loop bodies, losses, optimizer updates), where the Builder's per-value facts and
// reuse are not needed.
#pragma once

#include <onnx/onnx_pb.h>

#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "ir/names.h"

namespace onnax {

using Names = std::vector<std::string>;
using AttrList = std::vector<onnx::AttributeProto>;

inline std::string lowercase(std::string_view s) {
  std::string out;
  for (char ch : s) out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  return out;
}

// Appends nodes to one graph under fresh names of the model's value scope (names must collide
// with nothing: a Loop body keeps its names when cloned). Rules write op expansions with it
// (rules/expansion_writer.h); the training layer writes losses and optimizer updates.
class GraphWriter {
 public:
  GraphWriter(NameScope& names, onnx::GraphProto& g, std::string base, int32_t dtype)
      : names_(names), g_(g), base_(std::move(base)), dtype_(dtype) {}

  std::string fresh(std::string_view hint) { return names_.fresh(base_ + "_" + std::string(hint)); }

  std::string op(std::string_view type, const Names& inputs, AttrList attrs = {}, std::string out = {}) {
    return op_n(type, inputs, 1, std::move(attrs), {std::move(out)})[0];
  }
  Names op_n(std::string_view type, const Names& inputs, int outputs, AttrList attrs = {}, Names names = {}) {
    auto* n = g_.add_node();
    n->set_op_type(std::string(type));
    for (const auto& i : inputs) n->add_input(i);
    names.resize(static_cast<size_t>(outputs));
    for (auto& o : names) {
      if (o.empty()) o = fresh(lowercase(type));
      n->add_output(o);
    }
    for (auto& a : attrs) *n->add_attribute() = std::move(a);
    return names;
  }

  std::string i64s(const std::vector<int64_t>& values) { return constant(onnx::TensorProto::INT64, values, {}, true); }
  std::string i64(int64_t value) { return constant(onnx::TensorProto::INT64, {value}, {}, false); }
  std::string flag(bool value) {
    onnx::AttributeProto a;
    a.set_name("value");
    a.set_type(onnx::AttributeProto::TENSOR);
    a.mutable_t()->set_data_type(onnx::TensorProto::BOOL);
    a.mutable_t()->add_int32_data(value ? 1 : 0);
    return op("Constant", {}, {a});
  }
  // A scalar, or a 1-D tensor, of the op's float type.
  std::string scalar(double value) { return constant(dtype_, {}, {value}, false); }
  std::string reals(const std::vector<double>& values) { return constant(dtype_, {}, values, true); }

  int32_t dtype() const { return dtype_; }

 private:
  std::string constant(int32_t dtype, const std::vector<int64_t>& ints, const std::vector<double>& reals, bool vector) {
    onnx::AttributeProto a;
    a.set_name("value");
    a.set_type(onnx::AttributeProto::TENSOR);
    onnx::TensorProto* t = a.mutable_t();
    t->set_data_type(dtype);
    if (vector) t->add_dims(static_cast<int64_t>(ints.size() + reals.size()));
    for (int64_t v : ints) t->add_int64_data(v);
    for (double v : reals) {
      if (dtype == onnx::TensorProto::DOUBLE)
        t->add_double_data(v);
      else
        t->add_float_data(static_cast<float>(v));
    }
    return op("Constant", {}, {a});
  }

  NameScope& names_;
  onnx::GraphProto& g_;
  std::string base_;
  int32_t dtype_;
};

// A one-element tensor of `dtype` (float, double or int64) holding `value`: a Constant's or
// ConstantOfShape's `value`.
inline onnx::AttributeProto value_attr(int32_t dtype, double value, bool scalar) {
  onnx::AttributeProto a;
  a.set_name("value");
  a.set_type(onnx::AttributeProto::TENSOR);
  onnx::TensorProto* t = a.mutable_t();
  t->set_data_type(dtype);
  if (!scalar) t->add_dims(1);
  if (dtype == onnx::TensorProto::DOUBLE)
    t->add_double_data(value);
  else if (dtype == onnx::TensorProto::INT64)
    t->add_int64_data(static_cast<int64_t>(value));
  else
    t->add_float_data(static_cast<float>(value));
  return a;
}

// Attributes by value, for nodes written by name (and the Builder's Attr).
inline onnx::AttributeProto attr_i(std::string_view name, int64_t v) {
  onnx::AttributeProto a;
  a.set_name(std::string(name));
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}
inline onnx::AttributeProto attr_f(std::string_view name, float v) {
  onnx::AttributeProto a;
  a.set_name(std::string(name));
  a.set_type(onnx::AttributeProto::FLOAT);
  a.set_f(v);
  return a;
}
inline onnx::AttributeProto attr_ints(std::string_view name, const std::vector<int64_t>& v) {
  onnx::AttributeProto a;
  a.set_name(std::string(name));
  a.set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a.add_ints(x);
  return a;
}

}  // namespace onnax
