// Collision-free, deterministic, readable names, and dense integer ids for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace onnax {

// Maps names to dense ids 0, 1, 2, ... in insertion order. Large models hold hundreds of
// thousands of names, so this is an open-addressing table of views into a private arena: one
// hash and no allocation per name, where a node-based std::unordered_map<std::string, int>
// costs two allocations and a cache miss per entry. Transforms look a name up once and then
// index plain vectors by its id.
// A name with its hash, computed once for the several tables one new name is looked up in.
struct HashedName {
  std::string_view text;
  uint32_t hash = 0;
};

class Interner {
 public:
  Interner() = default;
  Interner(Interner&&) noexcept = default;
  Interner& operator=(Interner&&) noexcept = default;

  static HashedName hashed(std::string_view name) { return {name, static_cast<uint32_t>(hash(name))}; }
  // The id of `name`, or -1 when it was never interned.
  int find(std::string_view name) const { return find(hashed(name)); }
  int find(HashedName name) const;
  // The id of `name`, interning it first when new; `added` tells which.
  int intern(std::string_view name, bool* added = nullptr) { return intern(hashed(name), added); }
  int intern(HashedName name, bool* added = nullptr);
  std::string_view name(int id) const { return names_[static_cast<size_t>(id)]; }
  int size() const { return static_cast<int>(names_.size()); }
  // Makes room for `names` names in all, so interning them never rehashes.
  void reserve(size_t names);
  // Starts loading the table slot where `name` would be, ahead of interning or finding it: on
  // tables larger than the cache, each new name otherwise waits for a miss to memory.
  void prefetch(HashedName name) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[name.hash & (slots_.size() - 1)], 1);
  }

 private:
  static size_t hash(std::string_view s);
  std::string_view store(std::string_view s);
  // Load factor at most 3/4: probes stay short (the hash is checked before the name), and
  // the table of a million names is half the size it would be at 1/2.
  static bool over_full(size_t names, size_t slots) { return names * 4 > slots * 3; }
  void grow(size_t slots);  // rehashes into `slots` slots (a power of two)

  struct Slot {
    uint32_t hash = 0;
    int32_t id = -1;  // -1 = free
  };
  std::vector<Slot> slots_;
  std::vector<std::string_view> names_;          // by id, into the arena
  std::vector<std::unique_ptr<char[]>> blocks_;  // the arena holding the names' characters
  size_t block_used_ = 0, block_size_ = 0;
};

// The set of names in use in a model (every value or every node name, across subgraphs).
class NameScope {
 public:
  NameScope() = default;
  NameScope(NameScope&&) noexcept = default;
  NameScope& operator=(NameScope&&) noexcept = default;

  void reserve(std::string_view name) { names_.intern(name); }
  // Reserves `name`; false if it was already taken.
  bool insert(std::string_view name) {
    bool added = false;
    names_.intern(name, &added);
    return added;
  }
  bool contains(std::string_view name) const { return names_.find(name) >= 0; }
  bool contains(HashedName name) const { return names_.find(name) >= 0; }
  // Every name in the scope has a dense id (in order of reservation); transforms index their
  // per-value tables by it.
  int id(std::string_view name) const { return names_.find(name); }
  int intern(std::string_view name) { return names_.intern(name); }
  void prefetch(HashedName name) const { names_.prefetch(name); }
  std::string_view name(int id) const { return names_.name(id); }
  int size() const { return names_.size(); }
  // Makes room for `count` names in all (a hint: more can always be added).
  void expect(size_t count) { names_.reserve(count); }
  // `base` itself when free, else base_1, base_2, ... (amortised O(1) per call). With `avoid`,
  // also a name that scope does not hold: generated nodes are named after their first output
  // without reserving that name here, so node names come fresh of the value scope too.
  std::string fresh(std::string_view base, const NameScope* avoid = nullptr) {
    return std::string(fresh_view(base, avoid));
  }
  // The same name as a view of the scope's own copy (valid while the scope lives), sparing the
  // string a caller that copies it into a proto field anyway would allocate.
  std::string_view fresh_view(std::string_view base, const NameScope* avoid = nullptr) {
    return fresh_hashed(Interner::hashed(base), avoid).text;
  }
  // The same from a hashed base, returning the new name's hash too.
  HashedName fresh_hashed(HashedName base, const NameScope* avoid = nullptr);
  // Numbers for the unknown dims a transform names (facts.h: name_unknown_dims), unique in it.
  uint32_t next_unknown_dim() { return unknown_dims_++; }

 private:
  Interner names_;
  std::vector<int> next_suffix_;  // by the base name's id: the last suffix tried for it
  uint32_t unknown_dims_ = 0;
  std::string candidate_;  // reused buffer for suffixed candidates
};

}  // namespace onnax
