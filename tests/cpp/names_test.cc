// The name tables every transform uses: Interner against std::unordered_map through many
// rehashes, and NameScope::fresh_view's collision-free, deterministic names.
#include "ir/names.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace onnax {
namespace {

TEST(Interner, MatchesUnorderedMapThroughRehashes) {
  std::mt19937 rng(11);
  Interner names;
  std::unordered_map<std::string, int> want;
  for (int step = 0; step < 20000; ++step) {
    // Short names collide often (re-interning), long ones span several 8-byte hash steps.
    const int len = static_cast<int>(rng() % 3 == 0 ? 1 + rng() % 3 : 9 + rng() % 40);
    std::string name;
    for (int i = 0; i < len; ++i) name.push_back(static_cast<char>('a' + rng() % 4));
    if (step == 5000) names.reserve(50000);  // a rehash in one step, mid-way
    bool added = false;
    const int id = names.intern(name, &added);
    auto [it, fresh] = want.emplace(name, static_cast<int>(want.size()));
    EXPECT_EQ(added, fresh) << name;
    ASSERT_EQ(id, it->second) << name;  // ids are dense, in insertion order
  }
  ASSERT_EQ(names.size(), static_cast<int>(want.size()));
  for (const auto& [name, id] : want) {
    EXPECT_EQ(names.find(name), id);
    EXPECT_EQ(names.name(id), name);
  }
  EXPECT_EQ(names.find("not-a-name"), -1);
}

TEST(NameScope, FreshNamesAreUniqueReadableAndDeterministic) {
  auto run = [] {
    NameScope scope;
    scope.reserve("h");
    scope.reserve("h_2");  // a taken suffix is skipped
    std::vector<std::string> made;
    for (int i = 0; i < 5; ++i) made.emplace_back(scope.fresh_view("h"));
    made.emplace_back(scope.fresh_view("g"));
    made.emplace_back(scope.fresh_view(""));  // an empty base gets a name too
    return made;
  };
  const std::vector<std::string> made = run();
  EXPECT_EQ(made, (std::vector<std::string>{"h_1", "h_3", "h_4", "h_5", "h_6", "g", "v"}));
  EXPECT_EQ(run(), made);
  NameScope scope;
  std::unordered_set<std::string> seen;
  for (int i = 0; i < 3000; ++i) {
    const std::string base = i % 2 ? "x" : "x_" + std::to_string(i % 7);
    EXPECT_TRUE(seen.insert(std::string(scope.fresh_view(base))).second) << base;
  }
}

}  // namespace
}  // namespace onnax
