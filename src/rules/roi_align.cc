// Derivatives of RoiAlign in the feature map and in the boxes, by expansion into elementary ops
// that follow ONNX Runtime's kernel: each output bin averages (or, in max mode, takes the
// largest weighted corner of) sampling_ratio x sampling_ratio bilinear samples at regular
// positions inside the bin; a sample more than a pixel outside the map reads zero, positions
// clamp to the map, and output_half_pixel boxes are at least one pixel wide. The derivative in
// the boxes is the piecewise one (Floor and Ceil carry none). With an adaptive sampling ratio
// (0, the default: ceil(bin size) samples per bin and axis, per box), every box takes as many
// samples as the largest needs, and those beyond its own count are masked out.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "rules/derivative.h"
#include "rules/expansion_writer.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

Vs roi_align_jvp(JvpCtx& c) {
  const int64_t samples = c.attr_i("sampling_ratio", 0);
  const bool adaptive = samples <= 0;
  if (c.rank(0) != 4) c.unsupported("X has rank " + std::to_string(c.rank(0)), "give X the shape (N, C, H, W)");
  std::string mode = "avg", transform = "half_pixel";
  if (const auto* a = c.attr("mode")) mode = a->s();
  if (const auto* a = c.attr("coordinate_transformation_mode")) transform = a->s();
  const bool half_pixel = transform == "half_pixel";
  const int64_t out_h = c.attr_i("output_height", 1), out_w = c.attr_i("output_width", 1);
  // Bounds before any table is sized from them: an attribute of 2^40 would otherwise make the
  // expansion allocate 2^40 positions (a memory bomb from a 300-byte model).
  constexpr int64_t kMaxSamplesPerAxis = int64_t{1} << 31;
  for (const auto& [name, bins] : {std::pair{"output_height", out_h}, std::pair{"output_width", out_w}}) {
    int64_t total = 0;
    if (bins < 1 || __builtin_mul_overflow(bins, std::max<int64_t>(samples, 1), &total) || total > kMaxSamplesPerAxis)
      c.unsupported(std::string(name) + " " + std::to_string(bins) + " with sampling_ratio " + std::to_string(samples),
                    "give output_height and output_width in [1, 2^31 / max(sampling_ratio, 1)]");
  }
  const float scale = c.attr_f("spatial_scale", 1.0f);

  onnx::GraphProto g;
  ExpansionWriter w(c.b, g, c.node.output(0), c.dtype(0));
  const std::string& x = c.node.input(0);
  const std::string& rois = c.node.input(1);
  const std::string x_shape = w.op("Shape", {x});
  auto dim = [&](int64_t k) { return w.op("Gather", {x_shape, w.i64(k)}, {attr_i("axis", 0)}); };
  const std::string height = dim(2), width = dim(3);
  auto as_float = [&](const std::string& v) { return w.op("Cast", {v}, {attr_i("to", w.dtype())}); };
  // Box corners in pixels: (R, 1) each.
  auto corner = [&](int64_t k) {
    const std::string v =
        w.op("Mul", {w.op("Slice", {rois, w.i64s({k}), w.i64s({k + 1}), w.i64s({1})}), w.scalar(scale)});
    return half_pixel ? w.op("Sub", {v, w.scalar(0.5)}) : v;
  };
  const std::string x0 = corner(0), y0 = corner(1), x1 = corner(2), y1 = corner(3);
  auto extent = [&](const std::string& lo, const std::string& hi) {
    const std::string e = w.op("Sub", {hi, lo});
    return half_pixel ? e : w.op("Max", {e, w.scalar(1.0)});
  };
  // Sample positions along one axis: start + bin * (bin index + (sample + 0.5) / count), as
  // (R, bins * S) with S samples per bin: `samples`, or (adaptive) the largest count of any
  // box, each box's own count being ceil(bin), and a mask (R, bins * S) of the samples it has.
  // Sample k = b * S + s of `bins` bins sits b + (s + 0.5) / S = (k + 0.5) / S bins from the
  // start: a constant for small tables, a Range for large ones (no table of output_height x
  // sampling_ratio entries is ever built here).
  constexpr int64_t kMaxConstantTable = 4096;
  auto sample_offsets = [&](int64_t bins) {
    if (bins * samples <= kMaxConstantTable) {
      std::vector<double> f;
      for (int64_t b = 0; b < bins; ++b)
        for (int64_t s = 0; s < samples; ++s)
          f.push_back(static_cast<double>(b) + (static_cast<double>(s) + 0.5) / static_cast<double>(samples));
      return w.reals(f);
    }
    const std::string k = as_float(w.op("Range", {w.i64(0), w.i64(bins * samples), w.i64(1)}));
    return w.op("Div", {w.op("Add", {k, w.scalar(0.5)}), w.scalar(static_cast<double>(samples))});
  };
  auto bin_indices = [&](int64_t n) {  // 0, 1, ..., n - 1 in the model's float type
    if (n <= kMaxConstantTable) {
      std::vector<double> f;
      for (int64_t k = 0; k < n; ++k) f.push_back(static_cast<double>(k));
      return w.reals(f);
    }
    return as_float(w.op("Range", {w.i64(0), w.i64(n), w.i64(1)}));
  };
  struct Samples {
    std::string pos, mask, count, per_bin;  // (mask, count: adaptive only; count (R, 1))
  };
  auto positions = [&](const std::string& start, const std::string& size, int64_t bins) {
    Samples out;
    const std::string bin = w.op("Div", {size, w.scalar(static_cast<double>(bins))});
    if (!adaptive) {
      out.pos = w.op("Add", {start, w.op("Mul", {bin, sample_offsets(bins)})});
      out.per_bin = w.i64s({samples});
      return out;
    }
    out.count = w.op("Ceil", {bin});
    const std::string most = w.op("Max", {w.op("ReduceMax", {out.count}, {attr_i("keepdims", 0)}), w.scalar(1.0)});
    const std::string sample = w.op("Range", {w.scalar(0.0), most, w.scalar(1.0)});  // (S,)
    const std::string divisor = w.op("Max", {out.count, w.scalar(1.0)});
    const std::string offset = w.op("Div", {w.op("Add", {sample, w.scalar(0.5)}), divisor});  // (R, S)
    auto per_bin = [&](const std::string& v) {  // (R, S) -> (R, bins, S) -> (R, bins * S)
      return w.op("Reshape",
                  {w.op("Expand", {w.op("Unsqueeze", {v, w.i64s({1})}),
                                   w.op("Concat", {w.i64s({1, bins}), w.op("Shape", {sample})}, {attr_i("axis", 0)})}),
                   w.i64s({0, -1})});
    };
    // (bins, 1) + (R, 1, S): (R, bins, S)
    const std::string within =
        w.op("Add", {w.op("Unsqueeze", {bin_indices(bins), w.i64s({1})}), w.op("Unsqueeze", {offset, w.i64s({1})})});
    out.pos = w.op("Add", {start, w.op("Mul", {bin, w.op("Reshape", {within, w.i64s({0, -1})})})});
    out.mask = per_bin(w.op("Less", {sample, out.count}));
    out.per_bin = w.op("Shape", {sample});
    return out;
  };
  const Samples sy = positions(y0, extent(y0, y1), out_h);
  const Samples sx = positions(x0, extent(x0, x1), out_w);
  const std::string ys = sy.pos, xs = sx.pos;

  // Per axis: whether a sample is within a pixel of the map, and its two taps.
  struct Axis {
    std::string valid, low, high, frac;
  };
  auto axis = [&](const std::string& pos, const std::string& size) {
    const std::string fsize = as_float(size);
    Axis a;
    a.valid = w.op("And", {w.op("GreaterOrEqual", {pos, w.scalar(-1.0)}), w.op("LessOrEqual", {pos, fsize})});
    const std::string last = w.op("Sub", {fsize, w.scalar(1.0)});
    const std::string clamped = w.op("Min", {w.op("Max", {pos, w.scalar(0.0)}), last});
    const std::string floor = w.op("Floor", {clamped});
    a.frac = w.op("Sub", {clamped, floor});
    a.low = w.op("Cast", {floor}, {attr_i("to", onnx::TensorProto::INT64)});
    a.high = w.op("Min", {w.op("Add", {a.low, w.i64(1)}), w.op("Sub", {size, w.i64(1)})});
    return a;
  };
  const Axis ay = axis(ys, height), ax = axis(xs, width);
  // Broadcast to (R, out_h * samples, out_w * samples).
  auto rows = [&](const std::string& v) { return w.op("Unsqueeze", {v, w.i64s({2})}); };
  auto cols = [&](const std::string& v) { return w.op("Unsqueeze", {v, w.i64s({1})}); };
  std::string inside = w.op("And", {rows(ay.valid), cols(ax.valid)});
  std::string taken;  // (adaptive: the samples each box has, (R, P, 1))
  if (adaptive) {
    taken = w.op("And", {rows(sy.mask), cols(sx.mask)});
    inside = w.op("And", {inside, taken});
    taken = w.op("Reshape", {taken, w.i64s({0, -1, 1})});
  }
  const std::string valid = w.op("Cast", {inside}, {attr_i("to", w.dtype())});
  const std::string one = w.scalar(1.0);
  const std::string wy[2] = {rows(w.op("Sub", {one, ay.frac})), rows(ay.frac)};
  const std::string wx[2] = {cols(w.op("Sub", {one, ax.frac})), cols(ax.frac)};
  const std::string iy[2] = {rows(ay.low), rows(ay.high)};
  const std::string ix[2] = {cols(ax.low), cols(ax.high)};

  // The feature map of each box's image, channels last: (R, H*W, C). Each corner gathers a
  // row per sample (GatherND over the box axis: no index per channel): (R, P, C).
  const std::string image = w.op(
      "Transpose", {w.op("Reshape", {w.op("Gather", {x, c.node.input(2)}, {attr_i("axis", 0)}), w.i64s({0, 0, -1})})},
      {attr_ints("perm", {0, 2, 1})});
  std::vector<std::string> corners;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) {
      const std::string flat = w.op("Reshape", {w.op("Add", {w.op("Mul", {iy[a], width}), ix[b]}), w.i64s({0, -1, 1})});
      const std::string weight =
          w.op("Reshape", {w.op("Mul", {w.op("Mul", {wy[a], wx[b]}), valid}), w.i64s({0, -1, 1})});
      corners.push_back(w.op("Mul", {w.op("GatherND", {image, flat}, {attr_i("batch_dims", 1)}), weight}));
    }
  std::string values;  // (R, P, C)
  if (mode == "max") {
    values = w.op("Max", {corners[0], corners[1], corners[2], corners[3]});
    // Samples a box does not have take no part in its maximum.
    if (adaptive) values = w.op("Where", {taken, values, w.scalar(-std::numeric_limits<double>::infinity())});
  } else {
    values = corners[0];
    for (size_t k = 1; k < corners.size(); ++k) values = w.op("Add", {values, corners[k]});
  }
  // (R, out_h, S_h, out_w, S_w, C): reduce each bin's samples, channels back to axis 1.
  const std::string binned = w.op(
      "Reshape", {values, w.op("Concat", {w.i64s({0, out_h}), sy.per_bin, w.i64s({out_w}), sx.per_bin, w.i64s({-1})},
                               {attr_i("axis", 0)})});
  std::string bins;
  if (mode == "max") {
    bins = w.op("ReduceMax", {binned, w.i64s({2, 4})}, {attr_i("keepdims", 0)});
    // (A box with no samples at all, zero in size, gives zeros, as ONNX Runtime does.)
    if (adaptive) bins = w.op("Where", {w.op("IsInf", {bins}, {attr_i("detect_positive", 0)}), w.scalar(0.0), bins});
  } else if (!adaptive) {
    bins = w.op("ReduceMean", {binned, w.i64s({2, 4})}, {attr_i("keepdims", 0)});
  } else {
    // The mean over the box's own samples (at least one), (R, 1, 1, 1) against (R, out_h, out_w, C).
    const std::string count = w.op("Max", {w.op("Mul", {sy.count, sx.count}), w.scalar(1.0)});
    bins = w.op("Div", {w.op("ReduceSum", {binned, w.i64s({2, 4})}, {attr_i("keepdims", 0)}),
                        w.op("Unsqueeze", {count, w.i64s({2, 3})})});
  }
  w.op("Transpose", {bins}, {attr_ints("perm", {0, 3, 1, 2})}, c.node.output(0));
  return expansion_jvp(c, g);
}

}  // namespace

void register_roi_align(OpTable& table) {
  table.op("RoiAlign").jvp(roi_align_jvp);
}

}  // namespace onnax
