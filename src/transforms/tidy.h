// What a transform leaves behind and nothing uses, removed from its result: initializers no node
// reads (the constants a rule replaced; ONNX Runtime warns about each), value_info of values the
// graph no longer has, and opset imports of domains no node or function uses (the custom
// domains of inlined functions). Graph inputs and outputs are never touched.
#pragma once

#include <onnx/onnx_pb.h>

namespace onnax {

void tidy(onnx::ModelProto& model);

}  // namespace onnax
