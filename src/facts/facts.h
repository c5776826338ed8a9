// Per-value facts the rules need: element type and (possibly symbolic) shape.
#pragma once

#include <google/protobuf/arena.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

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

// The type of every value of a graph, as ONNX's per-operator inference (with data
// propagation) and the model's own annotations tell it. Built in one topological pass
// (facts/infer.cc); the TypeProtos double as the inference functions' inputs.
class FactTable {
 public:
  FactTable();
  ~FactTable();
  FactTable(FactTable&&) noexcept;
  FactTable& operator=(FactTable&&) noexcept;

  Facts get(const std::string& name) const;
  const onnx::TypeProto* type(const std::string& name) const;
  void set(const std::string& name, const onnx::TypeProto& type);
  void alias(const std::string& name, const std::string& existing);

  // For the inference pass.
  std::unordered_map<std::string, onnx::TypeProto*>& types() { return types_; }
  // A copy of `type` / an empty TypeProto owned by the table. They live on a protobuf arena:
  // large graphs hold hundreds of thousands of them, and one allocation (and one free) each,
  // with their nested shapes and dims, dominated building and tearing the table down.
  onnx::TypeProto* store(const onnx::TypeProto& type);
  onnx::TypeProto* make();

 private:
  std::unique_ptr<google::protobuf::Arena> arena_;
  std::unordered_map<std::string, onnx::TypeProto*> types_;
};

// The tensor a Constant node produces (from value, value_int(s) or value_float(s)), if any.
std::optional<onnx::TensorProto> constant_tensor(const onnx::NodeProto& node);

// Runs ONNX's per-node type and shape inference (and partial data propagation, so shapes
// computed with Shape/Gather/Concat stay known) over `graph`, whose nodes must be in
// topological order. Declared value_info fills in what inference cannot tell.
void infer_facts(const onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets, FactTable& table);

}  // namespace onnax
