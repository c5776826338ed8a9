// The `onnax` command line, as a library function so the Python package's console script and
// the standalone binary share one implementation.
#pragma once

#include <string>
#include <vector>

namespace onnax::cli {

// Runs the command line `args` (without the program name); returns the exit code.
int run(const std::vector<std::string>& args);

}  // namespace onnax::cli
