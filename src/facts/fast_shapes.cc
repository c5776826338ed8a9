#include "facts/fast_shapes.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

namespace onnax {
namespace {

enum class Kind {
  kNone,
  kUnary,
  kBroadcast,
  kMatMul,
  // Output 0 has input 0's type and shape, other inputs are parameters. For the function ops
  // ONNX gives no inference function at all (GroupNormalization 18/21, MVN 13), so without
  // this their outputs, and everything after them, would have no rank.
  kLikeFirst,
  // Output dims are the input's permuted by `perm` (reversed without it).
  kTranspose,
  // Output 0 has input 0's type and shape; `axis` must name one of its axes (Softmax,
  // LogSoftmax, LayerNormalization with its Y output alone).
  kLikeFirstOnAxis,
  // Reduce*: input 0's dims without (or with size 1 at) the axes of input 1 or `axes`.
  kReduce,
  // Reshape / Expand to the constant target shape of input 1.
  kReshape,
  kExpand,
};

// Operators whose ONNX inference is "element type and shape of the first input" (for
// floating inputs) or a plain broadcast of all inputs, in every opset from 18 to 28.
// How an op is inferred here, and whether it takes any number of inputs (Sum, Mean, Max, Min)
// rather than exactly two. One table lookup per node: fast_infer runs for every node.
struct OpKind {
  Kind kind = Kind::kNone;
  bool variadic = false;
  int since = 0;  // the first opset where this kind applies (Gelu: 20)
};

// The kinds by op type. fast_infer runs for every emitted node, so the lookup is one load of
// the name's first bytes, a multiply and one short compare: a general string hash costs more
// than the rest of inferring an elementwise op.
class KindTable {
 public:
  KindTable() {
    for (const char* u : {"Abs",       "Acos",     "Acosh",   "Asin",        "Asinh",      "Atan",
                          "Atanh",     "Ceil",     "Celu",    "Cos",         "Cosh",       "Elu",
                          "Erf",       "Exp",      "Floor",   "HardSigmoid", "HardSwish",  "Identity",
                          "LeakyRelu", "Log",      "Mish",    "Neg",         "Reciprocal", "Relu",
                          "Round",     "Selu",     "Sigmoid", "Sign",        "Sin",        "Sinh",
                          "Softplus",  "Softsign", "Sqrt",    "Tan",         "Tanh",       "ThresholdedRelu"})
      add(u, OpKind{Kind::kUnary});
    add("Gelu", OpKind{Kind::kUnary, false, 20});
    for (const char* b : {"Add", "Sub", "Mul", "Div", "Pow"}) add(b, OpKind{Kind::kBroadcast});
    for (const char* b : {"Max", "Min", "Sum", "Mean"}) add(b, OpKind{Kind::kBroadcast, true});
    add("MatMul", OpKind{Kind::kMatMul});
    add("Transpose", OpKind{Kind::kTranspose});
    for (const char* r : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                          "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
      add(r, OpKind{Kind::kReduce});
    add("Reshape", OpKind{Kind::kReshape});
    add("Expand", OpKind{Kind::kExpand});
    // (Softmax before opset 13 coerces to 2-D around its axis; LayerNormalization is from 17.)
    for (const char* a : {"Softmax", "LogSoftmax"}) add(a, OpKind{Kind::kLikeFirstOnAxis, false, 13});
    add("LayerNormalization", OpKind{Kind::kLikeFirstOnAxis, false, 17});
    add("GroupNormalization", OpKind{Kind::kLikeFirst});
    add("MeanVarianceNormalization", OpKind{Kind::kLikeFirst});
  }
  OpKind find(std::string_view op, int opset) const {
    for (size_t i = slot(op);; i = (i + 1) % kSlots) {
      const Entry& e = entries_[i];
      if (e.name.empty()) return OpKind{};
      if (e.name == op) return opset < e.kind.since ? OpKind{} : e.kind;
    }
  }

 private:
  // Open addressing over a fixed table (at most half full); the hash reads only the first
  // eight bytes and the length, which tell these names apart well enough.
  static constexpr size_t kSlots = 128;
  static size_t slot(std::string_view op) {
    uint64_t k = 0;
    std::memcpy(&k, op.data(), std::min<size_t>(op.size(), 8));
    k = (k ^ op.size()) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(k >> 57);  // top 7 bits: 0..127
  }
  void add(std::string_view op, OpKind kind) {
    size_t i = slot(op);
    while (!entries_[i].name.empty()) i = (i + 1) % kSlots;
    entries_[i] = Entry{op, kind};
  }
  struct Entry {
    std::string_view name;  // (string literals)
    OpKind kind;
  };
  Entry entries_[kSlots];
};

OpKind kind_of(std::string_view op, int opset) {
  static const KindTable table;
  return table.find(op, opset);
}

bool floating(int32_t t) {
  return t == onnx::TensorProto::FLOAT || t == onnx::TensorProto::DOUBLE || t == onnx::TensorProto::FLOAT16 ||
         t == onnx::TensorProto::BFLOAT16;
}

// The leading `size` dims of a shape (all of them, or the batch dims of a MatMul operand).
struct Operand {
  const Dims* dims;
  int size;
};

// The same dimension algebra as ONNX's multidirectional broadcast inference: a known size
// other than 1 wins; one distinct symbolic dim survives; several give an unknown dim.
// False when known sizes conflict (ONNX's inference fails there; leave it to report).
bool broadcast(const Operand* ops, int count, Dims& out) {
  int rank = 0;
  for (int k = 0; k < count; ++k) rank = std::max(rank, ops[k].size);
  for (int i = 0; i < rank; ++i) {
    int64_t value = 1;
    const Dim* symbolic = nullptr;
    int symbolic_count = 0;
    for (int k = 0; k < count; ++k) {
      const Operand& op = ops[k];
      if (i < rank - op.size) continue;
      const Dim& d = (*op.dims)[static_cast<size_t>(i - rank + op.size)];
      if (d.known()) {
        if (d.value() == 1) continue;
        if (value != 1 && value != d.value()) return false;
        value = d.value();
      } else if (symbolic_count == 0) {
        symbolic = &d;
        symbolic_count = 1;
      } else if (!(d == *symbolic)) {
        ++symbolic_count;
      }
    }
    if (value != 1 || symbolic_count == 0)
      out.push_back(Dim::of(value));
    else if (symbolic_count == 1)
      out.push_back(*symbolic);
    else
      out.push_back(Dim{});
  }
  return true;
}

// MatMul of operands of rank >= 2: broadcast batch dims, then [.., M, K] x [.., K, N].
bool matmul(const Dims& a, const Dims& b, Dims& out) {
  const int ra = static_cast<int>(a.size()), rb = static_cast<int>(b.size());
  if (ra < 2 || rb < 2) return false;  // vector promotion: leave to ONNX
  const Dim& k1 = a[static_cast<size_t>(ra - 1)];
  const Dim& k2 = b[static_cast<size_t>(rb - 2)];
  if (k1.known() && k2.known() && k1.value() != k2.value()) return false;
  const Operand batch[2] = {{&a, ra - 2}, {&b, rb - 2}};
  out.reserve(static_cast<size_t>(std::max(ra, rb)));
  if (!broadcast(batch, 2, out)) return false;
  out.push_back(a[static_cast<size_t>(ra - 2)]);
  out.push_back(b[static_cast<size_t>(rb - 1)]);
  return true;
}

// Transpose: a valid permutation of the input's axes (every axis once); anything else is left
// to ONNX's inference, which reports it.
bool transpose(const onnx::NodeProto& node, const Facts& in, Facts& out) {
  if (!in.has_shape) return true;  // ONNX types the output without a shape
  const size_t rank = in.dims.size();
  const onnx::AttributeProto* perm = nullptr;
  for (const auto& a : node.attribute()) {
    if (a.name() != "perm") return false;  // unknown attributes: ONNX decides
    perm = &a;
  }
  if (perm && (perm->type() != onnx::AttributeProto::INTS || static_cast<size_t>(perm->ints_size()) != rank))
    return false;
  std::vector<char> seen(rank, 0);
  out.has_shape = true;
  out.dims.reserve(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t axis = perm ? perm->ints(static_cast<int>(i)) : static_cast<int64_t>(rank - 1 - i);
    if (axis < 0 || static_cast<size_t>(axis) >= rank || seen[static_cast<size_t>(axis)]) return false;
    seen[static_cast<size_t>(axis)] = 1;
    out.dims.push_back(in.dims[static_cast<size_t>(axis)]);
  }
  return true;
}

// Softmax, LogSoftmax, LayerNormalization: x's type and shape, for an axis within its rank.
bool like_first_on_axis(const onnx::NodeProto& node, const Facts& x, Facts& out) {
  int64_t axis = -1;
  for (const auto& a : node.attribute()) {
    if (a.name() == "axis" && a.type() == onnx::AttributeProto::INT)
      axis = a.i();
    else if (a.name() != "epsilon" && a.name() != "stash_type")
      return false;
  }
  if (!x.has_shape) return false;
  const int64_t r = static_cast<int64_t>(x.dims.size());
  if (r == 0 || axis < -r || axis >= r) return false;  // ONNX reports it
  out.has_shape = true;
  out.dims = x.dims;
  return true;
}

// Reduce*: axes from input 1 (a constant) or the `axes` attribute; keepdims (default 1) and
// noop_with_empty_axes (default 0) as ONNX reads them.
bool reduce(const onnx::NodeProto& node, int input_count, const Facts& x, const ConstantInputs* constants, Facts& out) {
  int64_t keepdims = 1, noop = 0;
  std::vector<int64_t> axes;
  bool axes_attribute = false;
  for (const auto& a : node.attribute()) {
    if (a.name() == "keepdims" && a.type() == onnx::AttributeProto::INT) {
      keepdims = a.i();
    } else if (a.name() == "noop_with_empty_axes" && a.type() == onnx::AttributeProto::INT) {
      noop = a.i();
    } else if (a.name() == "axes" && a.type() == onnx::AttributeProto::INTS) {
      axes.assign(a.ints().begin(), a.ints().end());
      axes_attribute = true;
    } else {
      return false;
    }
  }
  if (!x.has_shape) {
    // Every axis reduced, keepdims 0: a scalar whatever the input's rank (a loop's output whose
    // rank inference lost, summed into a loss).
    if (input_count != 1 || axes_attribute || keepdims != 0 || noop != 0) return false;
    out.has_shape = true;
    out.dims.clear();
    return true;
  }
  if (input_count > 2) return false;
  if (input_count == 2) {
    if (axes_attribute || !constants) return false;
    const std::vector<int64_t>* k = constants->values(1);
    if (!k) return false;
    axes = *k;
  }
  const int64_t r = static_cast<int64_t>(x.dims.size());
  if (axes.empty() && noop) {
    out.has_shape = true;
    out.dims = x.dims;
    return true;
  }
  std::vector<char> reduced(static_cast<size_t>(r), axes.empty() ? 1 : 0);
  for (int64_t a : axes) {
    if (a < -r || a >= r) return false;
    const size_t i = static_cast<size_t>(a < 0 ? a + r : a);
    if (reduced[i]) return false;  // a repeated axis: ONNX decides
    reduced[i] = 1;
  }
  out.has_shape = true;
  for (size_t i = 0; i < reduced.size(); ++i) {
    if (!reduced[i])
      out.dims.push_back(x.dims[i]);
    else if (keepdims)
      out.dims.push_back(Dim::of(1));
  }
  return true;
}

// Reshape and Expand with constant target dims: what node attributes and constant inputs say.
bool reshape(const onnx::NodeProto& node, int input_count, const Facts& x, const ConstantInputs* constants,
             Facts& out) {
  bool allowzero = false;
  for (const auto& a : node.attribute()) {
    if (a.name() != "allowzero" || a.type() != onnx::AttributeProto::INT) return false;
    allowzero = a.i() != 0;
  }
  const std::vector<int64_t>* target = input_count == 2 && constants ? constants->values(1) : nullptr;
  if (!target) return false;
  auto dims = reshaped_dims(x, *target, allowzero);
  if (!dims) return false;
  out.has_shape = true;
  out.dims = std::move(*dims);
  return true;
}

bool expand(const onnx::NodeProto& node, int input_count, const Facts& x, const ConstantInputs* constants, Facts& out) {
  const std::vector<int64_t>* target =
      node.attribute_size() == 0 && input_count == 2 && constants ? constants->values(1) : nullptr;
  if (!target || !x.has_shape) return false;
  auto dims = expanded_dims(x.dims, *target);
  if (!dims) return false;
  out.has_shape = true;
  out.dims = std::move(*dims);
  return true;
}

}  // namespace

std::optional<Dims> reshaped_dims(const Facts& x, const std::vector<int64_t>& target, bool allowzero) {
  int minus_one = -1;
  bool zero = false;
  for (size_t i = 0; i < target.size(); ++i) {
    const int64_t v = target[i];
    if (v < -1 || (v == -1 && minus_one >= 0)) return std::nullopt;
    if (v == -1) minus_one = static_cast<int>(i);
    zero = zero || v == 0;
  }
  if ((zero && allowzero && minus_one >= 0) || ((zero || minus_one >= 0) && !x.has_shape)) return std::nullopt;
  Dims out(target.size());
  int64_t known_product = 1;
  bool all_known = true;
  for (size_t i = 0; i < target.size(); ++i) {
    const int64_t v = target[i];
    if (v == 0 && !allowzero) {
      if (i >= x.dims.size()) return std::nullopt;
      out[i] = x.dims[i];
    } else if (v >= 0) {
      out[i] = Dim::of(v);
    }
    if (static_cast<int>(i) == minus_one) continue;
    all_known = all_known && out[i].known();
    // (Sizes beyond int64 are invalid models: ONNX's inference decides.)
    if (out[i].known() && __builtin_mul_overflow(known_product, out[i].value(), &known_product)) return std::nullopt;
  }
  int64_t input_product = 1;
  bool input_known = x.has_shape;
  for (size_t i = 0; input_known && i < x.dims.size(); ++i) {
    input_known = x.dims[i].known();
    if (input_known && __builtin_mul_overflow(input_product, x.dims[i].value(), &input_product)) return std::nullopt;
  }
  if (minus_one >= 0) {
    // ONNX fills the -1 only when it can divide exactly; anything else is left to it.
    if (!all_known || !input_known || known_product == 0 || input_product % known_product != 0) return std::nullopt;
    out[static_cast<size_t>(minus_one)] = Dim::of(input_product / known_product);
  } else if (all_known && input_known && known_product != input_product) {
    return std::nullopt;  // sizes disagree: ONNX reports it
  }
  return out;
}

std::optional<Dims> expanded_dims(const Dims& x, const std::vector<int64_t>& target) {
  const size_t r = std::max(x.size(), target.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    const Dim* xd = i + x.size() >= r ? &x[i + x.size() - r] : nullptr;
    const int64_t* td = i + target.size() >= r ? &target[i + target.size() - r] : nullptr;
    if (td && *td < 0) return std::nullopt;
    if (!td || *td == 1) {
      out[i] = xd ? *xd : Dim::of(1);
    } else if (!xd || !xd->known() || xd->value() == 1 || xd->value() == *td) {
      out[i] = Dim::of(*td);  // (a symbolic dim of x must be 1 or the target's)
    } else {
      return std::nullopt;
    }
  }
  return out;
}

std::optional<Dims> broadcast_dims(const Dims& a, const Dims& b) {
  const Operand ops[] = {{&a, static_cast<int>(a.size())}, {&b, static_cast<int>(b.size())}};
  Dims out;
  if (!broadcast(ops, 2, out)) return std::nullopt;
  return out;
}

bool fast_infer(const onnx::NodeProto& node, int input_count, int output_count, int opset, const Facts* const* inputs,
                Facts& out, const ConstantInputs* constants) {
  if (!node.domain().empty() && node.domain() != "ai.onnx") return false;
  const OpKind op = kind_of(node.op_type(), opset);
  const Kind kind = op.kind;
  if (kind == Kind::kNone || output_count != 1 || input_count == 0) return false;
  if (kind == Kind::kReduce || kind == Kind::kReshape || kind == Kind::kExpand) {
    // Input 1 holds int64 axes or dims, known as values (constants), not as facts.
    if (!inputs[0] || !floating(inputs[0]->dtype)) return false;
    if (input_count > 1 && (!inputs[1] || inputs[1]->dtype != onnx::TensorProto::INT64)) return false;
    out = Facts{};
    out.dtype = inputs[0]->dtype;
    if (kind == Kind::kReduce) return reduce(node, input_count, *inputs[0], constants, out);
    if (kind == Kind::kReshape) return reshape(node, input_count, *inputs[0], constants, out);
    return expand(node, input_count, *inputs[0], constants, out);
  }
  if (kind == Kind::kLikeFirstOnAxis) {
    const bool layer_norm = node.op_type() == "LayerNormalization";
    if (layer_norm ? input_count < 2 || input_count > 3 : input_count != 1) return false;
    for (int i = 0; i < input_count; ++i)
      if (!inputs[i] || !floating(inputs[i]->dtype)) return false;
    out = Facts{};
    out.dtype = inputs[0]->dtype;
    return like_first_on_axis(node, *inputs[0], out);
  }
  if ((kind == Kind::kUnary || kind == Kind::kTranspose) && input_count != 1) return false;
  if ((kind == Kind::kMatMul || (kind == Kind::kBroadcast && !op.variadic)) && input_count != 2) return false;
  constexpr int kMaxInputs = 8;  // Sum/Max/... with more inputs go to ONNX
  if (input_count > kMaxInputs) return false;
  bool all_shapes = true;
  for (int i = 0; i < input_count; ++i) {
    const Facts* f = inputs[i];
    if (!f || !floating(f->dtype)) return false;
    all_shapes = all_shapes && f->has_shape;
  }
  out = Facts{};
  out.dtype = inputs[0]->dtype;
  if (kind == Kind::kTranspose) return transpose(node, *inputs[0], out);
  if (kind == Kind::kUnary || kind == Kind::kLikeFirst) {
    out.has_shape = inputs[0]->has_shape;
    out.dims = inputs[0]->dims;
    return true;
  }
  if (!all_shapes) return kind == Kind::kBroadcast;  // ONNX then types the output without a shape
  out.has_shape = true;
  if (kind == Kind::kMatMul) return matmul(inputs[0]->dims, inputs[1]->dims, out.dims);
  Operand ops[kMaxInputs];
  for (int i = 0; i < input_count; ++i) ops[i] = {&inputs[i]->dims, static_cast<int>(inputs[i]->dims.size())};
  return broadcast(ops, input_count, out.dims);
}

}  // namespace onnax
