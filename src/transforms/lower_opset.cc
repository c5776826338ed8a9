#include "transforms/lower_opset.h"

#include <onnax/onnax.h>
#include <onnx/defs/schema.h>
#include <onnx/defs/tensor_proto_util.h>
#include <onnx/shape_inference/implementation.h>
#include <onnx/version_converter/convert.h>

#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "check/model_check.h"
#include "diagnostics/error.h"
#include "notice.h"
#include "transforms/prepare.h"

namespace onnax {
namespace {

// Why a node cannot be lowered (thrown, caught by lower_opset).
struct NoOlderForm {
  std::string why;
};

class Lowering {
 public:
  Lowering(const onnx::ModelProto& model, int64_t target) : target_(target) {
    collect(model.graph());
    // Ranks, for the forms that spell out every axis (Pad without axes).
    onnx::ModelProto inferred = model;
    try {
      onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(),
                                         onnx::ShapeInferenceOptions(/*check_type=*/false, /*strict_mode=*/0));
    } catch (const std::exception&) {
      // (then no rank is known: those forms are not lowered)
    }
    collect_ranks(inferred.graph());
  }

  // Drops the constants whose reads moved into attributes, when nothing else reads them.
  void drop_unread_constants(onnx::GraphProto& g) {
    if (dropped_.empty()) return;
    std::unordered_set<std::string> read;
    collect_reads(g, read);
    drop_in(g, read);
  }

  void graph(onnx::GraphProto& g) {
    google::protobuf::RepeatedPtrField<onnx::NodeProto> out;
    for (auto& n : *g.mutable_node()) {
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_g()) graph(*a.mutable_g());
        for (auto& sub : *a.mutable_graphs()) graph(sub);
      }
      if (is_default_domain(n)) node(n, out);
      *out.Add() = std::move(n);
    }
    g.mutable_node()->Swap(&out);
  }

 private:
  // Every constant of the model by name (names are unique across a model and its subgraphs).
  void collect(const onnx::GraphProto& g) {
    for (const auto& t : g.initializer()) constants_[t.name()] = &t;
    for (const auto& n : g.node()) {
      for (const auto& o : n.output()) names_.insert(o);
      if (n.op_type() == "Constant" && is_default_domain(n) && n.output_size() == 1)
        for (const auto& a : n.attribute())
          if (a.name() == "value" && a.has_t()) constants_[n.output(0)] = &a.t();
      for (const auto& a : n.attribute()) {
        if (a.has_g()) collect(a.g());
        for (const auto& sub : a.graphs()) collect(sub);
      }
    }
    for (const auto* list : {&g.input(), &g.output()})
      for (const auto& vi : *list) names_.insert(vi.name());
  }

  void collect_ranks(const onnx::GraphProto& g) {
    for (const auto* list : {&g.input(), &g.output(), &g.value_info()})
      for (const auto& vi : *list)
        if (vi.type().has_tensor_type() && vi.type().tensor_type().has_shape())
          ranks_[vi.name()] = vi.type().tensor_type().shape().dim_size();
    for (const auto& n : g.node())
      for (const auto& a : n.attribute()) {
        if (a.has_g()) collect_ranks(a.g());
        for (const auto& sub : a.graphs()) collect_ranks(sub);
      }
  }

  [[noreturn]] void fail(const onnx::NodeProto& n, const std::string& what) const {
    // (A node of an unchecked model may have neither a name nor an output.)
    const std::string name = !n.name().empty() ? n.name() : n.output_size() > 0 ? n.output(0) : std::string();
    throw NoOlderForm{n.op_type() + " node '" + name + "' " + what};
  }

  std::vector<int64_t> constant_ints(const onnx::NodeProto& n, int i, const char* role) const {
    auto it = constants_.find(n.input(i));
    if (it == constants_.end())
      fail(n, std::string("takes its ") + role + " as a run-time input, which opset " + std::to_string(target_) +
                  " wants as an attribute");
    return it->second->data_type() == onnx::TensorProto::INT32
               ? [&] {
                   const auto v = onnx::ParseData<int32_t>(it->second);
                   return std::vector<int64_t>(v.begin(), v.end());
                 }()
               : onnx::ParseData<int64_t>(it->second);
  }

  static const onnx::AttributeProto* find(const onnx::NodeProto& n, const std::string& name) {
    for (const auto& a : n.attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  static void erase(onnx::NodeProto& n, const std::string& name) {
    auto* attrs = n.mutable_attribute();
    for (int i = attrs->size(); i-- > 0;)
      if (attrs->Get(i).name() == name) attrs->DeleteSubrange(i, 1);
  }
  static void set_ints(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
    erase(n, name);
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  // Input i moved to attribute `attr` (dropping the input; trailing absent inputs too).
  void input_to_attribute(onnx::NodeProto& n, int i, const std::string& attr, const char* role) {
    if (n.input_size() <= i || n.input(i).empty()) return;
    set_ints(n, attr, constant_ints(n, i, role));
    for (int k = i; k < n.input_size(); ++k) dropped_.insert(n.input(k));
    n.mutable_input()->DeleteSubrange(i, n.input_size() - i);
  }

  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int k = 1; names_.count(name); ++k) name = base + "_" + std::to_string(k);
    names_.insert(name);
    return name;
  }
  // A node of `type` with one output named fresh from `base` (and the node after it).
  onnx::NodeProto new_node(const char* type, const std::string& base) {
    onnx::NodeProto m;
    m.set_op_type(type);
    m.add_output(fresh(base));
    m.set_name(m.output(0));
    return m;
  }
  static void set_int(onnx::NodeProto& n, const std::string& name, int64_t v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  onnx::NodeProto int64_constant(const std::string& base, const std::vector<int64_t>& values) {
    onnx::NodeProto c = new_node("Constant", base);
    auto* a = c.add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(onnx::TensorProto::INT64);
    a->mutable_t()->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) a->mutable_t()->add_int64_data(v);
    return c;
  }

  // Rewrites `n` into its form at the target opset (nodes it needs first go to `before`), then
  // checks it against that opset's schema.
  void node(onnx::NodeProto& n, google::protobuf::RepeatedPtrField<onnx::NodeProto>& before) {
    const std::string& op = n.op_type();
    static const std::unordered_set<std::string> reductions_18 = {"ReduceMean",   "ReduceMax",       "ReduceMin",
                                                                  "ReduceProd",   "ReduceL1",        "ReduceL2",
                                                                  "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};
    if ((op == "ReduceSum" && target_ < 13) || (reductions_18.count(op) && target_ < 18)) {
      const onnx::AttributeProto* noop = find(n, "noop_with_empty_axes");
      const bool has_axes = n.input_size() > 1 && !n.input(1).empty();
      if (noop && noop->i() != 0 && (!has_axes || constant_ints(n, 1, "axes").empty()))
        fail(n, "reduces nothing (noop_with_empty_axes=1 with no axes), which opset " + std::to_string(target_) +
                    " cannot say");
      if (has_axes && constant_ints(n, 1, "axes").empty()) {
        dropped_.insert(n.input(1));
        n.mutable_input()->DeleteSubrange(1, n.input_size() - 1);
      }
      input_to_attribute(n, 1, "axes", "axes");
      erase(n, "noop_with_empty_axes");
    } else if ((op == "Squeeze" || op == "Unsqueeze") && target_ < 13) {
      input_to_attribute(n, 1, "axes", "axes");
    } else if (op == "Split") {
      if (find(n, "num_outputs") && target_ < 18) {
        if (n.input_size() < 2 || n.input(1).empty())
          fail(n, "splits by num_outputs (chunks of ceil(n / k), the last smaller), which opset " +
                      std::to_string(target_) + " has no form for");
        erase(n, "num_outputs");
      }
      if (target_ < 13) input_to_attribute(n, 1, "split", "split sizes");
    } else if (op == "Shape" && target_ < 15 && (find(n, "start") || find(n, "end"))) {
      // Shape(x)[start:end]: the whole shape, then a Slice of it.
      const onnx::AttributeProto* s = find(n, "start");
      const onnx::AttributeProto* e = find(n, "end");
      const std::string sliced = n.output(0);
      const std::string whole = fresh(sliced + "_whole");
      const int64_t from = s ? s->i() : 0, to = e ? e->i() : INT64_MAX;
      onnx::NodeProto slice = new_node("Slice", sliced + "_slice");
      slice.add_input(whole);
      slice.set_output(0, sliced);
      if (target_ < 10) {  // (bounds as attributes)
        set_ints(slice, "starts", {from});
        set_ints(slice, "ends", {to});
      } else {
        onnx::NodeProto starts = int64_constant(sliced + "_start", {from});
        onnx::NodeProto ends = int64_constant(sliced + "_end", {to});
        slice.add_input(starts.output(0));
        slice.add_input(ends.output(0));
        *before.Add() = std::move(starts);
        *before.Add() = std::move(ends);
      }
      erase(n, "start");
      erase(n, "end");
      n.set_output(0, whole);
      check(n);
      check(slice);
      *before.Add() = std::move(n);
      n = std::move(slice);
      return;
    } else if (op == "Pad" && target_ < 18 && n.input_size() > 3 && !n.input(3).empty()) {
      pads_for_every_axis(n, before);
    } else if (op == "Reshape" && target_ < 14 && find(n, "allowzero") && find(n, "allowzero")->i() != 0) {
      erase(n, "allowzero");
      if (auto it = constants_.find(n.input(1)); it != constants_.end()) {
        for (int64_t d : constant_ints(n, 1, "shape"))
          if (d == 0)
            fail(n,
                 "has an empty dim in its shape (allowzero=1), which opset " + std::to_string(target_) + " cannot say");
      } else {
        reshape_allowing_zero(n, before);
        return;
      }
    } else if ((op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") && target_ < 13) {
      // Before 13 these flatten to 2-D at `axis` (default 1): the same as normalising over one
      // axis only when it is the last.
      const onnx::AttributeProto* axis = find(n, "axis");
      if (axis && axis->i() != -1)
        fail(n, "normalises over axis " + std::to_string(axis->i()) + ", which opset " + std::to_string(target_) +
                    " reads as the flattened trailing axes");
      erase(n, "axis");
      set_int(n, "axis", -1);
    }
    check(n);
  }

  // Pad with an axes input (18+): its pads spelled out for every axis, 0 for the others.
  void pads_for_every_axis(onnx::NodeProto& n, google::protobuf::RepeatedPtrField<onnx::NodeProto>& before) {
    const std::vector<int64_t> axes = constant_ints(n, 3, "axes");
    const auto rank_it = ranks_.find(n.input(0));
    if (rank_it == ranks_.end()) fail(n, "pads some axes by an axes input, and the rank of its input is not known");
    const int64_t rank = rank_it->second;
    std::vector<int64_t> slot(static_cast<size_t>(rank), -1);  // axis -> its entry in pads
    for (size_t j = 0; j < axes.size(); ++j) {
      const int64_t a = axes[j] < 0 ? axes[j] + rank : axes[j];
      if (a < 0 || a >= rank) fail(n, "has axis " + std::to_string(axes[j]) + " out of range");
      slot[static_cast<size_t>(a)] = static_cast<int64_t>(j);
    }
    const std::string base = n.output(0) + "_pads";
    const int64_t count = static_cast<int64_t>(axes.size());
    onnx::NodeProto full = new_node("Concat", base);
    set_int(full, "axis", 0);
    std::string zero;
    for (int side = 0; side < 2; ++side)
      for (int64_t k = 0; k < rank; ++k) {
        const int64_t j = slot[static_cast<size_t>(k)];
        if (j < 0) {
          if (zero.empty()) {
            onnx::NodeProto c = int64_constant(base + "_zero", {0});
            zero = c.output(0);
            *before.Add() = std::move(c);
          }
          full.add_input(zero);
          continue;
        }
        const int64_t at = j + side * count;
        onnx::NodeProto from = int64_constant(base + "_from", {at});
        onnx::NodeProto to = int64_constant(base + "_to", {at + 1});
        onnx::NodeProto entry = new_node("Slice", base + "_entry");
        entry.add_input(n.input(1));
        entry.add_input(from.output(0));
        entry.add_input(to.output(0));
        check(entry);
        full.add_input(entry.output(0));
        *before.Add() = std::move(from);
        *before.Add() = std::move(to);
        *before.Add() = std::move(entry);
      }
    check(full);
    n.set_input(1, full.output(0));
    *before.Add() = std::move(full);
    dropped_.insert(n.input(3));
    n.mutable_input()->DeleteSubrange(3, n.input_size() - 3);
    while (n.input_size() > 2 && n.input(n.input_size() - 1).empty()) n.mutable_input()->RemoveLast();
  }

  // Reshape(x, s) with allowzero=1 and a run-time s, where a 0 in s is an empty dim (opset 14+),
  // in older ops: x flattened, padded with zeros to the size of s with its 0s read as 1s (it
  // needs that padding only when x is empty), reshaped to that, then sliced to s. For a
  // non-empty x this is Reshape(x, s).
  void reshape_allowing_zero(onnx::NodeProto& n, google::protobuf::RepeatedPtrField<onnx::NodeProto>& before) {
    if (target_ < 11) fail(n, "reshapes with allowzero=1 to a run-time shape, which needs Pad's opset-11 form");
    const std::string base = n.output(0);
    auto emit = [&](const char* type, std::vector<std::string> inputs, const std::string& suffix) {
      onnx::NodeProto m = new_node(type, base + suffix);
      for (auto& in : inputs) m.add_input(std::move(in));
      return m;
    };
    auto add = [&](onnx::NodeProto m) {
      check(m);
      const std::string out = m.output(0);
      *before.Add() = std::move(m);
      return out;
    };
    const std::string x = n.input(0), shape = n.input(1);
    const std::string minus_one = add(int64_constant(base + "_flat_shape", {-1}));
    const std::string zero = add(int64_constant(base + "_zero", {0}));
    const std::string one = add(int64_constant(base + "_one", {1}));
    const std::string flat = add(emit("Reshape", {x, minus_one}, "_flat"));
    const std::string empty_dims = add(emit("Equal", {shape, zero}, "_empty_dims"));
    const std::string nonzero = add(emit("Where", {empty_dims, one, shape}, "_nonzero_shape"));
    const std::string size = add(emit("ReduceProd", {nonzero}, "_padded_size"));
    const std::string have = add(emit("Reshape", {add(emit("Size", {x}, "_size")), one}, "_size_1d"));
    onnx::NodeProto join = emit("Concat", {zero, add(emit("Sub", {size, have}, "_missing"))}, "_pads");
    set_int(join, "axis", 0);
    const std::string pads = add(std::move(join));
    const std::string padded = add(emit("Pad", {flat, pads}, "_padded"));
    const std::string full = add(emit("Reshape", {padded, nonzero}, "_full"));
    const std::string starts = add(emit("Mul", {shape, zero}, "_starts"));
    onnx::NodeProto slice = emit("Slice", {full, starts, shape}, "_slice");
    slice.set_output(0, base);
    check(slice);
    n = std::move(slice);
  }

  void check(const onnx::NodeProto& n) const {
    const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(n.op_type(), static_cast<int>(target_), "");
    if (!schema) fail(n, "has no schema at opset " + std::to_string(target_));
    if (schema->Deprecated()) fail(n, "is deprecated at opset " + std::to_string(target_));
    try {
      schema->Verify(n);
    } catch (const std::exception& e) {
      std::string what = e.what();
      while (!what.empty() && (what.back() == '.' || what.back() == ' ' || what.back() == '\n')) what.pop_back();
      fail(n, "does not fit its opset-" + std::to_string(target_) + " schema: " + what);
    }
  }

  static void collect_reads(const onnx::GraphProto& g, std::unordered_set<std::string>& read) {
    for (const auto& n : g.node()) {
      for (const auto& in : n.input()) read.insert(in);
      for (const auto& a : n.attribute()) {
        if (a.has_g()) collect_reads(a.g(), read);
        for (const auto& sub : a.graphs()) collect_reads(sub, read);
      }
    }
    for (const auto& o : g.output()) read.insert(o.name());
  }
  void drop_in(onnx::GraphProto& g, const std::unordered_set<std::string>& read) const {
    auto gone = [&](const std::string& name) { return dropped_.count(name) && !read.count(name); };
    auto* inits = g.mutable_initializer();
    for (int i = inits->size(); i-- > 0;)
      if (gone(inits->Get(i).name())) inits->DeleteSubrange(i, 1);
    auto* nodes = g.mutable_node();
    for (int i = nodes->size(); i-- > 0;) {
      const onnx::NodeProto& n = nodes->Get(i);
      if (n.op_type() == "Constant" && n.output_size() == 1 && gone(n.output(0))) {
        nodes->DeleteSubrange(i, 1);
        continue;
      }
      for (auto& a : *nodes->Mutable(i)->mutable_attribute()) {
        if (a.has_g()) drop_in(*a.mutable_g(), read);
        for (auto& sub : *a.mutable_graphs()) drop_in(sub, read);
      }
    }
  }

  int64_t target_;
  std::unordered_set<std::string> dropped_;  // inputs that became attributes
  std::unordered_map<std::string, int64_t> ranks_;
  std::unordered_map<std::string, const onnx::TensorProto*> constants_;
  std::unordered_set<std::string> names_;
};

}  // namespace

std::string lower_opset(onnx::ModelProto& model, int64_t target) {
  onnx::ModelProto lowered = model;
  try {
    Lowering lowering(lowered, target);
    lowering.graph(*lowered.mutable_graph());
    lowering.drop_unread_constants(*lowered.mutable_graph());
  } catch (const NoOlderForm& e) {
    return e.why;
  }
  for (auto& o : *lowered.mutable_opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") o.set_version(target);
  // Types: an op at the older opset may accept fewer element types.
  if (std::string problem = check::strict_shape_inference(lowered); !problem.empty()) return problem;
  if (std::string problem = check::checker(lowered); !problem.empty()) return problem;
  model = std::move(lowered);
  return "";
}

void return_to_source_opset(onnx::ModelProto& result, int64_t source_opset, const std::string& mode) {
  int64_t opset = -1;
  for (const auto& o : result.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  if (source_opset <= 0 || opset <= source_opset) return;
  const std::string why = lower_opset(result, source_opset);
  if (why.empty()) return;
  // Else the oldest opset after the source's where every node has a form.
  int64_t landed = opset;
  for (int64_t target = source_opset + 1; target < opset && landed == opset; ++target)
    if (lower_opset(result, target).empty()) landed = target;
  notice(mode + ": the result is at ai.onnx opset " + std::to_string(landed) + ", not the model's " +
         std::to_string(source_opset) + ": " + why + ". Fix: run it where opset " + std::to_string(landed) +
         " is supported");
}

void convert_opset_in_place(onnx::ModelProto& model, int64_t target) {
  check_opset_imports(model, "convert_opset");
  int64_t current = -1;
  for (const auto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") current = o.version();
  const std::string at = "ai.onnx opset " + std::to_string(target);
  if (current < 0)
    diag::fail(Error::Kind::kVersion,
               "convert_opset: the model imports no ai.onnx opset. Fix: add an opset_import entry for domain \"\"");
  if (target < kMinConvertibleOpset || target > kMaxOpset)
    diag::fail(Error::Kind::kVersion, "convert_opset: target opset " + std::to_string(target) +
                                          " is outside the supported " + std::to_string(kMinConvertibleOpset) + "-" +
                                          std::to_string(kMaxOpset) + ". Fix: choose a target in that range");
  if (target == current) return;
  if (target < current) {
    if (const std::string why = lower_opset(model, target); !why.empty())
      diag::fail(Error::Kind::kVersion,
                 "convert_opset: cannot write the model at " + at + " (it is at " + std::to_string(current) +
                     "): " + why + ". Fix: choose a newer target opset, or keep opset " + std::to_string(current));
    return;
  }
  try {
    model = onnx::version_conversion::ConvertVersion(model, static_cast<int>(target));
  } catch (const std::exception& e) {
    diag::fail(Error::Kind::kVersion, "convert_opset: ONNX's version converter cannot bring the model from opset " +
                                          std::to_string(current) + " to " + std::to_string(target) + ": " + e.what() +
                                          ". Fix: choose another target opset");
  }
}

}  // namespace onnax
