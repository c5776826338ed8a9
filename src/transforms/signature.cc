// signature: the flat layout of a step or sequence model (include/onnax/sequence.h), and its
// JSON form, whose field names follow spyx's ONNXStepSignature where it has them.
#include <onnax/sequence.h>

#include <string>
#include <unordered_set>

#include "check/model_check.h"
#include "diagnostics/error.h"
#include "ir/graph_edit.h"
#include "transforms/provenance.h"
#include "transforms/step_roles.h"

namespace onnax {
namespace {

SignatureTensor tensor_of(const onnx::ValueInfoProto& vi) {
  SignatureTensor t;
  t.name = vi.name();
  const auto& tt = vi.type().tensor_type();
  t.dtype = tt.elem_type();
  t.has_shape = tt.has_shape();
  for (const auto& d : tt.shape().dim()) {
    if (d.has_dim_value())
      t.shape.emplace_back(d.dim_value());
    else
      t.shape.emplace_back(d.dim_param());
  }
  return t;
}

bool has_top_level_loop(const onnx::GraphProto& g) {
  for (const auto& n : g.node())
    if (is_default_domain(n) && (n.op_type() == "Loop" || n.op_type() == "Scan")) return true;
  return false;
}

std::vector<const onnx::ValueInfoProto*> runtime_inputs(const onnx::GraphProto& g) {
  std::unordered_set<std::string> stored;
  for (const auto& t : g.initializer()) stored.insert(t.name());
  std::vector<const onnx::ValueInfoProto*> out;
  for (const auto& vi : g.input())
    if (!stored.count(vi.name())) out.push_back(&vi);
  return out;
}

std::string dim_json(const std::variant<int64_t, std::string>& d) {
  if (const auto* v = std::get_if<int64_t>(&d)) return std::to_string(*v);
  const auto& s = std::get<std::string>(d);
  return s.empty() ? "null" : provenance::quote(s);
}

std::string shape_json(const SignatureTensor& t) {
  if (!t.has_shape) return "null";
  std::vector<std::string> dims;
  for (const auto& d : t.shape) dims.push_back(dim_json(d));
  return provenance::list(dims);
}

std::string dtype_json(int32_t dtype) {
  return dtype == 0 ? "null" : provenance::quote(diag::dtype_name(dtype));
}

std::string names_json(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const auto& n : names) quoted.push_back(n.empty() ? "null" : provenance::quote(n));
  return provenance::list(quoted);
}

const SignatureTensor* find(const std::vector<SignatureTensor>& tensors, const std::string& name) {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace

Signature signature(const onnx::ModelProto& model, const StepRoles& roles) {
  if (const std::string problem = check::structure_checker(model); !problem.empty())
    diag::fail(Error::Kind::kInvalidModel, "signature: the model is not valid ONNX: " + problem);
  const onnx::GraphProto& g = model.graph();
  const bool roles_given = roles.state || !roles.next_state.empty() || !roles.constants.empty();
  Signature sig;
  for (const auto* vi : runtime_inputs(g)) sig.inputs.push_back(tensor_of(*vi));
  for (const auto& vi : g.output()) sig.outputs.push_back(tensor_of(vi));

  if (has_top_level_loop(g) && !roles_given) {
    std::string why;
    auto extracted = extract_step(model, &why);
    if (!extracted)
      diag::fail(
          Error::Kind::kUnsupported,
          "signature: the model has a top-level Loop/Scan but is not a sequence model signature can read: " + why +
              ". Fix: for a step model that loops inside, name its state inputs (command line --state, "
              "Python state=[...]) to read it as a step");
    sig.is_sequence = true;
    sig.state_inputs = extracted->states;
    sig.constants = extracted->constants;
    sig.sequence_length = extracted->length;
    std::unordered_set<std::string> returned;
    for (const auto& vi : g.output()) returned.insert(vi.name());
    for (const auto& name : extracted->state_outputs) sig.state_outputs.push_back(returned.count(name) ? name : "");
    const std::unordered_set<std::string> finals(sig.state_outputs.begin(), sig.state_outputs.end());
    for (int o = 0; o < g.output_size(); ++o)
      if (!finals.count(g.output(o).name())) sig.per_step_outputs.push_back(o);
    // The stacked outputs' time axis is the loop's length, whatever the exporter declared
    // (jax2onnx writes a placeholder name there).
    const bool length_known = sig.sequence_length && (std::holds_alternative<int64_t>(*sig.sequence_length) ||
                                                      !std::get<std::string>(*sig.sequence_length).empty());
    if (length_known)
      for (const int o : sig.per_step_outputs)
        if (sig.outputs[o].has_shape && !sig.outputs[o].shape.empty()) sig.outputs[o].shape[0] = *sig.sequence_length;
    return sig;
  }
  const StepLayout layout = read_step_roles(g, given_or_recorded(model, roles), "signature");
  for (const int s : layout.states) sig.state_inputs.push_back(layout.inputs[s]->name());
  for (const int o : layout.next_state_outputs) sig.state_outputs.push_back(g.output(o).name());
  for (const int c : layout.constants) sig.constants.push_back(layout.inputs[c]->name());
  sig.per_step_outputs = layout.per_step_outputs;
  return sig;
}

std::string signature_json(const Signature& sig) {
  std::unordered_set<std::string> state_in(sig.state_inputs.begin(), sig.state_inputs.end());
  std::unordered_set<std::string> constants(sig.constants.begin(), sig.constants.end());
  const SignatureTensor* x = nullptr;
  for (const auto& t : sig.inputs)
    if (!state_in.count(t.name) && !constants.count(t.name)) {
      x = &t;
      break;
    }
  const SignatureTensor* out = sig.per_step_outputs.empty() ? nullptr : &sig.outputs[sig.per_step_outputs.front()];
  std::vector<std::string> input_names, output_names, state_shapes, state_dtypes, inputs, outputs;
  for (const auto& t : sig.inputs) input_names.push_back(provenance::quote(t.name));
  for (const auto& t : sig.outputs) output_names.push_back(provenance::quote(t.name));
  for (const auto& name : sig.state_inputs) {
    const SignatureTensor* t = find(sig.inputs, name);
    state_shapes.push_back(t ? shape_json(*t) : "null");
    state_dtypes.push_back(t ? dtype_json(t->dtype) : "null");
  }
  auto tensor_json = [](const SignatureTensor& t) {
    return "{\"name\": " + provenance::quote(t.name) + ", \"dtype\": " + dtype_json(t.dtype) +
           ", \"shape\": " + shape_json(t) + "}";
  };
  for (const auto& t : sig.inputs) inputs.push_back(tensor_json(t));
  for (const auto& t : sig.outputs) outputs.push_back(tensor_json(t));
  std::string length = "null";
  if (sig.sequence_length) length = dim_json(*sig.sequence_length);
  return std::string("{\n") + "  \"kind\": " + (sig.is_sequence ? "\"sequence\"" : "\"step\"") + ",\n" +
         "  \"input_names\": " + provenance::list(input_names) + ",\n" +
         "  \"output_names\": " + provenance::list(output_names) + ",\n" +
         "  \"input_shape\": " + (x ? shape_json(*x) : "null") + ",\n" +
         "  \"input_dtype\": " + (x ? dtype_json(x->dtype) : "null") + ",\n" +
         "  \"state_names\": " + names_json(sig.state_inputs) + ",\n" +
         "  \"state_shapes\": " + provenance::list(state_shapes) + ",\n" +
         "  \"state_dtypes\": " + provenance::list(state_dtypes) + ",\n" +
         "  \"state_output_names\": " + names_json(sig.state_outputs) + ",\n" +
         "  \"output_shape\": " + (out ? shape_json(*out) : "null") + ",\n" +
         "  \"output_dtype\": " + (out ? dtype_json(out->dtype) : "null") + ",\n" +
         "  \"constants\": " + names_json(sig.constants) + ",\n" + "  \"sequence_length\": " + length + ",\n" +
         "  \"num_state\": " + std::to_string(sig.state_inputs.size()) + ",\n" +
         "  \"inputs\": " + provenance::list(inputs) + ",\n" + "  \"outputs\": " + provenance::list(outputs) + "\n}\n";
}

}  // namespace onnax
