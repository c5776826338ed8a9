// Derivatives of the pooling ops other than MaxPool/GlobalAveragePool (those live in nn.cc):
// AveragePool (linear, with an exact transpose), LpPool, GlobalMaxPool, GlobalLpPool, and LRN
// (whose channel-window sums are an AveragePool).
#include <climits>

#include "rules/derivative.h"
#include "rules/op_table.h"
#include "rules/window.h"

namespace onnax {
namespace {

using D = JvpCtx;

std::vector<int64_t> spatial_axes(int64_t rank) {
  std::vector<int64_t> axes;
  for (int64_t k = 2; k < rank; ++k) axes.push_back(k);
  return axes;
}

V spatial_dims(Builder& b, V shape) {
  return b.op1("Slice", {shape, b.i64s({2}), b.i64s({INT64_MAX})});
}

// Crops the spatial dims of `v` to [start, start + size).
V crop(Builder& b, V v, V start, V size, int64_t spatial) {
  return b.op1("Slice", {v, start, b.op1("Add", {start, size}), b.i64s(spatial_axes(spatial + 2))});
}

// Elements each window covers, shaped (1, 1, out...): a ones-kernel Conv over a ones image.
// With count_include_pad the pads count (but not a ceil_mode overhang past them, as in ONNX
// Runtime and the reference evaluator); without it only the input's own elements count.
// Computed in FLOAT (small exact integers) so the counts also run where a backend lacks
// float64 Conv, then cast.
V window_counts(Builder& b, const Window& w, V in_sp, V out_sp, const std::vector<int64_t>& kernel, int32_t dt,
                bool include_pad, bool ceil_mode) {
  const int32_t f = onnx::TensorProto::FLOAT;
  // Without ceil_mode every window lies within the (explicitly) padded input, so when pads
  // count or there are none, each window covers the whole kernel: a constant.
  bool no_pads = w.static_known;
  for (int64_t p : w.static_pads) no_pads = no_pads && p == 0;
  if (!ceil_mode && w.static_known && (include_pad || no_pads)) {
    int64_t n = 1;
    for (int64_t k : kernel) n *= k;
    return b.scalar(static_cast<double>(n), dt);
  }
  V ones = b.expand(b.scalar(1.0, f), b.concat({b.i64s({1, 1}), in_sp}, 0));
  V padded = b.op1("Pad", {ones, nc_pads(b, w.begin, w.end), b.scalar(include_pad ? 1.0 : 0.0, f)});
  // ceil_mode may add one partial window per axis: s - 1 extra zeros cover it.
  std::vector<int64_t> extra(w.spatial);
  for (int64_t k = 0; k < w.spatial; ++k) extra[k] = w.strides[k] - 1;
  padded = b.op1("Pad", {padded, nc_pads(b, b.i64s(std::vector<int64_t>(w.spatial, 0)), b.i64s(extra))});
  V counts = b.op1("Conv", {padded, ones_kernel(b, kernel, f)},
                   {Attr::ints("strides", w.strides), Attr::ints("dilations", w.dilations)});
  counts = crop(b, counts, b.i64s(std::vector<int64_t>(w.spatial, 0)), out_sp, w.spatial);
  // A window lying wholly in the padding has no inputs; 1 keeps its (unused) weight finite.
  counts = b.op1("Max", {counts, b.scalar(1.0, f)});
  if (dt != f) counts = b.op1("Cast", {counts}, {Attr::i("to", dt)});
  // Its rank is what reverse mode needs to unbroadcast against it; inference may not see it
  // through the run-time shapes above.
  std::vector<Dim> dims(w.spatial + 2, Dim{});
  dims[0] = dims[1] = Dim::of(1);
  b.set_facts(counts, Facts::of(dt, dims));
  return counts;
}

// AveragePool is linear: y[w] = sum_{i in w} x[i] / count[w]. Its transpose scatters
// ct[w] / count[w] back over each window: a ones-kernel ConvTranspose over (N*C, 1, out...)
// (output_padding s-1 makes it at least pad_begin + in long), then the input's span is cut out.
Vs average_pool_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.attr("kernel_shape") == nullptr)
    c.unsupported("it has no kernel_shape attribute", "add the kernel_shape attribute ONNX requires");
  const std::vector<int64_t> kernel = c.attr_ints("kernel_shape");
  const int64_t spatial = static_cast<int64_t>(kernel.size());
  const int32_t dt = b.facts(c.ct()).dtype;
  V xshape = tangent_shape(c, c.in(0));
  V in_sp = spatial_dims(b, xshape);
  V out_sp = b.shape_of(c.ct(), 2);
  Window w = window_geometry(b, c.node, spatial, in_sp, b.i64s(kernel));
  V counts = window_counts(b, w, in_sp, out_sp, kernel, dt, c.attr_i("count_include_pad", 0) != 0,
                           c.attr_i("ceil_mode", 0) != 0);
  V scaled = b.op1("Div", {c.ct(), counts});
  V merged = b.reshape(scaled, b.concat({b.i64s({-1, 1}), out_sp}, 0));
  std::vector<int64_t> out_pad(spatial);
  for (int64_t k = 0; k < spatial; ++k) out_pad[k] = w.strides[k] - 1;
  V spread = b.op1(
      "ConvTranspose", {merged, ones_kernel(b, kernel, dt)},
      {Attr::ints("strides", w.strides), Attr::ints("dilations", w.dilations), Attr::ints("output_padding", out_pad)});
  return {b.reshape(crop(b, spread, w.begin, in_sp, spatial), xshape)};
}

// d|x|^p = p |x|^(p-1) sign(x) dx, so d(sum |x|^p)^(1/p) = y^(1-p) * sum(|x|^(p-1) sign(x) dx).
// sign(0) = 0 as in JAX; where y = 0 (every input of the window is 0) the tangent is 0.
V lp_weight(D& c, int64_t p) {
  auto& b = c.b;
  if (p == 2) return c.x(0);
  V sign = b.op1("Sign", {c.x(0)});
  if (p == 1) return sign;
  return b.op1("Mul", {b.op1("Pow", {b.op1("Abs", {c.x(0)}), c.scalar(static_cast<double>(p - 1))}), sign});
}
V lp_scale(D& c, int64_t p) {
  auto& b = c.b;
  V zero = c.scalar(0.0);
  V pw = b.op1("Pow", {c.y(), c.scalar(static_cast<double>(1 - p))});
  return b.op1("Where", {b.op1("Equal", {c.y(), zero}), zero, pw});
}

// The window sums of LpPool's JVP are an AveragePool counting pads (so it has a transpose)
// times the per-window counts; AveragePool has dilations only from opset 19.
Vs lp_pool_jvp(D& c) {
  if (!c.t(0).valid()) return {V{}};
  auto& b = c.b;
  const int64_t p = c.attr_i("p", 2);
  if (c.attr("kernel_shape") == nullptr)
    c.unsupported("it has no kernel_shape attribute", "add the kernel_shape attribute ONNX requires");
  const std::vector<int64_t> kernel = c.attr_ints("kernel_shape");
  const int64_t spatial = static_cast<int64_t>(kernel.size());
  V in_sp = b.shape_of(c.x(0), 2);
  Window w = window_geometry(b, c.node, spatial, in_sp, b.i64s(kernel));
  Attrs attrs{Attr::ints("kernel_shape", kernel), Attr::ints("strides", w.strides),
              Attr::i("ceil_mode", c.attr_i("ceil_mode", 0)), Attr::i("count_include_pad", 1)};
  const std::string auto_pad = node_s(c.node, "auto_pad", "NOTSET");
  if (auto_pad != "NOTSET") attrs.push_back(Attr::s("auto_pad", auto_pad));
  if (!c.attr_ints("pads").empty() && auto_pad == "NOTSET") attrs.push_back(Attr::ints("pads", c.attr_ints("pads")));
  bool dilated = false;
  for (int64_t d : w.dilations) dilated = dilated || d != 1;
  if (dilated) {
    if (c.opset < 19)
      c.unsupported("dilations need AveragePool with dilations (opset 19) for the window sums",
                    "convert the model to opset 19 or later (onnx.version_converter)");
    attrs.push_back(Attr::ints("dilations", w.dilations));
  }
  V weighted = b.op1("Mul", {c.t(0), lp_weight(c, p)});
  b.set_witness(weighted, c.x(0));
  V out_sp = b.shape_of(c.y(), 2);
  V counts = window_counts(b, w, in_sp, out_sp, kernel, c.dtype(0), true, c.attr_i("ceil_mode", 0) != 0);
  V sums = b.op1("Mul", {b.op1("AveragePool", {weighted}, attrs), counts});
  return {p == 1 ? sums : b.op1("Mul", {sums, lp_scale(c, p)})};
}

Vs global_lp_pool_jvp(D& c) {
  if (!c.t(0).valid()) return {V{}};
  auto& b = c.b;
  const int64_t p = c.attr_i("p", 2);
  V weighted = b.op1("Mul", {c.t(0), lp_weight(c, p)});
  b.set_witness(weighted, c.x(0));
  V sums = b.op1("ReduceSum", {weighted, b.i64s(spatial_axes(c.rank(0)))}, {Attr::i("keepdims", 1)});
  return {p == 1 ? sums : b.op1("Mul", {sums, lp_scale(c, p)})};
}

// Ties share the tangent evenly, as JAX's max reductions do.
Vs global_max_pool_jvp(D& c) {
  if (!c.t(0).valid()) return {V{}};
  auto& b = c.b;
  V axes = b.i64s(spatial_axes(c.rank(0)));
  V mask = b.op1("Cast", {b.op1("Equal", {c.x(0), c.y()})}, {Attr::i("to", c.dtype(0))});
  V picked = b.op1("Mul", {c.t(0), mask});
  b.set_witness(picked, c.x(0));
  V num = b.op1("ReduceSum", {picked, axes}, {Attr::i("keepdims", 1)});
  V den = b.op1("ReduceSum", {mask, axes}, {Attr::i("keepdims", 1)});
  return {b.op1("Div", {num, den})};
}

// LRN's window sums over channels: an AveragePool (counting pads, times the window size) of
// (N, 1, C, spatial...) with the window along C.
V channel_window_sum(D& c, V z, int64_t size) {
  auto& b = c.b;
  const int64_t r = c.rank(0);
  std::vector<int64_t> kernel(r - 1, 1), pads(2 * (r - 1), 0);
  kernel[0] = size;
  pads[0] = (size - 1) / 2;
  pads[r - 1] = size / 2;  // ceil((size - 1) / 2)
  V avg = b.op1("AveragePool", {b.unsqueeze(z, {1})},
                {Attr::ints("kernel_shape", kernel), Attr::ints("pads", pads), Attr::i("count_include_pad", 1)});
  return b.op1("Mul", {b.squeeze(avg, {1}), c.scalar(static_cast<double>(size))});
}

// y = x d^-beta with d = bias + alpha / size * S, S the channel-window sum of x^2:
// dy = dx d^-beta - beta x d^(-beta-1) alpha / size * window_sum(2 x dx).
Vs lrn_jvp(D& c) {
  if (!c.t(0).valid()) return {V{}};
  auto& b = c.b;
  const int64_t size = c.attr_i("size", 0);
  if (size <= 0) c.unsupported("size is missing or not positive", "set size");
  const double alpha = c.attr_f("alpha", 1e-4f), beta = c.attr_f("beta", 0.75f), bias = c.attr_f("bias", 1.0f);
  const double k = alpha / static_cast<double>(size);
  V d = b.op1("Add", {b.op1("Mul", {channel_window_sum(c, b.op1("Mul", {c.x(0), c.x(0)}), size), c.scalar(k)}),
                      c.scalar(bias)});
  V p = b.op1("Pow", {d, c.scalar(-beta)});
  V xt = b.op1("Mul", {c.x(0), c.t(0)});
  b.set_witness(xt, c.x(0));
  V ds = channel_window_sum(c, xt, size);
  V coef = b.op1("Mul", {b.op1("Div", {b.op1("Mul", {c.x(0), p}), d}), c.scalar(-2.0 * beta * k)});
  return {b.op1("Add", {b.op1("Mul", {c.t(0), p}), b.op1("Mul", {ds, coef})})};
}

}  // namespace

void register_pool(OpTable& table) {
  table.op("LRN").jvp(lrn_jvp);
  table.op("AveragePool")
      .jvp([](D& c) -> Vs { return {c.t(0).valid() ? c.same_op({c.t(0)}) : V{}}; })
      .transpose(average_pool_transpose);
  table.op("LpPool").jvp(lp_pool_jvp);
  table.op("GlobalLpPool").jvp(global_lp_pool_jvp);
  table.op("GlobalMaxPool").jvp(global_max_pool_jvp);
}

}  // namespace onnax
