// `onnax check MODEL`: the ONNX checker and strict shape inference (plus optional symbolic
// length and embedded weight checks) with a readable report; exit 1 when anything fails.
#pragma once

#include <string>
#include <vector>

namespace onnax::cli {

int cmd_check(const std::vector<std::string>& args);

}  // namespace onnax::cli
