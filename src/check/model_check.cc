#include "check/model_check.h"

#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <set>

#include "check/node_check.h"
#include "diagnostics/error.h"

namespace onnax::check {
namespace {

const onnx::ValueInfoProto* find_value(const onnx::GraphProto& g, const std::string& name) {
  for (const auto& vi : g.input())
    if (vi.name() == name) return &vi;
  for (const auto& vi : g.output())
    if (vi.name() == name) return &vi;
  return nullptr;
}

std::vector<std::string> io_names(const onnx::GraphProto& g) {
  std::set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  std::vector<std::string> out;
  for (const auto& vi : g.input())
    if (!inits.count(vi.name())) out.push_back(vi.name());
  for (const auto& vi : g.output()) out.push_back(vi.name());
  return out;
}

std::string shape_text(const onnx::TensorShapeProto& s) {
  std::vector<std::string> dims;
  for (const auto& d : s.dim())
    dims.push_back(d.has_dim_value() ? std::to_string(d.dim_value()) : d.has_dim_param() ? d.dim_param() : "?");
  // (appended piecewise: GCC 12 warns falsely about "[" + std::string&&)
  std::string out = "[";
  out += diag::join(dims);
  out += "]";
  return out;
}

// ONNX's messages span lines (node dumps); a report line keeps them on one.
std::string one_line(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool space = c == '\n' || c == '\r' || c == '\t' || c == ' ';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == '.')) out.pop_back();
  return out;
}

}  // namespace

std::string checker(const onnx::ModelProto& model) {
  try {
    onnx::checker::check_model(model, /*full_check=*/false);
  } catch (const std::exception& e) {
    return "the ONNX checker rejects the model: " + one_line(e.what()) +
           ". Fix: repair the node or field the message names (for a model onnax wrote, report it with the "
           "output of `onnax validate`)";
  }
  return "";
}

std::string structure_checker(const onnx::ModelProto& model) {
  auto external = [](const onnx::TensorProto& t) { return t.data_location() == onnx::TensorProto::EXTERNAL; };
  const auto& inits = model.graph().initializer();
  if (std::none_of(inits.begin(), inits.end(), external)) return checker(model);
  // The checker opens external-data files; a transform reads only names, dtypes and shapes,
  // so those tensors are checked as declared inputs instead (the Python package's stand-ins
  // for large weights are external-data tensors without a file).
  onnx::ModelProto copy;
  copy.CopyFrom(model);
  auto* g = copy.mutable_graph();
  std::set<std::string> inputs;
  for (const auto& vi : g->input()) inputs.insert(vi.name());
  auto* kept = g->mutable_initializer();
  for (int i = kept->size() - 1; i >= 0; --i) {
    const onnx::TensorProto& t = kept->Get(i);
    if (!external(t)) continue;
    if (!inputs.count(t.name())) {
      auto* vi = g->add_input();
      vi->set_name(t.name());
      auto* tt = vi->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(t.data_type());
      auto* shape = tt->mutable_shape();
      for (const int64_t d : t.dims()) shape->add_dim()->set_dim_value(d);
    }
    kept->DeleteSubrange(i, 1);
  }
  return checker(copy);
}

namespace {

// The first of `nodes` (or of their subgraphs' nodes) on which ONNX's inference would hang,
// with what is wrong with it; "" for none.
std::string first_inference_hazard(const google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes) {
  for (const auto& n : nodes) {
    if (std::string why = onnax::inference_hazard(n); !why.empty())
      return n.op_type() + " at " + diag::node_location(n) + " " + why;
    for (const auto& a : n.attribute()) {
      if (a.has_g())
        if (std::string why = first_inference_hazard(a.g().node()); !why.empty()) return why;
      for (const auto& g : a.graphs())
        if (std::string why = first_inference_hazard(g.node()); !why.empty()) return why;
    }
  }
  return "";
}

}  // namespace

std::string strict_shape_inference(const onnx::ModelProto& model) {
  // ONNX's inference loops forever on some malformed nodes (found by fuzzing `onnax check`):
  // those fail here, as the transforms' node checks fail them, and inference does not run.
  std::string hazard = first_inference_hazard(model.graph().node());
  for (const auto& f : model.functions())
    if (hazard.empty()) hazard = first_inference_hazard(f.node());
  if (!hazard.empty()) return "strict ONNX shape inference was not run: " + hazard;
  // Inference writes value_info into the model; the caller's model stays untouched.
  onnx::ModelProto copy = model;
  try {
    onnx::shape_inference::InferShapes(copy, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(/*check_type=*/true, /*strict_mode=*/1,
                                                                   /*data_prop=*/false));
  } catch (const std::exception& e) {
    return "strict ONNX shape inference fails: " + one_line(e.what()) +
           ". Fix: make the declared types and shapes of the named node's inputs and outputs agree with what the "
           "operator computes";
  }
  return "";
}

std::vector<std::string> symbolic_lengths(const onnx::ModelProto& model,
                                          const std::map<std::string, std::vector<int64_t>>& axes) {
  std::vector<std::string> problems;
  for (const auto& [name, list] : axes) {
    const onnx::ValueInfoProto* vi = find_value(model.graph(), name);
    if (!vi) {
      problems.push_back("symbolic lengths: '" + name + "' is not a graph input or output; available: [" +
                         diag::join(io_names(model.graph())) + "]. Fix: name one of them");
      continue;
    }
    if (!vi->type().has_tensor_type() || !vi->type().tensor_type().has_shape()) {
      problems.push_back("symbolic lengths: '" + name +
                         "' has no declared shape, so its axes cannot be checked. Fix: declare its shape with "
                         "dim_param names for the variable axes");
      continue;
    }
    const auto& shape = vi->type().tensor_type().shape();
    const int64_t rank = shape.dim_size();
    for (int64_t axis : list) {
      const int64_t a = axis < 0 ? axis + rank : axis;
      if (a < 0 || a >= rank) {
        problems.push_back("symbolic lengths: axis " + std::to_string(axis) + " of '" + name +
                           "' is out of range for rank " + std::to_string(rank) + " (shape " + shape_text(shape) +
                           "). Fix: pick an axis in [" + std::to_string(-rank) + ", " + std::to_string(rank - 1) + "]");
        continue;
      }
      const auto& d = shape.dim(static_cast<int>(a));
      if (d.has_dim_value())
        problems.push_back("symbolic lengths: axis " + std::to_string(axis) + " of '" + name + "' is baked to " +
                           std::to_string(d.dim_value()) + " (shape " + shape_text(shape) +
                           "), expected a symbolic dim_param. Fix: keep the source's dim_param on this axis "
                           "(export with a symbolic length, and transform that model)");
    }
  }
  return problems;
}

std::vector<std::string> embedded_weights(const onnx::ModelProto& model, const std::vector<std::string>& names) {
  std::set<std::string> inits, inputs;
  for (const auto& t : model.graph().initializer()) inits.insert(t.name());
  for (const auto& vi : model.graph().input()) inputs.insert(vi.name());
  std::vector<std::string> problems;
  for (const auto& n : names) {
    const bool is_init = inits.count(n) > 0, is_input = inputs.count(n) > 0;
    if (is_init && !is_input) continue;
    if (is_init)
      problems.push_back("embedded weights: '" + n +
                         "' is an initializer but also a graph input, so a runtime feed can replace it. Fix: "
                         "remove it from graph.input to embed it");
    else if (is_input)
      problems.push_back("embedded weights: '" + n +
                         "' is a runtime graph input, expected an initializer stored in the model. Fix: store its "
                         "values as an initializer of that name (and drop it from graph.input)");
    else
      problems.push_back("embedded weights: '" + n + "' is neither an initializer nor a graph input; initializers: [" +
                         diag::join(std::vector<std::string>(inits.begin(), inits.end())) + "]. Fix: name one of them");
  }
  return problems;
}

}  // namespace onnax::check
