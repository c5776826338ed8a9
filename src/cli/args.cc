#include "cli/args.h"

#include <sstream>

namespace onnax::cli {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

int64_t parse_int(const std::string& s, const std::string& option) {
  try {
    size_t used = 0;
    int64_t v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError{option + ": '" + s + "' is not an integer"};
}

}  // namespace onnax::cli
