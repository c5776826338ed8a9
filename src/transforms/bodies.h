// The body transforms the transforms give control-flow rules (rules/body_transforms.h): vmap,
// jvp and vjp of a body as a model of its own.
#pragma once

#include "rules/body_transforms.h"

namespace onnax {

const BodyTransforms& body_transforms();

}  // namespace onnax
