// Per-example gradients of a model's scalar loss: vmap(grad(f)), written as a new ONNX model.
//   per_example_grads MODEL.onnx OUT.onnx [PARAM ...]
// PARAM names the inputs to differentiate (default: every float input); they stay shared
// across the batch, every other runtime input (not initializers) gets a leading batch axis.
#include <onnax/onnax.h>

#include <iostream>
#include <set>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: per_example_grads MODEL.onnx OUT.onnx [PARAM ...]\n";
    return 2;
  }
  try {
    const onnx::ModelProto model = onnax::load_model(argv[1]);
    std::optional<std::vector<std::string>> params;
    if (argc > 3) params = std::vector<std::string>(argv + 3, argv + argc);
    onnx::ModelProto gradient = onnax::grad(model, params, std::nullopt);

    onnax::VmapOptions options;
    options.in_axes_form = onnax::VmapOptions::InAxesForm::kByName;
    std::set<std::string> stored;
    for (const auto& tensor : model.graph().initializer()) stored.insert(tensor.name());
    for (const auto& input : model.graph().input())
      if (!stored.contains(input.name())) options.in_axes_by_name[input.name()] = 0;
    if (params)
      for (const auto& name : *params) options.in_axes_by_name[name] = std::nullopt;
    onnax::save_model(onnax::vmap(std::move(gradient), options), argv[2]);
    std::cout << "wrote " << argv[2] << " (onnax " << onnax::version() << ")\n";
    return 0;
  } catch (const onnax::Error& error) {
    std::cerr << error.what() << "\n";
    return 1;
  }
}
