#include "rules/window.h"

namespace onnax {

std::vector<int64_t> node_ints(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute())
    if (a.name() == name) return {a.ints().begin(), a.ints().end()};
  return {};
}

std::string node_s(const onnx::NodeProto& node, const std::string& name, const std::string& fallback) {
  for (const auto& a : node.attribute())
    if (a.name() == name) return a.s();
  return fallback;
}

void settle_static_pads(const Builder& b, Window& w) {
  const std::vector<int64_t>* begin = b.known_i64(w.begin);
  const std::vector<int64_t>* end = b.known_i64(w.end);
  if (!begin || !end || static_cast<int64_t>(begin->size()) != w.spatial ||
      static_cast<int64_t>(end->size()) != w.spatial)
    return;
  w.static_pads.assign(begin->begin(), begin->end());
  w.static_pads.insert(w.static_pads.end(), end->begin(), end->end());
  w.static_known = true;
}

Window window_geometry(Builder& b, const onnx::NodeProto& node, int64_t spatial, V in_sp, V kernel_sp) {
  Window w;
  w.spatial = spatial;
  w.strides = node_ints(node, "strides");
  if (w.strides.empty()) w.strides.assign(spatial, 1);
  w.dilations = node_ints(node, "dilations");
  if (w.dilations.empty()) w.dilations.assign(spatial, 1);
  const std::string mode = node_s(node, "auto_pad", "NOTSET");
  if (mode == "SAME_UPPER" || mode == "SAME_LOWER") {
    // out = ceil(in / s); total = max(0, (out - 1) * s + (k - 1) * d + 1 - in); the odd
    // element goes to the end for SAME_UPPER and to the beginning for SAME_LOWER.
    V s = b.i64s(w.strides), one = b.i64(1);
    V out = b.op1("Div", {b.op1("Add", {in_sp, b.op1("Sub", {s, one})}), s});
    V extent = b.op1("Add", {b.op1("Mul", {b.op1("Sub", {kernel_sp, one}), b.i64s(w.dilations)}), one});
    V total = b.op1(
        "Max", {b.op1("Sub", {b.op1("Add", {b.op1("Mul", {b.op1("Sub", {out, one}), s}), extent}), in_sp}), b.i64(0)});
    V half = b.op1("Div", {total, b.i64(2)});
    V rest = b.op1("Sub", {total, half});
    w.begin = mode == "SAME_UPPER" ? half : rest;
    w.end = mode == "SAME_UPPER" ? rest : half;
    settle_static_pads(b, w);
    return w;
  }
  w.static_pads = mode == "VALID" ? std::vector<int64_t>{} : node_ints(node, "pads");
  if (w.static_pads.empty()) w.static_pads.assign(2 * spatial, 0);
  w.static_known = true;
  w.begin = b.i64s({w.static_pads.begin(), w.static_pads.begin() + spatial});
  w.end = b.i64s({w.static_pads.begin() + spatial, w.static_pads.end()});
  return w;
}

V nc_pads(Builder& b, V begin, V end) {
  V zeros = b.i64s({0, 0});
  return b.concat({zeros, begin, zeros, end}, 0);
}

V ones_kernel(Builder& b, const std::vector<int64_t>& kernel, int32_t dt) {
  std::vector<int64_t> shape{1, 1};
  shape.insert(shape.end(), kernel.begin(), kernel.end());
  return b.expand(b.scalar(1.0, dt), b.i64s(shape));
}

}  // namespace onnax
