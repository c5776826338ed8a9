#include "emit/int64_fold.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>

namespace onnax {
namespace {

using Values = std::vector<int64_t>;
using Result = std::optional<FoldedInt64>;

const onnx::AttributeProto* find_attr(const Attrs& attrs, std::string_view name) {
  for (const auto& a : attrs)
    if (a.proto.name() == name) return &a.proto;
  return nullptr;
}

int64_t attr_i(const Attrs& attrs, std::string_view name, int64_t fallback) {
  const auto* a = find_attr(attrs, name);
  return a ? a->i() : fallback;
}

// An axis argument that names the only axis of a vector (0 or -1).
bool only_axis(const Values& axes) {
  return axes.size() == 1 && (axes[0] == 0 || axes[0] == -1);
}

// numpy broadcasting of scalars and vectors, element by element; nullopt on overflow or a
// size mismatch.
template <typename Op>
Result elementwise(std::span<const KnownInt64> in, Op op) {
  size_t n = 1;
  int64_t rank = 0;
  for (const auto& k : in) {
    if (!k.values) return std::nullopt;
    rank = std::max(rank, k.rank);
    const size_t m = k.values->size();
    if (m != 1 && n != 1 && m != n) return std::nullopt;
    if (m != 1) n = m;
  }
  FoldedInt64 out{Values(n), rank};
  for (size_t i = 0; i < n; ++i) {
    auto at = [&](const KnownInt64& k) { return (*k.values)[k.values->size() == 1 ? 0 : i]; };
    int64_t acc = at(in[0]);
    for (size_t j = 1; j < in.size(); ++j) {
      const std::optional<int64_t> next = op(acc, at(in[j]));
      if (!next) return std::nullopt;
      acc = *next;
    }
    out.values[i] = acc;
  }
  return out;
}

Result slice(std::span<const KnownInt64> in) {
  if (in.size() < 3 || !in[0].values || !in[1].values || !in[2].values || in[0].rank != 1) return std::nullopt;
  if (in[1].values->size() != 1 || in[2].values->size() != 1) return std::nullopt;
  if (in.size() > 3 && in[3].values && !only_axis(*in[3].values)) return std::nullopt;
  int64_t step = 1;
  if (in.size() > 4 && in[4].values) {
    if (in[4].values->size() != 1) return std::nullopt;
    step = (*in[4].values)[0];
  }
  if (step == 0) return std::nullopt;
  const Values& data = *in[0].values;
  const auto n = static_cast<int64_t>(data.size());
  // ONNX's clamping: negative positions count from the end; then into [0, n] going forwards and
  // into [-1, n - 1] going backwards.
  auto position = [&](int64_t p, int64_t lo, int64_t hi) { return std::clamp(p < 0 ? p + n : p, lo, hi); };
  int64_t start = (*in[1].values)[0], end = (*in[2].values)[0];
  FoldedInt64 out{{}, 1};
  if (step > 0) {
    start = position(start, 0, n);
    end = position(end, 0, n);
    for (int64_t i = start; i < end; i += step) out.values.push_back(data[static_cast<size_t>(i)]);
  } else {
    start = position(start, -1, n - 1);
    end = position(end, -1, n - 1);
    for (int64_t i = start; i > end; i += step) out.values.push_back(data[static_cast<size_t>(i)]);
  }
  return out;
}

Result gather(std::span<const KnownInt64> in, const Attrs& attrs) {
  if (in.size() != 2 || !in[0].values || !in[1].values || in[0].rank != 1) return std::nullopt;
  const int64_t axis = attr_i(attrs, "axis", 0);
  if (axis != 0 && axis != -1) return std::nullopt;
  const Values& data = *in[0].values;
  const auto n = static_cast<int64_t>(data.size());
  FoldedInt64 out{{}, in[1].rank};
  for (int64_t i : *in[1].values) {
    if (i < -n || i >= n) return std::nullopt;
    out.values.push_back(data[static_cast<size_t>(i < 0 ? i + n : i)]);
  }
  return out;
}

Result concat(std::span<const KnownInt64> in, const Attrs& attrs) {
  const int64_t axis = attr_i(attrs, "axis", 0);
  if (axis != 0 && axis != -1) return std::nullopt;
  FoldedInt64 out{{}, 1};
  for (const auto& k : in) {
    if (!k.values || k.rank != 1) return std::nullopt;
    out.values.insert(out.values.end(), k.values->begin(), k.values->end());
  }
  return out;
}

// The axes of Squeeze/Unsqueeze/Reduce*: input 1 (newer opsets) or the attribute (older).
Values axes_of(std::span<const KnownInt64> in, const Attrs& attrs) {
  if (in.size() > 1 && in[1].values) return *in[1].values;
  const onnx::AttributeProto* a = find_attr(attrs, "axes");
  return a ? Values(a->ints().begin(), a->ints().end()) : Values{};
}

// Squeeze / Unsqueeze between a scalar and a one-element vector.
Result squeeze(std::span<const KnownInt64> in, const Attrs& attrs, bool unsqueeze) {
  if (in.empty() || !in[0].values) return std::nullopt;
  const Values axes = axes_of(in, attrs);
  if (unsqueeze) {
    if (in[0].rank != 0 || !only_axis(axes)) return std::nullopt;
    return FoldedInt64{*in[0].values, 1};
  }
  if (in[0].rank != 1 || in[0].values->size() != 1 || !(axes.empty() || only_axis(axes))) return std::nullopt;
  return FoldedInt64{*in[0].values, 0};
}

Result reduce(std::span<const KnownInt64> in, const Attrs& attrs, bool product) {
  if (in.empty() || !in[0].values || in[0].rank != 1) return std::nullopt;
  const Values axes = axes_of(in, attrs);
  if (!axes.empty() && !only_axis(axes)) return std::nullopt;
  if (axes.empty() && attr_i(attrs, "noop_with_empty_axes", 0) != 0) return std::nullopt;
  int64_t acc = product ? 1 : 0;
  for (int64_t v : *in[0].values)
    if (product ? __builtin_mul_overflow(acc, v, &acc) : __builtin_add_overflow(acc, v, &acc)) return std::nullopt;
  const bool keep = attr_i(attrs, "keepdims", 1) != 0;
  return FoldedInt64{{acc}, keep ? 1 : 0};
}

Result range(std::span<const KnownInt64> in) {
  if (in.size() != 3) return std::nullopt;
  for (const auto& k : in)
    if (!k.values || k.rank != 0) return std::nullopt;
  const int64_t start = (*in[0].values)[0], limit = (*in[1].values)[0], delta = (*in[2].values)[0];
  constexpr int64_t kMaxLength = 1024;  // shape arithmetic, not data
  if (delta == 0 || std::abs(start) > (int64_t{1} << 40) || std::abs(limit) > (int64_t{1} << 40)) return std::nullopt;
  FoldedInt64 out{{}, 1};
  for (int64_t v = start; delta > 0 ? v < limit : v > limit; v += delta) {
    if (static_cast<int64_t>(out.values.size()) == kMaxLength) return std::nullopt;
    out.values.push_back(v);
  }
  return out;
}

}  // namespace

bool int64_foldable(std::string_view type) {
  static constexpr std::array<std::string_view, 16> kOps = {
      "Add",    "Sub",    "Mul",     "Div",       "Max",        "Min",       "Neg",   "Slice",
      "Gather", "Concat", "Squeeze", "Unsqueeze", "ReduceProd", "ReduceSum", "Range", "Identity"};
  return std::find(kOps.begin(), kOps.end(), type) != kOps.end();
}

std::optional<FoldedInt64> fold_int64(std::string_view type, std::span<const KnownInt64> in, const Attrs& attrs) {
  using I = std::optional<int64_t>;
  if (in.size() == 2 && type == "Add")
    return elementwise(in, [](int64_t a, int64_t b) {
      int64_t r = 0;
      return __builtin_add_overflow(a, b, &r) ? I{} : I{r};
    });
  if (in.size() == 2 && type == "Sub")
    return elementwise(in, [](int64_t a, int64_t b) {
      int64_t r = 0;
      return __builtin_sub_overflow(a, b, &r) ? I{} : I{r};
    });
  if (in.size() == 2 && type == "Mul")
    return elementwise(in, [](int64_t a, int64_t b) {
      int64_t r = 0;
      return __builtin_mul_overflow(a, b, &r) ? I{} : I{r};
    });
  // Integer division truncates in ONNX Runtime and floors in numpy: folded only where both agree.
  if (in.size() == 2 && type == "Div")
    return elementwise(in, [](int64_t a, int64_t b) { return a >= 0 && b > 0 ? I{a / b} : I{}; });
  if (type == "Max" && !in.empty()) return elementwise(in, [](int64_t a, int64_t b) { return I{std::max(a, b)}; });
  if (type == "Min" && !in.empty()) return elementwise(in, [](int64_t a, int64_t b) { return I{std::min(a, b)}; });
  if (type == "Neg" && in.size() == 1 && in[0].values) {
    FoldedInt64 out{*in[0].values, in[0].rank};
    for (int64_t& v : out.values) {
      if (v == std::numeric_limits<int64_t>::min()) return std::nullopt;
      v = -v;
    }
    return out;
  }
  if (type == "Identity" && in.size() == 1 && in[0].values) return FoldedInt64{*in[0].values, in[0].rank};
  if (type == "Slice") return slice(in);
  if (type == "Gather") return gather(in, attrs);
  if (type == "Concat") return concat(in, attrs);
  if (type == "Squeeze") return squeeze(in, attrs, false);
  if (type == "Unsqueeze") return squeeze(in, attrs, true);
  if (type == "ReduceProd") return reduce(in, attrs, true);
  if (type == "ReduceSum") return reduce(in, attrs, false);
  if (type == "Range") return range(in);
  return std::nullopt;
}

}  // namespace onnax
