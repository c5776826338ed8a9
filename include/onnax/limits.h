// Bounds on the transforms a thread runs, for services that transform models they did not
// write, and cancellation from another thread (a Ctrl-C handler). A transform that reaches a
// bound stops with an Error of kind kLimit and writes nothing.
#pragma once

#include <atomic>
#include <cstdint>

namespace onnax {

struct Limits {
  // Wall-clock seconds a transform may take; 0: no bound. Checked between nodes and between
  // bodies, so a transform stops a few milliseconds past the bound (one call into ONNX's shape
  // inference is not interrupted).
  double max_seconds = 0;
  // Bytes the result may take serialized, its tensors included; 0: no bound (a result over
  // 2 GB then needs external data: save_model writes it).
  uint64_t max_output_bytes = 0;
  // Set from another thread: the transform stops at its next check.
  const std::atomic<bool>* cancel = nullptr;
  // A counter something else increments (a signal handler, say): the transform stops at its next
  // check once the count differs from the one it had when the scope began.
  const std::atomic<uint64_t>* interrupts = nullptr;
};

// Applies `limits` to the transforms this thread runs while the scope lives (max_seconds counts
// from the scope's creation). Within another scope, the bounds this one leaves unset (0, no
// cancel flag, no interrupt counter) are the enclosing scope's.
class LimitsScope {
 public:
  explicit LimitsScope(const Limits& limits);
  ~LimitsScope();
  LimitsScope(const LimitsScope&) = delete;
  LimitsScope& operator=(const LimitsScope&) = delete;

 private:
  const void* outer_;
};

}  // namespace onnax
