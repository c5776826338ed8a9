// The training commands (loss, train-step) and the parameter-selection options grad, jvp and
// vjp share with them.
#pragma once

#include <onnax/training.h>

#include <optional>
#include <string>
#include <vector>

namespace onnax::cli {

struct ParamArgs {
  ParamSpec spec;
  bool given = false;                         // --params was passed
  std::optional<int64_t> constants_min_size;  // --constants-as-params N
  std::vector<std::string> stop_gradient;     // --stop-gradient NAMES
  std::vector<Surrogate> surrogates;          // --surrogate SPEC (repeatable)
};

// Consumes args[i] (and its value) when it is --params, --exclude, --min-size,
// --constants-as-params, --stop-gradient or --surrogate.
bool take_param_option(const std::vector<std::string>& args, size_t& i, ParamArgs& out);
// The parameters the options select. `model` is replaced by the model to transform: Constant
// weights promoted when asked, stop_gradient and surrogate marks added.
std::vector<std::string> selected_params(onnx::ModelProto& model, const ParamArgs& args);

int cmd_loss(const std::vector<std::string>& args);
int cmd_train_step(const std::vector<std::string>& args);

}  // namespace onnax::cli
