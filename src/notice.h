// Non-fatal notices to the user (stderr by default; redirected by the Python binding).
#pragma once

#include <string>

namespace onnax {
void notice(const std::string& message);
}
