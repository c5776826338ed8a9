// Folding of int64 shape arithmetic against the values numpy gives for the same expressions
// (ONNX's Slice, Gather and broadcasting on vectors are numpy's), and the cases that must not
// fold: where ONNX Runtime's truncating integer Div and numpy's floor division differ, overflow,
// out-of-range indices.
#include "emit/int64_fold.h"

#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <vector>

namespace onnax {
namespace {

using Values = std::vector<int64_t>;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

struct Operand {
  Values values;
  int64_t rank;
};

std::optional<FoldedInt64> fold(std::string_view type, const std::vector<std::optional<Operand>>& operands,
                                const Attrs& attrs = {}) {
  std::vector<KnownInt64> known;
  for (const auto& o : operands) known.push_back(o ? KnownInt64{&o->values, o->rank} : KnownInt64{nullptr, -1});
  return fold_int64(type, known, attrs);
}

Operand vec(Values v) {
  return {std::move(v), 1};
}
Operand scalar(int64_t v) {
  return {{v}, 0};
}

void expect_folded(const std::optional<FoldedInt64>& got, const Values& values, int64_t rank) {
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->values, values);
  EXPECT_EQ(got->rank, rank);
}

TEST(Int64Fold, BroadcastingArithmetic) {
  // np.array([3, 4]) + 1, 10 - np.array([3, 4]), np.maximum(np.array([-1, 5]), 0)
  expect_folded(fold("Add", {vec({3, 4}), scalar(1)}), {4, 5}, 1);
  expect_folded(fold("Sub", {scalar(10), vec({3, 4})}), {7, 6}, 1);
  expect_folded(fold("Mul", {vec({2}), vec({3, 4})}), {6, 8}, 1);
  expect_folded(fold("Max", {vec({-1, 5}), scalar(0)}), {0, 5}, 1);
  expect_folded(fold("Min", {vec({-1, 5}), scalar(0), vec({-3, 9})}), {-3, 0}, 1);
  expect_folded(fold("Neg", {scalar(7)}), {-7}, 0);
  EXPECT_FALSE(fold("Add", {vec({1, 2}), vec({1, 2, 3})}));  // sizes do not broadcast
}

TEST(Int64Fold, DivisionOnlyWhereTruncationAndFloorAgree) {
  expect_folded(fold("Div", {vec({7, 8, 0}), scalar(2)}), {3, 4, 0}, 1);
  EXPECT_FALSE(fold("Div", {scalar(-7), scalar(2)}));  // -3 in ONNX Runtime, -4 in numpy
  EXPECT_FALSE(fold("Div", {scalar(7), scalar(0)}));
}

TEST(Int64Fold, OverflowIsNotFolded) {
  EXPECT_FALSE(fold("Add", {scalar(kMax), scalar(1)}));
  EXPECT_FALSE(fold("Mul", {scalar(kMax / 2 + 1), scalar(2)}));
  EXPECT_FALSE(fold("Neg", {scalar(kMin)}));
}

TEST(Int64Fold, SliceIsNumpySlicing) {
  const Operand data = vec({0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  // data[-3:]
  expect_folded(fold("Slice", {data, vec({-3}), vec({kMax})}), {7, 8, 9}, 1);
  // data[8:2:-2]
  expect_folded(fold("Slice", {data, vec({8}), vec({2}), vec({0}), vec({-2})}), {8, 6, 4}, 1);
  // data[::-1] as exporters write it (start -1, end INT64_MIN)
  expect_folded(fold("Slice", {data, vec({-1}), vec({kMin}), std::nullopt, vec({-1})}), {9, 8, 7, 6, 5, 4, 3, 2, 1, 0},
                1);
  // data[20:30], data[2:4] with axes [-1]
  expect_folded(fold("Slice", {data, vec({20}), vec({30})}), {}, 1);
  expect_folded(fold("Slice", {data, vec({2}), vec({4}), vec({-1})}), {2, 3}, 1);
  EXPECT_FALSE(fold("Slice", {data, vec({0}), vec({4}), vec({0}), vec({0})}));  // step 0 is invalid
}

TEST(Int64Fold, GatherConcatAndRankChanges) {
  const Operand shape = vec({2, 3, 5});
  expect_folded(fold("Gather", {shape, scalar(-1)}), {5}, 0);
  expect_folded(fold("Gather", {shape, vec({2, 0})}), {5, 2}, 1);
  EXPECT_FALSE(fold("Gather", {shape, scalar(3)}));
  expect_folded(fold("Concat", {vec({1}), vec({}), vec({4, 5})}, {Attr::i("axis", 0)}), {1, 4, 5}, 1);
  expect_folded(fold("Unsqueeze", {scalar(6), vec({0})}), {6}, 1);
  expect_folded(fold("Squeeze", {vec({6}), vec({0})}), {6}, 0);
  EXPECT_FALSE(fold("Squeeze", {vec({6, 7}), vec({0})}));
}

TEST(Int64Fold, ReductionsAndRange) {
  expect_folded(fold("ReduceProd", {vec({2, 3, 5})}, {Attr::i("keepdims", 0)}), {30}, 0);
  expect_folded(fold("ReduceSum", {vec({2, 3, 5}), vec({0})}), {10}, 1);
  EXPECT_FALSE(fold("ReduceSum", {vec({2, 3}), vec({})}, {Attr::i("noop_with_empty_axes", 1)}));
  // np.arange(1, 8, 3), np.arange(5, 0, -2), np.arange(3, 3)
  expect_folded(fold("Range", {scalar(1), scalar(8), scalar(3)}), {1, 4, 7}, 1);
  expect_folded(fold("Range", {scalar(5), scalar(0), scalar(-2)}), {5, 3, 1}, 1);
  expect_folded(fold("Range", {scalar(3), scalar(3), scalar(1)}), {}, 1);
}

}  // namespace
}  // namespace onnax
