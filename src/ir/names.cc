#include "ir/names.h"

#include <cstring>

namespace onnax {

size_t Interner::hash(std::string_view s) {
  // Eight bytes per step (value names in exported models are often 30-80 characters), then a
  // final avalanche. Only the table's layout depends on it, never an iteration order, so the
  // transforms' output does not.
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = kMul ^ s.size();
  const char* p = s.data();
  size_t n = s.size();
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t k;
    std::memcpy(&k, p, 8);
    h = (h ^ k) * kMul;
    h ^= h >> 32;
  }
  if (n) {
    uint64_t k = 0;
    std::memcpy(&k, p, n);
    h = (h ^ k) * kMul;
  }
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  return static_cast<size_t>(h);
}

void Interner::reserve(size_t names) {
  names_.reserve(names);
  size_t slots = slots_.empty() ? 64 : slots_.size();
  while (over_full(names + 1, slots)) slots *= 2;
  if (slots > slots_.size()) grow(slots);
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

void Interner::grow(size_t slots) {
  // Slots keep the low 32 bits of each hash, which is all the index of a table of up to 2^32
  // slots uses: rehashing moves slots and never reads a name again (on large tables each name
  // read is a miss to memory).
  std::vector<Slot> old(slots, Slot{});
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.id < 0) continue;
    size_t i = s.hash & mask;
    while (slots_[i].id >= 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

int Interner::find(HashedName hashed_name) const {
  if (slots_.empty()) return -1;
  const std::string_view name = hashed_name.text;
  const uint32_t h = hashed_name.hash;
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask; slots_[i].id >= 0; i = (i + 1) & mask)
    if (slots_[i].hash == h && names_[static_cast<size_t>(slots_[i].id)] == name) return slots_[i].id;
  return -1;
}

int Interner::intern(HashedName hashed_name, bool* added) {
  if (over_full(names_.size() + 1, slots_.size())) grow(slots_.empty() ? 64 : slots_.size() * 2);
  const std::string_view name = hashed_name.text;
  const uint32_t h = hashed_name.hash;
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

HashedName NameScope::fresh_hashed(HashedName base, const NameScope* avoid) {
  if (base.text.empty()) base = Interner::hashed("v");
  bool added = false;
  const int base_id = names_.intern(base, &added);
  if (added && !(avoid && avoid->contains(base))) return {names_.name(base_id), base.hash};
  if (static_cast<size_t>(base_id) >= next_suffix_.size()) next_suffix_.resize(static_cast<size_t>(base_id) + 1, 0);
  for (;;) {
    const int suffix = ++next_suffix_[static_cast<size_t>(base_id)];
    candidate_.assign(names_.name(base_id));
    candidate_.push_back('_');
    candidate_.append(std::to_string(suffix));
    const HashedName candidate = Interner::hashed(candidate_);
    const int id = names_.intern(candidate, &added);
    if (added && !(avoid && avoid->contains(candidate))) return {names_.name(id), candidate.hash};
  }
}

}  // namespace onnax
