#include "emit/names.h"

namespace onnax {

std::string NameScope::fresh(std::string_view base_view) {
  std::string base(base_view.empty() ? "v" : base_view);
  if (used_.insert(base).second) return base;
  int& next = next_suffix_[base];
  for (;;) {
    std::string candidate = base + "_" + std::to_string(++next);
    if (used_.insert(candidate).second) return candidate;
  }
}

}  // namespace onnax
