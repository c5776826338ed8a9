// Helpers the training layer's files share: choosing and declaring graph inputs and outputs,
// names, metadata.
#pragma once

#include <onnx/onnx_pb.h>

#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "facts/facts.h"
#include "ir/graph_names.h"
#include "transforms/prepare.h"

namespace onnax::training {

// The float output named `requested`, or the model's only float output when it is empty;
// `mode` prefixes the diagnostics, which list the outputs.
std::string choose_output(const Prepared& p, const std::string& mode, const std::string& requested);

// Reserves `name` for a value the transform adds; fails when the model already uses it,
// naming the `option` that sets it.
void claim_name(Prepared& p, const std::string& mode, const std::string& name, const std::string& option);

void add_input(onnx::GraphProto& g, const std::string& name, const Facts& facts);
void add_output(onnx::GraphProto& g, const std::string& name, const Facts& facts);
void insert_output(onnx::GraphProto& g, int position, const std::string& name, const Facts& facts);

// Sets (or replaces) metadata_props[key].
void set_metadata(onnx::ModelProto& model, const std::string& key, const std::string& value);
// metadata_props[key], or "" when absent.
std::string metadata(const onnx::ModelProto& model, const std::string& key);
void erase_metadata(onnx::ModelProto& model, const std::string& key);

// Renames value `from` to `to` wherever it occurs in `g` and its subgraphs (its producer, its
// readers, inputs, outputs, initializers, value_info). Names are unique model-wide (SSA), so
// this renames one value.
void rename_everywhere(onnx::GraphProto& g, const std::string& from, const std::string& to);

// Whole-name glob matching: * (any run), ? (one character), [abc] / [a-z] / [!a].
bool glob_match(std::string_view pattern, std::string_view name);

// One entry of a parameter selection: "all", an exact name, a glob pattern, or "re:REGEX"
// (ECMAScript, matched against the whole name). `option` names it in diagnostics.
class Matcher {
 public:
  Matcher(const std::string& entry, const std::string& mode, const std::string& option);
  bool matches(const std::string& name) const;

 private:
  std::string entry_;
  std::optional<std::regex> regex_;
};

// "[a, b, ...]" listing at most `limit` names, then how many more, for diagnostics.
std::string listed(const std::vector<std::string>& names, size_t limit = 12);

}  // namespace onnax::training
