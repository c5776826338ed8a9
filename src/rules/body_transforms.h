// How a rule has a Loop, Scan or If body transformed: the transform running the rule gives these
// (rules do not call the public API), with the body as a model of its own (subgraph.h).
#pragma once

#include <onnax/options.h>
#include <onnx/onnx_pb.h>

#include <functional>

namespace onnax {

struct BodyTransforms {
  // vmap of a body; throws onnax::Error when the body cannot be batched as a whole.
  std::function<onnx::ModelProto(onnx::ModelProto, const VmapOptions&)> vmap;
  // jvp (forward) or vjp of a body; `for_reverse_mode`: the enclosing transform records a tape,
  // so no loop inside may compute its primal outputs in its JVP loop (control_flow.cc).
  std::function<onnx::ModelProto(bool forward, onnx::ModelProto, const Selection&, bool for_reverse_mode)> derive;
};

}  // namespace onnax
