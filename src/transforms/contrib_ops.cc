#include "transforms/contrib_ops.h"

#include <cmath>
#include <functional>
#include <map>
#include <optional>

#include "diagnostics/error.h"
#include "emit/graph_writer.h"

namespace onnax {
namespace {

const std::string kDomain = "com.microsoft";

std::optional<int64_t> int_attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name && a.type() == onnx::AttributeProto::INT) return a.i();
  return std::nullopt;
}

double float_attr(const onnx::NodeProto& n, const std::string& name, double otherwise) {
  for (const auto& a : n.attribute())
    if (a.name() == name && a.type() == onnx::AttributeProto::FLOAT) return a.f();
  return otherwise;
}

using FactsOf = std::function<const Facts*(const std::string&)>;

// One contrib node being expanded: its inputs and outputs by position, the facts known of its
// inputs, and a writer whose nodes replace it.
class Expansion {
 public:
  Expansion(const onnx::NodeProto& n, NameScope& names, onnx::GraphProto& g, const FactsOf& facts,
            const std::string& mode)
      : n_(n),
        g_(g),
        facts_(facts),
        mode_(mode),
        dtype_(dtype(0)),
        w_(names, g, n.name().empty() ? n.output(0) : n.name(),
           dtype_ == onnx::TensorProto::DOUBLE ? dtype_ : onnx::TensorProto::FLOAT) {}

  const onnx::NodeProto& node() const { return n_; }
  // Input i, or "" when absent.
  std::string in(int i) const { return i < n_.input_size() ? n_.input(i) : std::string(); }
  // Output i's name, or "" when the node leaves it out.
  std::string out(int i) const { return i < n_.output_size() ? n_.output(i) : std::string(); }
  int64_t rank(int i) const {
    const Facts* f = in(i).empty() ? nullptr : facts_(in(i));
    return f ? f->rank() : -1;
  }
  int32_t dtype(int i) const {
    const Facts* f = in(i).empty() ? nullptr : facts_(in(i));
    return f ? f->dtype : 0;
  }

  std::string op(std::string_view type, const Names& inputs, AttrList attrs = {}, std::string out = {}) {
    return w_.op(type, inputs, std::move(attrs), std::move(out));
  }
  void op_n(std::string_view type, const Names& inputs, Names outs, AttrList attrs) {
    const int count = static_cast<int>(outs.size());  // (before `outs` is moved from)
    w_.op_n(type, inputs, count, std::move(attrs), std::move(outs));
  }
  // Makes `v` the node's output i when the node has it: the expansion's value is renamed, or
  // copied by an Identity when the expansion did not write it (an input passed through).
  // Returns the name that now holds `v`.
  std::string output(int i, const std::string& v) {
    if (out(i).empty()) return v;
    bool written = false;
    for (const auto& n : g_.node())
      for (const auto& o : n.output()) written = written || o == v;
    if (!written) return op("Identity", {v}, {}, out(i));
    for (auto& n : *g_.mutable_node()) {
      for (auto& x : *n.mutable_input())
        if (x == v) x = out(i);
      for (auto& o : *n.mutable_output())
        if (o == v) o = out(i);
    }
    return out(i);
  }
  // The scalar `v` in input 0's type: a constant of that type when it is float or double (or
  // unknown: float), else a float constant cast like input 0.
  std::string scalar(double v) {
    const bool direct = dtype_ == 0 || dtype_ == onnx::TensorProto::FLOAT || dtype_ == onnx::TensorProto::DOUBLE;
    return direct ? w_.scalar(v) : op("CastLike", {w_.scalar(v), in(0)});
  }
  // `v` as float32 (double for a double input): for computations stashed in float32.
  std::string float_scalar(double v) { return w_.scalar(v); }
  std::string i64s(const std::vector<int64_t>& v) { return w_.i64s(v); }

  [[noreturn]] void refuse(const std::string& why, const std::string& fix) const {
    const std::string domain = n_.domain().empty() ? "ai.onnx" : n_.domain();
    diag::fail(Error::Kind::kUnsupported, mode_ + ": cannot expand " + domain + "::" + n_.op_type() + " at node '" +
                                              (n_.name().empty() ? n_.output(0) : n_.name()) + "': " + why +
                                              ". Fix: " + fix);
  }

 private:
  const onnx::NodeProto& n_;
  onnx::GraphProto& g_;  // what the expansion writes
  const FactsOf& facts_;
  const std::string& mode_;
  int32_t dtype_;
  GraphWriter w_;
};

// x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
std::string gelu(Expansion& e, const std::string& x) {
  const std::string erf = e.op("Erf", {e.op("Mul", {x, e.scalar(M_SQRT1_2)})});
  return e.op("Mul", {e.op("Mul", {x, e.scalar(0.5)}), e.op("Add", {erf, e.scalar(1.0)})});
}

std::string plus_optional(Expansion& e, const std::string& x, int i) {
  return e.in(i).empty() ? x : e.op("Add", {x, e.in(i)});
}

void expand_gelu(Expansion& e) {
  e.output(0, gelu(e, e.in(0)));
}
void expand_bias_gelu(Expansion& e) {
  e.output(0, gelu(e, plus_optional(e, e.in(0), 1)));
}

// ONNX Runtime's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void expand_fast_gelu(Expansion& e) {
  const std::string x = plus_optional(e, e.in(0), 1);
  const double k = std::sqrt(2.0 / M_PI);
  const std::string inner =
      e.op("Mul", {x, e.op("Add", {e.scalar(k), e.op("Mul", {e.op("Mul", {x, x}), e.scalar(0.044715 * k)})})});
  e.output(0, e.op("Mul", {e.op("Mul", {x, e.scalar(0.5)}), e.op("Add", {e.op("Tanh", {inner}), e.scalar(1.0)})}));
}

void expand_quick_gelu(Expansion& e) {
  const double alpha = float_attr(e.node(), "alpha", 1.702);
  const std::string x = e.in(0);
  e.output(0, e.op("Mul", {x, e.op("Sigmoid", {e.op("Mul", {x, e.scalar(alpha)})})}));
}

void expand_bias_add(Expansion& e) {
  e.output(0, e.op("Add", {e.op("Add", {e.in(0), e.in(1)}), e.in(2)}));
}

// alpha op(A) op(B), op transposing the last two axes when transA / transB is set.
void expand_fused_matmul(Expansion& e) {
  const onnx::NodeProto& n = e.node();
  if (int_attr(n, "transBatchA").value_or(0) != 0 || int_attr(n, "transBatchB").value_or(0) != 0)
    e.refuse("transBatchA / transBatchB (moving batch axes) are not expanded",
             "run the model without ONNX Runtime's FusedMatMul batch transposes (optimization level basic)");
  const bool ta = int_attr(n, "transA").value_or(0) != 0, tb = int_attr(n, "transB").value_or(0) != 0;
  auto transposed = [&](int i) -> std::optional<std::string> {
    const int64_t r = e.rank(i);
    if (r < 2) return std::nullopt;
    std::vector<int64_t> perm;
    for (int64_t k = 0; k < r; ++k) perm.push_back(k < r - 2 ? k : 2 * r - 3 - k);
    return e.op("Transpose", {e.in(i)}, {attr_ints("perm", perm)});
  };
  std::optional<std::string> a = ta ? transposed(0) : e.in(0), b = tb ? transposed(1) : e.in(1);
  std::string y;
  if (a && b) {
    y = e.op("MatMul", {*a, *b});
  } else {  // (a rank not known here: an Einsum transposes whatever the batch axes)
    onnx::AttributeProto eq;
    eq.set_name("equation");
    eq.set_type(onnx::AttributeProto::STRING);
    eq.set_s(std::string(ta ? "...ji" : "...ij") + (tb ? ",...kj" : ",...jk") + "->...ik");
    y = e.op("Einsum", {e.in(0), e.in(1)}, {eq});
  }
  const double alpha = float_attr(n, "alpha", 1.0);
  e.output(0, alpha == 1.0 ? y : e.op("Mul", {y, e.scalar(alpha)}));
}

// The axes from `axis` to the last (negative, so the rank need not be known).
std::vector<int64_t> trailing_axes(Expansion& e, int64_t axis) {
  if (axis >= 0) {
    const int64_t r = e.rank(0);
    if (r < 0)
      e.refuse("axis " + std::to_string(axis) + " counts from the front and the input's rank is not known",
               "declare the input's shape (value_info) or use a negative axis");
    axis -= r;
  }
  std::vector<int64_t> axes;
  for (int64_t a = axis; a < 0; ++a) axes.push_back(a);
  return axes;
}

// Y = x / sqrt(mean(x^2) + eps) * scale over `axes`; the inverse root to output `inv_out`.
// With stash_type 1 (the default) a float16/bfloat16 input is computed in float32.
std::string rms_norm(Expansion& e, const std::string& x, const std::string& scale, const std::vector<int64_t>& axes,
                     int inv_out) {
  const int32_t dt = e.dtype(0);
  const bool stash = int_attr(e.node(), "stash_type").value_or(1) == 1 &&
                     (dt == onnx::TensorProto::FLOAT16 || dt == onnx::TensorProto::BFLOAT16);
  const std::string xf = stash ? e.op("Cast", {x}, {attr_i("to", onnx::TensorProto::FLOAT)}) : x;
  const std::string mean_square = e.op("ReduceMean", {e.op("Mul", {xf, xf}), e.i64s(axes)}, {attr_i("keepdims", 1)});
  const double epsilon = float_attr(e.node(), "epsilon", 1e-5);
  const std::string eps = stash ? e.float_scalar(epsilon) : e.scalar(epsilon);
  const std::string inv = e.output(inv_out, e.op("Reciprocal", {e.op("Sqrt", {e.op("Add", {mean_square, eps})})}));
  std::string normed = e.op("Mul", {xf, inv});
  if (stash) normed = e.op("CastLike", {normed, x});
  return e.op("Mul", {normed, scale});
}

void expand_simplified_layer_norm(Expansion& e) {
  const std::vector<int64_t> axes = trailing_axes(e, int_attr(e.node(), "axis").value_or(-1));
  e.output(0, rms_norm(e, e.in(0), e.in(1), axes, 1));
}

// input + skip (+ bias): the sum the Skip* ops normalize (and give as output 3).
std::string skip_sum(Expansion& e, int bias_input) {
  return e.output(3, plus_optional(e, e.op("Add", {e.in(0), e.in(1)}), bias_input));
}

void expand_skip_simplified_layer_norm(Expansion& e) {
  if (!e.out(1).empty())
    e.refuse("its output 1 (mean) is one ONNX Runtime does not compute", "drop the node's second output");
  const std::string s = skip_sum(e, 3);
  e.output(0, rms_norm(e, s, e.in(2), {-1}, 2));
}

// ONNX's LayerNormalization (opset 17) of `x`, to the node's outputs 0, `mean_out` and
// `inv_out` (Y, Mean, InvStdDev: the shapes ONNX Runtime's contrib ops give them).
void layer_norm(Expansion& e, const std::string& x, const std::string& scale, const std::string& bias, int mean_out,
                int inv_out, AttrList attrs) {
  Names inputs{x, scale};
  if (!bias.empty()) inputs.push_back(bias);
  Names outs{e.out(0), e.out(mean_out), e.out(inv_out)};
  while (outs.size() > 1 && outs.back().empty()) outs.pop_back();
  // (A left-out Mean before a wanted InvStdDev gets a name of its own, read by nothing.)
  e.op_n("LayerNormalization", inputs, outs, std::move(attrs));
}

void expand_skip_layer_norm(Expansion& e) {
  const std::string s = skip_sum(e, 4);
  layer_norm(e, s, e.in(2), e.in(3), 1, 2,
             {attr_i("axis", -1), attr_f("epsilon", static_cast<float>(float_attr(e.node(), "epsilon", 1e-12)))});
}

const std::map<std::string, void (*)(Expansion&), std::less<>>& expansions() {
  static const std::map<std::string, void (*)(Expansion&), std::less<>> table{
      {"Gelu", expand_gelu},
      {"BiasGelu", expand_bias_gelu},
      {"FastGelu", expand_fast_gelu},
      {"QuickGelu", expand_quick_gelu},
      {"BiasAdd", expand_bias_add},
      {"FusedMatMul", expand_fused_matmul},
      {"SimplifiedLayerNormalization", expand_simplified_layer_norm},
      {"SkipLayerNormalization", expand_skip_layer_norm},
      {"SkipSimplifiedLayerNormalization", expand_skip_simplified_layer_norm},
  };
  return table;
}

// ONNX Runtime registers SimplifiedLayerNormalization (RMS normalization) in the default
// domain, where ONNX itself has no such op; the others are com.microsoft's.
bool covered_in(const std::string& domain, const std::string& op) {
  if (domain.empty() || domain == "ai.onnx") return op == "SimplifiedLayerNormalization";
  return domain == kDomain && expansions().count(op) > 0;
}

bool covered(const onnx::NodeProto& n) {
  return covered_in(n.domain(), n.op_type());
}

bool any_covered(const onnx::GraphProto& g) {
  for (const auto& n : g.node()) {
    if (covered(n)) return true;
    for (const auto& a : n.attribute()) {
      if (a.has_g() && any_covered(a.g())) return true;
      for (const auto& sg : a.graphs())
        if (any_covered(sg)) return true;
    }
  }
  return false;
}

// Rewrites `g` (and its subgraphs) in place, keeping the node order.
void expand_graph(onnx::GraphProto& g, NameScope& names, const FactsOf& facts, const std::string& mode) {
  google::protobuf::RepeatedPtrField<onnx::NodeProto> rewritten;
  for (auto& n : *g.mutable_node()) {
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) expand_graph(*a.mutable_g(), names, facts, mode);
      for (auto& sg : *a.mutable_graphs()) expand_graph(sg, names, facts, mode);
    }
    if (!covered(n)) {
      *rewritten.Add() = std::move(n);
      continue;
    }
    onnx::GraphProto scratch;
    Expansion e(n, names, scratch, facts, mode);
    expansions().find(n.op_type())->second(e);
    for (auto& written : *scratch.mutable_node()) *rewritten.Add() = std::move(written);
  }
  g.mutable_node()->Swap(&rewritten);
}

}  // namespace

bool is_expanded_contrib_op(const std::string& domain, const std::string& op) {
  return covered_in(domain, op);
}

std::string unexpanded_contrib_op_advice(const onnx::NodeProto& node) {
  if (node.domain() != kDomain) return "";
  std::string covered;
  for (const auto& [op, expand] : expansions()) covered += (covered.empty() ? "" : ", ") + op;
  std::string advice = "it is an ONNX Runtime contrib op that onnax does not expand into standard ops (it expands " +
                       covered + ", and the default-domain SimplifiedLayerNormalization). Fix: ";
  if (node.op_type() == "Attention" || node.op_type() == "MultiHeadAttention")
    advice +=
        "run ONNX Runtime's transformer optimizer without attention fusion "
        "(FusionOptions.enable_attention = False, passed as optimization_options), or transform the model "
        "before optimizing it";
  else
    advice += "transform the model before ONNX Runtime's optimizer fuses it, or optimize with fewer fusions";
  return advice;
}

bool expand_contrib_ops(Prepared& p, const std::string& mode) {
  if (!any_covered(*p.graph)) return false;
  onnx::GraphProto& g = mutable_graph(p);
  const FactsOf facts = [&](const std::string& name) -> const Facts* {
    const int id = p.value_names.id(name);
    return id < 0 ? nullptr : &p.facts.at(id);
  };
  expand_graph(g, p.value_names, facts, mode);
  return true;
}

}  // namespace onnax
