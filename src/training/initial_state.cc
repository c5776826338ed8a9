// initial_state: the first values of what a training step carries, as a model without inputs.
#include <onnax/training.h>

#include <map>

#include "diagnostics/error.h"
#include "emit/graph_writer.h"
#include "training/training_parts.h"

namespace onnax {
namespace {

using Entry = std::map<std::string, std::string>;

// Reads train_step's record: a JSON list of flat objects whose values are strings or null (null
// reads as ""). Anything else is a model onnax did not write.
std::vector<Entry> parse_state(const std::string& s) {
  auto bad = [] {
    diag::fail(Error::Kind::kInvalidModel,
               "initial-state: metadata_props['onnax.train_state'] is not what onnax's train-step writes. Fix: "
               "pass the step model train-step wrote, unchanged");
  };
  std::vector<Entry> out;
  size_t i = 0;
  auto skip = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  };
  auto expect = [&](char c) {
    skip();
    if (i >= s.size() || s[i] != c) bad();
    ++i;
  };
  auto string = [&]() -> std::string {
    skip();
    if (s.compare(i, 4, "null") == 0) {
      i += 4;
      return {};
    }
    expect('"');
    std::string v;
    for (; i < s.size() && s[i] != '"'; ++i) {
      if (s[i] == '\\' && i + 1 < s.size()) ++i;
      v += s[i];
    }
    expect('"');
    return v;
  };
  expect('[');
  skip();
  if (i < s.size() && s[i] == ']') return out;
  while (true) {
    expect('{');
    Entry e;
    while (true) {
      const std::string key = string();
      expect(':');
      e[key] = string();
      skip();
      if (i < s.size() && s[i] == ',') {
        ++i;
        continue;
      }
      expect('}');
      break;
    }
    out.push_back(std::move(e));
    skip();
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    expect(']');
    break;
  }
  return out;
}

}  // namespace

onnx::ModelProto initial_state(const onnx::ModelProto& loss_model, const onnx::ModelProto& step_model) {
  const std::string m = "initial-state";
  const std::string record = training::metadata(step_model, "onnax.train_state");
  if (record.empty())
    diag::fail(Error::Kind::kInvalidModel, m + ": the step model has no metadata_props['onnax.train_state']: it "
                                               "was not written by onnax's train-step. Fix: pass the model "
                                               "train-step wrote");
  std::map<std::string, const onnx::ValueInfoProto*> inputs;
  for (const auto& vi : step_model.graph().input()) inputs[vi.name()] = &vi;
  std::map<std::string, const onnx::TensorProto*> stored;
  for (const auto& t : loss_model.graph().initializer()) stored[t.name()] = &t;

  onnx::ModelProto out;
  out.set_ir_version(step_model.ir_version());
  *out.mutable_opset_import() = step_model.opset_import();
  onnx::GraphProto& g = *out.mutable_graph();
  g.set_name(step_model.graph().name() + "_initial_state");
  NameScope names;
  for (const auto& [name, vi] : inputs) names.reserve(name);
  GraphWriter w(names, g, "initial", onnx::TensorProto::FLOAT);
  for (const Entry& e : parse_state(record)) {
    const std::string& name = e.count("input") ? e.at("input") : std::string();
    auto in = inputs.find(name);
    if (in == inputs.end())
      diag::fail(Error::Kind::kInvalidModel, m + ": metadata_props['onnax.train_state'] names '" + name +
                                                 "', which is not an input of the step model. Fix: pass the step "
                                                 "model train-step wrote, unchanged");
    *g.add_output() = *in->second;
    if (e.count("init") && e.at("init") == "param") {
      auto t = stored.find(name);
      if (t == stored.end())
        diag::fail(Error::Kind::kSelection,
                   m + ": the step trains parameter '" + name +
                       "', which is not an initializer of the given loss model. Fix: pass the loss model the step "
                       "was made from");
      onnx::TensorProto* init = g.add_initializer();
      *init = *t->second;
      init->set_name(names.fresh(name + "_stored"));
      w.op("Identity", {init->name()}, {}, name);
      continue;
    }
    // Zeros (or the recorded value) of the input's static shape and dtype.
    const auto& type = in->second->type().tensor_type();
    const double value = e.count("init") && e.at("init") == "value" ? std::stod(e.at("value")) : 0.0;
    std::vector<int64_t> dims;
    for (const auto& d : type.shape().dim()) {
      if (!d.has_dim_value())
        diag::fail(Error::Kind::kInvalidModel, m + ": carried input '" + name + "' has a dim without a size. Fix: " +
                                                   "pass the step model train-step wrote, unchanged");
      dims.push_back(d.dim_value());
    }
    w.op("ConstantOfShape", {w.i64s(dims)}, {value_attr(type.elem_type(), value, false)}, name);
  }
  return out;
}

}  // namespace onnax
