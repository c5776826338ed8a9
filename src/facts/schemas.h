// Schema lookups memoised per operator: ONNX's registry hashes the domain and the op name and
// then searches the version map on every call, which adds up to microseconds per node over
// large graphs that repeat the same few operators.
#pragma once

#include <onnx/defs/schema.h>

#include <string>
#include <unordered_map>

namespace onnax {

class SchemaCache {
 public:
  // The schema of domain::op in effect at `opset` (nullptr when ONNX has none).
  const onnx::OpSchema* find(const std::string& op, const std::string& domain, int opset) {
    key_.assign(domain).push_back('\0');
    key_.append(op).push_back('\0');
    key_.append(reinterpret_cast<const char*>(&opset), sizeof opset);
    auto it = cache_.find(key_);
    if (it != cache_.end()) return it->second;
    const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(op, opset, domain);
    cache_.emplace(key_, schema);
    return schema;
  }

 private:
  std::string key_;  // reused to avoid an allocation per lookup
  std::unordered_map<std::string, const onnx::OpSchema*> cache_;
};

}  // namespace onnax
