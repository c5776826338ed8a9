#include "rules/batching.h"

#include "diagnostics/error.h"
#include "ir/graph_edit.h"
#include "rules/op_table.h"

namespace onnax {

bool BatchCtx::any_batched() const {
  for (bool x : batched)
    if (x) return true;
  return false;
}

std::string BatchCtx::describe_input(int i) const {
  std::string name = i < node.input_size() ? node.input(i) : std::string("?");
  std::string s = "input " + std::to_string(i) + " '" + name + "' (per-example shape ";
  s += facts[i] ? facts[i]->shape_string() : std::string("unknown");
  s += ", " + diag::dtype_name(dtype(i));
  s += batched[i] ? ", batched at axis 0)" : ", not batched)";
  return s;
}

void BatchCtx::unsupported(const std::string& what, const std::string& fix) const {
  diag::fail(Error::Kind::kUnsupported,
             "vmap: cannot batch " + diag::op_at(node, opset) + ": " + what + ". Fix: " + fix);
}

int32_t BatchCtx::out_dtype(int o) const {
  if (o < static_cast<int>(out_facts.size()) && out_facts[o]->dtype) return out_facts[o]->dtype;
  if (!schema || o >= static_cast<int>(schema->outputs().size())) return 0;
  const std::string& type_str = schema->outputs()[o].GetTypeStr();
  const auto& formals = schema->inputs();
  for (int i = 0; i < num_inputs() && i < static_cast<int>(formals.size()); ++i)
    if (formals[i].GetTypeStr() == type_str && dtype(i)) return dtype(i);
  return 0;
}

int64_t BatchCtx::rank(int i) const {
  if (!facts[i] || !facts[i]->has_shape)
    unsupported("the rank of " + describe_input(i) + " is unknown and this rule needs it",
                "give the model static ranks: add value_info for '" + node.input(i) +
                    "' or run `onnax check` to see where shape inference stops");
  return facts[i]->rank();
}

const onnx::AttributeProto* BatchCtx::attr(const std::string& name) const {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t BatchCtx::attr_i(const std::string& name, int64_t fallback) const {
  const auto* a = attr(name);
  return a ? a->i() : fallback;
}

std::vector<int64_t> BatchCtx::attr_ints(const std::string& name) const {
  const auto* a = attr(name);
  if (!a) return {};
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

V BatchCtx::materialize(int i) {
  if (batched[i]) return in[i];
  // Expand(Unsqueeze(x, 0), [B, 1, ..., 1]) broadcasts along the new axis without copying
  // shape information we might not know statically.
  V x = b.unsqueeze(in[i], {0});
  int64_t r = rank(i);
  Vs parts{batch_size()};
  if (r > 0) parts.push_back(b.i64s(std::vector<int64_t>(r, 1)));
  V y = b.expand(x, b.concat(parts, 0));
  Facts f = facts[i]->with_dim(0, Dim{});
  b.set_facts(y, f);
  return y;
}

V BatchCtx::pad_rank(int i, int64_t r) {
  int64_t own = rank(i);
  if (!batched[i] || own >= r) return in[i];
  std::vector<int64_t> axes;
  for (int64_t k = 1; k <= r - own; ++k) axes.push_back(k);
  return b.unsqueeze(in[i], axes);
}

V BatchCtx::shifted_axes(int i) {
  if (batched[i])
    unsupported(describe_input(i) + " (axes) is batched; every example must use the same axes",
                "pass None in in_axes for the inputs that compute '" + node.input(i) + "'");
  if (const auto* k = known_i64(i)) {
    if (facts[i] && facts[i]->rank() == 0) return b.i64(shift_axis((*k)[0]));
    return b.i64s(shift_axes(*k));
  }
  V ge = b.op1("GreaterOrEqual", {in[i], b.scalar(0, dtype(i))});
  return b.op1("Add", {in[i], b.op1("Cast", {ge}, {Attr::i("to", dtype(i))})});
}

namespace {
onnx::TensorProto bool_true() {
  onnx::TensorProto yes;
  yes.set_data_type(onnx::TensorProto::BOOL);
  yes.add_int32_data(1);
  return yes;
}
}  // namespace

BatchResult scan_fallback(BatchCtx& c) {
  c.used_scan = true;
  // Scan over axis 0 of every batched value is exactly a per-example map: each iteration
  // sees one example's slices (shared values are read from the enclosing scope) and the
  // scan outputs stack the per-example results along a new axis 0. ONNX Runtime needs the
  // rank of every Scan body output; when a rank is unknown, a Loop (which does not) slices
  // the examples with Gather instead.
  bool ranks_known = true;
  for (int o = 0; o < c.node.output_size(); ++o)
    if (!c.node.output(o).empty() && (o >= static_cast<int>(c.out_facts.size()) || !c.out_facts[o]->has_shape))
      ranks_known = false;
  const bool use_loop = !ranks_known;
  onnx::GraphProto body;
  Builder bb = c.b.nested(body);
  bb.set_origin(c.node.output_size() ? c.node.output(0) + "_example" : c.node.op_type());
  body.set_name(c.b.fresh_value_name((c.node.name().empty() ? c.node.op_type() : c.node.name()) + "_per_example"));
  auto scalar_input = [&](const std::string& base, int32_t dtype) {
    onnx::ValueInfoProto vi;
    vi.set_name(c.b.fresh_value_name(base));
    auto* t = vi.mutable_type()->mutable_tensor_type();
    t->set_elem_type(dtype);
    t->mutable_shape();
    *body.add_input() = vi;
    return bb.existing(vi.name(), Facts::of(dtype, {}));
  };
  V iter, cond_in;
  if (use_loop) {
    iter = scalar_input("example_index", onnx::TensorProto::INT64);
    cond_in = scalar_input("loop_cond", onnx::TensorProto::BOOL);
  }
  Vs scan_inputs;
  auto slice_of = [&](V outer, const Facts* f, const std::string& base) {
    if (use_loop) return bb.op1("Gather", {bb.existing(c.b.name(outer), Facts{}), iter}, {Attr::i("axis", 0)});
    scan_inputs.push_back(outer);
    onnx::ValueInfoProto vi;
    vi.set_name(c.b.fresh_value_name(base + "_example"));
    if (f && f->dtype)
      write_type(*f, vi.mutable_type());
    else
      vi.mutable_type()->mutable_tensor_type()->set_elem_type(c.b.facts(outer).dtype);
    *body.add_input() = vi;
    return bb.existing(vi.name(), Facts{});
  };
  Vs ins;
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (!c.has(i))
      ins.push_back(V{});
    else if (!c.batched[i])
      ins.push_back(bb.existing(c.b.name(c.in[i]), Facts{}));
    else
      ins.push_back(slice_of(c.in[i], c.facts[i], c.node.input(i)));
  }
  std::vector<std::pair<std::string, std::string>> renames;
  for (const auto& read : c.reads) {
    if (!read.batched) continue;
    const std::string& name = read.name;
    const V v = read.v;
    Facts f = c.b.facts(v);
    if (f.has_shape && !f.dims.empty()) f.dims.erase(f.dims.begin());
    renames.emplace_back(name, std::string(bb.name(slice_of(v, &f, name))));
  }
  Vs outs = bb.clone(c.node, ins);
  onnx::NodeProto& cloned = bb.last_node();
  for (const auto& [from, to] : renames) rename_subgraph_reads(cloned, from, to);
  if (use_loop) {
    V cond_out = bb.op1("Identity", {cond_in});
    onnx::ValueInfoProto vi;
    vi.set_name(std::string(bb.name(cond_out)));
    vi.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::BOOL);
    *body.add_output() = vi;
  }
  std::vector<int> present;
  for (size_t o = 0; o < outs.size(); ++o) {
    if (!outs[o].valid()) continue;
    const int32_t dtype = c.out_dtype(static_cast<int>(o));
    if (dtype == 0)
      c.unsupported("output " + std::to_string(o) + " has an unknown element type, which the per-example map needs",
                    "declare the type of '" + c.node.output(static_cast<int>(o)) + "' in value_info");
    onnx::ValueInfoProto vi;
    vi.set_name(std::string(bb.name(outs[o])));
    Facts f = o < c.out_facts.size() ? *c.out_facts[o] : Facts{};
    f.dtype = dtype;
    write_type(f, vi.mutable_type());
    *body.add_output() = vi;
    present.push_back(static_cast<int>(o));
  }
  onnx::AttributeProto body_attr;
  body_attr.set_name("body");
  body_attr.set_type(onnx::AttributeProto::GRAPH);
  *body_attr.mutable_g() = std::move(body);
  Vs stacked;
  if (use_loop) {
    // An explicit true condition: some runtimes read an absent one as false.
    V trip = c.b.op1("Squeeze", {c.batch_size(), c.b.i64s({0})});
    stacked =
        c.b.op("Loop", {trip, c.b.tensor_const(bool_true())}, {Attr{body_attr}}, static_cast<int>(present.size()));
  } else {
    stacked = c.b.op("Scan", scan_inputs,
                     {Attr{body_attr}, Attr::i("num_scan_inputs", static_cast<int64_t>(scan_inputs.size()))},
                     static_cast<int>(present.size()));
  }
  Vs result(outs.size());
  for (size_t k = 0; k < present.size(); ++k) result[present[k]] = stacked[k];
  return all_batched(result);
}

void require_shared(BatchCtx& c, int i, const char* role) {
  if (c.has(i) && c.batched[i])
    c.unsupported(c.describe_input(i) + " (" + role +
                      ") is batched; it must be the same for every example (different per-example values would "
                      "give ragged outputs)",
                  "pass None in in_axes for the inputs that compute '" + c.node.input(i) + "'");
}

V common_length(Builder& b, V lengths) {
  // The largest and smallest length (0 and the largest join in, so an empty batch needs no
  // reduction over nothing); a tensor of the largest length reshaped to the smallest fails
  // unless they are equal.
  const V largest = b.op1("ReduceMax", {b.concat({b.i64s({0}), lengths}, 0)}, {Attr::i("keepdims", 1)});
  const V smallest = b.op1("ReduceMin", {b.concat({lengths, largest}, 0)}, {Attr::i("keepdims", 1)});
  const V probe = b.expand(b.tensor_const(bool_true()), largest);
  const std::string origin = b.origin();
  b.set_origin("examples_must_agree_on_this_length");
  const V checked = b.op1("Reshape", {probe, smallest});
  b.set_origin(origin);
  return b.op1("Squeeze", {b.op1("Shape", {checked}), b.i64s({0})});
}

void refuse_ragged(BatchCtx& c) {
  // Output shapes that depend on the data: examples can give differently shaped results, and
  // there is nothing to stack them into.
  c.unsupported(
      "its output shape depends on the input values, so examples can give outputs of different shapes "
      "(ragged), which a batch cannot hold",
      "pass None in in_axes for the inputs that reach it, or replace it with a fixed-shape computation "
      "(e.g. a mask instead of NonZero)");
}

void refuse_random(BatchCtx& c) {
  c.unsupported("random operators have no batching rule (per-example randomness is not defined)",
                "pass None in in_axes for the inputs that reach it, or draw the random values outside the model "
                "and feed them as a batched input");
}

void register_refusals(OpTable& table) {
  for (const char* op : {"NonZero", "Unique", "NonMaxSuppression", "StringSplit"})
    table.op(op).refuse_batch([](BatchCtx& c) -> BatchResult { refuse_ragged(c); });
  for (const char* op : {"RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"})
    table.op(op).refuse_batch([](BatchCtx& c) -> BatchResult { refuse_random(c); });
}

BatchResult all_batched(Vs outs) {
  BatchResult r;
  r.batched.assign(outs.size(), true);
  for (size_t i = 0; i < outs.size(); ++i)
    if (!outs[i].valid()) r.batched[i] = false;
  r.out = std::move(outs);
  return r;
}

std::vector<int64_t> shift_axes(const std::vector<int64_t>& axes) {
  std::vector<int64_t> out;
  out.reserve(axes.size());
  for (int64_t a : axes) out.push_back(shift_axis(a));
  return out;
}

}  // namespace onnax
