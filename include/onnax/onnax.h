// onnax: JAX-style transformations of ONNX models.
//
// Every transform takes a model and returns a new one; the source is never modified, and the
// same input always gives byte-identical output.
#pragma once

#include <onnax/diagnostics.h>
#include <onnax/options.h>
#include <onnax/rules.h>
#include <onnax/sequence.h>
#include <onnax/surrogate.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace onnax {

onnx::ModelProto vmap(const onnx::ModelProto& model, const VmapOptions& options);
// The same for a model the caller gives away (see grad below).
onnx::ModelProto vmap(onnx::ModelProto&& model, const VmapOptions& options);

// Forward mode: appends one tangent input per selected input (same shape and dtype, named
// "<input>_tangent") and returns all primal outputs, then the tangents of the selected
// outputs ("<output>_tangent").
onnx::ModelProto jvp(const onnx::ModelProto& model, const Selection& selection);
onnx::ModelProto jvp(onnx::ModelProto&& model, const Selection& selection);
// Reverse mode: appends one cotangent input per selected output ("<output>_cotangent") and
// returns all primal outputs, then the cotangents of the selected inputs ("<input>_cotangent").
onnx::ModelProto vjp(const onnx::ModelProto& model, const Selection& selection);
onnx::ModelProto vjp(onnx::ModelProto&& model, const Selection& selection);
// Gradient of one rank-0 output (default: the only rank-0 FLOAT/DOUBLE output) with an
// implicit unit seed: all primal outputs, then "<input>_grad" per selected input.
onnx::ModelProto grad(const onnx::ModelProto& model, const std::optional<std::vector<std::string>>& inputs,
                      const std::optional<std::string>& output);
// Each transform also takes a model the caller gives away (an rvalue): its nodes and
// initializers are then moved into the result instead of copied, which is much faster for large
// models. The Python package and the onnax command use these on the models they parse.
onnx::ModelProto grad(onnx::ModelProto&& model, const std::optional<std::vector<std::string>>& inputs,
                      const std::optional<std::string>& output);

// Jacobians in JAX's layout, after all primal outputs: for each selected output y and input x
// (outputs outer, inputs inner, as JAX nests them) an output "<y>_jacobian_<x>" of shape
// y.shape + x.shape. Defaults select as jvp (jacfwd) and vjp (jacrev) do. jacfwd is vmap(jvp)
// over a basis of input tangents (cost grows with the inputs' size), jacrev vmap(vjp) over a
// basis of output cotangents (grows with the outputs' size); both are one graph.
onnx::ModelProto jacfwd(const onnx::ModelProto& model, const Selection& selection);
onnx::ModelProto jacrev(const onnx::ModelProto& model, const Selection& selection);
// The Hessian of one output y (default: the only float output) with respect to the inputs,
// jacfwd(jacrev(f)): after the primal outputs and the Jacobians "<y>_jacobian_<a>", one output
// "<y>_hessian_<a>_<b>" of shape y.shape + a.shape + b.shape for every pair of inputs.
onnx::ModelProto hessian(const onnx::ModelProto& model, const std::optional<std::vector<std::string>>& inputs,
                         const std::optional<std::string>& output);

// jvp split in two, as jax.linearize: `primal` maps the source's inputs to all its outputs,
// then the `residuals` (the primal values the derivative reads, by their names in jvp's
// result); `linear` maps the residuals, then one tangent per selected input ("<input>_tangent"),
// to the tangents of the selected outputs ("<output>_tangent"), and is linear in the tangents.
// Evaluate `primal` once and `linear` for as many tangents as needed. Selections as jvp's.
struct Linearized {
  onnx::ModelProto primal;
  onnx::ModelProto linear;
  std::vector<std::string> residuals;
};
Linearized linearize(const onnx::ModelProto& model, const Selection& selection);
// One part of linearize (the primal one when `primal`), serialized, for the Python package.
std::string linearize_serialized(const std::string& model, const Selection& selection, bool primal);

// The model with `values` (names of values of its main graph: node outputs or graph inputs)
// marked so that jvp, vjp and grad treat them as constants: their derivative is cut, as JAX's
// lax.stop_gradient cuts it (the primal values are unchanged). The marks are kept in
// metadata_props["onnax.stop_gradient"], so they hold through later transforms of the result.
onnx::ModelProto stop_gradient(const onnx::ModelProto& model, const std::vector<std::string>& values);

// The model at ai.onnx opset `target`: older ones by moving inputs back to attributes where
// that opset wants them (Reduce* axes, Squeeze/Unsqueeze axes, Split sizes, Shape's start/end)
// and checking every node against that opset's schema; newer ones by ONNX's version converter.
// Transforms already return a model below opset 18 at its own opset when they can; this is
// for another target. Fails (Error::Kind::kVersion) naming the first node that has no form at
// `target`; the model is unchanged then.
void convert_opset_in_place(onnx::ModelProto& model, int64_t target);

// Serialized model in, serialized result out: the same transforms (with the same errors) for
// callers that would serialize the result anyway, such as the Python package. The model is
// parsed onto one protobuf arena shared by the transform and its result, so no node is
// allocated or freed one by one; for large models this is markedly faster than parse_model,
// the ModelProto overloads and SerializeToString. Results over protobuf's 2 GB limit fail
// (the ModelProto overloads and save_model handle them with external data).
std::string vmap_serialized(const std::string& model, const VmapOptions& options);
std::string jvp_serialized(const std::string& model, const Selection& selection);
std::string vjp_serialized(const std::string& model, const Selection& selection);
std::string grad_serialized(const std::string& model, const std::optional<std::vector<std::string>>& inputs,
                            const std::optional<std::string>& output);

// In place: the transform of `model` itself, left in it (the model may live on a protobuf
// arena, whose nodes are then never allocated or freed one by one; the onnax command works
// this way). On error the model is left in an unspecified but valid state.
void vmap_in_place(onnx::ModelProto& model, const VmapOptions& options);
void jvp_in_place(onnx::ModelProto& model, const Selection& selection);
void vjp_in_place(onnx::ModelProto& model, const Selection& selection);
void grad_in_place(onnx::ModelProto& model, const std::optional<std::vector<std::string>>& inputs,
                   const std::optional<std::string>& output);

// Model I/O. load_model resolves external data relative to the file's directory so the
// returned model is self-contained; save_model writes tensors to an external data file next
// to the output when the model would exceed protobuf's 2 GB message limit (or when asked).
onnx::ModelProto load_model(const std::string& path);
onnx::ModelProto parse_model(const std::string& bytes);
void save_model(const onnx::ModelProto& model, const std::string& path, bool external_data = false);

std::string version();

}  // namespace onnax
