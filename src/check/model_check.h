// The checks `onnax check` runs and `onnax.testing` reuses: the ONNX checker, strict shape
// inference, and two deployment properties of generated models (symbolic lengths stay
// symbolic; weights stay embedded as initializers). Each returns "" when the model passes,
// else a diagnostic in the contract's shape (what failed, actual vs expected, a fix).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace onnax::check {

// onnx::checker::check_model structure checks (the part of full_check before inference).
std::string checker(const onnx::ModelProto& model);

// checker() for a model whose external-data tensors are not at hand (their files, or the
// Python package's data-less stand-ins): those are checked as declared inputs.
std::string structure_checker(const onnx::ModelProto& model);

// Strict shape inference: type checks on, node-level errors thrown (what full_check adds).
std::string strict_shape_inference(const onnx::ModelProto& model);

// Fails for every listed axis of a graph input (or output) that carries a fixed dim_value
// instead of a symbolic dim_param. One message per problem.
std::vector<std::string> symbolic_lengths(const onnx::ModelProto& model,
                                          const std::map<std::string, std::vector<int64_t>>& axes);

// Fails for every name that is not an initializer, or that is also a graph input (then a
// runtime feed can replace it, so it is not embedded). One message per problem.
std::vector<std::string> embedded_weights(const onnx::ModelProto& model, const std::vector<std::string>& names);

}  // namespace onnax::check
