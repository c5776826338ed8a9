#include "training/outer_products.h"

#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include <unordered_map>

#include "training/training_parts.h"

namespace onnax::training {
namespace {

// Static dims of the values the candidates read (-1: unknown or symbolic), by ONNX shape
// inference with data propagation over a copy of `model` (the shapes of the cotangents come
// through Shape/Concat/Reshape chains). Empty when inference fails: no form is used then.
std::unordered_map<std::string, std::vector<int64_t>> inferred_dims(const onnx::ModelProto& model,
                                                                    const std::vector<Param>& params) {
  // (ONNX's data propagation materializes 1-D integer values element by element: a model
  // declaring a long one gets no outer-product forms rather than an unbounded allocation.)
  for (const auto* list : {&model.graph().input(), &model.graph().value_info()})
    for (const auto& vi : *list) {
      const auto& t = vi.type().tensor_type();
      if (t.has_shape() && t.shape().dim_size() == 1 && t.shape().dim(0).dim_value() > kMaxPropagatedElements &&
          t.elem_type() == onnx::TensorProto::INT64)
        return {};
    }
  onnx::ModelProto copy = model;
  for (const auto& p : params) add_input(*copy.mutable_graph(), p.name, p.facts);
  try {
    onnx::shape_inference::InferShapes(copy, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(/*check_type=*/false, /*strict_mode=*/0,
                                                                   /*data_prop=*/true));
  } catch (const std::exception&) {
    return {};
  }
  std::unordered_map<std::string, std::vector<int64_t>> dims;
  auto record = [&](const onnx::ValueInfoProto& vi) {
    const auto& t = vi.type().tensor_type();
    if (!vi.type().has_tensor_type() || !t.has_shape()) return;
    std::vector<int64_t>& d = dims[vi.name()];
    for (const auto& dim : t.shape().dim()) d.push_back(dim.has_dim_value() ? dim.dim_value() : -1);
  };
  for (const auto& vi : copy.graph().input()) record(vi);
  for (const auto& vi : copy.graph().value_info()) record(vi);
  return dims;
}

// A Transpose swapping the last two of `rank` axes.
bool swaps_last_axes(const onnx::NodeProto& n, int rank) {
  if (n.op_type() != "Transpose" || !n.domain().empty()) return false;
  for (const auto& a : n.attribute())
    if (a.name() == "perm") {
      if (a.ints_size() != rank) return false;
      for (int i = 0; i < rank; ++i)
        if (a.ints(i) != (i < rank - 2 ? i : 2 * rank - 3 - i)) return false;
      return true;
    }
  return false;
}

// The int64 values of a Constant node's `value`, when it has them in int64_data.
std::vector<int64_t> constant_ints(const onnx::NodeProto* n) {
  if (!n || n->op_type() != "Constant") return {};
  for (const auto& a : n->attribute())
    if (a.name() == "value" && a.t().data_type() == onnx::TensorProto::INT64)
      return {a.t().int64_data().begin(), a.t().int64_data().end()};
  return {};
}

int64_t int_attribute(const onnx::NodeProto& n, const std::string& name, int64_t otherwise) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return otherwise;
}

}  // namespace

std::vector<std::optional<OuterProduct>> outer_product_forms(const onnx::ModelProto& model,
                                                             const std::vector<Param>& params) {
  std::vector<std::optional<OuterProduct>> forms(params.size());
  std::unordered_map<std::string, const onnx::NodeProto*> producer;
  for (const auto& n : model.graph().node())
    for (const auto& o : n.output()) producer[o] = &n;
  auto produced_by = [&](const std::string& v) -> const onnx::NodeProto* {
    auto it = producer.find(v);
    return it == producer.end() ? nullptr : it->second;
  };
  // Rows [B, (L,) K, c] from the MatMul operand `v` = [B, (L,) c, K]: the transpose's input when
  // the gradient transposed them itself (that Transpose then goes unused), else a transpose.
  auto rows_from_transposed = [&](const std::string& v, int rank) {
    const onnx::NodeProto* t = produced_by(v);
    return t && swaps_last_axes(*t, rank) ? Rows{t->input(0), false, rank} : Rows{v, true, rank};
  };
  struct Candidate {
    size_t param;
    const onnx::NodeProto* product;
    bool transposed;  // the gradient is the product's transpose
    int rank;         // the product's: 3, or 4 when summed over axis 1
  };
  std::vector<Candidate> candidates;
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    if (p.facts.dims.size() != 2 || !p.facts.dims[0].known() || !p.facts.dims[1].known()) continue;
    const onnx::NodeProto* g = produced_by(p.grad);
    const bool transposed = g && swaps_last_axes(*g, 3);
    if (transposed) g = produced_by(g->input(0));
    int rank = 3;
    if (g && !transposed && g->op_type() == "ReduceSum" && g->domain().empty() && g->input_size() == 2 &&
        int_attribute(*g, "keepdims", 1) == 0 && int_attribute(*g, "noop_with_empty_axes", 0) == 0 &&
        constant_ints(produced_by(g->input(1))) == std::vector<int64_t>{1}) {
      g = produced_by(g->input(0));
      rank = 4;
    }
    if (!g || g->op_type() != "MatMul" || !g->domain().empty()) continue;
    candidates.push_back({i, g, transposed, rank});
  }
  if (candidates.empty()) return forms;
  const auto dims = inferred_dims(model, params);
  for (const Candidate& c : candidates) {
    const Param& p = params[c.param];
    const int64_t m = p.facts.dims[0].value(), n = p.facts.dims[1].value();
    const std::string& left = c.product->input(0);
    const std::string& right = c.product->input(1);
    auto a = dims.find(left), d = dims.find(right);
    const size_t rank = static_cast<size_t>(c.rank);
    if (a == dims.end() || d == dims.end() || a->second.size() != rank || d->second.size() != rank) continue;
    // (The product's last dims are the parameter's, so only K is to be found: from either
    // operand, as the cotangent's often comes through a Reshape to a computed shape that
    // inference leaves unknown.)
    int64_t k = a->second[rank - 1] > 0 ? a->second[rank - 1] : d->second[rank - 2];
    if (rank == 4) {
      const int64_t l = a->second[1] > 0 ? a->second[1] : d->second[1];
      k = l > 0 && k > 0 ? l * k : -1;
    }
    if (k <= 0) continue;
    // The Gram form pays K^2 (m + n) per example against the gradient's m n (written, then
    // read by the norm and the sum).
    if (k != 1 && k * (m + n) >= m * n) continue;
    OuterProduct f;
    if (c.transposed) {  // G = (L R)^T = R^T L^T: X = R, D = L^T
      f.x = Rows{right, false, c.rank};
      f.d = rows_from_transposed(left, c.rank);
    } else {  // G = L R: X = L^T, D = R
      f.x = rows_from_transposed(left, c.rank);
      f.d = Rows{right, false, c.rank};
    }
    f.k = k;
    f.m = m;
    f.n = n;
    forms[c.param] = std::move(f);
  }
  return forms;
}

namespace {

// The [B, K, width] value `r` describes (written once, the first time).
std::string rows_of(StepWriter& sw, Rows& r, int64_t width, const std::string& hint) {
  std::string v = r.name;
  if (r.transposed) {
    std::vector<int64_t> perm;
    for (int i = 0; i < r.rank; ++i) perm.push_back(i < r.rank - 2 ? i : 2 * r.rank - 3 - i);
    v = sw.op("Transpose", {v}, {attr_ints("perm", perm)}, {}, hint);
  }
  if (r.rank != 3) v = sw.op("Reshape", {v, sw.i64s({0, -1, width})}, {}, {}, hint);
  r = Rows{v, false, 3};
  return v;
}

}  // namespace

std::string outer_product_squared_norm(StepWriter& sw, OuterProduct& f, const std::string& hint) {
  const std::string x = rows_of(sw, f.x, f.m, hint + "_left_rows"), d = rows_of(sw, f.d, f.n, hint + "_right_rows");
  const std::string all = sw.i64s({1, 2});
  const onnx::AttributeProto flat = attr_i("keepdims", 0);
  if (f.k == 1)
    return sw.op("Mul",
                 {sw.op("ReduceSumSquare", {x, all}, {flat}, {}, hint + "_left_sq_norm"),
                  sw.op("ReduceSumSquare", {d, all}, {flat}, {}, hint + "_right_sq_norm")},
                 {}, {}, hint + "_grad_sq_norm");
  auto gram = [&](const std::string& v, const std::string& what) {
    return sw.op("MatMul", {v, sw.op("Transpose", {v}, {attr_ints("perm", {0, 2, 1})})}, {}, {}, hint + what);
  };
  return sw.op("ReduceSum", {sw.op("Mul", {gram(x, "_left_gram"), gram(d, "_right_gram")}), all}, {flat}, {},
               hint + "_grad_sq_norm");
}

std::string outer_product_weighted_sum(StepWriter& sw, OuterProduct& f, const std::string& factor,
                                       const std::string& hint) {
  const std::string x = rows_of(sw, f.x, f.m, hint + "_left_rows"), d = rows_of(sw, f.d, f.n, hint + "_right_rows");
  const std::string c = sw.op("Unsqueeze", {factor, sw.i64s({1, 2})}, {}, {}, hint + "_factor");
  // (The factor scales the narrower operand.)
  const std::string xs = f.m <= f.n ? sw.op("Mul", {x, c}, {}, {}, hint + "_scaled_left_rows") : x;
  const std::string ds = f.m <= f.n ? d : sw.op("Mul", {d, c}, {}, {}, hint + "_scaled_right_rows");
  return sw.op("Gemm",
               {sw.op("Reshape", {xs, sw.i64s({-1, f.m})}, {}, {}, hint + "_all_left_rows"),
                sw.op("Reshape", {ds, sw.i64s({-1, f.n})}, {}, {}, hint + "_all_right_rows")},
               {attr_i("transA", 1)}, {}, hint + "_clipped_sum");
}

}  // namespace onnax::training
