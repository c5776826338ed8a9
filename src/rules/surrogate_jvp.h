// The derivative of a spike marked by with_surrogates (include/onnax/surrogate.h): how the
// marked node's comparison is found in its graph, and the surrogate JVP itself.
#pragma once

#include <onnax/surrogate.h>
#include <onnx/onnx_pb.h>

#include <optional>
#include <string>
#include <unordered_map>

#include "rules/derivative.h"

namespace onnax {

inline constexpr const char* kSurrogateKey = "onnax.surrogate";

// A surrogate as its canonical text ("superspike:k=25"), the form a mark holds.
std::string surrogate_text(const Surrogate& s);

// The surrogate a node is marked with ("kind:k=25,..."); nullptr: none.
const std::string* surrogate_mark(const onnx::NodeProto& node);

// What a spike reads: the comparison's operands (x = a - b, or b - a for Less*; b empty for
// Sign, whose x is a) and the Where's two values (empty without a Where).
struct SpikeOperands {
  std::string a, b, v1, v0;
  bool reversed = false;  // Less / LessOrEqual
  bool sign = false;      // a Sign node: H(x) - H(-x)
};

// The operands of the spike `node` produces, reading producers by output name in `producer`;
// nullopt when `node` is not a spike (Cast of a comparison or of Where(comparison, v1, v0),
// such a Where, or Sign of a float).
std::optional<SpikeOperands> spike_operands(const onnx::NodeProto& node,
                                            const std::unordered_map<std::string, const onnx::NodeProto*>& producer);

// The tangent of the spike's output: c.xs = {a, b, v1, v0} (invalid where absent), c.ts =
// {ta, tb}; `mark` is the node's surrogate.
Vs surrogate_jvp(JvpCtx& c, const SpikeOperands& spike, const std::string& mark);

}  // namespace onnax
