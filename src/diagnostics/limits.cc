#include "diagnostics/limits.h"

#include <chrono>
#include <cstdio>

#include "diagnostics/error.h"

namespace onnax {
namespace {

struct Active {
  Limits limits;
  std::chrono::steady_clock::time_point start;
  const Active* outer;
  uint64_t interrupts_at_start = 0;
};
thread_local const Active* active = nullptr;

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", s);
  return buf;
}

}  // namespace

LimitsScope::LimitsScope(const Limits& limits) : outer_(active) {
  auto* mine = new Active{limits, std::chrono::steady_clock::now(), active,
                          limits.interrupts ? limits.interrupts->load(std::memory_order_relaxed) : 0};
  // What this scope leaves unset, the enclosing one still bounds (the Python binding's
  // cancellation around the command line's own --max-seconds, say).
  if (const Active* outer = active) {
    if (mine->limits.max_seconds <= 0) {
      mine->limits.max_seconds = outer->limits.max_seconds;
      mine->start = outer->start;
    }
    if (mine->limits.max_output_bytes == 0) mine->limits.max_output_bytes = outer->limits.max_output_bytes;
    if (!mine->limits.cancel) mine->limits.cancel = outer->limits.cancel;
    if (!mine->limits.interrupts) {
      mine->limits.interrupts = outer->limits.interrupts;
      mine->interrupts_at_start = outer->interrupts_at_start;
    }
  }
  active = mine;
}

LimitsScope::~LimitsScope() {
  const Active* mine = active;
  active = static_cast<const Active*>(outer_);
  delete mine;
}

namespace limits {

void poll() {
  if (!active) return;
  const Limits& l = active->limits;
  if ((l.cancel && l.cancel->load(std::memory_order_relaxed)) ||
      (l.interrupts && l.interrupts->load(std::memory_order_relaxed) != active->interrupts_at_start))
    diag::fail(Error::Kind::kLimit, "the transform was interrupted; nothing was written");
  if (l.max_seconds <= 0) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - active->start).count();
  if (elapsed > l.max_seconds)
    diag::fail(Error::Kind::kLimit, "the transform ran " + seconds_text(elapsed) + " s, past its time limit of " +
                                        seconds_text(l.max_seconds) +
                                        " s, and was stopped; nothing was written. Fix: raise the limit "
                                        "(--max-seconds; max_seconds in onnax.limits), or transform a smaller "
                                        "model");
}

uint64_t max_output_bytes() {
  return active ? active->limits.max_output_bytes : 0;
}

void check_output_size(uint64_t bytes, const std::string& mode) {
  if (!active || active->limits.max_output_bytes == 0 || bytes <= active->limits.max_output_bytes) return;
  auto size = [](uint64_t b) {
    return seconds_text(static_cast<double>(b) / (1024.0 * 1024.0)) + " MB (" + std::to_string(b) + " bytes)";
  };
  diag::fail(Error::Kind::kLimit, mode + ": the result would take " + size(bytes) + ", over the limit of " +
                                      size(active->limits.max_output_bytes) +
                                      "; nothing was written. Fix: raise the limit (--max-output-mb; "
                                      "max_output_mb in onnax.limits) if the model is trusted");
}

}  // namespace limits
}  // namespace onnax
