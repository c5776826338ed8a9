#include "facts/facts.h"

#include <charconv>
#include <mutex>
#include <unordered_set>

namespace onnax {

const std::string* intern_dim_param(std::string_view name) {
  if (name.empty()) return nullptr;
  static std::mutex mutex;
  static auto* names = new std::unordered_set<std::string>();  // never freed: views outlive statics
  std::lock_guard<std::mutex> lock(mutex);
  return &*names->emplace(name).first;
}

Dim Dim::internal(uint32_t n) {
  char text[16] = {kInternalMark};
  const auto end = std::to_chars(text + 1, text + sizeof text, n).ptr;
  return named(std::string_view(text, static_cast<size_t>(end - text)));
}

std::string Facts::shape_string() const {
  if (!has_shape) return "unknown shape";
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    if (dims[i].known())
      s += std::to_string(dims[i].value());
    else
      s += dims[i].symbolic() && !dims[i].internal() ? dims[i].param() : std::string_view("?");
  }
  return s + "]";
}

Facts Facts::with_dim(int64_t axis, Dim dim) const {
  Facts out = *this;
  if (has_shape) out.dims.insert(out.dims.begin() + axis, std::move(dim));
  return out;
}

bool same_static_shape(const Facts& a, const Facts& b) {
  if (!a.has_shape || !b.has_shape || a.rank() != b.rank()) return false;
  for (size_t i = 0; i < a.dims.size(); ++i)
    if (!a.dims[i].same_as(b.dims[i])) return false;
  return true;
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
      if (d.has_dim_value())
        f.dims.push_back(Dim::of(d.dim_value()));
      else
        f.dims.push_back(Dim::named(d.has_dim_param() ? d.dim_param() : ""));
    }
  }
  return f;
}

void name_unknown_dims(Facts& facts, NameScope& scope) {
  for (Dim& d : facts.dims)
    if (d == Dim{}) d = Dim::internal(scope.next_unknown_dim());
}

void write_type(const Facts& facts, onnx::TypeProto* type, bool keep_internal) {
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
    if (d.known())
      pd->set_dim_value(d.value());
    else if (d.symbolic() && (keep_internal || !d.internal()))
      pd->set_dim_param(std::string(d.param()));
  }
}

std::optional<onnx::TensorProto> constant_tensor(const onnx::NodeProto& node) {
  if (node.op_type() != "Constant" || !(node.domain().empty() || node.domain() == "ai.onnx") || node.output_size() != 1)
    return std::nullopt;
  for (const auto& a : node.attribute()) {
    onnx::TensorProto t;
    if (a.name() == "value" && a.has_t()) {
      t = a.t();
    } else if (a.name() == "value_int") {
      t.set_data_type(onnx::TensorProto::INT64);
      t.add_int64_data(a.i());
    } else if (a.name() == "value_ints") {
      t.set_data_type(onnx::TensorProto::INT64);
      t.add_dims(a.ints_size());
      for (int64_t v : a.ints()) t.add_int64_data(v);
    } else if (a.name() == "value_float") {
      t.set_data_type(onnx::TensorProto::FLOAT);
      t.add_float_data(a.f());
    } else if (a.name() == "value_floats") {
      t.set_data_type(onnx::TensorProto::FLOAT);
      t.add_dims(a.floats_size());
      for (float v : a.floats()) t.add_float_data(v);
    } else {
      continue;
    }
    t.set_name(node.output(0));
    return t;
  }
  return std::nullopt;
}

const onnx::TypeProto* FactTable::non_tensor_type(int id) const {
  if (non_tensor_.empty()) return nullptr;
  auto it = non_tensor_.find(id);
  return it == non_tensor_.end() ? nullptr : &it->second;
}

void FactTable::set(int id, Facts facts) {
  if (static_cast<size_t>(id) >= facts_.size()) facts_.resize(static_cast<size_t>(id) + 1);
  facts_[static_cast<size_t>(id)] = std::move(facts);
  if (!non_tensor_.empty()) non_tensor_.erase(id);
}

void FactTable::set_type(int id, const onnx::TypeProto& type) {
  set(id, facts_from_type(type));
  if (!type.has_tensor_type() && type.value_case() != onnx::TypeProto::VALUE_NOT_SET) non_tensor_[id] = type;
}

void FactTable::alias(int id, int existing) {
  Facts copy = at(existing);
  std::optional<onnx::TypeProto> other;
  if (const onnx::TypeProto* t = non_tensor_type(existing)) other = *t;
  set(id, std::move(copy));
  if (other) non_tensor_[id] = std::move(*other);
}

std::optional<std::vector<int64_t>> static_dims(const Facts& f) {
  if (!f.has_shape) return std::nullopt;
  std::vector<int64_t> dims(f.dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    if (!f.dims[i].known()) return std::nullopt;
    dims[i] = f.dims[i].value();
  }
  return dims;
}

onnx::ValueInfoProto consistent_value_info(const onnx::ValueInfoProto& declared, const Facts& facts) {
  if (!declared.has_type() || !declared.type().has_tensor_type() || !declared.type().tensor_type().has_shape() ||
      !facts.has_shape)
    return declared;
  const auto& shape = declared.type().tensor_type().shape();
  // (A size the facts do not know is unconfirmed: ONNX Runtime would fold Shape nodes of the
  // result, which the source may not have had, to it.)
  bool unconfirmed = shape.dim_size() != static_cast<int>(facts.dims.size());
  for (int i = 0; !unconfirmed && i < shape.dim_size(); ++i) {
    const Dim& d = facts.dims[static_cast<size_t>(i)];
    unconfirmed = shape.dim(i).has_dim_value() && !(d.known() && shape.dim(i).dim_value() == d.value());
  }
  if (!unconfirmed) return declared;
  onnx::ValueInfoProto vi = declared;  // (name, doc string and metadata stay)
  vi.clear_type();
  Facts f = facts;
  if (!f.dtype) f.dtype = declared.type().tensor_type().elem_type();
  write_type(f, vi.mutable_type());
  return vi;
}

bool refine_with(Facts& have, const Facts& known) {
  if (!known.has_shape || (have.has_shape && have.rank() != known.rank())) return false;
  bool gained = !have.has_shape;
  if (gained) have = Facts::of(have.dtype, Dims(known.dims.size(), Dim{}));
  for (size_t i = 0; i < known.dims.size(); ++i) {
    const Dim k = known.dims[i], h = have.dims[i];
    const bool better = (k.known() && !h.known()) || (k.symbolic() && !k.internal() && (h == Dim{} || h.internal()));
    if (better) have.dims[i] = k;
    gained = gained || better;
  }
  if (!have.dtype) have.dtype = known.dtype;
  return gained;
}

bool data_propagation_is_bounded(const Facts* const* inputs, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const Facts* f = inputs[i];
    if (f && f->rank() == 1 && f->dims[0].known() && f->dims[0].value() > kMaxPropagatedElements) return false;
  }
  return true;
}

}  // namespace onnax
