#include "cli/check_command.h"

#include <onnax/onnax.h>

#include <iostream>
#include <map>

#include "check/model_check.h"
#include "cli/args.h"
#include "diagnostics/error.h"

namespace onnax::cli {
namespace {

struct Step {
  std::string name;
  std::vector<std::string> problems;
};

// One line describing the model, so a report pasted into an issue says what was checked.
void describe(const onnx::ModelProto& m, std::ostream& os) {
  os << "  ir_version " << m.ir_version() << ", opsets";
  for (const auto& o : m.opset_import())
    os << " " << (o.domain().empty() ? "ai.onnx" : o.domain()) << ":" << o.version();
  std::map<std::string, int> ops;
  for (const auto& n : m.graph().node()) ++ops[n.op_type()];
  os << ", " << m.graph().node_size() << " nodes";
  if (!ops.empty()) {
    os << " (";
    bool first = true;
    for (const auto& [op, n] : ops) {
      os << (first ? "" : ", ") << op << " " << n;
      first = false;
    }
    os << ")";
  }
  os << "\n";
  for (const auto& e : m.metadata_props())
    if (e.key() == "onnax.transforms") os << "  onnax.transforms: " << e.value() << "\n";
}

}  // namespace

int cmd_check(const std::vector<std::string>& args) {
  std::string path;
  std::map<std::string, std::vector<int64_t>> symbolic;
  std::vector<std::string> embedded;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UsageError{a + " needs a value"};
      return args[++i];
    };
    if (a == "--symbolic") {
      const std::string v = value();
      const auto colon = v.rfind(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == v.size())
        throw UsageError{"--symbolic needs INPUT:AXIS[,AXIS], e.g. 'x:0', got '" + v + "'"};
      auto& axes = symbolic[v.substr(0, colon)];
      for (const auto& item : split(v.substr(colon + 1), ',')) axes.push_back(parse_int(item, "--symbolic"));
    } else if (a == "--embedded") {
      const std::string v = value();
      if (v.empty()) throw UsageError{"--embedded needs comma-separated initializer names"};
      for (const auto& n : split(v, ',')) {
        if (n.empty()) throw UsageError{"--embedded: empty name in '" + v + "'"};
        embedded.push_back(n);
      }
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError{"unknown option '" + a + "' for check"};
    } else if (path.empty()) {
      path = a;
    } else {
      throw UsageError{"unexpected argument '" + a + "' (check takes one model)"};
    }
  }
  if (path.empty()) throw UsageError{"check needs a model: onnax check MODEL.onnx"};

  const onnx::ModelProto model = load_model(path);
  std::cout << "onnax check " << path << "\n";
  describe(model, std::cout);

  std::vector<Step> steps;
  auto single = [](const std::string& p) { return p.empty() ? std::vector<std::string>{} : std::vector{p}; };
  steps.push_back({"checker", single(check::checker(model))});
  // Inference on a structurally invalid graph reports confusing follow-on errors: skip it.
  const bool structure_ok = steps.back().problems.empty();
  if (structure_ok) steps.push_back({"strict shape inference", single(check::strict_shape_inference(model))});
  if (!symbolic.empty()) {
    std::vector<std::string> what;
    for (const auto& [name, axes] : symbolic) {
      std::vector<std::string> list;
      for (int64_t a : axes) list.push_back(std::to_string(a));
      what.push_back(name + ":" + diag::join(list, ","));
    }
    steps.push_back({"symbolic lengths (" + diag::join(what, " ") + ")", check::symbolic_lengths(model, symbolic)});
  }
  if (!embedded.empty())
    steps.push_back({"embedded weights (" + diag::join(embedded, ",") + ")", check::embedded_weights(model, embedded)});

  int failed = 0;
  for (const auto& s : steps) {
    std::cout << "  [" << (s.problems.empty() ? "pass" : "FAIL") << "] " << s.name << "\n";
    for (const auto& p : s.problems) std::cout << "         " << p << "\n";
    failed += s.problems.empty() ? 0 : 1;
    if (s.name == "checker" && !structure_ok) std::cout << "  [skip] strict shape inference (the checker failed)\n";
  }
  if (failed) {
    std::cout << "onnax check: FAILED (" << failed << " of " << steps.size() << " checks; first: " << [&] {
      for (const auto& s : steps)
        if (!s.problems.empty()) return s.name;
      return std::string();
    }() << ")\n";
    return 1;
  }
  std::cout << "onnax check: all " << steps.size() << " checks passed\n";
  return 0;
}

}  // namespace onnax::cli
