#include "notice.h"

#include <onnax/diagnostics.h>

#include <iostream>

namespace onnax {
namespace {
void to_stderr(const std::string& m) {
  std::cerr << "onnax: " << m << "\n";
}
NoticeSink g_sink = to_stderr;
}  // namespace

void set_notice_sink(NoticeSink sink) {
  g_sink = sink ? sink : to_stderr;
}
void notice(const std::string& message) {
  g_sink(message);
}

std::string version() {
  return ONNAX_VERSION;
}
}  // namespace onnax
