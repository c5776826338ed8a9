// Collision-free, deterministic, readable names.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace onnax {

class NameScope {
 public:
  void reserve(const std::string& name) { used_.insert(name); }
  // Reserves `name`; false if it was already taken.
  bool insert(const std::string& name) { return used_.insert(name).second; }
  bool contains(const std::string& name) const { return used_.count(name) != 0; }
  // `base` itself when free, else base_1, base_2, ... (amortised O(1) per call).
  std::string fresh(std::string_view base);

 private:
  std::unordered_set<std::string> used_;
  std::unordered_map<std::string, int> next_suffix_;
};

}  // namespace onnax
