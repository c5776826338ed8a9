// Surrogate gradients for step functions (spiking networks): a spike written as a comparison
// turned into numbers (Heaviside: Greater/GreaterOrEqual/Less/LessOrEqual, through Where and
// Cast; or Sign) has derivative zero almost everywhere. A surrogate keeps the forward pass
// exactly and gives the derivative g(x) of a smooth stand-in instead, x being the comparison's
// margin (a - b for a > b), as spyx's spyx.axn surrogates define g:
//   superspike (alias fast_sigmoid), k = 25 (alias slope):  1 / (1 + k|x|)^2
//   arctan, k = 2 (alias alpha):                             1 / (pi (1 + (k pi x)^2))
//   triangular (alias triangle), k = 2:                      max(0, 1 - |k x|)
//   boxcar, width = 2, height = 0.5:                         height where |x| < width / 2, else 0
//   tanh, k = 1:                                             1 - tanh(k x)^2
//   straight_through:                                        1
// A spike Where(cond, v1, v0) scales g by v1 - v0; Sign (= H(x) - H(-x)) by 2.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <string>
#include <vector>

namespace onnax {

struct Surrogate {
  std::string value;                     // the spike's output value; empty: every spike the model has
  std::string kind;                      // superspike, arctan, triangular, boxcar, tanh, straight_through (or an alias)
  std::map<std::string, double> params;  // by name (k, width, height; aliases slope, alpha)
};

// "superspike", "superspike:k=25", "arctan:alpha=2", or "VALUE=tanh:k=2" for one spike.
Surrogate parse_surrogate(const std::string& spec);

// `model` with its spikes marked (node metadata_props "onnax.surrogate"), in subgraphs too;
// jvp, vjp and grad then differentiate each marked spike by its surrogate. Fails when a
// selected value is not a spike, or when no spike is found.
onnx::ModelProto with_surrogates(const onnx::ModelProto& model, const std::vector<Surrogate>& surrogates);

}  // namespace onnax
