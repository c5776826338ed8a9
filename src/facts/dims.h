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
#include <string_view>
#include <type_traits>
#include <vector>

namespace onnax {

// The process-wide copy of a symbolic dimension name: equal names give the same view, which
// stays valid for the life of the process (models use a handful of distinct names).
std::string_view intern_dim_param(std::string_view name);

struct Dim {
  int64_t value = -1;      // >= 0 when the size is known
  std::string_view param;  // symbolic name when the size is symbolic (interned)
  bool known() const { return value >= 0; }
  static Dim of(int64_t v) { return Dim{v, {}}; }
  static Dim named(std::string_view p) { return Dim{-1, intern_dim_param(p)}; }
};
static_assert(std::is_trivially_copyable_v<Dim>);

class Dims {
 public:
  static constexpr size_t kInline = 6;

  Dims() = default;
  explicit Dims(size_t n, Dim d = Dim{}) { resize(n, d); }
  Dims(std::initializer_list<Dim> dims) { assign(dims.begin(), dims.size()); }
  Dims(const std::vector<Dim>& dims) { assign(dims.data(), dims.size()); }  // NOLINT: implicit on purpose
  Dims(const Dims& o) { assign(o.data(), o.size_); }
  Dims(Dims&& o) noexcept { take(o); }
  Dims& operator=(const Dims& o) {
    if (this != &o) {
      size_ = 0;
      assign(o.data(), o.size_);
    }
    return *this;
  }
  Dims& operator=(Dims&& o) noexcept {
    if (this != &o) {
      heap_.reset();
      take(o);
    }
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Dim* data() { return heap_ ? heap_.get() : inline_; }
  const Dim* data() const { return heap_ ? heap_.get() : inline_; }
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
    std::unique_ptr<Dim[]> grown(new Dim[n]);
    if (size_) std::memcpy(static_cast<void*>(grown.get()), data(), size_ * sizeof(Dim));
    heap_ = std::move(grown);
    capacity_ = n;
  }
  void clear() { size_ = 0; }
  void push_back(Dim d) {
    if (size_ == capacity_) reserve(capacity_ * 2);
    data()[size_++] = d;
  }
  void resize(size_t n, Dim d = Dim{}) {
    reserve(n);
    for (size_t i = size_; i < n; ++i) data()[i] = d;
    size_ = n;
  }
  Dim* insert(const Dim* pos, Dim d) {
    const size_t at = static_cast<size_t>(pos - data());
    if (size_ == capacity_) reserve(capacity_ * 2);
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
    size_ -= b - a;
    return p + a;
  }
  Dim* erase(const Dim* pos) { return erase(pos, pos + 1); }

 private:
  void assign(const Dim* src, size_t n) {
    reserve(n);
    if (n) std::memcpy(static_cast<void*>(data()), src, n * sizeof(Dim));
    size_ = n;
  }
  void take(Dims& o) {
    if (o.heap_) {
      heap_ = std::move(o.heap_);
      capacity_ = o.capacity_;
    } else {
      capacity_ = kInline;
      if (o.size_) std::memcpy(static_cast<void*>(inline_), o.inline_, o.size_ * sizeof(Dim));
    }
    size_ = o.size_;
    o.size_ = 0;
    o.capacity_ = kInline;
  }

  size_t size_ = 0;
  size_t capacity_ = kInline;
  std::unique_ptr<Dim[]> heap_;  // set when more than kInline dims were ever needed
  Dim inline_[kInline];
};

}  // namespace onnax
