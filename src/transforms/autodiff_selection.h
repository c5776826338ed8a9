// What a derivative transform differentiates: the selected inputs and outputs, checked and
// defaulted as the contract says (docs/contract.md), and the names of the values it makes.
#pragma once

#include <onnax/options.h>

#include <string>
#include <string_view>
#include <vector>

#include "ir/names.h"
#include "transforms/prepare.h"

namespace onnax::autodiff {

enum class Mode { kJvp, kVjp, kGrad };

// "jvp", "vjp" or "grad": the prefix of the transform's messages.
const char* mode_name(Mode m);

// ['a', 'b'] for messages.
std::string quoted_names(const std::vector<std::string>& names);

struct Resolved {
  std::vector<std::string> inputs;   // differentiated with respect to, in order
  std::vector<std::string> outputs;  // differentiated, in order
};

// The selection of a jvp/vjp/grad of `p`, defaults applied; a diagnostic when it selects
// nothing, a name twice, a non-float value or a name the model lacks (grad: a non-scalar loss).
Resolved resolve(const Prepared& p, Mode mode, const Selection& sel);

// The name of a derivative of `base`: base + suffix, or, when earlier transforms took that name,
// the suffix once more per order (grad of grad of grad gives w_grad_grad_grad; jvp of jvp pairs
// the tangent input w_tangent_tangent with the output loss_tangent_tangent); numbered only past
// a few orders. Reserved in `names`.
std::string derived_name(NameScope& names, const std::string& base, std::string_view suffix);

}  // namespace onnax::autodiff
