#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include <deque>
#include <optional>

#include "facts/facts.h"
#include "facts/fast_shapes.h"
#include "facts/schemas.h"

namespace onnax {
namespace {

onnx::TypeProto tensor_type_of(const onnx::TensorProto& t) {
  onnx::TypeProto type;
  auto* tt = type.mutable_tensor_type();
  tt->set_elem_type(t.data_type());
  auto* shape = tt->mutable_shape();
  for (int64_t d : t.dims()) shape->add_dim()->set_dim_value(d);
  return type;
}

bool has_rank(const onnx::TypeProto* t) {
  return t && t->has_tensor_type() && t->tensor_type().has_shape();
}

}  // namespace

void infer_facts(const onnx::GraphProto& g, const std::unordered_map<std::string, int>& opsets, FactTable& table) {
  auto& types = table.types();
  types.reserve(types.size() + static_cast<size_t>(g.node_size()) * 2 + g.input_size() + g.initializer_size());
  std::unordered_map<std::string, const onnx::TensorProto*> data;
  std::unordered_map<std::string, const onnx::SparseTensorProto*> sparse;
  std::unordered_map<std::string, const onnx::ValueInfoProto*> declared;
  std::deque<onnx::TensorProto> constants;  // Constant nodes' values (stable addresses)
  for (const auto& t : g.initializer()) {
    types[t.name()] = table.store(tensor_type_of(t));
    data[t.name()] = &t;
  }
  for (const auto& s : g.sparse_initializer()) {
    types[s.values().name()] = table.store(tensor_type_of(s.values()));
    sparse[s.values().name()] = &s;
  }
  for (const auto& vi : g.input())
    if (vi.has_type() && !types.count(vi.name())) types[vi.name()] = table.store(vi.type());
  for (const auto& vi : g.value_info()) declared[vi.name()] = &vi;
  for (const auto& vi : g.output()) declared[vi.name()] = &vi;

  const auto default_domain = opsets.find("");
  const int default_opset = default_domain == opsets.end() ? 0 : default_domain->second;
  const onnx::ShapeInferenceOptions options(/*check_type=*/false, /*error_mode=*/0, /*data_prop=*/true);
  onnx::shape_inference::DataValueMap generated;
  onnx::shape_inference::GraphInferenceContext graph_ctx(types, opsets, nullptr, {}, onnx::OpSchemaRegistry::Instance(),
                                                         &generated);
  SchemaCache schemas;
  for (const auto& n : g.node()) {
    std::vector<onnx::TypeProto*> inferred(n.output_size());
    for (auto& t : inferred) t = table.make();
    const bool fast = n.output_size() == 1 && fast_infer(n, default_opset, types, inferred[0]);
    if (!fast && !inferred.empty()) inferred[0]->Clear();
    const std::string domain = n.domain() == "ai.onnx" ? "" : n.domain();
    auto op = fast ? opsets.end() : opsets.find(domain);
    const onnx::OpSchema* schema = op == opsets.end() ? nullptr : schemas.find(n.op_type(), domain, op->second);
    if (schema && schema->has_type_and_shape_inference_function()) {
      try {
        // ONNX's context takes the node mutably only because inferring a subgraph attribute
        // (If/Loop/Scan bodies) records value_info in it; give such nodes a private copy so
        // the graph (possibly the caller's source model) is never written.
        std::optional<onnx::NodeProto> with_subgraphs;
        for (const auto& a : n.attribute())
          if (a.has_g() || a.graphs_size() > 0) with_subgraphs = n;
        onnx::NodeProto& node = with_subgraphs ? *with_subgraphs : const_cast<onnx::NodeProto&>(n);
        onnx::shape_inference::InferenceContextImpl ctx(node, types, data, sparse, options, &generated, &graph_ctx);
        schema->GetTypeAndShapeInferenceFunction()(ctx);
        for (int i = 0; i < n.output_size(); ++i) inferred[i]->CopyFrom(*ctx.getOutputType(i));
        if (schema->has_data_propagation_function()) {
          onnx::shape_inference::DataPropagationContextImpl dctx(node, types, data, generated);
          schema->GetDataPropagationFunction()(dctx);
        }
      } catch (const std::exception&) {
        // Inference is best effort here: declared types (below) and the rules' own
        // diagnostics cover values it cannot type.
      }
    }
    if (auto t = constant_tensor(n)) {
      constants.push_back(std::move(*t));
      *inferred[0] = tensor_type_of(constants.back());
      data[n.output(0)] = &constants.back();
    }
    for (int i = 0; i < n.output_size(); ++i) {
      const std::string& name = n.output(i);
      if (name.empty()) continue;
      onnx::TypeProto* t = nullptr;
      auto d = declared.find(name);
      const bool inferred_typed = inferred[i]->value_case() != onnx::TypeProto::VALUE_NOT_SET;
      if (d != declared.end() && d->second->has_type() &&
          (!inferred_typed || (!has_rank(inferred[i]) && has_rank(&d->second->type()))))
        t = table.store(d->second->type());
      else if (inferred_typed)
        t = inferred[i];
      if (t) types[name] = t;
    }
  }
  for (const auto& vi : g.output())
    if (!types.count(vi.name()) && vi.has_type()) types[vi.name()] = table.store(vi.type());
}

}  // namespace onnax
