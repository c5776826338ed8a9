// Collision-free, deterministic, readable names.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace onnax {

// The set of names in use in a model (every value or every node name, across subgraphs).
// Large models hold hundreds of thousands of names, so this is an open-addressing table of
// views into a private arena: one hash and no allocation per name, where a node-based
// std::unordered_set<std::string> costs two allocations and a cache miss per entry.
class NameScope {
 public:
  NameScope() = default;
  NameScope(NameScope&&) noexcept = default;
  NameScope& operator=(NameScope&&) noexcept = default;

  void reserve(std::string_view name) { insert(name); }
  // Reserves `name`; false if it was already taken.
  bool insert(std::string_view name);
  bool contains(std::string_view name) const;
  // `base` itself when free, else base_1, base_2, ... (amortised O(1) per call).
  std::string fresh(std::string_view base);

 private:
  static size_t hash(std::string_view s);
  std::string_view store(std::string_view s);
  void grow();

  std::vector<std::string_view> slots_;  // empty view (data() == nullptr) = free slot
  size_t size_ = 0;
  std::vector<std::unique_ptr<char[]>> blocks_;  // the arena holding the names' characters
  size_t block_used_ = 0, block_size_ = 0;
  std::unordered_map<std::string, int> next_suffix_;
};

}  // namespace onnax
