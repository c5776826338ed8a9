// step: the one timestep inside a full-sequence model (one top-level Loop or Scan over the time
// axis), as a model of its own (include/onnax/sequence.h). Reads the layouts exporters write:
// jax2onnx carries the sequence and the weights through the Loop unchanged (passthrough
// outputs) and takes x_t = Gather(sequence, iteration); onnax's own scan reads the sequence from
// the outer scope; ONNX Scan hands the body x_t directly.
#include <onnax/sequence.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "check/model_check.h"
#include "diagnostics/error.h"
#include "ir/graph_edit.h"
#include "ir/graph_names.h"
#include "transforms/prepare.h"
#include "transforms/provenance.h"
#include "transforms/step_roles.h"
#include "transforms/tidy.h"

namespace onnax {
namespace {

// A refusal: the model is not a sequence model step() can read.
struct NotASequence {
  std::string why;
};

const onnx::AttributeProto* attribute(const onnx::NodeProto& n, const char* name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

// `vi` without its first (time) axis.
onnx::ValueInfoProto without_time_axis(const onnx::ValueInfoProto& vi, const std::string& name) {
  onnx::ValueInfoProto out = vi;
  out.set_name(name);
  auto* t = out.mutable_type()->mutable_tensor_type();
  if (t->has_shape() && t->shape().dim_size() > 0) t->mutable_shape()->mutable_dim()->erase(t->shape().dim().begin());
  return out;
}

onnx::ValueInfoProto type_of_tensor(const onnx::TensorProto& t, const std::string& name) {
  onnx::ValueInfoProto vi;
  vi.set_name(name);
  auto* tt = vi.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(t.data_type());
  auto* shape = tt->mutable_shape();
  for (const int64_t d : t.dims()) shape->add_dim()->set_dim_value(d);
  return vi;
}

bool has_declared_type(const onnx::ValueInfoProto& vi) {
  return vi.type().has_tensor_type() && vi.type().tensor_type().elem_type() != 0;
}

class Extractor {
 public:
  explicit Extractor(const onnx::ModelProto& model) : model_(model), g_(model.graph()) {}

  ExtractedStep run() {
    index_outer();
    find_loop();
    if (loop_->op_type() == "Loop")
      read_loop();
    else
      read_scan();
    return assemble();
  }

 private:
  // --- the outer graph ---
  void index_outer() {
    for (const auto& t : g_.initializer()) initializers_.emplace(t.name(), &t);
    for (const auto& vi : g_.input())
      if (!initializers_.count(vi.name())) runtime_inputs_.emplace(vi.name(), &vi);
    for (int i = 0; i < g_.node_size(); ++i)
      for (const auto& o : g_.node(i).output()) producer_.emplace(o, i);
  }

  void find_loop() {
    for (const auto& n : g_.node())
      if (is_default_domain(n) && (n.op_type() == "Loop" || n.op_type() == "Scan")) {
        if (loop_)
          throw NotASequence{"it has more than one top-level Loop/Scan ('" + loop_->name() + "' and '" + n.name() +
                             "'); step reads a model whose work is one Loop or Scan over time"};
        loop_ = &n;
      }
    if (!loop_) throw NotASequence{"it has no top-level Loop or Scan"};
    const auto* body = attribute(*loop_, "body");
    if (!body || !body->has_g()) throw NotASequence{"its " + loop_->op_type() + " has no body"};
    body_ = &body->g();
    // The loop's results, and Identity copies of them (exporters name outputs so).
    std::unordered_set<std::string> loop_outputs(loop_->output().begin(), loop_->output().end());
    for (const auto& o : loop_->output()) result_of_[o] = o;
    for (bool grew = true; grew;) {
      grew = false;
      for (const auto& n : g_.node())
        if (n.op_type() == "Identity" && is_default_domain(n) && n.input_size() == 1 && n.output_size() == 1 &&
            result_of_.count(n.input(0)) && !result_of_.count(n.output(0))) {
          result_of_[n.output(0)] = result_of_.at(n.input(0));
          grew = true;
        }
    }
    for (const auto& vi : g_.output())
      if (!result_of_.count(vi.name()))
        throw NotASequence{"graph output '" + vi.name() + "' is not an output of the " + loop_->op_type() +
                           " (it is computed around it); step needs the loop's results to be the model's outputs"};
    for (const auto& n : g_.node()) {
      if (&n == loop_ || (n.op_type() == "Identity" && n.output_size() == 1 && result_of_.count(n.output(0)))) continue;
      for (const auto& in : n.input())
        if (result_of_.count(in))
          throw NotASequence{"node '" + n.name() + "' (" + n.op_type() + ") uses the " + loop_->op_type() +
                             "'s result '" + in + "'; step needs the loop's results to be the model's outputs"};
    }
  }

  // What an outer value is, for the step: a runtime input, an initializer, or a value computed
  // from neither runtime input (its nodes move into the step).
  void require_outer_constant_or_input(const std::string& name, const std::string& use) {
    if (runtime_inputs_.count(name) || initializers_.count(name) || name.empty()) return;
    auto it = producer_.find(name);
    if (it == producer_.end())
      throw NotASequence{"the body reads '" + name + "', which the outer graph does not define"};
    pull_node(it->second, use);
  }

  void pull_node(int index, const std::string& use) {
    if (pulled_set_.count(index)) return;
    const auto& n = g_.node(index);
    for (const auto& in : n.input()) {
      if (in.empty() || initializers_.count(in)) continue;
      if (runtime_inputs_.count(in))
        throw NotASequence{use + " is computed from the graph input '" + in + "' outside the loop (node '" + n.name() +
                           "'); step needs the loop to read graph inputs and constants directly"};
      auto it = producer_.find(in);
      if (it == producer_.end()) throw NotASequence{"node '" + n.name() + "' reads the undefined '" + in + "'"};
      pull_node(it->second, use);
    }
    for (const auto& r : outer_scope_reads(n)) require_outer_constant_or_input(r, use);
    pulled_set_.insert(index);
    pulled_.push_back(index);
  }

  // --- the body ---
  // Body names read as x_t: Gather(sequence, iteration, axis 0) outputs, by the sequence's
  // outer name.
  void find_sequence_gathers(const std::string& iteration,
                             const std::unordered_map<std::string, std::string>& carried) {
    for (int i = 0; i < body_->node_size(); ++i) {
      const auto& n = body_->node(i);
      if (n.op_type() != "Gather" || !is_default_domain(n) || n.input_size() != 2 || n.input(1) != iteration) continue;
      const auto* axis = attribute(n, "axis");
      if (axis && axis->i() != 0) continue;
      auto it = carried.find(n.input(0));
      const std::string outer = it != carried.end() ? it->second : n.input(0);
      if (!runtime_inputs_.count(outer)) continue;
      sequence_of_[n.output(0)] = outer;
      dropped_.insert(i);
      add_unique(sequences_, outer);
    }
  }

  static void add_unique(std::vector<std::string>& names, const std::string& name) {
    for (const auto& n : names)
      if (n == name) return;
    names.push_back(name);
  }

  void read_loop() {
    const int n_carried = loop_->input_size() - 2;
    if (n_carried < 0 || body_->input_size() != n_carried + 2 || body_->output_size() < n_carried + 1)
      throw NotASequence{"its Loop's body does not match the Loop's inputs"};
    const std::string& iteration = body_->input(0).name();
    const std::string& cond_in = body_->input(1).name();
    std::unordered_map<std::string, int> body_producer;
    for (int i = 0; i < body_->node_size(); ++i)
      for (const auto& o : body_->node(i).output()) body_producer.emplace(o, i);
    auto passthrough_of = [&](const std::string& out) -> std::pair<std::string, int> {
      auto it = body_producer.find(out);
      if (it == body_producer.end()) return {out, -1};
      const auto& p = body_->node(it->second);
      if (p.op_type() == "Identity" && is_default_domain(p)) return {p.input(0), it->second};
      return {"", -1};
    };
    // The condition must stay as it came in: a fixed number of steps.
    if (const auto [src, node] = passthrough_of(body_->output(0).name()); src != cond_in)
      throw NotASequence{
          "its Loop's condition is computed in the body (a while loop); step needs a loop of a "
          "fixed number of steps"};
    else if (node >= 0)
      dropped_.insert(node);

    // Carried values: invariant ones are constants or sequences, the others state.
    std::unordered_map<std::string, std::string> invariant;  // body input -> outer value
    for (int i = 0; i < n_carried; ++i) {
      const std::string& in = body_->input(2 + i).name();
      const std::string& init = loop_->input(2 + i);
      const auto [src, node] = passthrough_of(body_->output(1 + i).name());
      if (src == in) {
        invariant[in] = init;
        if (node >= 0) dropped_.insert(node);
        continue;
      }
      State s;
      s.body_input = in;
      s.init = init;
      s.body_output = body_->output(1 + i).name();
      s.outer_output = i < loop_->output_size() ? loop_->output(i) : "";
      states_.push_back(s);
    }
    for (int j = 1 + n_carried; j < body_->output_size(); ++j) {
      const int k = j - 1;  // the Loop output
      per_step_.push_back({body_->output(j).name(), k < loop_->output_size() ? loop_->output(k) : ""});
    }
    find_sequence_gathers(iteration, invariant);
    // Every other read of the iteration number makes the step depend on time itself.
    for (int i = 0; i < body_->node_size(); ++i) {
      if (dropped_.count(i)) continue;
      for (const auto& in : body_->node(i).input())
        if (in == iteration)
          throw NotASequence{"its body uses the step number '" + iteration + "' (node '" + body_->node(i).name() +
                             "'), so the step is not the same at every time; step cannot drop it"};
    }
    for (const auto& [in, outer] : invariant) rename_[in] = outer;
    carried_invariant_ = std::move(invariant);
    length_from_trip_count(loop_->input(0));
  }

  void read_scan() {
    if (default_opset(model_) < 9)
      throw NotASequence{"its Scan is the opset-8 form (batched, with sequence_lens); step reads Scan from opset 9"};
    const auto* num = attribute(*loop_, "num_scan_inputs");
    if (!num) throw NotASequence{"its Scan has no num_scan_inputs"};
    for (const char* name : {"scan_input_axes", "scan_input_directions", "scan_output_axes", "scan_output_directions"})
      if (const auto* a = attribute(*loop_, name))
        for (const int64_t v : a->ints())
          if (v != 0)
            throw NotASequence{std::string("its Scan has ") + name +
                               " other than 0; step reads scans over the first axis, forwards"};
    // (A count outside [0, inputs] made the reads below index past the body's inputs: a crash
    // that fuzzing found with -1.)
    if (num->i() < 0 || num->i() > loop_->input_size())
      throw NotASequence{"its Scan has num_scan_inputs " + std::to_string(num->i()) + " for " +
                         std::to_string(loop_->input_size()) + " inputs"};
    const int n_scan = static_cast<int>(num->i());
    const int n_state = loop_->input_size() - n_scan;
    if (body_->input_size() != loop_->input_size() || body_->output_size() < n_state)
      throw NotASequence{"its Scan's body does not match the Scan's inputs"};
    for (int i = 0; i < n_state; ++i) {
      State s;
      s.body_input = body_->input(i).name();
      s.init = loop_->input(i);
      s.body_output = body_->output(i).name();
      s.outer_output = i < loop_->output_size() ? loop_->output(i) : "";
      states_.push_back(s);
    }
    for (int j = 0; j < n_scan; ++j) {
      const std::string& outer = loop_->input(n_state + j);
      if (!runtime_inputs_.count(outer)) throw NotASequence{"its Scan's sequence '" + outer + "' is not a graph input"};
      rename_[body_->input(n_state + j).name()] = outer;
      add_unique(sequences_, outer);
    }
    for (int j = n_state; j < body_->output_size(); ++j)
      per_step_.push_back({body_->output(j).name(), j < loop_->output_size() ? loop_->output(j) : ""});
    if (!sequences_.empty()) length_from_sequence(sequences_.front());
  }

  void length_from_trip_count(const std::string& trip) {
    if (auto it = initializers_.find(trip); it != initializers_.end()) {
      const auto& t = *it->second;
      if (t.data_type() == onnx::TensorProto::INT64 && t.int64_data_size() == 1) {
        length_ = t.int64_data(0);
        return;
      }
      if (t.data_type() == onnx::TensorProto::INT64 && t.raw_data().size() == sizeof(int64_t)) {
        int64_t v = 0;
        std::memcpy(&v, t.raw_data().data(), sizeof v);
        length_ = v;
        return;
      }
    }
    if (!sequences_.empty()) length_from_sequence(sequences_.front());
  }

  void length_from_sequence(const std::string& seq) {
    const auto& t = runtime_inputs_.at(seq)->type().tensor_type();
    if (!t.has_shape() || t.shape().dim_size() == 0) {
      length_ = std::string();
      return;
    }
    const auto& d = t.shape().dim(0);
    if (d.has_dim_value())
      length_ = d.dim_value();
    else
      length_ = d.dim_param();
  }

  // --- the step model ---
  ExtractedStep assemble() {
    for (const auto& seq : sequences_)
      if (!runtime_inputs_.count(seq)) throw NotASequence{"sequence '" + seq + "' is not a graph input"};
    // Classify the outer values the body reads: constants (runtime inputs) or moved constants.
    const std::vector<std::string> outer_reads = graph_outer_reads(*body_);
    std::unordered_set<std::string> sequence_set(sequences_.begin(), sequences_.end());
    std::unordered_set<std::string> needed;  // outer names the step reads
    for (const auto& r : outer_reads) needed.insert(r);
    for (const auto& [body_name, outer] : rename_) needed.insert(outer);
    for (const auto& [gathered, outer] : sequence_of_) rename_[gathered] = outer;
    for (const auto& s : states_) {
      if (s.init.empty()) throw NotASequence{"state '" + s.body_input + "' has no initial value"};
      if (!runtime_inputs_.count(s.init) && !initializers_.count(s.init))
        throw NotASequence{"the initial state '" + s.init +
                           "' is computed in the graph; step needs initial states that are graph inputs or "
                           "initializers"};
      if (sequence_set.count(s.init)) throw NotASequence{"'" + s.init + "' is both a sequence and a state"};
      rename_[s.body_input] = s.init;
    }
    std::unordered_set<std::string> state_inits;
    for (const auto& s : states_)
      if (!state_inits.insert(s.init).second)
        throw NotASequence{"two states start from the same value '" + s.init +
                           "'; step needs one graph input per state"};
    // A sequence is read only as its element at each step (the Gathers dropped above).
    auto sequence_alias = [&](const std::string& name) -> const std::string* {
      if (sequence_set.count(name)) return &name;
      auto it = carried_invariant_.find(name);
      return it != carried_invariant_.end() && sequence_set.count(it->second) ? &it->second : nullptr;
    };
    for (int i = 0; i < body_->node_size(); ++i) {
      if (dropped_.count(i)) continue;
      std::vector<std::string> reads(body_->node(i).input().begin(), body_->node(i).input().end());
      for (auto& r : outer_scope_reads(body_->node(i))) reads.push_back(std::move(r));
      for (const auto& r : reads)
        if (const std::string* seq = sequence_alias(r))
          throw NotASequence{"the body reads the whole sequence '" + *seq + "' (node '" + body_->node(i).name() +
                             "'), not only its element at each step; step cannot split it"};
    }
    for (const auto& name : needed) {
      if (sequence_set.count(name) || state_inits.count(name)) continue;
      require_outer_constant_or_input(name, "'" + name + "'");
      if (runtime_inputs_.count(name)) add_unique(constants_, name);
    }

    ExtractedStep out;
    onnx::ModelProto& m = out.step;
    copy_model_fields(model_, m);
    onnx::GraphProto& s = *m.mutable_graph();
    s.set_name(body_->name().empty() ? g_.name() : body_->name());

    // Inputs in the outer graph's order.
    for (const auto& vi : g_.input()) {
      const std::string& name = vi.name();
      if (sequence_set.count(name)) {
        *s.add_input() = without_time_axis(vi, name);
        out.sequences.push_back(name);
      } else if (state_inits.count(name) && runtime_inputs_.count(name)) {
        *s.add_input() = vi;
      } else if (runtime_inputs_.count(name) &&
                 std::find(constants_.begin(), constants_.end(), name) != constants_.end()) {
        *s.add_input() = vi;
        out.constants.push_back(name);
      }
    }
    // States that start from an initializer: an input with the initializer as its default.
    for (const auto& st : states_)
      if (initializers_.count(st.init)) *s.add_input() = type_of_tensor(*initializers_.at(st.init), st.init);
    for (const auto& st : states_) out.states.push_back(st.init);

    for (const auto& t : g_.initializer())
      if (needed.count(t.name()) || state_inits.count(t.name()) || pulled_reads(t.name())) *s.add_initializer() = t;
    for (const auto& t : body_->initializer()) *s.add_initializer() = t;
    for (const int i : pulled_) *s.add_node() = g_.node(i);
    for (int i = 0; i < body_->node_size(); ++i)
      if (!dropped_.count(i)) *s.add_node() = body_->node(i);
    for (const auto& vi : body_->value_info())
      if (!rename_.count(vi.name())) *s.add_value_info() = vi;
    rename_reads(s, rename_);
    auto step_name = [&](const std::string& body_name) {
      auto it = rename_.find(body_name);
      return it == rename_.end() ? body_name : it->second;
    };

    // Outputs: the outer graph's, in order, then the states whose final value it drops.
    NameScope scope;
    collect_names(g_, scope);
    std::unordered_map<std::string, const onnx::ValueInfoProto*> outer_outputs;
    for (const auto& vi : g_.output()) outer_outputs.emplace(vi.name(), &vi);
    auto body_type = [&](const std::string& body_value) -> const onnx::ValueInfoProto* {
      for (const auto& vi : body_->output())
        if (vi.name() == body_value) return &vi;
      return nullptr;
    };
    std::unordered_set<std::string> emitted_names;
    auto emit = [&](const std::string& body_value, const std::string& want, bool stacked) {
      onnx::ValueInfoProto vi;
      if (auto it = outer_outputs.find(want); it != outer_outputs.end() && has_declared_type(*it->second))
        vi = stacked ? without_time_axis(*it->second, want) : *it->second;
      else if (const auto* b = body_type(body_value))
        vi = *b;
      vi.set_name(want);
      // (A name the sequence model lists twice is one value: one Identity, two outputs.)
      if (emitted_names.insert(want).second) {
        *s.add_node() = make_node("Identity", {step_name(body_value)}, want);
        s.mutable_node(s.node_size() - 1)->set_name(scope.fresh(want + "_output"));
      }
      *s.add_output() = std::move(vi);
    };
    std::unordered_map<std::string, const State*> state_by_output;
    for (const auto& st : states_)
      if (!st.outer_output.empty()) state_by_output[st.outer_output] = &st;
    std::unordered_map<std::string, std::string> per_step_by_output;
    for (const auto& [body_value, outer] : per_step_)
      if (!outer.empty()) per_step_by_output[outer] = body_value;
    std::unordered_set<const State*> emitted;
    std::unordered_map<const State*, std::string> state_output_name;
    for (const auto& vi : g_.output()) {
      const std::string& result = result_of_.at(vi.name());
      if (auto it = state_by_output.find(result); it != state_by_output.end()) {
        emit(it->second->body_output, vi.name(), false);
        emitted.insert(it->second);
        state_output_name.emplace(it->second, vi.name());
      } else if (auto p = per_step_by_output.find(result); p != per_step_by_output.end()) {
        emit(p->second, vi.name(), true);
      } else {
        throw NotASequence{"graph output '" + vi.name() + "' is a value the loop carries unchanged, not a result"};
      }
    }
    for (const auto& st : states_) {
      if (emitted.count(&st)) continue;
      const std::string name = st.outer_output.empty() ? scope.fresh(st.init + "_next") : st.outer_output;
      emit(st.body_output, name, false);
      out.dropped_final_states.push_back(name);
    }
    for (const auto& st : states_) {
      auto named = state_output_name.find(&st);
      out.state_outputs.push_back(named != state_output_name.end() ? named->second : std::string());
    }
    // Fill in the names chosen for unnamed final states.
    for (size_t i = 0, k = 0; i < out.state_outputs.size(); ++i)
      if (out.state_outputs[i].empty()) out.state_outputs[i] = out.dropped_final_states[k++];
    out.length = length_;
    prune(s);
    return out;
  }

  bool pulled_reads(const std::string& name) const {
    for (const int i : pulled_)
      for (const auto& in : g_.node(i).input())
        if (in == name) return true;
    return false;
  }

  struct State {
    std::string body_input, init, body_output, outer_output;
  };

  const onnx::ModelProto& model_;
  const onnx::GraphProto& g_;
  const onnx::NodeProto* loop_ = nullptr;
  const onnx::GraphProto* body_ = nullptr;
  std::unordered_map<std::string, const onnx::TensorProto*> initializers_;
  std::unordered_map<std::string, const onnx::ValueInfoProto*> runtime_inputs_;
  std::unordered_map<std::string, int> producer_;
  std::vector<int> pulled_;
  std::unordered_set<int> pulled_set_;
  std::unordered_set<int> dropped_;                                 // body nodes left out of the step
  std::unordered_map<std::string, std::string> sequence_of_;        // x_t in the body -> sequence
  std::unordered_map<std::string, std::string> carried_invariant_;  // Loop: body input -> outer
  std::unordered_map<std::string, std::string> result_of_;          // the loop's outputs and copies -> its output
  std::unordered_map<std::string, std::string> rename_;             // body name -> step name
  std::vector<std::string> sequences_, constants_;
  std::vector<State> states_;
  std::vector<std::pair<std::string, std::string>> per_step_;  // body output, outer output
  std::optional<std::variant<int64_t, std::string>> length_;
};

}  // namespace

std::optional<ExtractedStep> extract_step(const onnx::ModelProto& sequence, std::string* why) {
  try {
    return Extractor(sequence).run();
  } catch (const NotASequence& refusal) {
    if (why) *why = refusal.why;
    return std::nullopt;
  }
}

onnx::ModelProto step(const onnx::ModelProto& sequence) {
  if (const std::string problem = check::structure_checker(sequence); !problem.empty())
    diag::fail(Error::Kind::kInvalidModel, "step: the sequence model is not valid ONNX: " + problem);
  std::string why;
  auto extracted = extract_step(sequence, &why);
  if (!extracted)
    diag::fail(Error::Kind::kUnsupported,
               "step: the model is not a sequence model step can read: " + why +
                   ". Fix: pass a model whose graph is one Loop (or Scan) over the time axis, reading the graph's "
                   "inputs and returning the graph's outputs (as spyx's full-sequence export and `onnax scan` write)");
  onnx::ModelProto result = std::move(extracted->step);
  record_roles(result, extracted->states, extracted->state_outputs, extracted->constants);
  tidy(result);  // the loop's own constants the step no longer reads, say
  std::vector<std::string> states;
  for (const auto& s : extracted->states) states.push_back(provenance::quote(s));
  provenance::record_step(result, "{\"transform\": \"step\", \"state\": " + provenance::list(states) + "}");
  if (const std::string problem = check::structure_checker(result); !problem.empty())
    diag::fail(Error::Kind::kInvalidModel, "step: internal: the step model fails the ONNX checker: " + problem);
  return result;
}

}  // namespace onnax
