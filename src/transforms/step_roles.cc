#include "transforms/step_roles.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "diagnostics/error.h"
#include "notice.h"
#include "transforms/provenance.h"

namespace onnax {
namespace {

std::string quoted_names(const std::vector<const onnx::ValueInfoProto*>& values) {
  std::vector<std::string> names;
  for (const auto* vi : values) names.push_back("'" + vi->name() + "'");
  return diag::join(names);
}

std::string type_text(const onnx::ValueInfoProto& vi) {
  const auto& t = vi.type().tensor_type();
  std::string text = diag::dtype_name(t.elem_type());
  if (!t.has_shape()) return text + "[unknown rank]";
  text += "[";
  for (int i = 0; i < t.shape().dim_size(); ++i) {
    const auto& d = t.shape().dim(i);
    if (i) text += ", ";
    text += d.has_dim_value() ? std::to_string(d.dim_value()) : d.has_dim_param() ? d.dim_param() : "?";
  }
  return text + "]";
}

// Whether a value of type `b` can stand where `a` is declared: same dtype, and the same rank
// and fixed sizes where both declare them.
bool compatible(const onnx::ValueInfoProto& a, const onnx::ValueInfoProto& b) {
  const auto &ta = a.type().tensor_type(), &tb = b.type().tensor_type();
  if (ta.elem_type() != tb.elem_type()) return false;
  if (!ta.has_shape() || !tb.has_shape()) return true;
  if (ta.shape().dim_size() != tb.shape().dim_size()) return false;
  for (int i = 0; i < ta.shape().dim_size(); ++i) {
    const auto &da = ta.shape().dim(i), &db = tb.shape().dim(i);
    if (da.has_dim_value() && db.has_dim_value() && da.dim_value() != db.dim_value()) return false;
  }
  return true;
}

}  // namespace

StepLayout read_step_roles(const onnx::GraphProto& g, const StepRoles& roles, const char* what) {
  const std::string prefix = std::string(what) + ": ";
  StepLayout layout;
  std::unordered_set<std::string> stored;
  for (const auto& t : g.initializer()) stored.insert(t.name());
  for (const auto& t : g.sparse_initializer()) stored.insert(t.values().name());
  std::unordered_map<std::string, int> input_index;
  for (const auto& vi : g.input()) {
    if (stored.count(vi.name())) continue;
    if (!vi.type().has_tensor_type())
      diag::fail(Error::Kind::kUnsupported, prefix + "input '" + vi.name() +
                                                "' is not a tensor (a sequence, map or optional); a step's inputs "
                                                "must be tensors. Fix: export the step with tensor inputs");
    input_index[vi.name()] = static_cast<int>(layout.inputs.size());
    layout.inputs.push_back(&vi);
  }
  for (const auto& vi : g.output())
    if (!vi.type().has_tensor_type())
      diag::fail(Error::Kind::kUnsupported, prefix + "output '" + vi.name() +
                                                "' is not a tensor (a sequence, map or optional); a step's outputs "
                                                "must be tensors. Fix: export the step with tensor outputs");

  auto runtime_input = [&](const std::string& name, const char* role) {
    auto it = input_index.find(name);
    if (it == input_index.end())
      diag::fail(Error::Kind::kSelection, prefix + role + " '" + name +
                                              "' is not a runtime input of the step (runtime inputs: " +
                                              quoted_names(layout.inputs) + "). Fix: name one of those");
    return it->second;
  };
  std::vector<char> role(layout.inputs.size(), 0);  // 0 sequence, 1 state, 2 constant
  if (roles.state) {
    for (const auto& name : *roles.state) {
      const int i = runtime_input(name, "state input");
      if (role[i])
        diag::fail(Error::Kind::kSelection,
                   prefix + "state input '" + name + "' is named twice. Fix: name each state input once");
      role[i] = 1;
      layout.states.push_back(i);
    }
  } else {
    for (int i = 1; i < static_cast<int>(layout.inputs.size()); ++i) layout.states.push_back(i), role[i] = 1;
  }
  std::unordered_set<std::string> declared;
  for (const auto& vi : g.input()) declared.insert(vi.name());
  for (const auto& name : roles.constants) {
    // An input with a stored default is a constant already (the outer graph keeps both).
    if (stored.count(name) && declared.count(name)) continue;
    const int i = runtime_input(name, "constant input");
    if (role[i] == 1)
      diag::fail(Error::Kind::kSelection,
                 prefix + "input '" + name + "' is named both as state and as constant. Fix: give it one role");
    role[i] = 2;
    layout.constants.push_back(i);
  }
  for (int i = 0; i < static_cast<int>(layout.inputs.size()); ++i)
    if (!role[i]) layout.sequences.push_back(i);

  // Next-state outputs: named ones, then the last outputs in order for the rest.
  std::unordered_map<std::string, int> output_index;
  for (int o = 0; o < g.output_size(); ++o) output_index.emplace(g.output(o).name(), o);
  std::unordered_set<std::string> state_names;
  for (const int s : layout.states) state_names.insert(layout.inputs[s]->name());
  for (const auto& [state, out] : roles.next_state) {
    if (!state_names.count(state))
      diag::fail(Error::Kind::kSelection, prefix + "'" + state + "=" + out + "' pairs an output with '" + state +
                                              "', which is not a state input. Fix: name a state input on the left");
    if (!output_index.count(out))
      diag::fail(Error::Kind::kSelection, prefix + "'" + state + "=" + out + "': the step has no output '" + out +
                                              "'. Fix: name one of its outputs on the right");
  }
  std::vector<char> used(static_cast<size_t>(g.output_size()), 0);
  std::vector<int> next(layout.states.size(), -1);
  auto take = [&](size_t i, int o) {
    const std::string& name = layout.inputs[layout.states[i]]->name();
    if (used[o])
      diag::fail(Error::Kind::kSelection, prefix + "output '" + g.output(o).name() +
                                              "' would be the next value of two states. Fix: pair each state with "
                                              "its own output (--state " +
                                              name + "=OUTPUT)");
    used[o] = 1;
    next[i] = o;
  };
  // Named pairs first, then outputs named after their state (h_next, h_new, next_h, new_h),
  // then the last unpaired outputs, in order.
  for (size_t i = 0; i < layout.states.size(); ++i)
    if (auto named = roles.next_state.find(layout.inputs[layout.states[i]]->name()); named != roles.next_state.end())
      take(i, output_index.at(named->second));
  for (size_t i = 0; i < layout.states.size(); ++i) {
    if (next[i] >= 0) continue;
    const std::string& name = layout.inputs[layout.states[i]]->name();
    for (const std::string& candidate : {name + "_next", name + "_new", "next_" + name, "new_" + name})
      if (auto it = output_index.find(candidate); it != output_index.end() && !used[it->second]) {
        take(i, it->second);
        break;
      }
  }
  std::vector<size_t> positional;
  for (size_t i = 0; i < layout.states.size(); ++i)
    if (next[i] < 0) positional.push_back(i);
  std::vector<int> free;
  for (int o = 0; o < g.output_size(); ++o)
    if (!used[o]) free.push_back(o);
  if (positional.size() > free.size())
    diag::fail(Error::Kind::kSelection,
               prefix + "the step has " + std::to_string(layout.states.size()) + " state inputs but only " +
                   std::to_string(g.output_size()) +
                   " outputs, so not every state has a next value. Fix: name the state inputs (--state h,c) and "
                   "their outputs (--state h=h_next)");
  for (size_t j = 0; j < positional.size(); ++j) {
    const size_t i = positional[j];
    const int o = free[free.size() - positional.size() + j];
    take(i, o);
    if (roles.state)  // (the states were named, their outputs not: say which were taken)
      notice(std::string(what) + ": state '" + layout.inputs[layout.states[i]]->name() + "' takes output '" +
             g.output(o).name() + "' as its next value (by position: the last outputs, in order). Name the pair (" +
             "--state " + layout.inputs[layout.states[i]]->name() + "=OUTPUT, Python state={...}) if it is another");
  }
  for (size_t i = 0; i < layout.states.size(); ++i) {
    const std::string& name = layout.inputs[layout.states[i]]->name();
    const auto& out = g.output(next[i]);
    if (!compatible(*layout.inputs[layout.states[i]], out))
      diag::fail(Error::Kind::kSelection, prefix + "state input '" + name + "' is " +
                                              type_text(*layout.inputs[layout.states[i]]) + " but output '" +
                                              out.name() + "', taken as its next value, is " + type_text(out) +
                                              ". Fix: pair the state with the output of its type (--state " + name +
                                              "=OUTPUT), or name the state inputs (--state)");
    layout.next_state_outputs.push_back(next[i]);
  }
  for (int o = 0; o < g.output_size(); ++o) {
    if (input_index.count(g.output(o).name()) || stored.count(g.output(o).name()))
      diag::fail(Error::Kind::kUnsupported,
                 prefix + "output '" + g.output(o).name() +
                     "' is an input or initializer of the step itself, so the sequence model would define the "
                     "name twice. Fix: give the output its own name (an Identity node)");
    if (!used[o]) layout.per_step_outputs.push_back(o);
  }
  return layout;
}

StepRoles given_or_recorded(const onnx::ModelProto& model, const StepRoles& roles) {
  if (roles.state || !roles.next_state.empty() || !roles.constants.empty()) return roles;
  const auto& props = model.metadata_props();
  if (std::none_of(props.begin(), props.end(), [](const auto& e) { return e.key() == kStepStateKey; })) return roles;
  const auto states = provenance::names_at(model, kStepStateKey);
  const auto next = provenance::names_at(model, kStepNextStateKey);
  const auto constants = provenance::names_at(model, kStepConstantsKey);
  if (states.size() != next.size()) return roles;
  std::unordered_set<std::string> inputs, outputs;
  for (const auto& vi : model.graph().input()) inputs.insert(vi.name());
  for (const auto& vi : model.graph().output()) outputs.insert(vi.name());
  for (const auto* names : {&states, &constants})
    for (const auto& n : *names)
      if (!inputs.count(n)) return roles;  // (a record a later edit made stale)
  for (const auto& n : next)
    if (!outputs.count(n)) return roles;
  StepRoles recorded;
  recorded.state = states;
  for (size_t i = 0; i < states.size(); ++i) recorded.next_state[states[i]] = next[i];
  recorded.constants = constants;
  return recorded;
}

void record_roles(onnx::ModelProto& model, const std::vector<std::string>& states,
                  const std::vector<std::string>& next_state, const std::vector<std::string>& constants) {
  provenance::set_names_at(model, kStepStateKey, states);
  provenance::set_names_at(model, kStepNextStateKey, next_state);
  provenance::set_names_at(model, kStepConstantsKey, constants);
}

void forget_roles(onnx::ModelProto& model) {
  auto* props = model.mutable_metadata_props();
  for (int i = props->size() - 1; i >= 0; --i) {
    const std::string& key = props->Get(i).key();
    if (key == kStepStateKey || key == kStepNextStateKey || key == kStepConstantsKey) props->DeleteSubrange(i, 1);
  }
}

}  // namespace onnax
