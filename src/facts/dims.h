// Dimensions of a value's shape, stored without heap allocation for the common ranks.
//
// Every value of a graph has facts, and transforms copy them several times per node (inferred,
// handed to a rule, batched); a std::vector<Dim> holding std::string names made each copy two
// or more allocations, which dominated transforming large graphs. Here a Dim is 16 trivially
// copyable bytes (symbolic names are interned once per process) and up to kInline dims live
// inside the Dims object.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace onnax {

// The process-wide copy of a symbolic dimension name: equal names give the same string, which
// stays valid for the life of the process (models use a handful of distinct names).
const std::string* intern_dim_param(std::string_view name);

// One dimension in 8 trivially copyable bytes: a known size, a symbolic name, or unknown.
// Tagged in one word: an odd word holds a size (2 * size + 1), a non-zero even word points to
// the interned name (strings are aligned, so their addresses are even), and 0 is unknown.
// Sizes of 2^62 or more (no real tensor has them) are treated as unknown.
class Dim {
 public:
  Dim() = default;
  static Dim of(int64_t v) { return v >= 0 && v < (int64_t{1} << 62) ? Dim(static_cast<uint64_t>(v) * 2 + 1) : Dim(); }
  static Dim named(std::string_view p) {
    const std::string* interned = intern_dim_param(p);
    return interned ? Dim(reinterpret_cast<uintptr_t>(interned)) : Dim();
  }
  bool known() const { return (bits_ & 1) != 0; }
  // The size when known, else -1.
  int64_t value() const { return known() ? static_cast<int64_t>(bits_ >> 1) : -1; }
  bool symbolic() const { return bits_ != 0 && !known(); }
  // The n-th dim a transform names itself (see name_unknown_dims in facts.h): a symbol of its
  // own, never written into a result.
  static Dim internal(uint32_t n);
  bool internal() const { return symbolic() && param().front() == kInternalMark; }
  // The symbolic name ("" when the size is known or unknown).
  std::string_view param() const {
    return symbolic() ? std::string_view(*reinterpret_cast<const std::string*>(bits_)) : std::string_view();
  }
  // Same known size, same symbolic name, or both unknown.
  bool operator==(const Dim& o) const { return bits_ == o.bits_; }
  // Provably the same size: the same known size or the same symbolic name (two unknown dims
  // may differ).
  bool same_as(const Dim& o) const { return bits_ != 0 && bits_ == o.bits_; }

 private:
  static constexpr char kInternalMark = '\x1f';  // (no exporter writes a control character into a dim name)
  explicit Dim(uint64_t bits) : bits_(bits) {}
  uint64_t bits_ = 0;
};
static_assert(std::is_trivially_copyable_v<Dim> && sizeof(Dim) == 8);

// Up to kInline dims live inside the object (56 bytes in all); more go to the heap.
class Dims {
 public:
  static constexpr uint32_t kInline = 6;

  Dims() : heap_(nullptr) {}
  explicit Dims(size_t n, Dim d = Dim{}) { resize(n, d); }
  Dims(std::initializer_list<Dim> dims) { assign(dims.begin(), dims.size()); }
  Dims(const std::vector<Dim>& dims) { assign(dims.data(), dims.size()); }  // NOLINT: implicit on purpose
  Dims(const Dims& o) { assign(o.data(), o.size_); }
  Dims(Dims&& o) noexcept { take(o); }
  ~Dims() { release(); }
  Dims& operator=(const Dims& o) {
    if (this != &o) {
      size_ = 0;
      assign(o.data(), o.size_);
    }
    return *this;
  }
  Dims& operator=(Dims&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Dim* data() { return on_heap() ? heap_ : inline_; }
  const Dim* data() const { return on_heap() ? heap_ : inline_; }
  Dim* begin() { return data(); }
  Dim* end() { return data() + size_; }
  const Dim* begin() const { return data(); }
  const Dim* end() const { return data() + size_; }
  Dim& operator[](size_t i) { return data()[i]; }
  const Dim& operator[](size_t i) const { return data()[i]; }
  Dim& back() { return data()[size_ - 1]; }
  const Dim& back() const { return data()[size_ - 1]; }

  void reserve(size_t n) {
    if (n <= capacity_) return;
    Dim* grown = new Dim[n];
    if (size_) std::memcpy(static_cast<void*>(grown), data(), size_ * sizeof(Dim));
    release();
    heap_ = grown;
    capacity_ = static_cast<uint32_t>(n);
  }
  void clear() { size_ = 0; }
  void push_back(Dim d) {
    if (size_ == capacity_) reserve(size_t{capacity_} * 2);
    data()[size_++] = d;
  }
  void resize(size_t n, Dim d = Dim{}) {
    reserve(n);
    for (size_t i = size_; i < n; ++i) data()[i] = d;
    size_ = static_cast<uint32_t>(n);
  }
  Dim* insert(const Dim* pos, Dim d) {
    const size_t at = static_cast<size_t>(pos - data());
    if (size_ == capacity_) reserve(size_t{capacity_} * 2);
    Dim* p = data();
    std::memmove(static_cast<void*>(p + at + 1), p + at, (size_ - at) * sizeof(Dim));
    p[at] = d;
    ++size_;
    return p + at;
  }
  Dim* erase(const Dim* first, const Dim* last) {
    const size_t a = static_cast<size_t>(first - data()), b = static_cast<size_t>(last - data());
    Dim* p = data();
    std::memmove(static_cast<void*>(p + a), p + b, (size_ - b) * sizeof(Dim));
    size_ -= static_cast<uint32_t>(b - a);
    return p + a;
  }
  Dim* erase(const Dim* pos) { return erase(pos, pos + 1); }

 private:
  bool on_heap() const { return capacity_ > kInline; }
  void release() {
    if (on_heap()) delete[] heap_;
    capacity_ = kInline;
  }
  void assign(const Dim* src, size_t n) {
    reserve(n);
    if (n) std::memcpy(static_cast<void*>(data()), src, n * sizeof(Dim));
    size_ = static_cast<uint32_t>(n);
  }
  // Takes o's dims (o is left empty, with inline storage).
  void take(Dims& o) {
    if (o.on_heap()) {
      heap_ = o.heap_;
      capacity_ = o.capacity_;
    } else {
      capacity_ = kInline;
      if (o.size_) std::memcpy(static_cast<void*>(inline_), o.inline_, o.size_ * sizeof(Dim));
    }
    size_ = o.size_;
    o.size_ = 0;
    o.capacity_ = kInline;
  }

  uint32_t size_ = 0;
  uint32_t capacity_ = kInline;  // more than kInline: the dims are on the heap
  union {
    Dim* heap_;
    Dim inline_[kInline];
  };
};
static_assert(sizeof(Dims) == 56);

}  // namespace onnax
