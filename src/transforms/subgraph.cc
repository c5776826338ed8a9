#include "transforms/subgraph.h"

#include <algorithm>
#include <functional>

#include "transforms/prepare.h"

namespace onnax {
namespace {}  // namespace

onnx::ValueInfoProto typed_value_info(const std::string& name, const Facts& facts, bool rank_only) {
  onnx::ValueInfoProto vi;
  vi.set_name(name);
  Facts f = facts;
  if (rank_only && f.has_shape)
    for (auto& d : f.dims) d = Dim{};
  if (f.dtype) write_type(f, vi.mutable_type());
  return vi;
}

onnx::ModelProto standalone_model(const onnx::GraphProto& body, const std::vector<const Facts*>& input_facts,
                                  const std::vector<std::pair<std::string, Facts>>& extra_inputs,
                                  const std::unordered_map<std::string, int>& opsets,
                                  const std::vector<onnx::TensorProto>& known_values, bool keep_dims) {
  onnx::ModelProto m;
  m.set_ir_version(10);
  for (const auto& [domain, version] : opsets) {
    auto* o = m.add_opset_import();
    o->set_domain(domain);
    o->set_version(version);
  }
  onnx::GraphProto& g = *m.mutable_graph() = body;
  g.set_name(body.name().empty() ? "body" : body.name());
  for (int i = 0; i < g.input_size(); ++i) {
    auto* vi = g.mutable_input(i);
    // A type with a rank is kept; otherwise the enclosing graph's facts give the element type
    // and rank (reverse mode needs ranks to undo broadcasting).
    const bool ranked = vi->has_type() && vi->type().has_tensor_type() && vi->type().tensor_type().elem_type() != 0 &&
                        vi->type().tensor_type().has_shape();
    const Facts* outer = static_cast<size_t>(i) < input_facts.size() ? input_facts[static_cast<size_t>(i)] : nullptr;
    if (keep_dims && outer && outer->has_shape) {
      // The declaration's known dims, else the given ones (a declaration of another rank wins).
      Facts f = ranked ? facts_from_type(vi->type()) : *outer;
      if (!f.dtype) f.dtype = outer->dtype;
      if (ranked && f.rank() == outer->rank())
        for (size_t d = 0; d < f.dims.size(); ++d)
          if (f.dims[d] == Dim{}) f.dims[d] = outer->dims[d];
      *vi = typed_value_info(vi->name(), f);
      continue;
    }
    if (!ranked && outer && (outer->dtype || outer->has_shape)) {
      Facts f = *outer;
      if (vi->has_type() && vi->type().has_tensor_type() && vi->type().tensor_type().elem_type() != 0)
        f.dtype = vi->type().tensor_type().elem_type();
      *vi = typed_value_info(vi->name(), f, true);
    }
  }
  for (const auto& [name, facts] : extra_inputs) *g.add_input() = typed_value_info(name, facts);
  for (const auto& t : known_values) *g.add_initializer() = t;
  return m;
}

std::vector<Facts> loop_carried_facts(const onnx::GraphProto& body, int states,
                                      const std::vector<const Facts*>& input_facts,
                                      const std::vector<std::pair<std::string, Facts>>& extra_inputs,
                                      const std::unordered_map<std::string, int>& opsets,
                                      const std::vector<onnx::TensorProto>& known_values,
                                      std::vector<std::string>* grows, std::vector<Facts>* body_outputs) {
  if (grows) grows->assign(static_cast<size_t>(std::max(states, 0)), std::string());
  if (body_outputs) body_outputs->clear();
  std::vector<Facts> facts;
  for (const Facts* f : input_facts) facts.push_back(f ? *f : Facts{});
  auto rank_only = [&] {
    for (int k = 0; k < states; ++k)
      for (auto& d : facts[static_cast<size_t>(2 + k)].dims) d = Dim{};
    return facts;
  };
  if (states < 0 || body.input_size() < 2 + states || body.output_size() < 1 + states ||
      input_facts.size() < static_cast<size_t>(2 + states))
    return rank_only();
  // Each round either keeps every dim (done) or forgets at least one: at most one round per dim.
  size_t rounds = 1;
  for (int k = 0; k < states; ++k) rounds += facts[static_cast<size_t>(2 + k)].dims.size();
  for (; rounds > 0; --rounds) {
    std::vector<const Facts*> given;
    for (const Facts& f : facts) given.push_back(&f);
    bool changed = false;
    try {
      const Prepared p = prepare(standalone_model(body, given, extra_inputs, opsets, known_values, true), "vjp");
      for (int k = 0; k < states; ++k) {
        Facts& in = facts[static_cast<size_t>(2 + k)];
        const Facts& out = p.fact(body.output(1 + k).name());
        bool differs = out.has_shape && in.has_shape && out.rank() != in.rank();
        for (size_t d = 0; !differs && out.rank() == in.rank() && d < in.dims.size(); ++d)
          differs = in.dims[d].known() && out.dims[d].known() && in.dims[d] != out.dims[d];
        if (grows && differs && (*grows)[static_cast<size_t>(k)].empty())
          (*grows)[static_cast<size_t>(k)] = in.shape_string() + " to " + out.shape_string();
        for (size_t d = 0; d < in.dims.size(); ++d) {
          const bool kept = out.has_shape && out.rank() == in.rank() && out.dims[d].same_as(in.dims[d]);
          if (!kept && in.dims[d] != Dim{}) {
            in.dims[d] = Dim{};
            changed = true;
          }
        }
      }
      if (!changed && body_outputs)
        for (const auto& o : body.output()) body_outputs->push_back(p.fact(o.name()));
    } catch (const std::exception&) {
      return rank_only();
    }
    if (!changed) return facts;
  }
  return rank_only();
}

std::vector<Facts> loop_output_facts(const onnx::NodeProto& loop, const std::vector<const Facts*>& input_facts,
                                     Dim trips, const std::unordered_map<std::string, int>& opsets,
                                     const std::function<const Facts*(std::string_view)>& outer) {
  const onnx::GraphProto* body = graph_attribute(loop, "body");
  const int states = loop.input_size() - 2;
  if (!body || states < 0 || body->input_size() != 2 + states || body->output_size() < 1 + states ||
      input_facts.size() < static_cast<size_t>(loop.input_size()))
    return {};
  std::vector<std::pair<std::string, Facts>> read_outside;
  for (auto& r : graph_outer_reads(*body)) {
    if (!outer) return {};
    const Facts* f = outer(r);
    read_outside.emplace_back(std::move(r), f ? *f : Facts{});
  }
  const Facts iter = Facts::of(onnx::TensorProto::INT64, {}), cond = Facts::of(onnx::TensorProto::BOOL, {});
  std::vector<const Facts*> entering = {&iter, &cond};
  for (int k = 0; k < states; ++k) entering.push_back(input_facts[static_cast<size_t>(2 + k)]);
  std::vector<Facts> outputs;
  const std::vector<Facts> carried =
      loop_carried_facts(*body, states, entering, read_outside, opsets, {}, nullptr, &outputs);
  if (outputs.size() != static_cast<size_t>(body->output_size())) return {};
  std::vector<Facts> result;
  // A final state is the entering one after some iterations, none included: the carried facts.
  for (int k = 0; k < states; ++k) result.push_back(carried[static_cast<size_t>(2 + k)]);
  for (int j = 1 + states; j < body->output_size(); ++j) {
    const Facts& step = outputs[static_cast<size_t>(j)];
    result.push_back(step.has_shape ? step.with_dim(0, trips) : Facts{step.dtype, false, {}});
  }
  return result;
}

}  // namespace onnax
