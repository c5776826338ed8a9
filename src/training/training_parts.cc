#include "training/training_parts.h"

#include <algorithm>

#include "diagnostics/error.h"
#include "rules/derivative.h"

namespace onnax::training {

bool glob_match(std::string_view pattern, std::string_view name) {
  size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  auto class_match = [&](size_t& pi, char c) -> std::optional<bool> {
    // pattern[pi] == '['; returns nullopt for an unterminated class (then '[' is literal).
    size_t i = pi + 1;
    bool negate = i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^');
    if (negate) ++i;
    bool matched = false;
    const size_t first = i;
    for (; i < pattern.size() && (pattern[i] != ']' || i == first); ++i) {
      if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
        matched |= pattern[i] <= c && c <= pattern[i + 2];
        i += 2;
      } else {
        matched |= pattern[i] == c;
      }
    }
    if (i >= pattern.size()) return std::nullopt;
    pi = i + 1;
    return matched != negate;
  };
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
      continue;
    }
    if (p < pattern.size()) {
      if (pattern[p] == '[') {
        size_t pi = p;
        if (auto m = class_match(pi, name[n])) {
          if (*m) {
            p = pi;
            ++n;
            continue;
          }
        } else if (name[n] == '[') {
          ++p;
          ++n;
          continue;
        }
      } else if (pattern[p] == '?' || pattern[p] == name[n]) {
        ++p;
        ++n;
        continue;
      }
    }
    if (star == std::string_view::npos) return false;
    p = star + 1;
    n = ++resume;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

Matcher::Matcher(const std::string& entry, const std::string& mode, const std::string& option) : entry_(entry) {
  if (entry.rfind("re:", 0) != 0) return;
  try {
    regex_.emplace(entry.substr(3), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    diag::fail(Error::Kind::kSelection, mode + ": " + option + " entry '" + entry +
                                            "' is not a valid regular expression (" + e.what() +
                                            "). Fix: correct the expression after 're:'");
  }
}

bool Matcher::matches(const std::string& name) const {
  if (entry_ == "all" || entry_ == name) return true;
  if (regex_) return std::regex_match(name, *regex_);
  return glob_match(entry_, name);
}

std::string listed(const std::vector<std::string>& names, size_t limit) {
  std::vector<std::string> shown;
  for (size_t i = 0; i < names.size() && i < limit; ++i) {
    std::string quoted(1, '\'');
    quoted.append(names[i]).push_back('\'');
    shown.push_back(std::move(quoted));
  }
  if (names.size() > limit) shown.push_back("... (" + std::to_string(names.size() - limit) + " more)");
  // (Appended, not "[" + join(...): GCC 12 warns falsely (-Wrestrict) on that form.)
  std::string out(1, '[');
  out.append(diag::join(shown)).push_back(']');
  return out;
}

std::string choose_output(const Prepared& p, const std::string& mode, const std::string& requested) {
  std::vector<std::string> outputs, floats;
  for (const auto& o : p.graph->output()) {
    outputs.push_back(o.name());
    if (differentiable_dtype(p.fact(o.name()).dtype)) floats.push_back(o.name());
  }
  if (requested.empty()) {
    if (floats.size() == 1) return floats[0];
    if (floats.empty())
      for (const auto& o : p.graph->output())
        if (o.type().has_sequence_type() || o.type().has_map_type()) return choose_output(p, mode, o.name());
    diag::fail(Error::Kind::kSelection, mode + ": no output was named and the model has " +
                                            std::to_string(floats.size()) + " float32/float64 outputs " +
                                            listed(floats) + ". Fix: name the output to read (--output NAME)");
  }
  if (std::find(outputs.begin(), outputs.end(), requested) == outputs.end())
    diag::fail(Error::Kind::kSelection, mode + ": '" + requested + "' is not a graph output; outputs: " +
                                            listed(outputs) + ". Fix: name one of these outputs");
  const int32_t dt = p.fact(requested).dtype;
  for (const auto& o : p.graph->output())
    if (o.name() == requested && (o.type().has_sequence_type() || o.type().has_map_type()))
      diag::fail(Error::Kind::kSelection,
                 mode + ": output '" + requested + "' is a " + (o.type().has_sequence_type() ? "sequence" : "map") +
                     ", not a tensor; a loss reads a float tensor. Fix: name a tensor output " + listed(floats) +
                     ", or re-export without the sequence (skl2onnx: options={'zipmap': False})");
  if (!differentiable_dtype(dt))
    diag::fail(Error::Kind::kSelection, mode + ": output '" + requested + "' has dtype " + diag::dtype_name(dt) +
                                            "; a loss needs float32 or float64. Fix: name one of the float outputs " +
                                            listed(floats));
  return requested;
}

void claim_name(Prepared& p, const std::string& mode, const std::string& name, const std::string& option) {
  if (name.empty())
    diag::fail(Error::Kind::kSelection,
               mode + ": an added input or output has an empty name. Fix: give it a name with " + option);
  if (!p.value_names.insert(name))
    diag::fail(Error::Kind::kSelection, mode + ": the model already has a value named '" + name +
                                            "', which this transform would add. Fix: choose another name with " +
                                            option);
}

namespace {
onnx::ValueInfoProto value_info(const std::string& name, const Facts& facts) {
  onnx::ValueInfoProto vi;
  vi.set_name(name);
  write_type(facts, vi.mutable_type());
  return vi;
}
}  // namespace

void add_input(onnx::GraphProto& g, const std::string& name, const Facts& facts) {
  *g.add_input() = value_info(name, facts);
}

void add_output(onnx::GraphProto& g, const std::string& name, const Facts& facts) {
  *g.add_output() = value_info(name, facts);
}

void insert_output(onnx::GraphProto& g, int position, const std::string& name, const Facts& facts) {
  add_output(g, name, facts);
  for (int i = g.output_size() - 1; i > position; --i) g.mutable_output()->SwapElements(i, i - 1);
}

void rename_everywhere(onnx::GraphProto& g, const std::string& from, const std::string& to) {
  auto fix = [&](std::string* s) {
    if (*s == from) *s = to;
  };
  for (auto& vi : *g.mutable_input()) fix(vi.mutable_name());
  for (auto& vi : *g.mutable_output()) fix(vi.mutable_name());
  for (auto& vi : *g.mutable_value_info()) fix(vi.mutable_name());
  for (auto& t : *g.mutable_initializer()) fix(t.mutable_name());
  for (auto& n : *g.mutable_node()) {
    for (auto& i : *n.mutable_input()) fix(&i);
    for (auto& o : *n.mutable_output()) fix(&o);
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) rename_everywhere(*a.mutable_g(), from, to);
      for (auto& sg : *a.mutable_graphs()) rename_everywhere(sg, from, to);
    }
  }
}

void set_metadata(onnx::ModelProto& model, const std::string& key, const std::string& value) {
  for (auto& e : *model.mutable_metadata_props())
    if (e.key() == key) {
      e.set_value(value);
      return;
    }
  auto* e = model.add_metadata_props();
  e->set_key(key);
  e->set_value(value);
}

std::string metadata(const onnx::ModelProto& model, const std::string& key) {
  for (const auto& e : model.metadata_props())
    if (e.key() == key) return e.value();
  return {};
}

void erase_metadata(onnx::ModelProto& model, const std::string& key) {
  auto* props = model.mutable_metadata_props();
  for (int i = 0; i < props->size(); ++i)
    if (props->Get(i).key() == key) {
      props->DeleteSubrange(i, 1);
      return;
    }
}

}  // namespace onnax::training
