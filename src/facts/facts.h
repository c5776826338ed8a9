// Per-value facts the rules need: element type and (possibly symbolic) shape.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
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

Facts facts_from_type(const onnx::TypeProto& type);
void write_type(const Facts& facts, onnx::TypeProto* type);

// Facts of every named value in a graph (inputs, initializers, value_info, outputs).
class FactTable {
 public:
  void add_graph(const onnx::GraphProto& graph);
  const Facts* find(const std::string& name) const;
  void set(const std::string& name, Facts facts) { table_[name] = std::move(facts); }

 private:
  std::unordered_map<std::string, Facts> table_;
};

}  // namespace onnax
