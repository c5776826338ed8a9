// What onnax records in a model's metadata_props: the transform chain that produced it (so a
// generated file is self-describing) and which outputs are generated derivatives (so
// jvp(grad(f)) knows to differentiate the gradient by default, also after save/load).
#pragma once

#include <onnx/onnx_pb.h>

#include <optional>
#include <string>
#include <vector>

namespace onnax::provenance {

inline constexpr const char* kTransformsKey = "onnax.transforms";
inline constexpr const char* kDerivativeOutputsKey = "onnax.derivative_outputs";
// Values whose derivative every transform cuts (onnax::stop_gradient).
inline constexpr const char* kStopGradientKey = "onnax.stop_gradient";

// Appends one step (a JSON object) to the recorded chain, with the onnax version.
void record_step(onnx::ModelProto& model, const std::string& step_json);
// A list of names recorded under `key` ({} when absent), and its replacement.
std::vector<std::string> names_at(const onnx::ModelProto& model, const char* key);
void set_names_at(onnx::ModelProto& model, const char* key, const std::vector<std::string>& names);
std::vector<std::string> derivative_outputs(const onnx::ModelProto& model);
void set_derivative_outputs(onnx::ModelProto& model, const std::vector<std::string>& names);

// The inputs and outputs the last recorded step (jvp, vjp or grad) selected, as resolved;
// nullopt when the last step records none.
struct RecordedSelection {
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
};
std::optional<RecordedSelection> last_selection(const onnx::ModelProto& model);

// JSON helpers for steps.
std::string quote(const std::string& s);
std::string list(const std::vector<std::string>& quoted_items);

}  // namespace onnax::provenance
