#include "cli/sequence_commands.h"

#include <onnax/onnax.h>
#include <onnax/sequence.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/args.h"
#include "io/model_io.h"

namespace onnax::cli {
namespace {

// --state h,c or h=h_next,c=c_next (each state, optionally with the output of its next value).
void parse_state(const std::string& value, StepRoles& roles) {
  if (value.empty()) throw UsageError{"--state needs names such as 'h,c' or 'h=h_next' (or 'none')"};
  roles.state.emplace();
  roles.next_state.clear();
  if (value == "none") return;
  for (const auto& item : parse_list(value, "--state")) {
    const auto eq = item.find('=');
    const std::string name = item.substr(0, eq);
    if (name.empty()) throw UsageError{"--state: an entry has no input name ('" + item + "')"};
    roles.state->push_back(name);
    if (eq != std::string::npos) {
      const std::string next = item.substr(eq + 1);
      if (next.empty()) throw UsageError{"--state: '" + item + "' names no output after '='"};
      roles.next_state[name] = next;
    }
  }
}

void add_role_options(Options& o, StepRoles& roles) {
  o.valued["--state"] = [&](const std::string& v) { parse_state(v, roles); };
  o.valued["--constants"] = [&](const std::string& v) { roles.constants = parse_list(v, "--constants"); };
}

onnx::ModelProto load_checked(const Files& f) {
  onnx::ModelProto model;
  std::vector<std::string> data_files;
  load_model_into(f.in, model, &data_files);
  check_output_paths_usage(f.in, data_files, f.out);
  return model;
}

}  // namespace

int cmd_scan(const std::vector<std::string>& args) {
  std::string out;
  bool external = false;
  ScanOptions opt;
  Options o;
  o.valued["-o"] = [&](const std::string& v) { out = v; };
  o.flags["--external-data"] = [&] { external = true; };
  add_role_options(o, opt.roles);
  o.valued["--length"] = [&](const std::string& v) {
    if (v == "none")
      opt.length.reset();
    else
      opt.length = parse_int(v, "--length");
  };
  o.valued["--truncate"] = [&](const std::string& v) { opt.truncate = parse_int(v, "--truncate"); };
  o.valued["--length-name"] = [&](const std::string& v) {
    if (v.empty()) throw UsageError{"--length-name needs a name"};
    opt.length_name = v;
  };
  const Files f = files(parse(args, o, "scan"), out, "scan");
  save_model(scan(load_checked(f), opt), f.out, external);
  std::cerr << "onnax: wrote " << f.out << "\n";
  return 0;
}

int cmd_step(const std::vector<std::string>& args) {
  std::string out;
  bool external = false;
  Options o;
  o.valued["-o"] = [&](const std::string& v) { out = v; };
  o.flags["--external-data"] = [&] { external = true; };
  const Files f = files(parse(args, o, "step"), out, "step");
  save_model(step(load_checked(f)), f.out, external);
  std::cerr << "onnax: wrote " << f.out << "\n";
  return 0;
}

int cmd_signature(const std::vector<std::string>& args) {
  std::string out;
  StepRoles roles;
  Options o;
  o.valued["-o"] = [&](const std::string& v) { out = v; };
  add_role_options(o, roles);
  o.valued["--zeros"] = [&](const std::string&) {
    throw UsageError{
        "--zeros writes NumPy arrays, so it lives in the Python command. Fix: run `.venv/bin/onnax signature "
        "... --zeros FILE.npz` (or `python -m onnax`)"};
  };
  o.valued["--dim"] = [&](const std::string&) {
    throw UsageError{
        "--dim gives sizes for --zeros, which the Python command writes. Fix: run `.venv/bin/onnax "
        "signature ... --zeros FILE.npz --dim NAME=SIZE`"};
  };
  const auto positional = parse(args, o, "signature");
  if (positional.empty()) throw UsageError{"signature needs an input model"};
  if (positional.size() > 1) throw UsageError{"unexpected argument '" + positional[1] + "'"};
  std::error_code ec;
  if (!out.empty() && std::filesystem::equivalent(positional[0], out, ec))
    throw UsageError{"-o '" + out +
                     "' is the input file; onnax never overwrites its input. Choose another output path"};
  const std::string json = signature_json(signature(load_model(positional[0]), roles));
  if (out.empty()) {
    std::cout << json << std::flush;
    return 0;
  }
  std::ofstream file(out, std::ios::binary | std::ios::trunc);
  file << json;
  if (!file.flush())
    throw Error(Error::Kind::kIo, "signature: cannot write '" + out + "'. Fix: choose a writable path");
  std::cerr << "onnax: wrote " << out << "\n";
  return 0;
}

}  // namespace onnax::cli
