// Derivatives of Resize. Resize is linear in X for fixed roi/scales/sizes (every mode
// interpolates with weights that depend only on the geometry), so X's tangent is resized like X
// and the transpose applies the per-axis interpolation matrices' transposes. Where the sampling
// positions move with run-time scales or roi (linear and cubic modes), or where the transpose
// has no Resize spelling (sizes kept to the aspect ratio), the JVP goes through an expansion
// of Resize into elementary ops instead (resize_expansion), whose own rules differentiate it
// in all inputs and transpose it.
#include <onnx/onnx_pb.h>

#include <functional>
#include <string>
#include <vector>

#include "rules/derivative.h"
#include "rules/expansion_writer.h"
#include "rules/op_table.h"
#include "rules/window.h"

namespace onnax {
namespace {

using D = JvpCtx;

// An expansion value made on first use.
class Lazy {
 public:
  explicit Lazy(std::function<std::string()> make) : make_(std::move(make)) {}
  const std::string& operator()() {
    if (value_.empty()) value_ = make_();
    return value_;
  }

 private:
  std::function<std::string()> make_;
  std::string value_;
};

bool stretches(const onnx::NodeProto& node) {
  return node_s(node, "keep_aspect_ratio_policy", "stretch") == "stretch";
}

// roi and scales carry no derivative (zero almost everywhere, as for Floor or Round) where
// they only pick the output size or which element is copied: in nearest mode; roi outside
// tf_crop_and_resize (which ignores it); scales under align_corners and tf_crop_and_resize,
// whose sampling positions depend on the output size alone (without antialias, whose filter
// width follows the scale).
bool piecewise_constant_in(D& c, int i) {
  const std::string mode = node_s(c.node, "mode", "nearest");
  const std::string coords = node_s(c.node, "coordinate_transformation_mode", "half_pixel");
  if (mode == "nearest") return true;
  if (i == 1) return coords != "tf_crop_and_resize";
  return (coords == "align_corners" || coords == "tf_crop_and_resize") && c.attr_i("antialias", 0) == 0;
}

// Antialiased linear or cubic resampling of `x` along axis `a` (of `rank`), as ONNX Runtime
// filters (after Pillow): output o weighs input q by the kernel at (q - center_o) * min(scale, 1),
// so downsampling widens the kernel by 1/scale, and the weights of each output are normalized
// over its taps. Taps beyond the input count toward that normalization and land on the nearest
// edge element, unless exclude_outside drops them. The number of taps follows the run-time
// scale, so the weights form a dense out x in matrix (over input positions widened by the
// kernel's reach) instead of a fixed set of gathered taps. Like ONNX Runtime, an axis whose
// length does not change is copied.
struct AntialiasAxis {
  std::string x, center, pos, scale, n, out;  // center, pos: [out] in the coordinate type
  int64_t a = 0, rank = 0;
  bool cubic = false, exclude_outside = false;
  double cubic_a = -0.75;
  int32_t value_type = 0;
};
std::string antialias_along(ExpansionWriter& w, const AntialiasAxis& p) {
  const int32_t i64 = onnx::TensorProto::INT64;
  auto to = [&](const std::string& v, int32_t dt) { return w.op("Cast", {v}, {attr_i("to", dt)}); };
  auto unsqueeze = [&](const std::string& v, int64_t axis) { return w.op("Unsqueeze", {v, w.i64s({axis})}); };
  const std::string one = w.scalar(1.0), zero = w.scalar(0.0);
  const std::string same = w.op("Equal", {p.out, p.n});
  const std::string stretch = w.op("Where", {same, one, w.op("Min", {p.scale, one})});
  const std::string center = w.op("Where", {same, p.pos, p.center});
  std::string taps;
  if (p.exclude_outside) {
    taps = w.op("Range", {w.i64(0), p.n, w.i64(1)});
  } else {
    const std::string reach = w.op("Div", {w.scalar(p.cubic ? 2.0 : 1.0), stretch});  // in input steps
    const std::string pad = w.op("Add", {to(w.op("Ceil", {reach}), i64), w.i64(1)});
    taps = w.op("Range", {w.op("Neg", {pad}), w.op("Add", {p.n, pad}), w.i64(1)});
  }
  const std::string distance =
      w.op("Abs", {w.op("Mul", {w.op("Sub", {unsqueeze(to(taps, w.dtype()), 0), unsqueeze(center, 1)}), stretch})});
  std::string kernel;
  if (p.cubic) {
    const std::string far =
        w.op("Where", {w.op("Less", {distance, w.scalar(2.0)}), polynomial(w, distance, keys_far(p.cubic_a)), zero});
    kernel = w.op("Where", {w.op("Less", {distance, one}), polynomial(w, distance, keys_near(p.cubic_a)), far});
  } else {
    kernel = w.op("Relu", {w.op("Sub", {one, distance})});
  }
  const std::string total = w.op("ReduceSum", {kernel, w.i64s({1})}, {attr_i("keepdims", 1)});
  if (!p.exclude_outside) {
    const std::string edge = w.op("Clip", {taps, w.i64(0), w.op("Sub", {p.n, w.i64(1)})});
    const std::string inputs = w.op("Range", {w.i64(0), p.n, w.i64(1)});
    kernel = w.op("MatMul", {kernel, to(w.op("Equal", {unsqueeze(edge, 1), unsqueeze(inputs, 0)}), w.dtype())});
  }
  const std::string safe_total = w.op("Where", {w.op("Equal", {total, zero}), one, total});
  const std::string weights = to(w.op("Div", {kernel, safe_total}), p.value_type);  // [out, in]
  if (p.a == p.rank - 2) return w.op("MatMul", {weights, p.x});
  const std::string weights_t = w.op("Transpose", {weights}, {attr_ints("perm", {1, 0})});
  if (p.a == p.rank - 1) return w.op("MatMul", {p.x, weights_t});
  std::vector<int64_t> perm, inverse(static_cast<size_t>(p.rank));
  for (int64_t d = 0; d < p.rank; ++d)
    if (d != p.a) perm.push_back(d);
  perm.push_back(p.a);
  for (int64_t d = 0; d < p.rank; ++d) inverse[static_cast<size_t>(perm[static_cast<size_t>(d)])] = d;
  const std::string moved = w.op("Transpose", {p.x}, {attr_ints("perm", perm)});
  return w.op("Transpose", {w.op("MatMul", {moved, weights_t})}, {attr_ints("perm", inverse)});
}

// Resize in elementary ops, one resized axis after another (every mode is separable),
// following ONNX Runtime's kernels. Per axis: the source coordinate of each output
// position (coordinate_transformation_mode, with the axis' scale from `scales`, or from `sizes`
// and keep_aspect_ratio_policy; lengths from X and from the op's own output), then taps gathered
// along the axis and weighted: nearest one index (nearest_mode), linear two (the coordinate
// clamped to the input, as ONNX Runtime clamps it), cubic four (Keys' kernel with
// cubic_coeff_a, edge-clamped indices, and under exclude_outside the taps outside the input
// dropped and the rest renormalized); antialiased linear and cubic weigh every input element
// (antialias_along). tf_crop_and_resize writes extrapolation_value where the
// coordinate leaves the input. Floor, Ceil and the comparisons carry no derivative, so the
// derivative in scales and roi is the piecewise one between sampling-grid jumps.
// Coordinates are computed in float32, as ONNX Runtime does, or in roi's type when roi is used.
Vs resize_expansion_jvp(D& c) {
  if (c.opset < 11) c.unsupported("Resize-10 has no roi input", "upgrade the model to opset 11 or later");
  const int64_t r = c.rank(0);
  if (r < 0) c.unsupported("X's rank is unknown", "give X a static rank (shape inference or value_info)");
  const std::string mode = node_s(c.node, "mode", "nearest");
  const std::string coords = node_s(c.node, "coordinate_transformation_mode", "half_pixel");
  const std::string nearest = node_s(c.node, "nearest_mode", "round_prefer_floor");
  const std::string policy = node_s(c.node, "keep_aspect_ratio_policy", "stretch");
  std::vector<int64_t> axes = c.attr_ints("axes");
  if (axes.empty())
    for (int64_t a = 0; a < r; ++a) axes.push_back(a);
  for (int64_t& a : axes) a = a < 0 ? a + r : a;
  const int64_t k = static_cast<int64_t>(axes.size());
  const bool crop = coords == "tf_crop_and_resize";
  const bool by_scales = c.has(2);
  const bool antialias = c.attr_i("antialias", 0) != 0 && mode != "nearest";
  const int32_t xdt = c.dtype(0);
  const int32_t cdt = crop && c.has(1) ? c.dtype(1) : static_cast<int32_t>(onnx::TensorProto::FLOAT);
  const int32_t i64 = onnx::TensorProto::INT64;

  onnx::GraphProto g;
  ExpansionWriter w(c.b, g, c.node.output(0), cdt);   // coordinates
  ExpansionWriter wx(c.b, g, c.node.output(0), xdt);  // values
  // The output's shape, read from the op's own output (which the expansion cannot name: it
  // writes the output's name itself).
  KnownPrimal known;
  const std::string out_shape = w.fresh("out_shape");
  known.values[out_shape] = c.b.shape_of(c.y());
  const std::string x_shape = w.op("Shape", {c.node.input(0)});
  auto to = [&](const std::string& v, int32_t dt) { return w.op("Cast", {v}, {attr_i("to", dt)}); };
  auto at = [&](const std::string& v, int64_t i) { return w.op("Gather", {v, w.i64(i)}, {attr_i("axis", 0)}); };
  // Values made on first use: every expansion node is emitted, so an unused one would stay in
  // the result as a dead node.
  Lazy one{[&] { return w.scalar(1.0); }}, half{[&] { return w.scalar(0.5); }}, zero{[&] { return w.scalar(0.0); }};
  // Sizes kept to the aspect ratio: one scale for every listed axis, the smallest (not_larger)
  // or largest (not_smaller) of sizes / input sizes.
  std::string common_scale;
  if (!by_scales && policy != "stretch") {
    const std::string ratios =
        w.op("Div", {to(c.node.input(3), cdt), to(w.op("Gather", {x_shape, w.i64s(axes)}, {attr_i("axis", 0)}), cdt)});
    common_scale = w.op(policy == "not_larger" ? "ReduceMin" : "ReduceMax", {ratios}, {attr_i("keepdims", 0)});
  }
  std::string cur = c.node.input(0);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t a = axes[static_cast<size_t>(j)];
    const std::string n = at(x_shape, a), out = at(out_shape, a);
    Lazy nf{[&] { return to(n, cdt); }}, outf{[&] { return to(out, cdt); }};
    Lazy last_f{[&] { return w.op("Sub", {nf(), one()}); }};
    Lazy scale{[&] {
      return by_scales               ? to(at(c.node.input(2), j), cdt)
             : !common_scale.empty() ? common_scale
                                     : w.op("Div", {outf(), nf()});
    }};
    const std::string pos = to(w.op("Range", {w.i64(0), out, w.i64(1)}), cdt);
    Lazy centered{[&] { return w.op("Sub", {w.op("Div", {w.op("Add", {pos, half()}), scale()}), half()}); }};
    // (No division by zero in a branch Where discards: its derivative would be NaN.)
    Lazy spans{[&] { return w.op("Max", {w.op("Sub", {outf(), one()}), one()}); }};
    Lazy several{[&] { return w.op("Greater", {out, w.i64(1)}); }};
    std::string x;
    if (coords == "half_pixel") {
      x = centered();
    } else if (coords == "half_pixel_symmetric") {
      const std::string adjustment = w.op("Div", {outf(), w.op("Mul", {scale(), nf()})});
      const std::string offset = w.op("Mul", {w.op("Mul", {nf(), half()}), w.op("Sub", {one(), adjustment})});
      x = w.op("Add", {offset, centered()});
    } else if (coords == "pytorch_half_pixel") {
      x = w.op("Where", {several(), centered(), zero()});
    } else if (coords == "tf_half_pixel_for_nn") {
      x = w.op("Div", {w.op("Add", {pos, half()}), scale()});
    } else if (coords == "asymmetric") {
      x = w.op("Div", {pos, scale()});
    } else if (coords == "align_corners") {
      x = w.op("Where", {several(), w.op("Div", {w.op("Mul", {pos, last_f()}), spans()}), zero()});
    } else if (crop) {
      if (!c.has(1)) c.unsupported("tf_crop_and_resize has no roi", "give Resize its roi input");
      const std::string roi = to(c.node.input(1), cdt);
      const std::string start = at(roi, j), end = at(roi, j + k);
      const std::string stepped =
          w.op("Add", {w.op("Mul", {start, last_f()}),
                       w.op("Div", {w.op("Mul", {w.op("Mul", {pos, w.op("Sub", {end, start})}), last_f()}), spans()})});
      const std::string middle = w.op("Mul", {w.op("Mul", {w.op("Add", {start, end}), half()}), last_f()});
      x = w.op("Where", {several(), stepped, middle});
    } else {
      c.unsupported("coordinate_transformation_mode is '" + coords + "'",
                    "use one of the modes ONNX defines for this opset");
    }
    // ONNX Runtime's antialiased filter centers an axis of scale 1 on the input grid, roi or not.
    if (antialias && crop) x = w.op("Where", {w.op("Equal", {scale(), one()}), pos, x});
    // A per-position vector [out] broadcast along axis a of the running result.
    std::vector<int64_t> trailing;
    for (int64_t d = 1; d < r - a; ++d) trailing.push_back(d);
    auto along = [&](const std::string& v) { return trailing.empty() ? v : w.op("Unsqueeze", {v, w.i64s(trailing)}); };
    const std::string last = w.op("Sub", {n, w.i64(1)});
    auto clamp = [&](const std::string& index) { return w.op("Clip", {index, w.i64(0), last}); };
    auto gather = [&](const std::string& index) { return w.op("Gather", {cur, index}, {attr_i("axis", a)}); };
    auto weighted = [&](const std::string& index, const std::string& weight) {
      return w.op("Mul", {gather(index), along(to(weight, xdt))});
    };
    std::string next;
    if (antialias) {
      next = antialias_along(w, {.x = cur,
                                 .center = x,
                                 .pos = pos,
                                 .scale = scale(),
                                 .n = n,
                                 .out = out,
                                 .a = a,
                                 .rank = r,
                                 .cubic = mode == "cubic",
                                 .exclude_outside = c.attr_i("exclude_outside", 0) != 0,
                                 .cubic_a = c.attr_f("cubic_coeff_a", -0.75f),
                                 .value_type = xdt});
    } else if (mode == "nearest") {
      const std::string picked = nearest == "round_prefer_floor"  ? w.op("Ceil", {w.op("Sub", {x, half()})})
                                 : nearest == "round_prefer_ceil" ? w.op("Floor", {w.op("Add", {x, half()})})
                                 : nearest == "floor"             ? w.op("Floor", {x})
                                                                  : w.op("Ceil", {x});
      next = gather(clamp(to(picked, i64)));
    } else if (mode == "linear") {
      const std::string inside = w.op("Clip", {x, zero(), last_f()});
      const std::string floor = w.op("Floor", {inside});
      const std::string frac = w.op("Sub", {inside, floor});
      const std::string lo = to(floor, i64);
      const std::string hi = w.op("Min", {w.op("Add", {lo, w.i64(1)}), last});
      next = w.op("Add", {weighted(lo, w.op("Sub", {one(), frac})), weighted(hi, frac)});
    } else if (mode == "cubic") {
      const std::string floor = w.op("Floor", {x});
      const std::string frac = w.op("Sub", {x, floor});
      const std::string base = to(floor, i64);
      std::vector<std::string> weights = cubic_weights(w, frac, c.attr_f("cubic_coeff_a", -0.75f));
      std::vector<std::string> taps;
      for (int64_t t = 0; t < 4; ++t) taps.push_back(w.op("Add", {base, w.i64(t - 1)}));
      if (c.attr_i("exclude_outside", 0) != 0) {
        std::string total;
        for (size_t t = 0; t < 4; ++t) {
          const std::string within =
              w.op("And", {w.op("GreaterOrEqual", {taps[t], w.i64(0)}), w.op("Less", {taps[t], n})});
          weights[t] = w.op("Mul", {weights[t], to(within, cdt)});
          total = total.empty() ? weights[t] : w.op("Add", {total, weights[t]});
        }
        for (auto& weight : weights) weight = w.op("Div", {weight, total});
      }
      for (size_t t = 0; t < 4; ++t) {
        const std::string term = weighted(clamp(taps[t]), weights[t]);
        next = next.empty() ? term : w.op("Add", {next, term});
      }
    } else {
      c.unsupported("mode is '" + mode + "'", "use nearest, linear or cubic");
    }
    if (crop) {
      const std::string outside = w.op("Or", {w.op("Less", {x, zero()}), w.op("Greater", {x, last_f()})});
      next = w.op("Where", {along(outside), wx.scalar(c.attr_f("extrapolation_value", 0.0f)), next});
    }
    cur = next;
  }
  w.op("Identity", {cur}, {}, c.node.output(0));
  return expansion_jvp(c, g, &known);
}

Vs resize_jvp(D& c) {
  bool expand = false;
  for (int i : {1, 2}) expand = expand || (c.t(i).valid() && !piecewise_constant_in(c, i));
  // Reverse mode of sizes kept to the aspect ratio: no Resize spelling resizes one axis with
  // the common scale to the size that scale gives, so the transpose cannot be built from Resize;
  // the expansion's Gathers transpose instead.
  expand = expand || (c.b.has_tape() && c.t(0).valid() && !c.has(2) && c.has(3) && !stretches(c.node));
  if (expand) return resize_expansion_jvp(c);
  if (!c.t(0).valid()) return {V{}};
  Vs ins = c.xs;
  ins[0] = c.t(0);
  Attrs zero;
  if (c.attr("extrapolation_value")) zero.push_back(Attr::f("extrapolation_value", 0.0f));
  V out = c.b.clone(c.node, ins, zero)[0];
  // Keep the rank known when inference cannot see it (e.g. after a GroupNormalization).
  if (c.b.facts(out).rank() < 0 && c.b.facts(c.t(0)).rank() >= 0)
    c.b.set_facts(out, Facts::of(c.b.facts(c.t(0)).dtype, std::vector<Dim>(c.b.facts(c.t(0)).rank(), Dim{})));
  return {out};
}

// Resize interpolates each resized axis independently (nearest, linear, cubic, antialiased or
// not), so X -> Y is a product of per-axis matrices M_a (out_a x in_a) and the transpose
// applies each M_a^T. M_a^T is Resize itself applied to an identity matrix E (in_a x in_a)
// along its last axis (scale 1 on the first, which every mode maps to itself), so the
// interpolation weights are exactly the op's. Axes whose constant size equals the static
// input size are the identity and skipped; with run-time scales every listed axis is applied.
Vs resize_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(1) || c.linear(2) || c.linear(3))
    c.unsupported("roi, scales or sizes is a tangent (Resize is linear in X only)",
                  "treat roi/scales/sizes as constants (initializers)");
  const bool by_sizes = c.in(3).valid();
  if (by_sizes && !stretches(c.node))  // (the JVP expands these in reverse mode)
    c.unsupported("keep_aspect_ratio_policy=" + node_s(c.node, "keep_aspect_ratio_policy", "") +
                      " couples the axes, and this Resize was not made by the JVP rule, which expands it",
                  "use jvp (forward mode), or keep_aspect_ratio_policy='stretch'");
  const int64_t r = c.rank(c.in(0));
  std::vector<int64_t> axes = c.attr_ints("axes");
  if (axes.empty())
    for (int64_t a = 0; a < r; ++a) axes.push_back(a);
  const int64_t k = static_cast<int64_t>(axes.size());
  const int32_t dt = b.facts(c.ct()).dtype;
  const Facts& xf = b.facts(c.in(0));
  const std::vector<int64_t>* sizes = by_sizes ? b.known_i64(c.in(3)) : nullptr;
  V xshape = tangent_shape(c, c.in(0));
  V ct = c.ct();
  for (int64_t j = 0; j < k; ++j) {
    const int64_t a = axes[j] < 0 ? axes[j] + r : axes[j];
    if (sizes && xf.has_shape && xf.dims[a].known() && (*sizes)[j] == xf.dims[a].value()) continue;
    V n = b.op1("Slice", {xshape, b.i64s({a}), b.i64s({a + 1})});
    V iota = b.op1("Range", {b.i64(0), b.op1("Squeeze", {n, b.i64s({0})}), b.i64(1)});
    V eye = b.op1("Cast", {b.op1("Equal", {b.unsqueeze(iota, {1}), b.unsqueeze(iota, {0})})}, {Attr::i("to", dt)});
    Vs ins{eye, V{}, V{}, V{}};
    if (c.in(1).valid()) {
      // tf_crop_and_resize's roi: the full range [0, 1] on E's identity axis.
      V roi = b.op1("Gather", {c.in(1), b.i64s({j, j + k})}, {Attr::i("axis", 0)});
      V full = b.op1("Cast", {b.i64s({0, 1})}, {Attr::i("to", b.facts(c.in(1)).dtype)});
      ins[1] = b.op1("Gather", {b.concat({full, roi}, 0), b.i64s({0, 2, 1, 3})}, {Attr::i("axis", 0)});
    }
    if (by_sizes)
      ins[3] = b.concat({n, b.op1("Gather", {c.in(3), b.i64s({j})}, {Attr::i("axis", 0)})}, 0);
    else
      ins[2] = b.concat({b.op1("Cast", {b.i64s({1})}, {Attr::i("to", onnx::TensorProto::FLOAT)}),
                         b.op1("Gather", {c.in(2), b.i64s({j})}, {Attr::i("axis", 0)})},
                        0);
    V mt = b.clone(c.node, ins, {Attr::s("keep_aspect_ratio_policy", "stretch")}, {"axes"})[0];  // (in_a, out_a)
    // ct (..., out_a at a, ...) -> axis a last -> @ M_a (out_a, in_a) -> back.
    std::vector<int64_t> perm;
    for (int64_t d = 0; d < r; ++d)
      if (d != a) perm.push_back(d);
    perm.push_back(a);
    std::vector<int64_t> inv(r);
    for (int64_t d = 0; d < r; ++d) inv[perm[d]] = d;
    V moved = b.transpose(ct, perm);
    ct = b.transpose(b.op1("MatMul", {moved, b.transpose(mt, {1, 0})}), inv);
  }
  Vs out(c.ins.size());
  out[0] = b.reshape(ct, xshape);
  return out;
}

}  // namespace

void register_resize(OpTable& table) {
  table.op("Resize").jvp(resize_jvp).transpose(resize_transpose);
}

}  // namespace onnax
