#include "emit/names.h"

#include <cstring>

namespace onnax {

size_t Interner::hash(std::string_view s) {
  // FNV-1a: names are short, and this keeps the table's layout independent of the platform's
  // std::hash (iteration never depends on it, but determinism is cheap to keep obvious).
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

std::string_view Interner::store(std::string_view s) {
  constexpr size_t kBlock = 64 * 1024;
  if (block_used_ + s.size() + 1 > block_size_) {
    block_size_ = s.size() + 1 > kBlock ? s.size() + 1 : kBlock;
    blocks_.push_back(std::make_unique<char[]>(block_size_));
    block_used_ = 0;
  }
  char* p = blocks_.back().get() + block_used_;
  if (!s.empty()) std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  block_used_ += s.size() + 1;
  return {p, s.size()};
}

void Interner::grow() {
  slots_.assign(slots_.empty() ? 64 : slots_.size() * 2, Slot{});
  const size_t mask = slots_.size() - 1;
  for (size_t id = 0; id < names_.size(); ++id) {
    const uint32_t h = static_cast<uint32_t>(hash(names_[id]));
    size_t i = h & mask;
    while (slots_[i].id >= 0) i = (i + 1) & mask;
    slots_[i] = Slot{h, static_cast<int32_t>(id)};
  }
}

int Interner::find(std::string_view name) const {
  if (slots_.empty()) return -1;
  const uint32_t h = static_cast<uint32_t>(hash(name));
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask; slots_[i].id >= 0; i = (i + 1) & mask)
    if (slots_[i].hash == h && names_[static_cast<size_t>(slots_[i].id)] == name) return slots_[i].id;
  return -1;
}

int Interner::intern(std::string_view name, bool* added) {
  if ((names_.size() + 1) * 2 > slots_.size()) grow();  // load factor <= 1/2
  const uint32_t h = static_cast<uint32_t>(hash(name));
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  for (; slots_[i].id >= 0; i = (i + 1) & mask) {
    if (slots_[i].hash == h && names_[static_cast<size_t>(slots_[i].id)] == name) {
      if (added) *added = false;
      return slots_[i].id;
    }
  }
  const int id = static_cast<int>(names_.size());
  names_.push_back(store(name));
  slots_[i] = Slot{h, id};
  if (added) *added = true;
  return id;
}

std::string_view NameScope::fresh_view(std::string_view base) {
  if (base.empty()) base = "v";
  bool added = false;
  const int base_id = names_.intern(base, &added);
  if (added) return names_.name(base_id);
  if (static_cast<size_t>(base_id) >= next_suffix_.size()) next_suffix_.resize(static_cast<size_t>(base_id) + 1, 0);
  for (;;) {
    const int suffix = ++next_suffix_[static_cast<size_t>(base_id)];
    candidate_.assign(names_.name(base_id));
    candidate_.push_back('_');
    candidate_.append(std::to_string(suffix));
    const int id = names_.intern(candidate_, &added);
    if (added) return names_.name(id);
  }
}

}  // namespace onnax
