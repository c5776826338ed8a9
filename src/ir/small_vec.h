// A vector of trivially copyable elements whose first N live inside the object.
//
// Transforms make a few short lists per node (which outputs are batched, ...); as
// std::vectors each was a heap allocation and a free, which over a 100k-node graph costs as
// much as the useful work. Lists longer than N (a Split with many outputs) move to the heap.
#pragma once

#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <vector>

namespace onnax {

template <typename T, size_t N>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SmallVec() = default;
  explicit SmallVec(size_t n, const T& fill = T{}) { resize(n, fill); }
  SmallVec(std::initializer_list<T> items) {
    for (const T& x : items) push_back(x);
  }
  // Interchangeable with std::vector where code still takes one (copies).
  SmallVec(const std::vector<T>& items) {  // NOLINT: implicit on purpose
    reserve(items.size());
    for (const T& x : items) push_back(x);
  }
  operator std::vector<T>() const { return std::vector<T>(begin(), end()); }  // NOLINT
  SmallVec(const SmallVec& o) { copy_from(o); }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) {
      size_ = 0;
      copy_from(o);
    }
    return *this;
  }
  SmallVec(SmallVec&& o) noexcept { take(o); }
  SmallVec& operator=(SmallVec&& o) noexcept {
    if (this != &o) take(o);
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return heap_ ? heap_.get() : inline_; }
  const T* data() const { return heap_ ? heap_.get() : inline_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }

  void clear() { size_ = 0; }
  void pop_back() { --size_; }
  void push_back(const T& x) {
    if (size_ == capacity_) reserve(capacity_ * 2);
    data()[size_++] = x;
  }
  void resize(size_t n, const T& fill = T{}) {
    reserve(n);
    for (size_t i = size_; i < n; ++i) data()[i] = fill;
    size_ = n;
  }
  void assign(size_t n, const T& fill) {
    size_ = 0;
    resize(n, fill);
  }
  void reserve(size_t n) {
    if (n <= capacity_) return;
    std::unique_ptr<T[]> grown(new T[n]);
    if (size_) std::memcpy(static_cast<void*>(grown.get()), data(), size_ * sizeof(T));
    heap_ = std::move(grown);
    capacity_ = n;
  }

 private:
  // Copies of inline contents copy the whole inline array: a constant size the compiler can
  // check against the buffers, and at most N small elements.
  void copy_from(const SmallVec& o) {
    reserve(o.size_);
    if (o.heap_)
      std::memcpy(static_cast<void*>(data()), o.heap_.get(), o.size_ * sizeof(T));
    else
      std::memcpy(static_cast<void*>(data()), o.inline_, sizeof inline_);
    size_ = o.size_;
  }
  // Takes o's elements (a heap buffer moves; inline ones are copied); o is left empty.
  void take(SmallVec& o) {
    if (o.heap_) {
      heap_ = std::move(o.heap_);
      capacity_ = o.capacity_;
    } else {
      heap_.reset();
      capacity_ = N;
      std::memcpy(static_cast<void*>(inline_), o.inline_, sizeof inline_);
    }
    size_ = o.size_;
    o.size_ = 0;
    o.capacity_ = N;
  }

  size_t size_ = 0;
  size_t capacity_ = N;
  std::unique_ptr<T[]> heap_;  // set once more than N elements were needed
  T inline_[N]{};
};

}  // namespace onnax
