// Derivatives of GridSample by expansion into elementary ops, in X and in the grid, for every
// mode (nearest, linear, cubic), padding mode (zeros, border, reflection), align_corners and
// spatial rank (2-D images, 3-D volumes). The expansion follows ONNX Runtime's kernel: grid
// coordinates are un-normalized to pixel positions, each spatial dim contributes taps (an
// integer index and a weight that is a function of the position), padding acts on the tap
// indices (zeros: out-of-range taps weigh nothing; border: indices clamp; reflection: indices
// reflect off the borders), and the output is the sum over the taps' corners of the product of
// their weights times X gathered at the corner. Weights are smooth in the grid between pixel
// boundaries (Floor and Round carry no derivative), so the derivative in the grid is the
// piecewise one JAX and PyTorch give; the derivative in X is the transpose of the gathers.
#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "rules/derivative.h"
#include "rules/expansion_writer.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

struct Tap {
  std::string index;   // int64 [N, P]
  std::string weight;  // float [N, P] (empty: 1)
};

Vs grid_sample_jvp(JvpCtx& c) {
  const int64_t rank = c.rank(0);
  if (rank < 3) c.unsupported("X has rank " + std::to_string(rank), "give X a batch, a channel and spatial dims");
  const int64_t r = rank - 2;
  std::string mode = "linear", padding = "zeros";
  if (const auto* a = c.attr("mode")) mode = a->s();
  if (const auto* a = c.attr("padding_mode")) padding = a->s();
  if (mode == "bilinear") mode = "linear";  // (opset 16 spellings)
  if (mode == "bicubic") mode = "cubic";
  if (mode != "linear" && mode != "nearest" && mode != "cubic")
    c.unsupported("mode is '" + mode + "'", "use linear, nearest or cubic");
  if (padding != "zeros" && padding != "border" && padding != "reflection")
    c.unsupported("padding_mode is '" + padding + "'", "use zeros, border or reflection");
  const bool align = c.attr_i("align_corners", 0) != 0;

  onnx::GraphProto g;
  ExpansionWriter w(c.b, g, c.node.output(0), c.dtype(0));
  const std::string& x = c.node.input(0);
  const std::string& grid = c.node.input(1);
  const std::string x_shape = w.op("Shape", {x});
  const std::string grid_shape = w.op("Shape", {grid});
  // Grid points flattened: [N, P, r]; X flattened: [N, C, S].
  const std::string points =
      w.op("Reshape", {grid, w.op("Concat", {w.i64s({0, -1}), w.i64s({r})}, {attr_i("axis", 0)})});
  // X flattened, channels last: [N, S, C] (each corner gathers one row per point, GatherND over
  // the batch axis: no index per channel).
  const std::string flat_x =
      w.op("Transpose", {w.op("Reshape", {x, w.i64s({0, 0, -1})})}, {attr_ints("perm", {0, 2, 1})});

  // Per spatial dim (outermost first): its size and taps.
  std::vector<std::string> sizes;
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) {
    const std::string size = w.op("Gather", {x_shape, w.i64(2 + i)}, {attr_i("axis", 0)});
    sizes.push_back(size);
    const std::string fsize = w.op("Cast", {size}, {attr_i("to", w.dtype())});
    // The grid's last axis lists coordinates innermost dim first (x, y, z).
    const std::string n = w.op("Gather", {points, w.i64(r - 1 - i)}, {attr_i("axis", 2)});
    const std::string one = w.scalar(1.0), half = w.scalar(0.5);
    // align_corners: (n + 1) / 2 * (size - 1); otherwise ((n + 1) * size - 1) / 2.
    const std::string pos = align
                                ? w.op("Mul", {w.op("Mul", {w.op("Add", {n, one}), half}), w.op("Sub", {fsize, one})})
                                : w.op("Mul", {w.op("Sub", {w.op("Mul", {w.op("Add", {n, one}), fsize}), one}), half});
    auto index = [&](const std::string& f) { return w.op("Cast", {f}, {attr_i("to", onnx::TensorProto::INT64)}); };
    std::vector<Tap>& t = taps[static_cast<size_t>(i)];
    if (mode == "nearest") {
      t.push_back({index(w.op("Round", {pos})), {}});  // (half to even, as nearbyint)
    } else {
      const std::string floor = w.op("Floor", {pos});
      const std::string frac = w.op("Sub", {pos, floor});
      const std::string base = index(floor);
      if (mode == "linear") {
        t.push_back({base, w.op("Sub", {one, frac})});
        t.push_back({w.op("Add", {base, w.i64(1)}), frac});
      } else {
        const std::vector<std::string> cw = cubic_weights(w, frac, -0.75);
        for (int k = 0; k < 4; ++k) t.push_back({w.op("Add", {base, w.i64(k - 1)}), cw[static_cast<size_t>(k)]});
      }
    }
    // Padding on the tap indices.
    const std::string last = w.op("Sub", {size, w.i64(1)});
    const std::string zero = w.i64(0);
    for (Tap& tap : t) {
      if (padding == "zeros") {
        const std::string inside =
            w.op("And", {w.op("GreaterOrEqual", {tap.index, zero}), w.op("Less", {tap.index, size})});
        const std::string mask = w.op("Cast", {inside}, {attr_i("to", w.dtype())});
        tap.weight = tap.weight.empty() ? mask : w.op("Mul", {tap.weight, mask});
      } else if (padding == "reflection") {
        // Indices reflect off the borders (at -0.5 and size - 0.5, or 0 and size - 1 with
        // align_corners): periodic with period 2 * size (2 * (size - 1)), mirrored in the
        // second half.
        const std::string span = align ? last : size;
        const std::string period = w.op("Max", {w.op("Mul", {span, w.i64(2)}), w.i64(1)});
        const std::string m = w.op("Mod", {tap.index, period});
        const std::string mirrored = w.op("Sub", {w.op("Sub", {period, m}), align ? zero : w.i64(1)});
        tap.index = w.op("Where", {w.op("Less", {m, size}), m, mirrored});
      }
      tap.index = w.op("Clip", {tap.index, zero, last});  // (zeros: the masked taps still gather)
    }
  }
  // Strides of the flattened spatial dims.
  std::vector<std::string> strides(static_cast<size_t>(r));
  strides[static_cast<size_t>(r - 1)] = w.i64(1);
  for (int64_t i = r - 2; i >= 0; --i)
    strides[static_cast<size_t>(i)] =
        w.op("Mul", {strides[static_cast<size_t>(i + 1)], sizes[static_cast<size_t>(i + 1)]});

  // Sum over the corners (one tap per dim) of weight * X[corner]: [N, P, C].
  std::string total;
  std::vector<size_t> pick(static_cast<size_t>(r), 0);
  while (true) {
    std::string flat, weight;
    for (int64_t i = 0; i < r; ++i) {
      const Tap& tap = taps[static_cast<size_t>(i)][pick[static_cast<size_t>(i)]];
      const std::string term = i == r - 1 ? tap.index : w.op("Mul", {tap.index, strides[static_cast<size_t>(i)]});
      flat = flat.empty() ? term : w.op("Add", {flat, term});
      if (!tap.weight.empty()) weight = weight.empty() ? tap.weight : w.op("Mul", {weight, tap.weight});
    }
    const std::string where = w.op("Unsqueeze", {flat, w.i64s({2})});
    std::string value = w.op("GatherND", {flat_x, where}, {attr_i("batch_dims", 1)});
    if (!weight.empty()) value = w.op("Mul", {value, w.op("Unsqueeze", {weight, w.i64s({2})})});
    total = total.empty() ? value : w.op("Add", {total, value});
    size_t d = 0;
    while (d < pick.size() && ++pick[d] == taps[d].size()) pick[d++] = 0;
    if (d == pick.size()) break;
  }
  // [N, P, C] -> [N, C, P] -> [N, C, O1, ..., Or]
  total = w.op("Transpose", {total}, {attr_ints("perm", {0, 2, 1})});
  const std::string out_shape =
      w.op("Concat",
           {w.op("Slice", {x_shape, w.i64s({0}), w.i64s({2})}), w.op("Slice", {grid_shape, w.i64s({1}), w.i64s({-1})})},
           {attr_i("axis", 0)});
  w.op("Reshape", {total, out_shape}, {}, c.node.output(0));
  return expansion_jvp(c, g);
}

}  // namespace

void register_grid_sample(OpTable& table) {
  table.op("GridSample").jvp(grid_sample_jvp);
}

}  // namespace onnax
