// The commands for stateful models: scan (step -> sequence), step (sequence -> step) and
// signature (the flat layout, as JSON).
#pragma once

#include <string>
#include <vector>

namespace onnax::cli {

int cmd_scan(const std::vector<std::string>& args);
int cmd_step(const std::vector<std::string>& args);
int cmd_signature(const std::vector<std::string>& args);

}  // namespace onnax::cli
