// Geometry of sliding-window ops (Conv, ConvTranspose, AveragePool, LpPool): the explicit
// begin/end pads per spatial axis, as run-time 1-D int64 tensors. auto_pad=SAME_* pads depend
// on the input's spatial size, so they are computed with shape arithmetic instead of being
// baked into attributes; that keeps reverse mode working for symbolic spatial dims.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "emit/builder.h"

namespace onnax {

struct Window {
  int64_t spatial = 0;
  std::vector<int64_t> strides, dilations;
  V begin, end;                      // 1-D int64 [spatial]
  std::vector<int64_t> static_pads;  // [begin..., end...] when known (attributes, or static sizes)
  bool static_known = false;
};

// Marks `w`'s pads static when begin and end are constants the builder knows (run-time pads
// computed from static sizes fold to constants).
void settle_static_pads(const Builder& b, Window& w);

std::vector<int64_t> node_ints(const onnx::NodeProto& node, const std::string& name);
std::string node_s(const onnx::NodeProto& node, const std::string& name, const std::string& fallback);

// Pads of a forward window op (Conv or a pool) over input spatial dims `in_sp` with kernel
// dims `kernel_sp` (both 1-D int64 tensors).
Window window_geometry(Builder& b, const onnx::NodeProto& node, int64_t spatial, V in_sp, V kernel_sp);
// Pad's pads input for a (N, C, spatial...) tensor: [0, 0, begin..., 0, 0, end...].
V nc_pads(Builder& b, V begin, V end);
// A tensor of ones of dtype `dt` shaped (1, 1, dims...) for static kernel dims.
V ones_kernel(Builder& b, const std::vector<int64_t>& kernel, int32_t dt);

}  // namespace onnax
