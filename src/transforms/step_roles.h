// Which runtime inputs of a step model are sequences, state or constants, and which outputs
// hold the next state: StepRoles (include/onnax/sequence.h) resolved and checked.
#pragma once

#include <onnax/sequence.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace onnax {

struct StepLayout {
  // The runtime inputs (graph inputs that are not initializers), in graph order; the roles
  // below index them.
  std::vector<const onnx::ValueInfoProto*> inputs;
  std::vector<int> sequences, states, constants;
  // Per state (in `states` order), the graph output holding its next value.
  std::vector<int> next_state_outputs;
  // The other graph outputs, in graph order.
  std::vector<int> per_step_outputs;
};

// Where step() records the roles of the step it writes (JSON lists of names in metadata_props),
// so that scan and signature read the step as it was meant.
inline constexpr const char* kStepStateKey = "onnax.step.state";
inline constexpr const char* kStepNextStateKey = "onnax.step.next_state";
inline constexpr const char* kStepConstantsKey = "onnax.step.constants";

// `roles` when given, else the roles step() recorded in `model` when they still name its inputs
// and outputs, else the defaults.
StepRoles given_or_recorded(const onnx::ModelProto& model, const StepRoles& roles);
// Records `roles` (states with their next-value outputs, constants) in `model`.
void record_roles(onnx::ModelProto& model, const std::vector<std::string>& states,
                  const std::vector<std::string>& next_state, const std::vector<std::string>& constants);
// Removes a record of roles (a sequence model made from a step is no step).
void forget_roles(onnx::ModelProto& model);

// `roles` applied to `g`, or a diagnostic (prefixed with `what`) naming the input or output at
// fault, what was expected, and the fix.
StepLayout read_step_roles(const onnx::GraphProto& g, const StepRoles& roles, const char* what);

// A sequence model read as its step (step() and signature()).
struct ExtractedStep {
  onnx::ModelProto step;
  // The step's inputs by role, by name (the sequence model's input names).
  std::vector<std::string> sequences, states, constants;
  // Per state, the step output holding its next value (the sequence model's final-state output,
  // or a new name when the sequence model does not return that state).
  std::vector<std::string> state_outputs;
  std::vector<std::string> dropped_final_states;  // those new names
  // The number of steps: fixed, a dim_param, or "" when unknown.
  std::optional<std::variant<int64_t, std::string>> length;
};

// The step inside `sequence` (one top-level Loop or Scan over time), or nullopt with the reason
// in `why`.
std::optional<ExtractedStep> extract_step(const onnx::ModelProto& sequence, std::string* why);

}  // namespace onnax
