// stop_gradient: marks values whose derivative the autodiff transforms cut.
#include <onnax/onnax.h>

#include <set>

#include "diagnostics/error.h"
#include "transforms/provenance.h"

namespace onnax {

onnx::ModelProto stop_gradient(const onnx::ModelProto& model, const std::vector<std::string>& values) {
  std::set<std::string> known;
  for (const auto& vi : model.graph().input()) known.insert(vi.name());
  for (const auto& n : model.graph().node())
    for (const auto& o : n.output()) known.insert(o);
  std::vector<std::string> marked = provenance::names_at(model, provenance::kStopGradientKey);
  for (const auto& v : values) {
    if (!known.count(v))
      diag::fail(Error::Kind::kSelection,
                 "stop_gradient: '" + v +
                     "' is not a value of the model's main graph (a node output or a graph input). Fix: name a "
                     "value the main graph computes (values inside Loop/Scan/If bodies cannot be marked)");
    if (std::find(marked.begin(), marked.end(), v) == marked.end()) marked.push_back(v);
  }
  onnx::ModelProto out = model;
  provenance::set_names_at(out, provenance::kStopGradientKey, marked);
  return out;
}

}  // namespace onnax
