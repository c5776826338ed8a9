// scan: a step model becomes the full-sequence model, one Loop over the time axis whose body is
// the step (include/onnax/sequence.h).
#include <onnax/sequence.h>

#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "check/model_check.h"
#include "diagnostics/error.h"
#include "emit/graph_writer.h"
#include "ir/graph_edit.h"
#include "ir/graph_names.h"
#include "transforms/provenance.h"
#include "transforms/step_roles.h"
#include "transforms/tidy.h"

namespace onnax {
namespace {

onnx::TypeProto scalar_type(int32_t elem_type) {
  onnx::TypeProto t;
  t.mutable_tensor_type()->set_elem_type(elem_type);
  t.mutable_tensor_type()->mutable_shape();
  return t;
}

onnx::ValueInfoProto value_info(const std::string& name, const onnx::TypeProto& type) {
  onnx::ValueInfoProto vi;
  vi.set_name(name);
  *vi.mutable_type() = type;
  return vi;
}

// `vi` with a time axis in front (none added to a value of unknown rank).
onnx::ValueInfoProto with_time_axis(const onnx::ValueInfoProto& vi, const std::optional<int64_t>& length,
                                    const std::string& dim_name) {
  onnx::ValueInfoProto out = vi;
  auto* tensor = out.mutable_type()->mutable_tensor_type();
  if (!tensor->has_shape()) return out;
  onnx::TensorShapeProto shape;
  auto* time = shape.add_dim();
  if (length)
    time->set_dim_value(*length);
  else
    time->set_dim_param(dim_name);
  for (const auto& d : tensor->shape().dim()) *shape.add_dim() = d;
  *tensor->mutable_shape() = std::move(shape);
  return out;
}

// A dim_param no declared shape of `g` uses yet: `base`, else base_1, base_2, ...
std::string fresh_dim_param(const onnx::GraphProto& g, const std::string& base) {
  std::set<std::string> used;
  auto collect = [&](const auto& infos) {
    for (const auto& vi : infos)
      for (const auto& d : vi.type().tensor_type().shape().dim())
        if (d.has_dim_param()) used.insert(d.dim_param());
  };
  collect(g.input());
  collect(g.output());
  collect(g.value_info());
  std::string name = base;
  for (int i = 1; used.count(name); ++i) name = base + "_" + std::to_string(i);
  return name;
}

onnx::NodeProto int64_scalar_constant(const std::string& output, int64_t value) {
  onnx::NodeProto n = make_node("Constant", {}, output);
  n.set_name(output);
  *n.add_attribute() = value_attr(onnx::TensorProto::INT64, static_cast<double>(value), /*scalar=*/true);
  return n;
}

}  // namespace

onnx::ModelProto scan(const onnx::ModelProto& step, const ScanOptions& options) {
  if (const std::string problem = check::structure_checker(step); !problem.empty())
    diag::fail(Error::Kind::kInvalidModel, "scan: the step model is not valid ONNX: " + problem);
  if (options.truncate && *options.truncate < 1)
    diag::fail(Error::Kind::kSelection, "scan: truncate " + std::to_string(*options.truncate) +
                                            " is not a number of steps (expected 1 or more). Fix: pass the number "
                                            "of last steps the derivatives flow through, or none");
  if (options.length && *options.length < 1)
    diag::fail(Error::Kind::kSelection, "scan: length " + std::to_string(*options.length) +
                                            " is not a number of steps (expected 1 or more). Fix: pass a "
                                            "positive length, or none for a length read at run time");
  const onnx::GraphProto& g = step.graph();
  const StepLayout layout = read_step_roles(g, given_or_recorded(step, options.roles), "scan");
  if (layout.sequences.empty() && !options.length)
    diag::fail(Error::Kind::kSelection,
               "scan: every runtime input of the step is state or constant, so there is no sequence to read the "
               "number of steps from. Fix: give the length (command line --length T, Python length=T), or leave "
               "the per-step input out of the state and constants");

  NameScope scope;
  collect_names(g, scope);
  NameScope node_scope;
  for (const auto& n : g.node())
    if (!n.name().empty()) node_scope.reserve(n.name());

  // The body: the step's nodes, reading body-local names for what the outer graph defines
  // under the step's names (the state, the sequences' elements, the step's outputs).
  onnx::GraphProto body;
  body.set_name(g.name().empty() ? "step" : g.name());
  std::unordered_map<std::string, std::string> local;
  for (const int s : layout.states) local[layout.inputs[s]->name()] = scope.fresh(layout.inputs[s]->name());
  for (const int s : layout.sequences) local[layout.inputs[s]->name()] = scope.fresh(layout.inputs[s]->name() + "_t");
  std::unordered_set<std::string> node_outputs;
  for (const auto& n : g.node())
    for (const auto& o : n.output()) node_outputs.insert(o);
  for (const auto& o : g.output())
    if (node_outputs.count(o.name()) && !local.count(o.name())) local[o.name()] = scope.fresh(o.name());
  const std::string iteration = scope.fresh("step_index");
  const std::string cond_in = scope.fresh("keep_going");
  const std::string cond_out = scope.fresh("keep_going_out");

  *body.add_input() = value_info(iteration, scalar_type(onnx::TensorProto::INT64));
  *body.add_input() = value_info(cond_in, scalar_type(onnx::TensorProto::BOOL));
  for (const int s : layout.states) {
    onnx::ValueInfoProto vi = *layout.inputs[s];
    vi.set_name(local.at(vi.name()));
    *body.add_input() = std::move(vi);
  }
  for (const int s : layout.sequences) {
    const std::string& name = layout.inputs[s]->name();
    onnx::NodeProto gather = make_node("Gather", {name, iteration}, local.at(name));
    gather.set_name(node_scope.fresh(local.at(name)));
    *body.add_node() = std::move(gather);
  }
  for (const auto& n : g.node()) *body.add_node() = n;
  for (const auto& vi : g.value_info()) *body.add_value_info() = vi;
  {
    onnx::NodeProto keep = make_node("Identity", {cond_in}, cond_out);
    keep.set_name(node_scope.fresh(cond_out));
    *body.add_node() = std::move(keep);
  }
  // Rename: reads (inputs, subgraph outer reads) and definitions (node outputs, value_info).
  const int gathers = static_cast<int>(layout.sequences.size());
  for (int i = gathers; i < body.node_size() - 1; ++i) {
    auto& n = *body.mutable_node(i);
    for (auto& in : *n.mutable_input())
      if (auto it = local.find(in); it != local.end()) in = it->second;
    rename_outer_reads(n, local);
    for (auto& o : *n.mutable_output())
      if (auto it = local.find(o); it != local.end()) o = it->second;
  }
  for (auto& vi : *body.mutable_value_info())
    if (auto it = local.find(vi.name()); it != local.end()) vi.set_name(it->second);

  auto body_name = [&](const std::string& outer) {
    auto it = local.find(outer);
    return it == local.end() ? outer : it->second;
  };
  *body.add_output() = value_info(cond_out, scalar_type(onnx::TensorProto::BOOL));
  for (const int o : layout.next_state_outputs) add_output(body, body_name(g.output(o).name()), g.output(o), scope);
  for (const int o : layout.per_step_outputs) add_output(body, body_name(g.output(o).name()), g.output(o), scope);

  // The outer graph: the step's inputs (sequences with a time axis), its initializers, the
  // trip count and the Loop.
  onnx::ModelProto result;
  copy_model_fields(step, result);
  onnx::GraphProto& outer = *result.mutable_graph();
  outer.set_name(g.name());
  outer.set_doc_string(g.doc_string());
  *outer.mutable_initializer() = g.initializer();
  *outer.mutable_sparse_initializer() = g.sparse_initializer();
  // A time axis named like one of the step's dims would merge two sizes: refused when asked
  // for by name, a fresh default name otherwise.
  const bool default_name = options.length_name.empty() || options.length_name == "time";
  const std::string dim_name = fresh_dim_param(g, default_name ? "time" : options.length_name);
  if (!default_name && dim_name != options.length_name)
    diag::fail(Error::Kind::kSelection, "scan: the time axis name '" + options.length_name +
                                            "' is already a dim of the step's inputs or outputs, so the two would "
                                            "be one size. Fix: choose another --length-name (Python length_name=)");
  std::unordered_set<std::string> sequences;
  for (const int s : layout.sequences) sequences.insert(layout.inputs[s]->name());
  for (const auto& vi : g.input())
    *outer.add_input() = sequences.count(vi.name()) ? with_time_axis(vi, options.length, dim_name) : vi;

  // A step may list one value as two outputs (spyx: a leaky-integrator layer's output is its
  // state); over a sequence they differ (stacked vs final), so later repeats get a new name.
  std::vector<std::string> outer_names(static_cast<size_t>(g.output_size()));
  {
    std::unordered_set<std::string> seen;
    std::unordered_set<int> is_state(layout.next_state_outputs.begin(), layout.next_state_outputs.end());
    for (int o = 0; o < g.output_size(); ++o) {
      const std::string& name = g.output(o).name();
      outer_names[o] = seen.insert(name).second ? name : scope.fresh(name + (is_state.count(o) ? "_final" : "_seq"));
    }
  }
  const std::string trip_count = scope.fresh("sequence_length");
  if (options.length) {
    *outer.add_node() = int64_scalar_constant(trip_count, *options.length);
  } else {
    const std::string& first = layout.inputs[layout.sequences.front()]->name();
    const std::string shape = scope.fresh(first + "_shape"), axis = scope.fresh("time_axis");
    onnx::NodeProto shape_node = make_node("Shape", {first}, shape);
    shape_node.set_name(node_scope.fresh(shape));
    *outer.add_node() = std::move(shape_node);
    *outer.add_node() = int64_scalar_constant(axis, 0);
    onnx::NodeProto length = make_node("Gather", {shape, axis}, trip_count);
    length.set_name(node_scope.fresh(trip_count));
    *outer.add_node() = std::move(length);
  }
  auto add_loop = [&](const std::string& trips, const std::vector<std::string>& state_in,
                      const std::vector<std::string>& outputs, onnx::GraphProto loop_body) {
    onnx::NodeProto loop;
    loop.set_op_type("Loop");
    loop.set_name(node_scope.fresh("time_loop"));
    loop.add_input(trips);
    loop.add_input("");
    for (const auto& name : state_in) loop.add_input(name);
    for (const auto& name : outputs) loop.add_output(name);
    auto* attr = loop.add_attribute();
    attr->set_name("body");
    attr->set_type(onnx::AttributeProto::GRAPH);
    *attr->mutable_g() = std::move(loop_body);
    *outer.add_node() = std::move(loop);
  };
  auto add_node = [&](const char* type, std::vector<std::string> inputs, const std::string& output) {
    onnx::NodeProto n = make_node(type, std::move(inputs), output);
    n.set_name(node_scope.fresh(output));
    *outer.add_node() = std::move(n);
  };
  std::vector<std::string> state_in, loop_outputs;
  for (const int s : layout.states) state_in.push_back(layout.inputs[s]->name());
  for (const int o : layout.next_state_outputs) loop_outputs.push_back(outer_names[o]);
  for (const int o : layout.per_step_outputs) loop_outputs.push_back(outer_names[o]);
  if (!options.truncate) {
    add_loop(trip_count, state_in, loop_outputs, std::move(body));
  } else {
    // Truncated: the first T - K steps in one loop whose results are constants to the
    // derivatives (stop_gradient marks), the last K in a second loop reading the sequences
    // from step T - K on; the stacked outputs are the two loops' joined.
    const std::string k = scope.fresh("truncate_steps"), zero = scope.fresh("no_steps");
    const std::string over = scope.fresh("steps_over"), early = scope.fresh("early_steps");
    const std::string late = scope.fresh("late_steps");
    *outer.add_node() = int64_scalar_constant(k, *options.truncate);
    *outer.add_node() = int64_scalar_constant(zero, 0);
    add_node("Sub", {trip_count, k}, over);
    add_node("Max", {over, zero}, early);
    add_node("Sub", {trip_count, early}, late);
    onnx::GraphProto late_body = body;
    if (gathers > 0) {
      const std::string index = scope.fresh("time_index");
      onnx::NodeProto shift = make_node("Add", {iteration, early}, index);
      shift.set_name(node_scope.fresh(index));
      for (int i = 0; i < gathers; ++i) late_body.mutable_node(i)->set_input(1, index);
      *late_body.add_node() = std::move(shift);
      for (int i = late_body.node_size() - 1; i > 0; --i) late_body.mutable_node()->SwapElements(i, i - 1);
    }
    rename_definitions(late_body, scope, node_scope);
    std::vector<std::string> early_outputs, marked = provenance::names_at(result, provenance::kStopGradientKey);
    for (const auto& name : loop_outputs) early_outputs.push_back(scope.fresh(name + "_early"));
    add_loop(early, state_in, early_outputs, std::move(body));
    marked.insert(marked.end(), early_outputs.begin(), early_outputs.end());
    provenance::set_names_at(result, provenance::kStopGradientKey, marked);
    const size_t n_states = layout.states.size();
    std::vector<std::string> late_outputs(loop_outputs.begin(), loop_outputs.begin() + static_cast<long>(n_states));
    for (size_t i = n_states; i < loop_outputs.size(); ++i)
      late_outputs.push_back(scope.fresh(loop_outputs[i] + "_late"));
    add_loop(late, std::vector<std::string>(early_outputs.begin(), early_outputs.begin() + static_cast<long>(n_states)),
             late_outputs, std::move(late_body));
    for (size_t i = n_states; i < loop_outputs.size(); ++i) {
      onnx::NodeProto join = make_node("Concat", {early_outputs[i], late_outputs[i]}, loop_outputs[i]);
      join.set_name(node_scope.fresh(loop_outputs[i]));
      *join.add_attribute() = attr_i("axis", 0);
      *outer.add_node() = std::move(join);
    }
  }
  // Outputs in the step's order: state outputs are the final state, the others stacked.
  std::unordered_set<int> per_step(layout.per_step_outputs.begin(), layout.per_step_outputs.end());
  for (int o = 0; o < g.output_size(); ++o) {
    onnx::ValueInfoProto vi = per_step.count(o) ? with_time_axis(g.output(o), options.length, dim_name) : g.output(o);
    vi.set_name(outer_names[o]);
    *outer.add_output() = std::move(vi);
  }

  tidy(result);
  forget_roles(result);
  std::vector<std::string> states, constants;
  for (const int s : layout.states) states.push_back(provenance::quote(layout.inputs[s]->name()));
  for (const int c : layout.constants) constants.push_back(provenance::quote(layout.inputs[c]->name()));
  provenance::record_step(
      result, "{\"transform\": \"scan\", \"state\": " + provenance::list(states) +
                  ", \"constants\": " + provenance::list(constants) +
                  ", \"length\": " + (options.length ? std::to_string(*options.length) : provenance::quote(dim_name)) +
                  (options.truncate ? ", \"truncate\": " + std::to_string(*options.truncate) : "") + "}");
  if (const std::string problem = check::structure_checker(result); !problem.empty())
    diag::fail(Error::Kind::kInvalidModel, "scan: internal: the sequence model fails the ONNX checker: " + problem);
  return result;
}

}  // namespace onnax
