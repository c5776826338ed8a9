// Parameter selection in bulk (names, globs, regular expressions, sizes, exclusions) and the
// promotion of Constant-node weights to initializers.
#include <onnax/training.h>

#include <set>

#include "diagnostics/error.h"
#include "facts/facts.h"
#include "ir/graph_edit.h"
#include "rules/derivative.h"
#include "training/training_parts.h"
#include "transforms/prepare.h"

namespace onnax {
namespace {

int64_t element_count(const onnx::TensorProto& t) {
  int64_t n = 1;
  for (int64_t d : t.dims()) n *= d;
  return n;
}

}  // namespace

std::vector<std::string> select_params(const onnx::ModelProto& model, const ParamSpec& spec) {
  const std::string m = "params";
  std::vector<std::string> candidates, floats;
  for (const auto& t : model.graph().initializer()) {
    if (!differentiable_dtype(t.data_type())) continue;
    floats.push_back(t.name());
    if (t.dims_size() >= 1 && element_count(t) >= spec.min_size) candidates.push_back(t.name());
  }
  const std::string what = "the float32/float64 initializers of rank >= 1" +
                           (spec.min_size > 0 ? " with at least " + std::to_string(spec.min_size) + " elements" : "");
  std::set<std::string> chosen;
  const std::vector<std::string> include = spec.include.empty() ? std::vector<std::string>{"all"} : spec.include;
  for (const auto& entry : include) {
    if (entry.empty())
      diag::fail(Error::Kind::kSelection, m + ": an empty entry selects nothing. Fix: remove it, or write 'all'");
    // An exact name selects that float initializer even below min_size or at rank 0.
    if (std::find(floats.begin(), floats.end(), entry) != floats.end()) {
      chosen.insert(entry);
      continue;
    }
    const training::Matcher match(entry, m, "params");
    size_t hits = 0;
    for (const auto& c : candidates)
      if (match.matches(c)) {
        chosen.insert(c);
        ++hits;
      }
    if (hits == 0)
      diag::fail(Error::Kind::kSelection,
                 m + ": '" + entry + "' matches none of " + what + ": " + training::listed(candidates) +
                     (candidates.empty() ? ". Fix: this model keeps no float weights as initializers; if its "
                                           "exporter wrote them as Constant nodes, turn those into initializers "
                                           "first (--constants-as-params 16; Python constants_to_initializers). "
                                           "Weights held in attributes (ai.onnx.ml ops such as "
                                           "LinearClassifier) cannot be trained"
                                         : ". Globs and re: match whole names (re:.*dense.* finds 'dense' "
                                           "anywhere). Fix: name one of these, or use a glob ('layers.*.weight') "
                                           "or 're:REGEX'"));
  }
  for (const auto& entry : spec.exclude) {
    const training::Matcher match(entry, m, "exclude");
    for (auto it = chosen.begin(); it != chosen.end();) it = match.matches(*it) ? chosen.erase(it) : std::next(it);
  }
  std::vector<std::string> out;
  for (const auto& t : model.graph().initializer())
    if (chosen.count(t.name())) out.push_back(t.name());
  if (out.empty())
    diag::fail(Error::Kind::kSelection, m + ": the exclusions " + training::listed(spec.exclude) +
                                            " leave no parameter. Fix: exclude fewer names");
  return out;
}

onnx::ModelProto constants_to_initializers(const onnx::ModelProto& model, int64_t min_size) {
  Prepared p = prepare(model, "constants-as-params");
  onnx::GraphProto& g = mutable_graph(p);
  std::set<std::string> outputs;
  for (const auto& o : g.output()) outputs.insert(o.name());
  auto* nodes = g.mutable_node();
  int kept = 0;
  for (int i = 0; i < nodes->size(); ++i) {
    onnx::NodeProto& n = *nodes->Mutable(i);
    const bool constant = n.op_type() == "Constant" && (n.domain().empty() || n.domain() == "ai.onnx") &&
                          n.output_size() == 1 && !outputs.count(n.output(0));
    std::optional<onnx::TensorProto> t = constant ? constant_tensor(n) : std::nullopt;
    if (t && differentiable_dtype(t->data_type()) && t->dims_size() >= 1 && element_count(*t) >= min_size &&
        t->data_location() != onnx::TensorProto::EXTERNAL) {
      t->set_name(n.output(0));
      *g.add_initializer() = std::move(*t);
      continue;
    }
    if (kept != i) nodes->SwapElements(kept, i);
    ++kept;
  }
  nodes->DeleteSubrange(kept, nodes->size() - kept);
  return std::move(*p.model);
}

}  // namespace onnax
