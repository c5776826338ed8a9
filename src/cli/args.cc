#include "cli/args.h"

#include <onnax/onnax.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/model_io.h"

namespace onnax::cli {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

int64_t parse_int(const std::string& s, const std::string& option) {
  try {
    size_t used = 0;
    int64_t v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError{option + ": '" + s + "' is not an integer"};
}

double parse_double(const std::string& s, const std::string& option) {
  try {
    size_t used = 0;
    double v = std::stod(s, &used);
    if (used == s.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  throw UsageError{option + ": '" + s + "' is not a number"};
}

std::vector<std::string> parse_list(const std::string& s, const std::string& option) {
  if (s.empty()) throw UsageError{option + " needs a value (comma-separated entries, or @FILE)"};
  std::vector<std::string> out;
  for (const auto& item : split(s, ',')) {
    if (item.empty()) throw UsageError{option + ": '" + s + "' has an empty entry"};
    if (item[0] != '@') {
      out.push_back(item);
      continue;
    }
    std::ifstream file(item.substr(1));
    if (!file) throw UsageError{option + ": cannot read the file '" + item.substr(1) + "'"};
    std::string line;
    while (std::getline(file, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
      size_t start = line.find_first_not_of(" \t");
      if (start == std::string::npos || line[start] == '#') continue;
      out.push_back(line.substr(start));
    }
  }
  return out;
}

void check_output_paths_usage(const std::string& in, const std::vector<std::string>& data_files,
                              const std::string& out) {
  try {
    check_output_paths(in, data_files, out);
  } catch (const Error& e) {
    throw UsageError{e.what()};
  }
}

std::vector<std::string> parse(const std::vector<std::string>& args, const Options& options,
                               const std::string& command) {
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (auto f = options.flags.find(a); f != options.flags.end()) {
      f->second();
    } else if (auto v = options.valued.find(a); v != options.valued.end()) {
      if (i + 1 >= args.size()) throw UsageError{a + " needs a value"};
      v->second(args[++i]);
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError{"unknown option '" + a + "' for " + command};
    } else {
      positional.push_back(a);
    }
  }
  return positional;
}

Files files(const std::vector<std::string>& positional, const std::string& out, const std::string& command) {
  if (positional.empty()) throw UsageError{command + " needs an input model"};
  if (positional.size() > 1) throw UsageError{"unexpected argument '" + positional[1] + "'"};
  if (out.empty()) throw UsageError{command + " needs -o OUT.onnx"};
  std::error_code ec;
  if (std::filesystem::equivalent(positional[0], out, ec))
    throw UsageError{"-o '" + out +
                     "' is the input file; onnax never overwrites its input. Choose another output path"};
  return {positional[0], out};
}

}  // namespace onnax::cli
