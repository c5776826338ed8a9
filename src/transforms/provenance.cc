#include "transforms/provenance.h"

#include <onnax/onnax.h>

#include <charconv>

namespace onnax::provenance {
namespace {

onnx::StringStringEntryProto* find(onnx::ModelProto& m, const std::string& key) {
  for (auto& e : *m.mutable_metadata_props())
    if (e.key() == key) return &e;
  return nullptr;
}

// Parses a JSON array of strings as written by list(quote(...)).
std::vector<std::string> parse_string_list(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while ((i = s.find('"', i)) != std::string::npos) {
    std::string item;
    for (++i; i < s.size() && s[i] != '"'; ++i) {
      unsigned code = 0;
      if (s[i] == '\\' && i + 5 < s.size() && s[i + 1] == 'u' &&
          std::from_chars(s.data() + i + 2, s.data() + i + 6, code, 16).ptr == s.data() + i + 6 && code < 0x80) {
        // \u00XX: a control character quote() escaped (metadata is untrusted: parsed, not assumed).
        item += static_cast<char>(code);
        i += 5;
        continue;
      }
      if (s[i] == '\\' && i + 1 < s.size()) ++i;
      item += s[i];
    }
    out.push_back(item);
    ++i;
  }
  return out;
}

// The JSON array of strings after `"key": ` in `s` (from `from`), or nullopt.
std::optional<std::vector<std::string>> string_array_at(const std::string& s, size_t from, const std::string& key) {
  const std::string tag = "\"" + key + "\": [";
  const size_t at = s.find(tag, from);
  if (at == std::string::npos) return std::nullopt;
  size_t i = at + tag.size() - 1;
  bool quoted = false;
  for (size_t j = i + 1; j < s.size(); ++j) {
    if (quoted && s[j] == '\\') {
      ++j;
    } else if (s[j] == '"') {
      quoted = !quoted;
    } else if (!quoted && s[j] == ']') {
      return parse_string_list(s.substr(i, j + 1 - i));
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<RecordedSelection> last_selection(const onnx::ModelProto& model) {
  for (const auto& e : model.metadata_props()) {
    if (e.key() != kTransformsKey) continue;
    const std::string& v = e.value();
    const size_t last = v.rfind("{\"transform\"");
    if (last == std::string::npos) return std::nullopt;
    auto inputs = string_array_at(v, last, "inputs");
    auto outputs = string_array_at(v, last, "outputs");
    if (!inputs || !outputs) return std::nullopt;
    return RecordedSelection{std::move(*inputs), std::move(*outputs)};
  }
  return std::nullopt;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      // Control characters are not allowed raw in a JSON string.
      static const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[(c >> 4) & 0xF];
      out += hex[c & 0xF];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

void record_step(onnx::ModelProto& model, const std::string& step_json) {
  std::string step = step_json;
  step.insert(step.size() - 1, ", \"onnax_version\": " + quote(version()));
  auto* e = find(model, kTransformsKey);
  if (!e) {
    e = model.add_metadata_props();
    e->set_key(kTransformsKey);
    e->set_value("[" + step + "]");
    return;
  }
  std::string v = e->value();
  const auto close = v.rfind(']');
  if (close == std::string::npos)
    v = "[" + step + "]";
  else
    v.insert(close, (v.find('{') == std::string::npos ? "" : ", ") + step);
  e->set_value(v);
}

std::vector<std::string> names_at(const onnx::ModelProto& model, const char* key) {
  for (const auto& e : model.metadata_props())
    if (e.key() == key) return parse_string_list(e.value());
  return {};
}

void set_names_at(onnx::ModelProto& model, const char* key, const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const auto& n : names) quoted.push_back(quote(n));
  auto* e = find(model, key);
  if (!e) {
    e = model.add_metadata_props();
    e->set_key(key);
  }
  e->set_value(list(quoted));
}

std::vector<std::string> derivative_outputs(const onnx::ModelProto& model) {
  return names_at(model, kDerivativeOutputsKey);
}

void set_derivative_outputs(onnx::ModelProto& model, const std::vector<std::string>& names) {
  set_names_at(model, kDerivativeOutputsKey, names);
}

}  // namespace onnax::provenance
