// Training-mode Dropout under differentiation: the derivative passes through the node's own
// random mask, which exporters rarely output (jax2onnx writes Dropout with
// training_mode = Not(deterministic), a run-time input, and no mask). Before jvp/vjp/grad, such
// nodes get a mask output of their own, so their rules read the mask this run drew.
#pragma once

#include <string>

#include "transforms/prepare.h"

namespace onnax {

// Names the mask output of every top-level default-domain Dropout whose training_mode input is
// present and not a constant false, when `mode` differentiates. True when the graph changed.
bool name_dropout_masks(Prepared& p, const std::string& mode);

}  // namespace onnax
