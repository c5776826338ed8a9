// The value names a graph defines, for fresh names that collide with none of them.
#pragma once

#include <onnx/onnx_pb.h>

#include "ir/names.h"

namespace onnax {

// Reserves in `values` every value name `g` defines or declares (inputs, outputs, value_info,
// initializers, node outputs), in its subgraphs too.
void collect_names(const onnx::GraphProto& g, NameScope& values);

}  // namespace onnax
