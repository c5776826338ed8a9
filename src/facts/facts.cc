#include "facts/facts.h"

namespace onnax {

std::string Facts::shape_string() const {
  if (!has_shape) return "unknown shape";
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    if (dims[i].known()) s += std::to_string(dims[i].value);
    else s += dims[i].param.empty() ? "?" : dims[i].param;
  }
  return s + "]";
}

Facts Facts::with_dim(int64_t axis, Dim dim) const {
  Facts out = *this;
  if (has_shape) out.dims.insert(out.dims.begin() + axis, std::move(dim));
  return out;
}

Facts facts_from_type(const onnx::TypeProto& type) {
  Facts f;
  if (!type.has_tensor_type()) return f;
  const auto& t = type.tensor_type();
  f.dtype = t.elem_type();
  if (t.has_shape()) {
    f.has_shape = true;
    f.dims.reserve(t.shape().dim_size());
    for (const auto& d : t.shape().dim()) {
      if (d.has_dim_value()) f.dims.push_back(Dim::of(d.dim_value()));
      else f.dims.push_back(Dim::named(d.has_dim_param() ? d.dim_param() : ""));
    }
  }
  return f;
}

void write_type(const Facts& facts, onnx::TypeProto* type) {
  auto* t = type->mutable_tensor_type();
  t->set_elem_type(facts.dtype);
  if (!facts.has_shape) {
    t->clear_shape();
    return;
  }
  auto* shape = t->mutable_shape();
  shape->clear_dim();
  for (const auto& d : facts.dims) {
    auto* pd = shape->add_dim();
    if (d.known()) pd->set_dim_value(d.value);
    else if (!d.param.empty()) pd->set_dim_param(d.param);
  }
}

static Facts facts_from_tensor(const onnx::TensorProto& t) {
  Facts f;
  f.dtype = t.data_type();
  f.has_shape = true;
  for (int64_t d : t.dims()) f.dims.push_back(Dim::of(d));
  return f;
}

void FactTable::add_graph(const onnx::GraphProto& graph) {
  for (const auto& t : graph.initializer()) table_[t.name()] = facts_from_tensor(t);
  for (const auto& s : graph.sparse_initializer()) table_[s.values().name()] = facts_from_tensor(s.values());
  auto add_vi = [&](const onnx::ValueInfoProto& vi) {
    if (vi.has_type() && vi.type().has_tensor_type()) table_[vi.name()] = facts_from_type(vi.type());
  };
  for (const auto& vi : graph.input()) add_vi(vi);
  for (const auto& vi : graph.value_info()) add_vi(vi);
  for (const auto& vi : graph.output()) add_vi(vi);
  // Constant nodes: their value attribute tells dtype and shape exactly.
  for (const auto& n : graph.node()) {
    if (n.op_type() != "Constant" || !n.domain().empty() || n.output_size() != 1) continue;
    for (const auto& a : n.attribute()) {
      if (a.name() == "value" && a.has_t()) table_[n.output(0)] = facts_from_tensor(a.t());
    }
  }
}

const Facts* FactTable::find(const std::string& name) const {
  auto it = table_.find(name);
  return it == table_.end() ? nullptr : &it->second;
}

}  // namespace onnax
