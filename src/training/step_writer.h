// The pieces of a training step graph: values carried from one step to the next, constants
// shared by value, and the optimizer updates (training/optimizer.cc).
#pragma once

#include <onnax/training.h>
#include <onnx/onnx_pb.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "emit/graph_writer.h"
#include "facts/facts.h"
#include "ir/names.h"

namespace onnax::training {

struct Param {
  std::string name;
  Facts facts;       // dtype and static dims of the stored tensor
  std::string grad;  // the value holding its gradient (set once the graph computes it)
  bool decay = true;
};

// An input the next step reads from an output of this one (output empty: fed unchanged).
struct Carried {
  enum class Init { kZeros, kParam, kValue };  // the first value: zeros, as stored, `value`
  std::string input, output;
  Facts facts;
  Init init = Init::kZeros;
  double value = 0.0;
};

class StepWriter {
 public:
  StepWriter(onnx::GraphProto& g, NameScope& names) : g_(g), names_(names) {}

  // Declares a carried value: its input and output names are reserved now, fresh in the scope.
  const Carried& carry(const std::string& base, const Facts& facts, Carried::Init init = Carried::Init::kZeros,
                       bool written = true, double value = 0.0);
  std::string fresh(const std::string& base) { return names_.fresh(base); }

  // A node writing `out` (empty: a fresh name from `hint`); returns its output.
  std::string op(std::string_view type, const Names& inputs, AttrList attrs = {}, std::string out = {},
                 std::string_view hint = {});
  std::string constant(int32_t dtype, double value);  // a scalar, one node per (dtype, value)
  std::string i64s(const std::vector<int64_t>& values);

  const std::vector<Carried>& carried() const { return carried_; }
  onnx::GraphProto& graph() { return g_; }
  NameScope& names() { return names_; }

 private:
  onnx::GraphProto& g_;
  NameScope& names_;
  std::vector<Carried> carried_;
  std::map<std::pair<int32_t, double>, std::string> constants_;
};

// The optimizer state of one parameter: SGD's velocity (with momentum), Adam's two moments.
using ParamState = std::vector<Carried>;

// Declares every parameter's optimizer state, in parameter order (names are fresh in declaration
// order, so declaring before writing anything keeps them the same in every form of the step).
std::vector<ParamState> declare_optimizer_state(StepWriter& w, const OptimizerOptions& o,
                                                const std::vector<Param>& params);

// Writes the update of every parameter from its gradient `p.grad` into `p_new[i]`. `t` is the
// number of this step (an int64 scalar, 1 for the first), `lr` the float32 learning rate.
void write_updates(StepWriter& w, const OptimizerOptions& o, const std::vector<Param>& params,
                   const std::vector<ParamState>& state, const std::vector<std::string>& p_new, const std::string& t,
                   const std::string& lr);

}  // namespace onnax::training
