// Derivatives of DeformConv (2-D) by expansion into elementary ops, in every input: the image,
// the weights, the offsets, the bias and the mask. Each kernel tap of each output position
// samples the image bilinearly at its base position plus its offset (corners outside the
// image read zero, as in the ONNX reference and ONNX Runtime), the mask scales the samples,
// and a grouped MatMul with the weights sums them. The derivative in the offsets is the
// piecewise one between pixel boundaries (Floor carries none).
#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "rules/derivative.h"
#include "rules/expansion_writer.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

std::vector<int64_t> ints_or(const JvpCtx& c, const char* name, std::vector<int64_t> fallback) {
  std::vector<int64_t> v = c.attr_ints(name);
  return v.empty() ? fallback : v;
}

Vs deform_conv_jvp(JvpCtx& c) {
  if (c.rank(0) != 4)
    c.unsupported("X has rank " + std::to_string(c.rank(0)) + "; the expansion covers 2-D convolutions",
                  "use a 2-D DeformConv (X of shape (N, C, H, W))");
  std::vector<int64_t> kernel = c.attr_ints("kernel_shape");
  if (kernel.empty()) {
    const Facts& wf = c.b.facts(c.x(1));
    if (wf.rank() == 4 && wf.dims[2].known() && wf.dims[3].known()) kernel = {wf.dims[2].value(), wf.dims[3].value()};
  }
  if (kernel.size() != 2)
    c.unsupported("the kernel size is not static", "set kernel_shape or declare the shape of the weights");
  const std::vector<int64_t> strides = ints_or(c, "strides", {1, 1});
  const std::vector<int64_t> dilations = ints_or(c, "dilations", {1, 1});
  const std::vector<int64_t> pads = ints_or(c, "pads", {0, 0, 0, 0});
  const int64_t group = c.attr_i("group", 1), offset_group = c.attr_i("offset_group", 1);
  const int64_t taps = kernel[0] * kernel[1];
  auto input = [&](int i) { return i < c.node.input_size() ? c.node.input(i) : std::string(); };

  onnx::GraphProto g;
  ExpansionWriter w(c.b, g, c.node.output(0), c.dtype(0));
  const std::string& x = c.node.input(0);
  const std::string& offset = c.node.input(2);
  const std::string x_shape = w.op("Shape", {x});
  auto dim = [&](const std::string& shape, int64_t k) {
    return w.op("Gather", {shape, w.i64(k)}, {attr_i("axis", 0)});
  };
  auto as_float = [&](const std::string& v) { return w.op("Cast", {v}, {attr_i("to", w.dtype())}); };
  const std::string height = dim(x_shape, 2), width = dim(x_shape, 3);
  const std::string offset_shape = w.op("Shape", {offset});
  const std::string out_h = dim(offset_shape, 2), out_w = dim(offset_shape, 3);

  // Base sampling positions, (kH, kW, oH, oW) broadcastable: o * stride - pad_begin + k * dilation.
  auto base = [&](int axis, const std::string& out_size) {
    const std::string o = w.op("Range", {w.i64(0), out_size, w.i64(1)});
    const std::string start = w.op("Sub", {w.op("Mul", {o, w.i64(strides[axis])}), w.i64(pads[axis])});
    std::vector<int64_t> k;
    for (int64_t t = 0; t < kernel[axis]; ++t) k.push_back(t * dilations[axis]);
    // (k, 1) + (o) -> (k, o), then placed at its axes of (kH, kW, oH, oW).
    const std::string pos = w.op("Add", {w.op("Unsqueeze", {w.i64s(k), w.i64s({1})}), start});
    const std::vector<int64_t> unsq = axis == 0 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{0, 2};
    return as_float(w.op("Unsqueeze", {pos, w.i64s(unsq)}));
  };
  // Offsets (N, G * kH * kW * 2, oH, oW) -> (N, G, kH, kW, 2, oH, oW): (dy, dx) per tap.
  const std::string offsets = w.op(
      "Reshape",
      {offset,
       w.op("Concat", {w.i64s({0, offset_group, kernel[0], kernel[1], 2, -1}), w.op("Unsqueeze", {out_w, w.i64s({0})})},
            {attr_i("axis", 0)})});
  auto offset_part = [&](int64_t k) { return w.op("Gather", {offsets, w.i64(k)}, {attr_i("axis", 4)}); };
  const std::string y = w.op("Add", {base(0, out_h), offset_part(0)});  // (N, G, kH, kW, oH, oW)
  const std::string xs = w.op("Add", {base(1, out_w), offset_part(1)});

  // Bilinear taps per axis: (index, weight), corners outside the image weighing nothing.
  struct Tap {
    std::string index, weight;
  };
  auto taps_of = [&](const std::string& pos, const std::string& size) {
    const std::string floor = w.op("Floor", {pos});
    const std::string frac = w.op("Sub", {pos, floor});
    const std::string lo = w.op("Cast", {floor}, {attr_i("to", onnx::TensorProto::INT64)});
    std::vector<Tap> out = {{lo, w.op("Sub", {w.scalar(1.0), frac})}, {w.op("Add", {lo, w.i64(1)}), frac}};
    for (Tap& t : out) {
      const std::string inside =
          w.op("And", {w.op("GreaterOrEqual", {t.index, w.i64(0)}), w.op("Less", {t.index, size})});
      t.weight = w.op("Mul", {t.weight, w.op("Cast", {inside}, {attr_i("to", w.dtype())})});
      t.index = w.op("Clip", {t.index, w.i64(0), w.op("Sub", {size, w.i64(1)})});
    }
    return out;
  };
  const std::vector<Tap> ty = taps_of(y, height), tx = taps_of(xs, width);

  // X (N, C, H, W) -> channels last per offset group (N, G, H*W, C/G); each corner gathers one
  // row per sample (GatherND over N and G: no index per channel); indices, weights and the mask
  // are (N, G, kH*kW*oH*oW, 1) (kernel taps, then output positions).
  auto shape_of = [&](std::vector<std::string> parts) { return w.op("Concat", parts, {attr_i("axis", 0)}); };
  auto unsq = [&](const std::string& scalar) { return w.op("Unsqueeze", {scalar, w.i64s({0})}); };
  const std::string flat_image =
      w.op("Transpose",
           {w.op("Reshape", {x, shape_of({w.i64s({0, offset_group, -1}), unsq(w.op("Mul", {height, width}))})})},
           {attr_ints("perm", {0, 1, 3, 2})});
  const std::string per_sample = w.i64s({0, offset_group, -1, 1});
  std::string cols;
  for (const Tap& a : ty)
    for (const Tap& b : tx) {
      const std::string idx = w.op("Reshape", {w.op("Add", {w.op("Mul", {a.index, width}), b.index}), per_sample});
      const std::string weight = w.op("Reshape", {w.op("Mul", {a.weight, b.weight}), per_sample});
      const std::string v = w.op("Mul", {w.op("GatherND", {flat_image, idx}, {attr_i("batch_dims", 2)}), weight});
      cols = cols.empty() ? v : w.op("Add", {cols, v});
    }
  if (!input(4).empty()) cols = w.op("Mul", {cols, w.op("Reshape", {input(4), per_sample})});
  cols = w.op("Transpose", {cols}, {attr_ints("perm", {0, 1, 3, 2})});  // (N, G, C/G, kH*kW*oH*oW)
  // (N, G, C/G, kH*kW*oH*oW) -> (N, C, kH*kW, oH*oW) -> (N, group, C/group*kH*kW, oH*oW), times
  // the weights (oC, C/group, kH, kW) -> (group, oC/group, C/group*kH*kW): (N, group, oC/group, oH*oW).
  const std::string positions = unsq(w.op("Mul", {out_h, out_w}));
  cols = w.op("Reshape", {cols, shape_of({w.i64s({0, -1, taps}), positions})});
  cols = w.op("Reshape", {cols, shape_of({w.i64s({0, group, -1}), positions})});
  const std::string& weights = c.node.input(1);
  const std::string per_group = unsq(w.op("Mul", {dim(w.op("Shape", {weights}), 1), w.i64(taps)}));
  const std::string kernels = w.op("Reshape", {weights, shape_of({w.i64s({group, -1}), per_group})});
  std::string out = w.op("MatMul", {kernels, cols});
  out = w.op("Reshape", {out, shape_of({w.i64s({0, -1}), unsq(out_h), unsq(out_w)})});
  if (!input(3).empty()) out = w.op("Add", {out, w.op("Reshape", {input(3), w.i64s({1, -1, 1, 1})})});
  w.op("Identity", {out}, {}, c.node.output(0));
  return expansion_jvp(c, g);
}

}  // namespace

void register_deform_conv(OpTable& table) {
  table.op("DeformConv").jvp(deform_conv_jvp);
}

}  // namespace onnax
