#include "transforms/autodiff_selection.h"

#include <algorithm>
#include <set>

#include "diagnostics/error.h"
#include "rules/derivative.h"
#include "transforms/provenance.h"

namespace onnax::autodiff {

const char* mode_name(Mode m) {
  return m == Mode::kJvp ? "jvp" : m == Mode::kVjp ? "vjp" : "grad";
}

std::string quoted_names(const std::vector<std::string>& names) {
  std::vector<std::string> q;
  for (const auto& n : names) q.push_back("'" + n + "'");
  // (Appended rather than "[" + join(q): GCC 12 warns, wrongly, about that form's memcpy.)
  std::string out = "[";
  out += diag::join(q);
  out += "]";
  return out;
}

std::string derived_name(NameScope& names, const std::string& base, std::string_view suffix) {
  std::string name = base + std::string(suffix);
  for (int order = 1; order < 6 && names.contains(name); ++order) name += suffix;
  return names.fresh(name);
}

Resolved resolve(const Prepared& p, Mode mode, const Selection& sel) {
  const std::string m = mode_name(mode);
  const auto& g = *p.graph;
  std::vector<std::string> runtime, float_runtime, float_inits, outputs, float_outputs;
  for (const auto* vi : p.runtime_inputs) {
    runtime.push_back(vi->name());
    if (differentiable_dtype(p.fact(vi->name()).dtype)) float_runtime.push_back(vi->name());
  }
  for (const auto& t : g.initializer())
    if (differentiable_dtype(t.data_type())) float_inits.push_back(t.name());
  for (const auto& o : g.output()) {
    outputs.push_back(o.name());
    if (differentiable_dtype(p.fact(o.name()).dtype)) float_outputs.push_back(o.name());
  }
  Resolved r;
  // The checks every selected name gets, inputs and outputs alike.
  auto check_float_once = [&](const std::string& role, const std::string& name, std::set<std::string>& seen,
                              const std::string& float_choices) {
    const int32_t dt = p.fact(name).dtype;
    if (!differentiable_dtype(dt))
      diag::fail(Error::Kind::kSelection, m + ": " + role + " selects '" + name + "' of dtype " + diag::dtype_name(dt) +
                                              "; derivatives are defined for float32/float64 only. Fix: select one "
                                              "of " +
                                              float_choices);
    if (!seen.insert(name).second)
      diag::fail(Error::Kind::kSelection,
                 m + ": " + role + " selects '" + name + "' twice. Fix: select each name once");
  };
  if (sel.inputs) {
    std::set<std::string> seen;
    for (const auto& name : *sel.inputs) {
      const bool is_runtime = std::find(runtime.begin(), runtime.end(), name) != runtime.end();
      const bool is_init = p.initializer_names.count(name) != 0;
      if (!is_runtime && !is_init)
        diag::fail(Error::Kind::kSelection,
                   m + ": inputs selects '" + name + "', which is neither a graph input nor an initializer; " +
                       "available inputs: " + quoted_names(runtime) + ", initializers: " + quoted_names(float_inits) +
                       ". Fix: select one of these names");
      check_float_once(
          "inputs", name, seen,
          "the float inputs " + quoted_names(float_runtime) + " or initializers " + quoted_names(float_inits));
      r.inputs.push_back(name);
    }
  } else {
    r.inputs = float_runtime;
  }
  if (r.inputs.empty() && sel.inputs)
    diag::fail(Error::Kind::kSelection, m + ": inputs=[] selects nothing to differentiate with respect to. Fix: " +
                                            "select at least one of the float inputs " + quoted_names(float_runtime) +
                                            " or initializers " + quoted_names(float_inits) +
                                            ", or leave inputs unset for the float inputs");
  if (r.inputs.empty())
    diag::fail(Error::Kind::kSelection,
               m + ": no input to differentiate with respect to: the model has no float32/float64 runtime inputs " +
                   "(inputs: " + quoted_names(runtime) + "). Fix: " +
                   (float_inits.empty() ? std::string("add a float32/float64 input")
                                        : "select initializers explicitly, e.g. inputs=" + quoted_names(float_inits)));
  if (sel.outputs) {
    std::set<std::string> seen;
    for (const auto& name : *sel.outputs) {
      if (std::find(outputs.begin(), outputs.end(), name) == outputs.end())
        diag::fail(Error::Kind::kSelection, m + ": outputs selects '" + name + "', which is not a graph output; " +
                                                "available outputs: " + quoted_names(outputs) +
                                                ". Fix: select one of these names");
      check_float_once("outputs", name, seen, quoted_names(float_outputs));
      r.outputs.push_back(name);
    }
  } else if (mode == Mode::kGrad) {
    // The only rank-0 float output, when there is exactly one.
    for (const auto& n : float_outputs)
      if (p.fact(n).rank() == 0) r.outputs.push_back(n);
    if (r.outputs.size() != 1)
      diag::fail(Error::Kind::kSelection, "grad: no output was selected and the model has " +
                                              std::to_string(r.outputs.size()) + " rank-0 float outputs " +
                                              quoted_names(r.outputs) + " (outputs: " + quoted_names(outputs) +
                                              "). Fix: pass output=<name of the scalar loss>");
  } else {
    std::vector<std::string> generated = provenance::derivative_outputs(*p.model);
    if (mode == Mode::kJvp)
      for (const auto& n : generated)
        if (std::find(float_outputs.begin(), float_outputs.end(), n) != float_outputs.end()) r.outputs.push_back(n);
    if (r.outputs.empty()) r.outputs = float_outputs;
  }
  if (r.outputs.empty() && sel.outputs)
    diag::fail(Error::Kind::kSelection, m + ": outputs=[] selects nothing to differentiate. Fix: select at least " +
                                            "one of the float outputs " + quoted_names(float_outputs) +
                                            ", or leave outputs unset for all of them");
  if (r.outputs.empty())
    diag::fail(Error::Kind::kSelection, m + ": the model has no float32/float64 output to differentiate; outputs: " +
                                            quoted_names(outputs) + ". Fix: add a float output");
  if (mode == Mode::kGrad) {
    const Facts f = p.fact(r.outputs[0]);
    if (f.rank() != 0)
      diag::fail(Error::Kind::kSelection,
                 "grad: output '" + r.outputs[0] + "' has shape " + f.shape_string() +
                     "; grad needs a rank-0 (scalar) loss. Fix: reduce it to a scalar (ReduceSum/ReduceMean) or use "
                     "vjp with an explicit cotangent");
  }
  return r;
}

}  // namespace onnax::autodiff
