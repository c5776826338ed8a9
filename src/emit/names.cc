#include "emit/names.h"

#include <cstring>

namespace onnax {

size_t NameScope::hash(std::string_view s) {
  // FNV-1a: names are short, and this keeps the table's layout independent of the platform's
  // std::hash (iteration never depends on it, but determinism is cheap to keep obvious).
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

std::string_view NameScope::store(std::string_view s) {
  constexpr size_t kBlock = 64 * 1024;
  if (block_used_ + s.size() + 1 > block_size_) {
    block_size_ = s.size() + 1 > kBlock ? s.size() + 1 : kBlock;
    blocks_.push_back(std::make_unique<char[]>(block_size_));
    block_used_ = 0;
  }
  char* p = blocks_.back().get() + block_used_;
  if (!s.empty()) std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';  // also makes the empty name's view non-null, so it is not "free"
  block_used_ += s.size() + 1;
  return {p, s.size()};
}

void NameScope::grow() {
  std::vector<std::string_view> old = std::move(slots_);
  slots_.assign(old.empty() ? 64 : old.size() * 2, std::string_view());
  const size_t mask = slots_.size() - 1;
  for (std::string_view s : old) {
    if (!s.data()) continue;
    size_t i = hash(s) & mask;
    while (slots_[i].data()) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

bool NameScope::contains(std::string_view name) const {
  if (slots_.empty()) return false;
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash(name) & mask; slots_[i].data(); i = (i + 1) & mask)
    if (slots_[i] == name) return true;
  return false;
}

bool NameScope::insert(std::string_view name) {
  if ((size_ + 1) * 2 > slots_.size()) grow();  // load factor <= 1/2
  const size_t mask = slots_.size() - 1;
  size_t i = hash(name) & mask;
  for (; slots_[i].data(); i = (i + 1) & mask)
    if (slots_[i] == name) return false;
  slots_[i] = store(name);
  ++size_;
  return true;
}

std::string NameScope::fresh(std::string_view base_view) {
  std::string base(base_view.empty() ? "v" : base_view);
  if (insert(base)) return base;
  int& next = next_suffix_[base];
  for (;;) {
    std::string candidate = base + "_" + std::to_string(++next);
    if (insert(candidate)) return candidate;
  }
}

}  // namespace onnax
