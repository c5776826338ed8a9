// Argument helpers shared by the onnax subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace onnax::cli {

// A command-line mistake: reported with a pointer to --help and exit code 2.
struct UsageError {
  std::string message;
};

// Comma-separated items; empty items are kept ("0," is two items) so they are reported.
std::vector<std::string> split(const std::string& s, char sep);

// The whole of `s` as an integer, else a UsageError naming `option`.
int64_t parse_int(const std::string& s, const std::string& option);

}  // namespace onnax::cli
