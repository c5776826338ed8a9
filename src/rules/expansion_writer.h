// Writes expansions of ops into elementary ONNX nodes (a GraphProto that expansion_jvp then
// differentiates node by node): for ops ONNX gives no function body (RNN/GRU/LSTM,
// GridSample).
#pragma once

#include <onnx/onnx_pb.h>

#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "emit/builder.h"

namespace onnax {

using Names = std::vector<std::string>;
using AttrList = std::vector<onnx::AttributeProto>;

inline std::string lowercase(std::string_view s) {
  std::string out;
  for (char ch : s) out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  return out;
}

// Appends nodes to one graph (the expansion, or a Loop body) under fresh names of the model's
// value scope: a Loop body keeps its names when cloned, so they must collide with nothing.
class ExpansionWriter {
 public:
  ExpansionWriter(Builder& b, onnx::GraphProto& g, std::string base, int32_t dtype)
      : b_(b), g_(g), base_(std::move(base)), dtype_(dtype) {}

  std::string fresh(std::string_view hint) { return b_.fresh_value_name(base_ + "_" + std::string(hint)); }

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

  Builder& b_;
  onnx::GraphProto& g_;
  std::string base_;
  int32_t dtype_;
};

inline onnx::AttributeProto attr_i(const char* name, int64_t v) {
  return Attr::i(name, v).proto;
}
inline onnx::AttributeProto attr_f(const char* name, float v) {
  return Attr::f(name, v).proto;
}
inline onnx::AttributeProto attr_ints(const char* name, const std::vector<int64_t>& v) {
  return Attr::ints(name, v).proto;
}

// c[0] x^(n-1) + ... + c[n-1], by Horner's rule.
inline std::string polynomial(ExpansionWriter& w, const std::string& x, const std::vector<double>& c) {
  std::string acc = w.scalar(c[0]);
  for (size_t k = 1; k < c.size(); ++k) acc = w.op("Add", {w.op("Mul", {acc, x}), w.scalar(c[k])});
  return acc;
}
// Keys' cubic convolution kernel with parameter `a` on its two pieces: |d| in [0, 1) and [1, 2).
inline std::vector<double> keys_near(double a) {
  return {a + 2, -(a + 3), 0, 1};
}
inline std::vector<double> keys_far(double a) {
  return {a, -5 * a, 8 * a, -4 * a};
}

// Keys' cubic convolution coefficients (ONNX Runtime's bicubic, parameter `a`: -0.75 for
// GridSample, cubic_coeff_a for Resize) for the fractional position t in [0, 1), taps at
// floor - 1 .. floor + 2.
inline std::vector<std::string> cubic_weights(ExpansionWriter& w, const std::string& t, double a) {
  const std::string one = w.scalar(1.0);
  const std::string t1 = w.op("Add", {t, one});  // distance to floor - 1
  const std::string s = w.op("Sub", {one, t});   // distance to floor + 1
  const std::string s1 = w.op("Add", {s, one});  // distance to floor + 2
  return {polynomial(w, t1, keys_far(a)), polynomial(w, t, keys_near(a)), polynomial(w, s, keys_near(a)),
          polynomial(w, s1, keys_far(a))};
}

}  // namespace onnax
