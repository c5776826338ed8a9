// Per-value facts the rules need: element type and (possibly symbolic) shape.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "emit/names.h"

namespace onnax {

struct Dim {
  int64_t value = -1;  // >= 0 when the size is known
  std::string param;   // symbolic name when the size is symbolic
  bool known() const { return value >= 0; }
  static Dim of(int64_t v) { return Dim{v, {}}; }
  static Dim named(std::string p) { return Dim{-1, std::move(p)}; }
};

struct Facts {
  int32_t dtype = 0;  // onnx::TensorProto::DataType, 0 when unknown
  bool has_shape = false;
  std::vector<Dim> dims;

  int64_t rank() const { return has_shape ? static_cast<int64_t>(dims.size()) : -1; }
  // "[batch, 3, N]" or "unknown shape"; for diagnostics.
  std::string shape_string() const;
  // The same facts with a dimension inserted at `axis` (0 <= axis <= rank).
  Facts with_dim(int64_t axis, Dim dim) const;
  static Facts of(int32_t dtype, std::vector<Dim> dims) { return Facts{dtype, true, std::move(dims)}; }
};

// True when both shapes are known and provably equal (equal sizes, or the same symbolic name).
bool same_static_shape(const Facts& a, const Facts& b);

Facts facts_from_type(const onnx::TypeProto& type);
void write_type(const Facts& facts, onnx::TypeProto* type);

// The facts of every value of a graph, as ONNX's per-operator inference (with data
// propagation) and the model's own annotations tell them. Built in one topological pass
// (facts/infer.cc). Names are interned once: transforms look a value up by name one time and
// then use its dense id to index their own per-value vectors.
class FactTable {
 public:
  // The id of a value the table knows (every value of the graph after infer_facts), or -1.
  int id(std::string_view name) const { return ids_.find(name); }
  int size() const { return ids_.size(); }
  std::string_view name(int id) const { return ids_.name(id); }
  const Facts& at(int id) const { return facts_[static_cast<size_t>(id)]; }
  // Empty facts (unknown dtype and shape) for values the table does not know.
  const Facts& get(std::string_view name) const;
  // The full type of a value whose type is not a tensor (sequence, optional, map), or nullptr;
  // kept so ONNX's inference can type the ops that read it.
  const onnx::TypeProto* non_tensor_type(int id) const;

  // Records (or replaces) facts; returns the value's id.
  int set(std::string_view name, Facts facts);
  int set_type(std::string_view name, const onnx::TypeProto& type);
  // `name` gets the facts `existing` has.
  void alias(std::string_view name, std::string_view existing);

 private:
  Interner ids_;
  std::vector<Facts> facts_;
  std::unordered_map<int, onnx::TypeProto> non_tensor_;
};

// The tensor a Constant node produces (from value, value_int(s) or value_float(s)), if any.
std::optional<onnx::TensorProto> constant_tensor(const onnx::NodeProto& node);

// Runs ONNX's per-node type and shape inference (and partial data propagation, so shapes
// computed with Shape/Gather/Concat stay known) over `graph`, whose nodes must be in
// topological order. Declared value_info fills in what inference cannot tell.
void infer_facts(const onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets, FactTable& table);

}  // namespace onnax
