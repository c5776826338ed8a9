// The compact containers transforms keep per value and per node: SmallVec against
// std::vector under the same random operations, Dim's tagged word against the plain values
// it encodes, and Dims across the inline/heap boundary.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "ir/small_vec.h"
#include "facts/dims.h"

namespace onnax {
namespace {

template <typename T, size_t N>
void expect_same(const SmallVec<T, N>& got, const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "at " << i;
  EXPECT_EQ(std::vector<T>(got), want);  // the conversion the rule interface relies on
}

TEST(SmallVec, MatchesStdVectorUnderRandomOperations) {
  std::mt19937 rng(7);
  SmallVec<int, 4> got;
  std::vector<int> want;
  for (int step = 0; step < 5000; ++step) {
    const int op = static_cast<int>(rng() % 7);
    const int x = static_cast<int>(rng() % 1000);
    if (op <= 2) {
      got.push_back(x);
      want.push_back(x);
    } else if (op == 3 && !want.empty()) {
      got.pop_back();
      want.pop_back();
    } else if (op == 4) {
      const size_t n = rng() % 12;
      got.resize(n, x);
      want.resize(n, x);
    } else if (op == 5) {
      const size_t n = rng() % 9;
      got.assign(n, x);
      want.assign(n, x);
      SmallVec<int, 4> copy = got;  // a copy is independent of the original
      copy.push_back(x + 1);
      EXPECT_EQ(copy.size(), want.size() + 1);
    } else {
      SmallVec<int, 4> moved(std::move(got));
      got = moved;
      if (rng() % 2) got = SmallVec<int, 4>(want);  // from a std::vector
    }
    expect_same(got, want);
  }
}

TEST(SmallVec, InitializerListSizeConstructorAndSpillToHeap) {
  SmallVec<int, 2> v{1, 2, 3, 4, 5};  // more than inline: lives on the heap
  expect_same(v, std::vector<int>{1, 2, 3, 4, 5});
  SmallVec<int, 2> copy = v;
  copy[0] = 9;
  EXPECT_EQ(v[0], 1);
  expect_same(SmallVec<int, 2>(3, 7), std::vector<int>{7, 7, 7});
  EXPECT_EQ(v.front(), 1);
  EXPECT_EQ(v.back(), 5);
}

TEST(Dim, TaggedWordRoundTripsSizesNamesAndUnknown) {
  for (int64_t size : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{1} << 40, (int64_t{1} << 62) - 1}) {
    const Dim d = Dim::of(size);
    EXPECT_TRUE(d.known());
    EXPECT_FALSE(d.symbolic());
    EXPECT_EQ(d.value(), size);
    EXPECT_EQ(d.param(), "");
  }
  // Sizes no tensor has, and negative ones, are unknown rather than wrong.
  for (int64_t size : {int64_t{-1}, int64_t{1} << 62, INT64_MAX}) {
    const Dim d = Dim::of(size);
    EXPECT_FALSE(d.known());
    EXPECT_EQ(d.value(), -1);
  }
  const Dim batch = Dim::named("batch");
  EXPECT_TRUE(batch.symbolic());
  EXPECT_FALSE(batch.known());
  EXPECT_EQ(batch.value(), -1);
  EXPECT_EQ(batch.param(), "batch");
  const std::string same_name = std::string("bat") + "ch";  // another string with the same text
  EXPECT_EQ(Dim::named(same_name), batch);
  EXPECT_FALSE(Dim::named("seq") == batch);
  EXPECT_FALSE(Dim::named("").symbolic());  // an empty name is no name
  EXPECT_EQ(Dim(), Dim::named(""));
  EXPECT_FALSE(Dim::of(1) == Dim());
}

TEST(Dims, InlineAndHeapStorageBehaveTheSame) {
  std::vector<Dim> want;
  Dims got;
  for (int i = 0; i < 20; ++i) {  // crosses the inline capacity
    const Dim d = i % 3 == 0 ? Dim::named(i % 2 ? "n1" : "n0") : Dim::of(i);
    got.push_back(d);
    want.push_back(d);
    Dims copy = got;
    Dims moved(std::move(copy));
    ASSERT_EQ(moved.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(moved[k], want[k]);
  }
  got.insert(got.begin(), Dim::named("batch"));
  want.insert(want.begin(), Dim::named("batch"));
  got.erase(got.begin() + 3);
  want.erase(want.begin() + 3);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(got[k], want[k]);
  Dims small{Dim::of(2), Dim::of(3)};
  small = got;  // inline object takes heap contents
  EXPECT_EQ(small.size(), got.size());
  got = Dims{Dim::of(4)};  // heap object goes back to one inline dim
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].value(), 4);
}

}  // namespace
}  // namespace onnax
