// Stateful models: one timestep `step(x_t, *state) -> (out, *new_state)` and the whole
// sequence `run(x_seq, *state) -> (out_seq, *final_state)` as one native ONNX Loop, turned
// into each other and described as a flat signature (names in call order, shapes, dtypes).
#pragma once

#include <onnax/diagnostics.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace onnax {

// How a step model's inputs and outputs are read. Runtime inputs are sequences (a time axis is
// added in front), state, or constants (the same value at every step).
struct StepRoles {
  // The state inputs, in order. Unset: every runtime input after the first (the layout of
  // spyx's and most exporters' steps: x first, then the flattened state).
  std::optional<std::vector<std::string>> state;
  // For a state input, the output holding its next value. States not named here take the last
  // outputs, in order (the i-th of the N states is output K - N + i of K).
  std::map<std::string, std::string> next_state;
  // Runtime inputs that are not per-step sequences but the same at every step.
  std::vector<std::string> constants;
};

struct ScanOptions {
  StepRoles roles;
  // The number of steps, declared as the time axis of every sequence input and output.
  // Unset: a symbolic dim `length_name`, read at run time from the first sequence input
  // (required then: with no sequence input there is nothing to read the length from).
  std::optional<int64_t> length;
  std::string length_name = "time";
  // Truncated backpropagation through time: derivatives flow through the last `truncate` steps
  // only (the steps before run in a loop of their own whose results are stop_gradient marked).
  // The forward pass is the same.
  std::optional<int64_t> truncate;
};

// The full-sequence model of a step: one Loop over the time axis (first) whose body is the
// step. Inputs keep their names (sequences gain the time axis); state outputs become the final
// state, the other outputs are stacked over time under their own names. Initializers stay
// initializers of the outer graph, read by the body.
onnx::ModelProto scan(const onnx::ModelProto& step, const ScanOptions& options = {});

// The step of a full-sequence model: a graph whose work is one top-level Loop or Scan over the
// time axis (plus the nodes computing its trip count). The body becomes the graph; inputs and
// outputs take the sequence model's names, in its order (x, then state; out, then state).
onnx::ModelProto step(const onnx::ModelProto& sequence);

// A tensor's place in the signature. A dim is its size or its symbolic name ("" if unknown).
struct SignatureTensor {
  std::string name;
  int32_t dtype = 0;  // onnx::TensorProto::DataType
  bool has_shape = false;
  std::vector<std::variant<int64_t, std::string>> shape;
};

// The flat layout of a step or sequence model (spyx's ONNXStepSignature, and more).
struct Signature {
  std::vector<SignatureTensor> inputs;     // call order: sequence/x inputs, constants, then state
  std::vector<SignatureTensor> outputs;    // call order: per-step outputs, then (new/final) state
  std::vector<std::string> state_inputs;   // in order
  std::vector<std::string> state_outputs;  // the i-th holds the next value of state_inputs[i]
  std::vector<int> per_step_outputs;       // the other outputs, as indices into `outputs`
  std::vector<std::string> constants;
  // Sequence models only: the time length (an int, a symbolic name, or "" if unknown).
  std::optional<std::variant<int64_t, std::string>> sequence_length;
  bool is_sequence = false;
};

// The signature of `model`: a sequence model (one top-level Loop/Scan, as `step` reads it)
// or else a step model read with `roles`.
Signature signature(const onnx::ModelProto& model, const StepRoles& roles = {});

// The signature as JSON (field names as spyx's ONNXStepSignature where they exist).
std::string signature_json(const Signature& signature);

}  // namespace onnax
