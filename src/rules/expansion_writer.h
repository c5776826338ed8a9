// Writes expansions of ops into elementary ONNX nodes (a GraphProto that expansion_jvp then
// differentiates node by node): for ops ONNX gives no function body (RNN/GRU/LSTM,
// GridSample).
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <string_view>
#include <vector>

#include "emit/builder.h"
#include "emit/graph_writer.h"

namespace onnax {

// A GraphWriter under the builder's value names: an op's expansion or a Loop body written
// while a rule runs.
class ExpansionWriter : public GraphWriter {
 public:
  ExpansionWriter(Builder& b, onnx::GraphProto& g, std::string base, int32_t dtype)
      : GraphWriter(b.value_scope(), g, std::move(base), dtype) {}
};

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
