// What the transforms are asked to do: vmap's axes and the derivatives' selections.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace onnax {

// Where a batched input carries its batch axis; std::nullopt means "not batched (shared)".
using Axis = std::optional<int64_t>;

struct VmapOptions {
  // How the batched inputs are selected:
  //   kAll       `in_axis` applies to every runtime graph input (initializers are never
  //              runtime inputs: they are always shared);
  //   kPerInput  `in_axes` has exactly one entry per runtime graph input, in order;
  //   kByName    `in_axes_by_name` names inputs; inputs not named are shared.
  enum class InAxesForm { kAll, kPerInput, kByName };
  InAxesForm in_axes_form = InAxesForm::kAll;
  Axis in_axis = 0;
  std::vector<Axis> in_axes;
  std::map<std::string, Axis> in_axes_by_name;
  // One entry per graph output, or a single entry for all; empty means 0.
  // std::nullopt: the output is the same for every example and stays unbatched (vmap fails
  // with a diagnostic if it depends on a batched input).
  std::vector<Axis> out_axes;
  // dim_param of the new batch dimension; empty picks "batch" (made unique in the model).
  std::string axis_name;
};

// Which values to differentiate, by graph name (ordered; not positions). Unset inputs select
// every FLOAT/DOUBLE runtime input (initializers are selectable explicitly and keep their
// stored values). Unset outputs select, for jvp, the derivative outputs an earlier onnax
// transform generated (so jvp(grad(f)) appends a Hessian-vector product) or else every
// FLOAT/DOUBLE output; for vjp, every FLOAT/DOUBLE output.
struct Selection {
  std::optional<std::vector<std::string>> inputs;
  std::optional<std::vector<std::string>> outputs;
};

}  // namespace onnax
