// Argument helpers shared by the onnax subcommands.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace onnax::cli {

// A command-line mistake: reported with a pointer to --help and exit code 2.
struct UsageError {
  std::string message;
};

// Comma-separated items; empty items are kept ("0," is two items) so they are reported.
std::vector<std::string> split(const std::string& s, char sep);

// The whole of `s` as an integer, else a UsageError naming `option`.
int64_t parse_int(const std::string& s, const std::string& option);

// The whole of `s` as a finite number, else a UsageError naming `option`.
double parse_double(const std::string& s, const std::string& option);

// A list option's entries: comma-separated, where an entry "@FILE" stands for the lines of FILE
// (blank lines and lines starting with '#' skipped; entries there may hold commas).
std::vector<std::string> parse_list(const std::string& s, const std::string& option);

// io/model_io.h's check_output_paths, its refusals as UsageErrors: an output path that would
// overwrite what the input reads is a choice of path, as -o naming the input is (exit 2).
void check_output_paths_usage(const std::string& in, const std::vector<std::string>& data_files,
                              const std::string& out);

// A command's options by name: those taking a value, and flags.
struct Options {
  std::map<std::string, std::function<void(const std::string&)>> valued;
  std::map<std::string, std::function<void()>> flags;
};

// Parses `args` against `options`; returns the positional arguments.
std::vector<std::string> parse(const std::vector<std::string>& args, const Options& options,
                               const std::string& command);

struct Files {
  std::string in, out;
};

// The one input model among `positional` and the -o path `out`, which must not be the input.
Files files(const std::vector<std::string>& positional, const std::string& out, const std::string& command);

}  // namespace onnax::cli
