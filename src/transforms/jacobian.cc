// jacfwd, jacrev and hessian, built from the other transforms so each stays one graph:
//   jacfwd(f) = vmap(jvp(f)) over a basis of input tangents,
//   jacrev(f) = vmap(vjp(f)) over a basis of output cotangents,
//   hessian(f) = jacfwd(jacrev(f)),
// as JAX defines them. The basis is computed in the graph (an identity matrix the size of all
// selected inputs' or outputs' elements together), so symbolic shapes stay symbolic; each
// Jacobian block is then cut from the batched derivatives and reshaped to JAX's layout: the
// output's dims, then the input's.
#include <onnax/onnax.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "diagnostics/error.h"
#include "emit/graph_writer.h"
#include "ir/graph_edit.h"
#include "ir/graph_names.h"
#include "transforms/lower_opset.h"
#include "transforms/prepare.h"
#include "transforms/provenance.h"

namespace onnax {
namespace {

enum class Direction { kForward, kReverse };

// The declared type of value `name` in `g` (a graph input, output or value_info; an
// initializer's is written into `scratch`), or nullptr.
const onnx::TypeProto* declared_type(const onnx::GraphProto& g, const std::string& name, onnx::TypeProto& scratch) {
  for (const auto* list : {&g.input(), &g.output(), &g.value_info()})
    for (const auto& vi : *list)
      if (vi.name() == name && vi.has_type()) return &vi.type();
  for (const auto& t : g.initializer())
    if (t.name() == name) {
      auto* tt = scratch.mutable_tensor_type();
      tt->set_elem_type(t.data_type());
      auto* shape = tt->mutable_shape();
      for (int64_t d : t.dims()) shape->add_dim()->set_dim_value(d);
      return &scratch;
    }
  return nullptr;
}

// The type of a Jacobian block: `of`'s dtype, `of`'s dims then `wrt`'s (unknown dims where the
// source does not declare them).
onnx::TypeProto block_type(const onnx::GraphProto& source, const std::string& of, const std::string& wrt) {
  onnx::TypeProto out, s1, s2;
  const onnx::TypeProto* a = declared_type(source, of, s1);
  const onnx::TypeProto* b = declared_type(source, wrt, s2);
  auto* tt = out.mutable_tensor_type();
  if (a && a->has_tensor_type()) tt->set_elem_type(a->tensor_type().elem_type());
  if (a && b && a->has_tensor_type() && b->has_tensor_type() && a->tensor_type().has_shape() &&
      b->tensor_type().has_shape()) {
    auto* shape = tt->mutable_shape();
    for (const auto& d : a->tensor_type().shape().dim()) *shape->add_dim() = d;
    for (const auto& d : b->tensor_type().shape().dim()) *shape->add_dim() = d;
  }
  return out;
}

// Where each value's elements sit among all of them: rows [offset, offset + size) of the basis.
struct Blocks {
  std::vector<std::string> shapes;  // 1-D int64: each value's shape
  std::vector<std::string> sizes;   // 1-D int64 [n_k]
  std::vector<std::string> starts;  // 1-D int64 [o_k]
  std::vector<std::string> ends;    // 1-D int64 [o_k + n_k]
  std::string total;                // 1-D int64 [N]
};

Blocks measure(GraphWriter& w, const std::vector<std::string>& values) {
  Blocks b;
  std::string offset = w.i64s({0});
  for (const auto& v : values) {
    b.shapes.push_back(w.op("Shape", {v}));
    b.sizes.push_back(w.op("Unsqueeze", {w.op("Size", {v}), w.i64s({0})}));
    b.starts.push_back(offset);
    offset = w.op("Add", {offset, b.sizes.back()});
    b.ends.push_back(offset);
  }
  b.total = offset;
  return b;
}

// Replaces the batched graph inputs `seeds` (one per value in `values`, each of shape
// (N, *value.shape)) with the rows of an N x N identity: seed k is one in the columns of
// value k's elements.
void seed_with_basis(GraphWriter& w, onnx::GraphProto& g, const Blocks& blocks, const std::vector<std::string>& values,
                     const std::vector<std::string>& seeds) {
  std::unordered_map<std::string, int32_t> seed_dtype;
  for (const auto& vi : g.input()) seed_dtype[vi.name()] = vi.type().tensor_type().elem_type();
  onnx::AttributeProto zero;
  zero.set_name("value");
  zero.set_type(onnx::AttributeProto::TENSOR);
  zero.mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  zero.mutable_t()->add_dims(1);
  zero.mutable_t()->add_float_data(0.0F);
  const std::string square = w.op("Concat", {blocks.total, blocks.total}, {attr_i("axis", 0)});
  const std::string eye = w.op("EyeLike", {w.op("ConstantOfShape", {square}, {zero})});
  for (size_t k = 0; k < values.size(); ++k) {
    const std::string columns = w.op("Slice", {eye, blocks.starts[k], blocks.ends[k], w.i64s({1})});
    const std::string shape = w.op("Concat", {blocks.total, blocks.shapes[k]}, {attr_i("axis", 0)});
    const std::string rows = w.op("Reshape", {columns, shape}, {attr_i("allowzero", 1)});
    // (Cast, not CastLike: results go back to sources' opsets, and CastLike is from 15.)
    if (const int32_t dtype = seed_dtype[seeds[k]]; dtype != 0)
      w.op("Cast", {rows}, {attr_i("to", dtype)}, seeds[k]);
    else
      w.op("CastLike", {rows, values[k]}, {}, seeds[k]);
  }
  auto* inputs = g.mutable_input();
  for (int i = inputs->size() - 1; i >= 0; --i)
    for (const auto& s : seeds)
      if (inputs->Get(i).name() == s) {
        inputs->DeleteSubrange(i, 1);
        break;
      }
}

void record(onnx::ModelProto& result, const onnx::ModelProto& source, const std::string& transform,
            const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
            const std::vector<std::string>& derivatives);

struct Plan {
  std::vector<std::string> inputs;   // selected, in order
  std::vector<std::string> outputs;  // selected, in order
};

// name(output, input) names the block of d output / d input.
template <typename Name>
onnx::ModelProto jacobian(const onnx::ModelProto& model, const Selection& selection, Direction dir,
                          const char* transform, Name name) {
  const bool forward = dir == Direction::kForward;
  onnx::ModelProto derivative = forward ? jvp(model, selection) : vjp(model, selection);
  const auto recorded = provenance::last_selection(derivative);
  if (!recorded) diag::fail(Error::Kind::kInvalidModel, "internal: the derivative recorded no selection");
  const Plan plan{recorded->inputs, recorded->outputs};
  const int primal_inputs = model.graph().input_size();
  const int primal_outputs = model.graph().output_size();
  // jvp appends one tangent input per selected input and one output per selected output; vjp
  // one cotangent input per selected output and one output per selected input.
  std::vector<std::string> seeds, derivatives;
  for (int i = primal_inputs; i < derivative.graph().input_size(); ++i)
    seeds.push_back(derivative.graph().input(i).name());
  for (int i = primal_outputs; i < derivative.graph().output_size(); ++i)
    derivatives.push_back(derivative.graph().output(i).name());

  VmapOptions over_seeds;
  over_seeds.in_axes_form = VmapOptions::InAxesForm::kByName;  // (unnamed inputs are shared)
  for (const auto& s : seeds) over_seeds.in_axes_by_name[s] = 0;
  over_seeds.out_axes.assign(static_cast<size_t>(derivative.graph().output_size()), std::nullopt);
  for (size_t k = 0; k < derivatives.size(); ++k) over_seeds.out_axes[static_cast<size_t>(primal_outputs) + k] = 0;
  onnx::ModelProto result = vmap(std::move(derivative), over_seeds);

  onnx::GraphProto& g = *result.mutable_graph();
  NameScope names;
  collect_names(g, names);
  GraphWriter w(names, g, forward ? "jacfwd" : "jacrev", onnx::TensorProto::FLOAT);
  // The seeds span the selected inputs (forward) or outputs (reverse).
  const std::vector<std::string>& spanned = forward ? plan.inputs : plan.outputs;
  const Blocks rows = measure(w, spanned);
  seed_with_basis(w, g, rows, spanned, seeds);
  // The other side's shapes, for the blocks' layout.
  const Blocks other = measure(w, forward ? plan.outputs : plan.inputs);

  std::vector<onnx::ValueInfoProto> blocks;
  std::vector<std::string> block_names;
  for (size_t o = 0; o < plan.outputs.size(); ++o) {
    for (size_t i = 0; i < plan.inputs.size(); ++i) {
      // Forward: output o's tangent, rows of input i, is (n_i, *o.shape): transpose to
      // (m_o, n_i). Reverse: input i's cotangent, rows of output o, is (m_o, *i.shape).
      const size_t row_block = forward ? i : o;
      const std::string& batched = derivatives[forward ? o : i];
      const Blocks& out_side = forward ? other : rows;
      const Blocks& in_side = forward ? rows : other;
      std::string part = w.op("Slice", {batched, rows.starts[row_block], rows.ends[row_block], w.i64s({0})});
      if (forward) {
        const std::string flat = w.op("Concat", {in_side.sizes[i], out_side.sizes[o]}, {attr_i("axis", 0)});
        part =
            w.op("Transpose", {w.op("Reshape", {part, flat}, {attr_i("allowzero", 1)})}, {attr_ints("perm", {1, 0})});
      }
      const std::string layout = w.op("Concat", {out_side.shapes[o], in_side.shapes[i]}, {attr_i("axis", 0)});
      const std::string out_name = names.fresh(name(plan.outputs[o], plan.inputs[i]));
      // (allowzero: a dim of size 0, an empty batch, is a size, not "copy the input's dim".)
      w.op("Reshape", {part, layout}, {attr_i("allowzero", 1)}, out_name);
      onnx::ValueInfoProto vi;
      vi.set_name(out_name);
      *vi.mutable_type() = block_type(model.graph(), plan.outputs[o], plan.inputs[i]);
      blocks.push_back(std::move(vi));
      block_names.push_back(out_name);
    }
  }
  // Outputs: the primal ones, then the blocks (outputs outer, inputs inner, as JAX nests them).
  g.mutable_output()->DeleteSubrange(primal_outputs, g.output_size() - primal_outputs);
  for (auto& vi : blocks) *g.add_output() = std::move(vi);
  sort_nodes(g);  // (the seeds' basis reads the primal outputs' shapes in reverse mode)

  // The file describes itself as this one transform; the block outputs are its derivatives
  // (so jvp and jacfwd of it differentiate them by default: hessian = jacfwd(jacrev)).
  record(result, model, transform, plan.inputs, plan.outputs, block_names);
  return result;
}

// The chain `source` recorded, then one step of `transform`; `derivatives` become the
// derivative outputs.
void record(onnx::ModelProto& result, const onnx::ModelProto& source, const std::string& transform,
            const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
            const std::vector<std::string>& derivatives) {
  for (int i = result.metadata_props_size() - 1; i >= 0; --i)
    if (result.metadata_props(i).key() == provenance::kTransformsKey)
      result.mutable_metadata_props()->DeleteSubrange(i, 1);
  for (const onnx::StringStringEntryProto& e : source.metadata_props())
    if (e.key() == provenance::kTransformsKey) *result.add_metadata_props() = e;
  auto quoted = [](const std::vector<std::string>& names) {
    std::vector<std::string> q;
    for (const auto& n : names) q.push_back(provenance::quote(n));
    return provenance::list(q);
  };
  provenance::record_step(result, "{\"transform\": " + provenance::quote(transform) +
                                      ", \"inputs\": " + quoted(inputs) + ", \"outputs\": " + quoted(outputs) +
                                      ", \"seeds\": [], \"derivatives\": " + quoted(derivatives) + "}");
  provenance::set_derivative_outputs(result, derivatives);
}

// Runs `build` on the model at opset 18 or newer (a source below is upgraded first, once) and
// brings the result back to the source's opset; errors name the transform the user called.
onnx::ModelProto at_transform_opset(const onnx::ModelProto& model, const char* transform,
                                    const std::function<onnx::ModelProto(const onnx::ModelProto&)>& build) {
  check_opset_imports(model, transform);
  const int64_t source_opset = default_opset(model);
  try {
    if (source_opset >= kMinOpset || source_opset < kMinConvertibleOpset) return build(model);
    onnx::ModelProto upgraded = model;
    convert_opset_in_place(upgraded, kMinOpset);
    onnx::ModelProto result = build(upgraded);
    return_to_source_opset(result, source_opset, transform);
    return result;
  } catch (const Error& e) {
    diag::fail(e.kind(), std::string(transform) + ": " + e.what());
  }
}

std::string jacobian_name(const std::string& y, const std::string& x) {
  return y + "_jacobian_" + x;
}

onnx::ModelProto hessian_at(const onnx::ModelProto& model, const std::optional<std::vector<std::string>>& inputs,
                            const std::optional<std::string>& output) {
  Selection first;
  first.inputs = inputs;
  if (output) first.outputs = std::vector<std::string>{*output};
  onnx::ModelProto gradient = jacobian(model, first, Direction::kReverse, "jacrev", jacobian_name);
  const auto recorded = provenance::last_selection(gradient);
  if (!recorded) diag::fail(Error::Kind::kInvalidModel, "internal: jacrev recorded no selection");
  if (recorded->outputs.size() != 1) {
    std::vector<std::string> quoted;
    for (const auto& o : recorded->outputs) quoted.push_back("'" + o + "'");
    diag::fail(Error::Kind::kSelection,
               std::to_string(recorded->outputs.size()) + " float outputs are selected (" + diag::join(quoted) +
                   "); a Hessian is of one output. Fix: name the one to differentiate twice (Python output=..., "
                   "command line --output NAME)");
  }
  const std::string y = recorded->outputs[0];
  Selection second;
  second.inputs = recorded->inputs;
  second.outputs = provenance::derivative_outputs(gradient);
  // Block (a, b) of the second pass is d(dy/da)/db: name it after y, a and b.
  const auto& firsts = *second.outputs;
  const auto& xs = recorded->inputs;
  onnx::ModelProto h =
      jacobian(gradient, second, Direction::kForward, "hessian", [&](const std::string& of, const std::string& wrt) {
        for (size_t a = 0; a < firsts.size(); ++a)
          if (firsts[a] == of) return y + "_hessian_" + xs[a] + "_" + wrt;
        return jacobian_name(of, wrt);
      });
  // The chain recorded: jacrev then hessian; keep one hessian step over the source's selection,
  // whose derivatives are the Jacobians and the Hessian blocks.
  std::vector<std::string> derivatives = firsts;
  const std::vector<std::string> blocks = provenance::derivative_outputs(h);
  derivatives.insert(derivatives.end(), blocks.begin(), blocks.end());
  record(h, model, "hessian", xs, {y}, derivatives);
  return h;
}

}  // namespace

onnx::ModelProto jacfwd(const onnx::ModelProto& model, const Selection& selection) {
  return at_transform_opset(model, "jacfwd", [&](const onnx::ModelProto& m) {
    return jacobian(m, selection, Direction::kForward, "jacfwd", jacobian_name);
  });
}

onnx::ModelProto jacrev(const onnx::ModelProto& model, const Selection& selection) {
  return at_transform_opset(model, "jacrev", [&](const onnx::ModelProto& m) {
    return jacobian(m, selection, Direction::kReverse, "jacrev", jacobian_name);
  });
}

onnx::ModelProto hessian(const onnx::ModelProto& model, const std::optional<std::vector<std::string>>& inputs,
                         const std::optional<std::string>& output) {
  return at_transform_opset(model, "hessian", [&](const onnx::ModelProto& m) { return hessian_at(m, inputs, output); });
}

}  // namespace onnax
