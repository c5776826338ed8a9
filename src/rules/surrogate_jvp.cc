#include "rules/surrogate_jvp.h"

#include <onnax/surrogate.h>

#include <cmath>
#include <numbers>
#include <set>

#include "diagnostics/error.h"
#include "emit/builder.h"
#include "ir/graph_edit.h"

namespace onnax {
namespace {

struct KindInfo {
  const char* name;
  std::map<std::string, double> defaults;
};

const std::vector<KindInfo>& kinds() {
  static const std::vector<KindInfo> all = {
      {"superspike", {{"k", 25.0}}}, {"arctan", {{"k", 2.0}}},
      {"triangular", {{"k", 2.0}}},  {"boxcar", {{"width", 2.0}, {"height", 0.5}}},
      {"tanh", {{"k", 1.0}}},        {"straight_through", {}},
  };
  return all;
}

std::string canonical_kind(const std::string& kind) {
  if (kind == "fast_sigmoid") return "superspike";
  if (kind == "triangle") return "triangular";
  if (kind == "ste") return "straight_through";
  return kind;
}

std::string canonical_param(const std::string& kind, const std::string& name) {
  if (name == "slope" && kind == "superspike") return "k";
  if (name == "alpha" && kind == "arctan") return "k";
  return name;
}

bool is_comparison(const onnx::NodeProto& n) {
  return is_default_domain(n) &&
         (n.op_type() == "Greater" || n.op_type() == "GreaterOrEqual" || n.op_type() == "Less" ||
          n.op_type() == "LessOrEqual") &&
         n.input_size() == 2;
}

bool casts_to_float(const onnx::NodeProto& n) {
  for (const auto& a : n.attribute())
    if (a.name() == "to")
      return a.i() == onnx::TensorProto::FLOAT || a.i() == onnx::TensorProto::DOUBLE ||
             a.i() == onnx::TensorProto::FLOAT16 || a.i() == onnx::TensorProto::BFLOAT16;
  return false;
}

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

Surrogate parse_surrogate(const std::string& spec) {
  Surrogate s;
  std::string rest = spec;
  const size_t colon = rest.find(':');
  const size_t eq = rest.find('=');
  if (eq != std::string::npos && (colon == std::string::npos || eq < colon)) {
    s.value = rest.substr(0, eq);
    rest = rest.substr(eq + 1);
    if (s.value.empty())
      diag::fail(Error::Kind::kSelection,
                 "surrogate '" + spec + "': no value name before '='. Fix: 'VALUE=KIND' or 'KIND'");
  }
  const size_t c = rest.find(':');
  s.kind = canonical_kind(rest.substr(0, c));
  const KindInfo* info = nullptr;
  for (const auto& k : kinds())
    if (s.kind == k.name) info = &k;
  if (!info) {
    std::vector<std::string> names;
    for (const auto& k : kinds()) names.push_back(k.name);
    diag::fail(Error::Kind::kSelection,
               "surrogate '" + spec + "': unknown kind '" + s.kind + "' (known: " + diag::join(names) +
                   ", and the aliases fast_sigmoid, triangle, ste)" + ". Fix: name one of those, e.g. superspike:k=25");
  }
  s.params = info->defaults;
  if (c != std::string::npos) {
    std::string params = rest.substr(c + 1);
    size_t start = 0;
    while (start <= params.size()) {
      const size_t end = std::min(params.find(',', start), params.size());
      const std::string item = params.substr(start, end - start);
      const size_t e = item.find('=');
      const std::string name = canonical_param(s.kind, item.substr(0, e));
      if (e == std::string::npos || !info->defaults.count(name)) {
        std::vector<std::string> known;
        for (const auto& [k, v] : info->defaults) known.push_back(k);
        diag::fail(Error::Kind::kSelection, "surrogate '" + spec + "': '" + item + "' is not a parameter of " + s.kind +
                                                " (parameters: " + diag::join(known) +
                                                "). Fix: write NAME=NUMBER, e.g. " + s.kind +
                                                (known.empty() ? "" : ":" + known[0] + "=2"));
      }
      const std::string number = item.substr(e + 1);
      char* parsed_end = nullptr;
      const double v = std::strtod(number.c_str(), &parsed_end);
      if (number.empty() || *parsed_end != '\0' || !std::isfinite(v) || v <= 0)
        diag::fail(Error::Kind::kSelection, "surrogate '" + spec + "': " + name + " = '" + number +
                                                "' is not a positive number. Fix: e.g. " + name + "=2");
      s.params[name] = v;
      start = end + 1;
    }
  }
  return s;
}

std::string surrogate_text(const Surrogate& s) {
  std::string out = s.kind;
  char sep = ':';
  for (const auto& [name, v] : s.params) {
    out += sep + name + "=" + format_number(v);
    sep = ',';
  }
  return out;
}

const std::string* surrogate_mark(const onnx::NodeProto& node) {
  for (const auto& e : node.metadata_props())
    if (e.key() == kSurrogateKey) return &e.value();
  return nullptr;
}

std::optional<SpikeOperands> spike_operands(const onnx::NodeProto& node,
                                            const std::unordered_map<std::string, const onnx::NodeProto*>& producer) {
  auto made_by = [&](const std::string& name) -> const onnx::NodeProto* {
    auto it = producer.find(name);
    return it == producer.end() ? nullptr : it->second;
  };
  auto from_comparison = [](const onnx::NodeProto& cmp, SpikeOperands s) {
    s.a = cmp.input(0);
    s.b = cmp.input(1);
    s.reversed = cmp.op_type() == "Less" || cmp.op_type() == "LessOrEqual";
    return s;
  };
  auto from_where = [&](const onnx::NodeProto& where) -> std::optional<SpikeOperands> {
    if (where.op_type() != "Where" || !is_default_domain(where) || where.input_size() != 3) return std::nullopt;
    const onnx::NodeProto* cmp = made_by(where.input(0));
    if (!cmp || !is_comparison(*cmp)) return std::nullopt;
    SpikeOperands s;
    s.v1 = where.input(1);
    s.v0 = where.input(2);
    return from_comparison(*cmp, s);
  };
  if (!is_default_domain(node) || node.input_size() == 0) return std::nullopt;
  if (node.op_type() == "Sign") {
    SpikeOperands s;
    s.a = node.input(0);
    s.sign = true;
    return s;
  }
  if (node.op_type() == "Where") return from_where(node);
  if (node.op_type() != "Cast" || !casts_to_float(node)) return std::nullopt;
  const onnx::NodeProto* in = made_by(node.input(0));
  if (!in) return std::nullopt;
  if (is_comparison(*in)) return from_comparison(*in, {});
  return from_where(*in);
}

Vs surrogate_jvp(JvpCtx& c, const SpikeOperands& spike, const std::string& mark) {
  Surrogate s;
  try {
    s = parse_surrogate(mark);
  } catch (const Error& e) {
    diag::fail(Error::Kind::kInvalidModel, "the node's metadata_props['" + std::string(kSurrogateKey) +
                                               "'] is not a surrogate onnax wrote: " + e.what());
  }
  Builder& b = c.b;
  // x, the comparison's margin, and its tangent.
  V x = c.x(0), tx = c.t(0);
  if (!spike.sign) {
    x = spike.reversed ? b.op1("Sub", {c.x(1), c.x(0)}) : b.op1("Sub", {c.x(0), c.x(1)});
    tx = spike.reversed ? b.sub(c.t(1), c.t(0)) : b.sub(c.t(0), c.t(1));
  }
  if (!tx.valid()) return {V{}};
  auto k = [&](const char* name) { return c.scalar(s.params.at(name)); };
  auto abs_x = [&] { return b.op1("Abs", {x}); };
  V g;  // the surrogate's derivative at x (invalid: 1)
  if (s.kind == "superspike") {
    V den = b.op1("Add", {c.scalar(1.0), b.op1("Mul", {k("k"), abs_x()})});
    g = b.op1("Reciprocal", {b.op1("Mul", {den, den})});
  } else if (s.kind == "arctan") {
    V kpx = b.op1("Mul", {c.scalar(s.params.at("k") * std::numbers::pi), x});
    V den = b.op1("Mul", {c.scalar(std::numbers::pi), b.op1("Add", {c.scalar(1.0), b.op1("Mul", {kpx, kpx})})});
    g = b.op1("Reciprocal", {den});
  } else if (s.kind == "triangular") {
    g = b.op1("Relu", {b.op1("Sub", {c.scalar(1.0), b.op1("Mul", {k("k"), abs_x()})})});
  } else if (s.kind == "boxcar") {
    V inside = b.op1("Less", {abs_x(), c.scalar(s.params.at("width") / 2)});
    g = b.op1("Where", {inside, k("height"), c.scalar(0.0)});
  } else if (s.kind == "tanh") {
    V th = b.op1("Tanh", {b.op1("Mul", {k("k"), x})});
    g = b.op1("Sub", {c.scalar(1.0), b.op1("Mul", {th, th})});
  }
  if (spike.sign) g = g.valid() ? b.op1("Mul", {g, c.scalar(2.0)}) : c.scalar(2.0);
  if (!spike.v1.empty()) {
    // A Where(cond, v1, v0) spike is v0 + (v1 - v0) H(x).
    V scale = b.op1("Sub", {c.x(2), c.x(3)});
    if (b.facts(scale).dtype != c.dtype(0)) scale = b.op1("Cast", {scale}, {Attr::i("to", c.dtype(0))});
    g = g.valid() ? b.op1("Mul", {g, scale}) : scale;
  }
  V t = c.like_out(g.valid() ? b.mul(tx, g) : tx);
  const int32_t out = b.facts(c.y()).dtype;
  if (out != 0 && out != c.dtype(0)) t = b.op1("Cast", {t}, {Attr::i("to", out)});
  return {t};
}

}  // namespace onnax
