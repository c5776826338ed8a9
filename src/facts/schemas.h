// Schema lookups memoised per operator: ONNX's registry hashes the domain and the op name and
// then searches the version map on every call, which adds up to microseconds per node over
// large graphs that repeat the same few operators.
#pragma once

#include <onnx/defs/schema.h>

#include <string>
#include <vector>

#include "ir/names.h"

namespace onnax {

class SchemaCache {
 public:
  // The schema of domain::op in effect at `opset` (nullptr when ONNX has none).
  const onnx::OpSchema* find(const std::string& op, const std::string& domain, int opset) {
    // One hash of the op type (graphs use a few dozen distinct ones), then a short scan over
    // the domains and opsets seen with it (usually one).
    const size_t id = static_cast<size_t>(ops_.intern(op));
    if (id >= entries_.size()) entries_.resize(id + 1);
    for (const Entry& e : entries_[id])
      if (e.opset == opset && e.domain == domain) return e.schema;
    const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(op, opset, domain);
    entries_[id].push_back(Entry{domain, opset, schema});
    return schema;
  }

 private:
  struct Entry {
    std::string domain;
    int opset;
    const onnx::OpSchema* schema;
  };
  Interner ops_;                             // op type -> id
  std::vector<std::vector<Entry>> entries_;  // by op id
};

}  // namespace onnax
