#include "transforms/subgraph.h"

#include <algorithm>
#include <functional>

#include "transforms/prepare.h"

namespace onnax {
namespace {

void collect_outer_reads(const onnx::GraphProto& g, std::unordered_set<std::string> defined,
                         std::unordered_set<std::string>& seen, std::vector<std::string>& reads) {
  for (const auto& vi : g.input()) defined.insert(vi.name());
  for (const auto& t : g.initializer()) defined.insert(t.name());
  auto read = [&](const std::string& n) {
    if (!n.empty() && !defined.count(n) && seen.insert(n).second) reads.push_back(n);
  };
  for (const auto& n : g.node()) {
    for (const auto& in : n.input()) read(in);
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_outer_reads(a.g(), defined, seen, reads);
      for (const auto& sg : a.graphs()) collect_outer_reads(sg, defined, seen, reads);
    }
    for (const auto& o : n.output()) defined.insert(o);
  }
  for (const auto& o : g.output()) read(o.name());
}

// Applies `fn` to every graph nested in `n`'s attributes.
void for_each_subgraph(onnx::NodeProto& n, const std::function<void(onnx::GraphProto&)>& fn) {
  for (auto& a : *n.mutable_attribute()) {
    if (a.has_g()) fn(*a.mutable_g());
    for (auto& sg : *a.mutable_graphs()) fn(sg);
  }
}

}  // namespace

const onnx::GraphProto* graph_attribute(const onnx::NodeProto& node, const char* name) {
  for (const auto& a : node.attribute())
    if (a.name() == name && a.has_g()) return &a.g();
  return nullptr;
}

std::vector<std::string> graph_outer_reads(const onnx::GraphProto& g) {
  std::unordered_set<std::string> seen;
  std::vector<std::string> reads;
  collect_outer_reads(g, {}, seen, reads);
  return reads;
}

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

void strip_known_values(onnx::GraphProto& g) {
  if (g.initializer_size() == 0) return;
  std::unordered_set<std::string> inputs;
  for (const auto& vi : g.input()) inputs.insert(vi.name());
  auto* inits = g.mutable_initializer();
  inits->erase(std::remove_if(inits->begin(), inits->end(),
                              [&](const onnx::TensorProto& t) { return inputs.count(t.name()) > 0; }),
               inits->end());
}

std::vector<char> outputs_depending_on(const onnx::GraphProto& g, const std::unordered_set<std::string>& active) {
  const std::unordered_set<std::string> live = values_depending_on(g, active);
  std::vector<char> out;
  for (const auto& o : g.output()) out.push_back(live.count(o.name()) ? 1 : 0);
  return out;
}

std::unordered_set<std::string> values_depending_on(const onnx::GraphProto& g,
                                                    const std::unordered_set<std::string>& active) {
  std::unordered_set<std::string> live = active;
  for (const auto& n : g.node()) {
    bool hit = false;
    for (const auto& in : n.input()) hit = hit || (!in.empty() && live.count(in));
    if (!hit)
      for (const auto& a : n.attribute()) {
        for (const auto* sg : {a.has_g() ? &a.g() : nullptr})
          if (sg)
            for (const auto& r : graph_outer_reads(*sg)) hit = hit || live.count(r);
        for (const auto& sg : a.graphs())
          for (const auto& r : graph_outer_reads(sg)) hit = hit || live.count(r);
      }
    if (hit)
      for (const auto& o : n.output())
        if (!o.empty()) live.insert(o);
  }
  return live;
}

void prune(onnx::GraphProto& g) {
  std::unordered_set<std::string> needed;
  for (const auto& o : g.output()) needed.insert(o.name());
  std::vector<char> keep(static_cast<size_t>(g.node_size()), 0);
  for (int i = g.node_size() - 1; i >= 0; --i) {
    const auto& n = g.node(i);
    bool used = false;
    for (const auto& o : n.output()) used = used || (!o.empty() && needed.count(o));
    if (!used) continue;
    keep[static_cast<size_t>(i)] = 1;
    for (const auto& in : n.input()) needed.insert(in);
    for (const auto& a : n.attribute()) {
      if (a.has_g())
        for (auto& r : graph_outer_reads(a.g())) needed.insert(r);
      for (const auto& sg : a.graphs())
        for (auto& r : graph_outer_reads(sg)) needed.insert(r);
    }
  }
  onnx::GraphProto kept;
  for (int i = 0; i < g.node_size(); ++i)
    if (keep[static_cast<size_t>(i)]) *kept.add_node() = std::move(*g.mutable_node(i));
  g.mutable_node()->Swap(kept.mutable_node());
  // value_info of dropped values would describe nothing.
  onnx::GraphProto infos;
  std::unordered_set<std::string> defined;
  for (const auto& n : g.node())
    for (const auto& o : n.output()) defined.insert(o);
  for (auto& vi : *g.mutable_value_info())
    if (defined.count(vi.name())) *infos.add_value_info() = std::move(vi);
  g.mutable_value_info()->Swap(infos.mutable_value_info());
  // Initializers nothing reads any more (runtimes warn about them).
  onnx::GraphProto inits;
  for (auto& t : *g.mutable_initializer())
    if (needed.count(t.name())) *inits.add_initializer() = std::move(t);
  g.mutable_initializer()->Swap(inits.mutable_initializer());
}

void rename_definitions(onnx::GraphProto& g, NameScope& scope, NameScope& node_scope) {
  std::unordered_map<std::string, std::string> map;
  std::function<void(onnx::GraphProto&)> define = [&](onnx::GraphProto& sg) {
    auto def = [&](const std::string& n) {
      if (!n.empty() && !map.count(n)) map.emplace(n, scope.fresh(n));
    };
    for (const auto& vi : sg.input()) def(vi.name());
    for (const auto& t : sg.initializer()) def(t.name());
    for (auto& n : *sg.mutable_node()) {
      for (const auto& o : n.output()) def(o);
      for_each_subgraph(n, define);
    }
  };
  define(g);
  auto re = [&](std::string* n) {
    if (auto it = map.find(*n); it != map.end()) *n = it->second;
  };
  std::function<void(onnx::GraphProto&)> apply = [&](onnx::GraphProto& sg) {
    for (auto& vi : *sg.mutable_input()) re(vi.mutable_name());
    for (auto& t : *sg.mutable_initializer()) re(t.mutable_name());
    for (auto& vi : *sg.mutable_output()) re(vi.mutable_name());
    for (auto& vi : *sg.mutable_value_info()) re(vi.mutable_name());
    for (auto& n : *sg.mutable_node()) {
      for (auto& in : *n.mutable_input()) re(&in);
      for (auto& o : *n.mutable_output()) re(&o);
      if (!n.name().empty()) n.set_name(node_scope.fresh(n.name(), &scope));
      for_each_subgraph(n, apply);
    }
  };
  apply(g);
}

void rename_reads(onnx::GraphProto& g, const std::unordered_map<std::string, std::string>& map) {
  if (map.empty()) return;
  for (auto& nd : *g.mutable_node()) {
    for (auto& i : *nd.mutable_input())
      if (auto it = map.find(i); it != map.end()) i = it->second;
    rename_outer_reads(nd, map);
  }
}

std::unordered_set<std::string> names_read(const onnx::GraphProto& g) {
  std::unordered_set<std::string> read;
  for (const auto& nd : g.node()) {
    for (const auto& i : nd.input()) read.insert(i);
    if (has_subgraphs(nd))
      for (auto& r : outer_scope_reads(nd)) read.insert(std::move(r));
  }
  return read;
}

void rename_outer_reads(onnx::NodeProto& node, const std::unordered_map<std::string, std::string>& map) {
  std::unordered_set<std::string> defined;  // anywhere inside: such a name is not an outer read
  std::function<void(onnx::GraphProto&)> define = [&](onnx::GraphProto& sg) {
    for (const auto& vi : sg.input()) defined.insert(vi.name());
    for (const auto& t : sg.initializer()) defined.insert(t.name());
    for (auto& n : *sg.mutable_node()) {
      for (const auto& o : n.output()) defined.insert(o);
      for_each_subgraph(n, define);
    }
  };
  for_each_subgraph(node, define);
  std::function<void(onnx::GraphProto&)> apply = [&](onnx::GraphProto& sg) {
    auto re = [&](std::string* n) {
      if (defined.count(*n)) return;
      if (auto it = map.find(*n); it != map.end()) *n = it->second;
    };
    for (auto& vi : *sg.mutable_output()) re(vi.mutable_name());
    for (auto& n : *sg.mutable_node()) {
      for (auto& in : *n.mutable_input()) re(&in);
      for_each_subgraph(n, apply);
    }
  };
  for_each_subgraph(node, apply);
}

onnx::NodeProto make_node(const char* type, std::vector<std::string> inputs, const std::string& output) {
  onnx::NodeProto nd;
  nd.set_op_type(type);
  for (auto& i : inputs) nd.add_input(std::move(i));
  nd.add_output(output);
  return nd;
}

const onnx::ValueInfoProto* find_value_info(const onnx::GraphProto& g, const std::string& name) {
  for (const auto& vi : g.output())
    if (vi.name() == name) return &vi;
  for (const auto& vi : g.input())
    if (vi.name() == name) return &vi;
  return nullptr;
}

void add_output(onnx::GraphProto& g, const std::string& name, const onnx::ValueInfoProto& type_of, NameScope& scope) {
  bool taken = false, defined = false;
  for (const auto& vi : g.output()) taken = taken || vi.name() == name;
  for (const auto& vi : g.input()) taken = taken || vi.name() == name;
  for (const auto& t : g.initializer()) defined = defined || t.name() == name;
  for (const auto& n : g.node())
    for (const auto& o : n.output()) defined = defined || o == name;
  onnx::ValueInfoProto vi = type_of;
  vi.set_name(name);
  if (taken || !defined) {
    vi.set_name(scope.fresh(name + "_out"));
    *g.add_node() = make_node("Identity", {name}, vi.name());
  }
  *g.add_output() = std::move(vi);
}

}  // namespace onnax
