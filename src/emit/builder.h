// The builder rules emit nodes through: fresh collision-free names, constants, and the
// spelling each opset wants. Rules see values only as handles (V) with facts.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "emit/names.h"
#include "facts/facts.h"

namespace onnax {

// Handle of a value in the graph being built. id < 0 means "absent optional input".
struct V {
  int id = -1;
  bool valid() const { return id >= 0; }
};

// One attribute to set on an emitted node.
struct Attr {
  onnx::AttributeProto proto;
  static Attr i(std::string_view name, int64_t v);
  static Attr f(std::string_view name, float v);
  static Attr s(std::string_view name, std::string_view v);
  static Attr ints(std::string_view name, const std::vector<int64_t>& v);
};
using Attrs = std::vector<Attr>;

class Builder {
 public:
  Builder(onnx::GraphProto& out, NameScope& value_names, NameScope& node_names, int64_t opset);

  int64_t opset() const { return opset_; }
  // A builder for a subgraph (e.g. a Loop body) sharing this builder's name scopes, so names
  // stay unique across the whole model.
  Builder nested(onnx::GraphProto& body) const { return Builder(body, value_names_, node_names_, opset_); }
  std::string fresh_value_name(std::string_view base) { return value_names_.fresh(base); }
  onnx::NodeProto& last_node() { return *out_.mutable_node(out_.node_size() - 1); }
  // Names generated next derive from `base` (e.g. the source value being transformed).
  void set_origin(std::string_view base) { origin_ = base; }

  // Registers an existing value (graph input, initializer, copied node output).
  V existing(const std::string& name, Facts facts);
  const std::string& name(V v) const { return values_[v.id].name; }
  const Facts& facts(V v) const { return values_[v.id].facts; }
  void set_facts(V v, Facts f) { values_[v.id].facts = std::move(f); }
  int64_t rank(V v) const { return values_[v.id].facts.rank(); }

  // Emits a node; outputs get fresh names derived from the origin and op type.
  std::vector<V> op(std::string_view type, const std::vector<V>& inputs, const Attrs& attrs = {},
                    int num_outputs = 1);
  V op1(std::string_view type, const std::vector<V>& inputs, const Attrs& attrs = {}) {
    return op(type, inputs, attrs, 1)[0];
  }
  // Emits a copy of `node` (type, domain, attributes) with new inputs; attributes in
  // `overrides` replace or add, names in `drop` are removed.
  std::vector<V> clone(const onnx::NodeProto& node, const std::vector<V>& inputs, const Attrs& overrides = {},
                       const std::vector<std::string>& drop = {});
  // Emits `node` unchanged (moves it); registers its outputs with the given facts.
  void copy_node(onnx::NodeProto&& node);
  // Emits a one-output node whose output has exactly `output_name` (already reserved).
  V op_named(std::string_view type, const std::vector<V>& inputs, const Attrs& attrs,
             const std::string& output_name);

  // Renames the output `v` (produced by a node emitted at index >= first_node) to `name`.
  void rename(V v, const std::string& new_name, int first_node);
  int node_count() const { return out_.node_size(); }

  // Constants (deduplicated per builder).
  V i64s(const std::vector<int64_t>& values);  // 1-D int64
  V i64(int64_t value);                         // int64 scalar
  V scalar(double value, int32_t dtype);        // scalar of any numeric dtype
  V tensor_const(const onnx::TensorProto& t);

  // Shape helpers that keep facts up to date.
  V unsqueeze(V x, const std::vector<int64_t>& axes);
  V squeeze(V x, const std::vector<int64_t>& axes);
  V transpose(V x, const std::vector<int64_t>& perm);
  V shape_of(V x, int64_t start = 0, std::optional<int64_t> end = std::nullopt);
  V concat(const std::vector<V>& parts, int64_t axis);
  V reshape(V x, V shape);
  V expand(V x, V shape);

  // If `v` is a Constant/initializer this builder knows, its int64 values.
  const std::vector<int64_t>* known_i64(V v) const;
  void remember_i64(const std::string& name, std::vector<int64_t> values);

 private:
  struct Value {
    std::string name;
    Facts facts;
  };
  V add_value(std::string name, Facts facts);
  onnx::NodeProto* new_node(std::string_view type);

  onnx::GraphProto& out_;
  NameScope& value_names_;
  NameScope& node_names_;
  int64_t opset_;
  std::string origin_;
  std::vector<Value> values_;
  std::map<std::string, V> const_cache_;
  std::map<std::string, std::vector<int64_t>> known_i64_;
};

}  // namespace onnax
