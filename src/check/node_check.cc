#include "check/node_check.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <set>
#include <vector>

namespace onnax {
namespace {

// The remedy for what ONNX's own checks also report (onnx.checker's node checks; strict shape
// inference for attribute values).
constexpr const char* kCheckerFix =
    ". Fix: repair the node (onnx.checker.check_model(model, full_check=True) reports such defects)";

std::string required_inputs(const onnx::OpSchema& schema, const onnx::NodeProto& node, const int32_t* input_ids) {
  const auto& formals = schema.inputs();
  if (node.input_size() < schema.min_input())
    return "has " + std::to_string(node.input_size()) + " input(s); its schema requires at least " +
           std::to_string(schema.min_input()) + kCheckerFix;
  for (int i = 0; i < node.input_size() && !formals.empty(); ++i) {
    if (input_ids[i] >= 0) continue;  // (the ids spare reading every input's name)
    // Inputs past the formal list belong to the last (variadic) formal input.
    const size_t formal = std::min(static_cast<size_t>(i), formals.size() - 1);
    const auto option = formals[formal].GetOption();
    if (option == onnx::OpSchema::Optional) continue;
    if (option == onnx::OpSchema::Variadic)
      return "gives its variadic input " + std::to_string(i) + " ('" + formals[formal].GetName() +
             "') an empty name. ONNX accepts that, but the node's rule cannot read a value that is not there. "
             "Fix: drop the empty names from the node's inputs";
    return "gives its required input " + std::to_string(i) + " ('" + formals[formal].GetName() +
           "') an empty name, so it has no value" + kCheckerFix;
  }
  return "";
}

// Output counts in the schema's range, and a name for every output it requires.
std::string required_outputs(const onnx::OpSchema& schema, const onnx::NodeProto& node, const int32_t* output_ids) {
  const int count = node.output_size();
  if (count < schema.min_output() || count > schema.max_output())
    return "has " + std::to_string(count) + " output(s); its schema allows " +
           (schema.min_output() == schema.max_output() ? std::to_string(schema.min_output())
            : schema.max_output() == std::numeric_limits<int>::max()
                ? std::to_string(schema.min_output()) + " or more"
                : std::to_string(schema.min_output()) + " to " + std::to_string(schema.max_output())) +
           kCheckerFix;
  const auto& formals = schema.outputs();
  for (int i = 0; i < count && !formals.empty(); ++i) {
    if (output_ids[i] >= 0) continue;  // (as for inputs: no output name read)
    const size_t formal = std::min(static_cast<size_t>(i), formals.size() - 1);
    if (formals[formal].GetOption() == onnx::OpSchema::Single)
      return "gives its required output " + std::to_string(i) + " ('" + formals[formal].GetName() + "') an empty name" +
             kCheckerFix;
  }
  return "";
}

std::string listed(const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return "[" + out + "]";
}

std::string transpose_perm(const onnx::NodeProto& node, int64_t rank) {
  for (const auto& a : node.attribute()) {
    if (a.name() != "perm") continue;
    const int64_t n = a.ints_size();
    std::vector<char> seen(static_cast<size_t>(n), 0);
    bool permutation = rank < 0 || n == rank;
    for (int64_t p : a.ints()) {
      permutation = permutation && p >= 0 && p < n && !seen[static_cast<size_t>(p)];
      if (p >= 0 && p < n) seen[static_cast<size_t>(p)] = 1;
    }
    if (permutation) return "";
    return "has perm " + listed({a.ints().begin(), a.ints().end()}) + ", which is not a permutation of the axes 0.." +
           std::to_string((rank < 0 ? n : rank) - 1) + " of its input (rank " +
           (rank < 0 ? std::string("unknown") : std::to_string(rank)) + ")" + kCheckerFix;
  }
  return "";
}

// 0 <= batch_dims < the rank of data and of indices (those known).
std::string gathernd_batch_dims(const onnx::NodeProto& node, int64_t data_rank, int64_t indices_rank) {
  for (const auto& a : node.attribute()) {
    if (a.name() != "batch_dims") continue;
    const int64_t b = a.i();
    if (b >= 0 && (data_rank < 0 || b < data_rank) && (indices_rank < 0 || b < indices_rank)) return "";
    return "has batch_dims " + std::to_string(b) + ", which must be at least 0 and below the ranks of data (" +
           (data_rank < 0 ? std::string("unknown") : std::to_string(data_rank)) + ") and indices (" +
           (indices_rank < 0 ? std::string("unknown") : std::to_string(indices_rank)) + ")" + kCheckerFix;
  }
  return "";
}

// Reduce*: every axis in [-rank, rank). (An axis named twice is accepted, as ONNX's checks and
// ONNX Runtime accept it; the rules reduce it once.)
std::string reduced_axes(const onnx::NodeProto& node, const NodeInputFacts& inputs) {
  std::vector<int64_t> axes;
  bool given = false;
  for (const auto& a : node.attribute())
    if (a.name() == "axes") {
      axes.assign(a.ints().begin(), a.ints().end());
      given = true;
    }
  if (!given && node.input_size() > 1 && !node.input(1).empty()) {
    const std::vector<int64_t>* k = inputs.constant_ints(1);
    if (!k) return "";  // known at run time only
    axes = *k;
  }
  const int64_t rank = inputs.rank(0);
  for (int64_t a : axes)
    if (rank >= 0 && (a < -rank || a >= rank))
      return "reduces axes " + listed(axes) + ", which must lie in [-" + std::to_string(rank) + ", " +
             std::to_string(rank) + ") for its input of rank " + std::to_string(rank) + kCheckerFix;
  return "";
}

// An `axis` attribute counting axes of input 0: in [-rank, rank) (Flatten: up to rank). Ops
// whose axis means something else (OneHot's output axis, DFT's signal axis, a per-tensor
// DequantizeLinear ignoring its default-like axis) are left to their rules.
std::string axis_in_range(const std::string& op, const onnx::NodeProto& node, int64_t rank) {
  if (rank < 0 || op == "OneHot" || op == "DFT" || op == "QuantizeLinear" || op == "DequantizeLinear" ||
      op == "ConcatFromSequence")
    return "";
  const int64_t top = op == "Flatten" ? rank : rank - 1;
  for (const auto& a : node.attribute()) {
    if (a.name() != "axis" || a.type() != onnx::AttributeProto::INT) continue;
    if (a.i() >= -rank && a.i() <= top) return "";
    return "has axis " + std::to_string(a.i()) + ", outside [-" + std::to_string(rank) + ", " + std::to_string(top) +
           "] for its input of rank " + std::to_string(rank) + kCheckerFix;
  }
  return "";
}

// A required attribute the node leaves out (Einsum's equation, Cast's `to`, ...).
std::string required_attributes(const onnx::OpSchema& schema, const onnx::NodeProto& node) {
  for (const auto& [name, attr] : schema.attributes()) {
    if (!attr.required) continue;
    bool present = false;
    for (const auto& a : node.attribute()) present = present || a.name() == name;
    if (!present) return "lacks its required attribute '" + name + "'" + kCheckerFix;
  }
  return "";
}

// Einsum's equation as ONNX defines it: comma-separated terms of letters (and at most one
// "..." each), one per input, optionally "->" and an output term; spaces allowed. (ONNX's own
// inference loops forever on some malformed ones, e.g. a '>' without '-'.)
std::string einsum_equation(const onnx::NodeProto& node) {
  std::string eq;
  for (const auto& a : node.attribute())
    if (a.name() == "equation") eq = a.s();
  std::string compact;
  for (char ch : eq)
    if (ch != ' ') compact.push_back(ch);
  const size_t arrow = compact.find("->");
  const std::string lhs = compact.substr(0, arrow);
  const std::string rhs = arrow == std::string::npos ? std::string() : compact.substr(arrow + 2);
  auto bad = [&](const std::string& why) { return "has equation '" + eq + "', which " + why + kCheckerFix; };
  if (rhs.find("->") != std::string::npos) return bad("has more than one '->'");
  int terms = 1;
  auto check_term = [&](const std::string& term) -> std::string {
    const size_t dots = term.find("...");
    if (dots != std::string::npos && term.find("...", dots + 3) != std::string::npos)
      return "has a term with two ellipses";
    for (size_t i = 0; i < term.size(); ++i) {
      const char ch = term[i];
      if (std::isalpha(static_cast<unsigned char>(ch))) continue;
      if (ch == '.' && dots != std::string::npos && i >= dots && i < dots + 3) continue;
      return std::string("has the character '") + ch + "' where only letters and one '...' per term may stand";
    }
    return "";
  };
  size_t start = 0;
  for (size_t i = 0; i <= lhs.size(); ++i) {
    if (i < lhs.size() && lhs[i] != ',') continue;
    if (std::string why = check_term(lhs.substr(start, i - start)); !why.empty()) return bad(why);
    if (i < lhs.size()) ++terms;
    start = i + 1;
  }
  if (std::string why = check_term(rhs); !why.empty()) return bad(why);
  if (terms != node.input_size())
    return bad("has " + std::to_string(terms) + " input term(s) for " + std::to_string(node.input_size()) +
               " input(s)");
  return "";
}

// Convolutions and pools read N x C x D1 ... Dk inputs and per-axis attribute lists: each list
// must have one entry per spatial axis (pads two), as kernel_shape or the input's rank gives.
std::string spatial_attributes(const std::string& op, const onnx::NodeProto& node, int64_t rank) {
  const int64_t min_rank = op == "LRN" ? 2 : 3;
  if (rank >= 0 && rank < min_rank)
    return "reads an input of rank " + std::to_string(rank) + "; " + op + " needs N x C" +
           (min_rank == 3 ? " x D1 ... (rank 3 or more)" : " ... (rank 2 or more)") + kCheckerFix;
  if (op == "LRN") return "";
  int64_t spatial = rank >= 0 ? rank - 2 : -1;
  for (const auto& a : node.attribute())
    if (a.name() == "kernel_shape") {
      if (spatial >= 0 && a.ints_size() != spatial)
        return "has kernel_shape of " + std::to_string(a.ints_size()) + " entries for " + std::to_string(spatial) +
               " spatial axes" + kCheckerFix;
      spatial = a.ints_size();
    }
  if (spatial < 0) return "";
  for (const auto& a : node.attribute()) {
    const bool per_axis = a.name() == "strides" || a.name() == "dilations" || a.name() == "output_padding";
    const int64_t want = a.name() == "pads" ? 2 * spatial : spatial;
    if ((per_axis || a.name() == "pads") && a.ints_size() != want)
      return "has " + a.name() + " of " + std::to_string(a.ints_size()) + " entries; expected " + std::to_string(want) +
             " (" + (a.name() == "pads" ? "two per spatial axis" : "one per spatial axis") + ")" + kCheckerFix;
  }
  return "";
}

// Attention's query, key and value are 3-D (N, seq, hidden) or 4-D (N, heads, seq, head_size);
// its rules build shapes from the query's rank (a rank-0 query made vmap size a vector by -1).
std::string attention_ranks(const NodeInputFacts& inputs) {
  static const char* const kRoles[] = {"query", "key", "value"};
  for (int i = 0; i < 3; ++i) {
    const int64_t rank = inputs.rank(i);
    if (rank >= 0 && rank != 3 && rank != 4)
      return std::string("reads a ") + kRoles[i] + " (input " + std::to_string(i) + ") of rank " +
             std::to_string(rank) + "; Attention needs rank 3 or 4" + kCheckerFix;
  }
  return "";
}

// Subgraph inputs and outputs must be named: the enclosing node's values map to them by name.
std::string subgraph_names(const onnx::NodeProto& node) {
  for (const auto& a : node.attribute()) {
    std::vector<const onnx::GraphProto*> graphs;
    if (a.has_g()) graphs.push_back(&a.g());
    for (const auto& g : a.graphs()) graphs.push_back(&g);
    for (const auto* g : graphs) {
      for (const auto& vi : g->output())
        if (vi.name().empty()) return "has a subgraph ('" + a.name() + "') with an unnamed output" + kCheckerFix;
      for (const auto& vi : g->input())
        if (vi.name().empty()) return "has a subgraph ('" + a.name() + "') with an unnamed input" + kCheckerFix;
    }
  }
  return "";
}

}  // namespace

std::string node_defect(const onnx::OpSchema& schema, const onnx::NodeProto& node, const int32_t* input_ids,
                        const NodeInputFacts& inputs) {
  if (std::string why = required_inputs(schema, node, input_ids); !why.empty()) return why;
  if (std::string why = required_outputs(schema, node, input_ids + node.input_size()); !why.empty()) return why;
  if (std::string why = required_attributes(schema, node); !why.empty()) return why;
  if (std::string why = subgraph_names(node); !why.empty()) return why;
  if (!schema.domain().empty()) return "";
  const std::string& op = schema.Name();
  if (op == "Einsum") return einsum_equation(node);
  if (op == "Attention") return attention_ranks(inputs);
  static const std::set<std::string, std::less<>> spatial{
      "Conv",         "ConvTranspose", "ConvInteger", "QLinearConv",          "AveragePool",
      "MaxPool",      "LpPool",        "MaxUnpool",   "GlobalAveragePool",    "GlobalMaxPool",
      "GlobalLpPool", "LRN",           "DeformConv",  "InstanceNormalization"};
  if (spatial.count(op)) {
    // A convolution's weight (M x C/group x kernel) has its input's rank; the transpose rules
    // count spatial axes from either, so they must agree (a rank-7 weight for a rank-4 input
    // made vjp read 5 pads from a list of 4).
    const int weight = op == "QLinearConv" ? 3 : 1;
    const bool has_weight =
        op == "Conv" || op == "ConvTranspose" || op == "ConvInteger" || op == "QLinearConv" || op == "DeformConv";
    const int64_t x_rank = inputs.rank(0), w_rank = has_weight ? inputs.rank(weight) : -1;
    if (x_rank >= 0 && w_rank >= 0 && x_rank != w_rank)
      return "has a weight (input " + std::to_string(weight) + ") of rank " + std::to_string(w_rank) +
             " for an input of rank " + std::to_string(x_rank) + "; " + op +
             "'s weight has its input's rank (M x C/group x kernel)" + kCheckerFix;
    if (std::string why = spatial_attributes(op, node, x_rank >= 0 ? x_rank : w_rank); !why.empty()) return why;
  }
  if (op == "Transpose") return transpose_perm(node, inputs.rank(0));
  if (op == "GatherND") return gathernd_batch_dims(node, inputs.rank(0), inputs.rank(1));
  if (op.rfind("Reduce", 0) == 0) return reduced_axes(node, inputs);
  if (op == "STFT" && !(node.input_size() > 2 && input_ids[2] >= 0) && !(node.input_size() > 3 && input_ids[3] >= 0))
    return "gives neither a window (input 2) nor a frame_length (input 3), so its frame length is undefined" +
           std::string(kCheckerFix);
  return axis_in_range(op, node, inputs.rank(0));
}

std::string inference_hazard(const onnx::NodeProto& node) {
  if ((node.domain().empty() || node.domain() == "ai.onnx") && node.op_type() == "Einsum") return einsum_equation(node);
  return "";
}

}  // namespace onnax
