// add_loss: a scalar loss attached to a model output, written from elementary ONNX ops so
// every transform differentiates, batches and composes it like the model itself.
#include <onnax/training.h>

#include <array>
#include <utility>

#include "diagnostics/error.h"
#include "emit/graph_writer.h"
#include "training/training_parts.h"
#include "transforms/prepare.h"
#include "transforms/provenance.h"

namespace onnax {
namespace {

constexpr std::array<std::pair<LossKind, std::string_view>, 6> kLossNames{{
    {LossKind::kMeanSquaredError, "mse"},
    {LossKind::kL1, "l1"},
    {LossKind::kHuber, "huber"},
    {LossKind::kSoftmaxCrossEntropy, "softmax_cross_entropy"},
    {LossKind::kBinaryCrossEntropyWithLogits, "binary_cross_entropy_with_logits"},
    {LossKind::kNegativeLogLikelihood, "nll"},
}};

std::string_view kind_name(LossKind kind) {
  for (const auto& [k, name] : kLossNames)
    if (k == kind) return name;
  return "?";
}

bool classification(LossKind kind) {
  return kind == LossKind::kSoftmaxCrossEntropy || kind == LossKind::kNegativeLogLikelihood;
}

// The loss elements' writer: y is the model output, the label and weight inputs are named by
// the options.
class LossWriter {
 public:
  LossWriter(GraphWriter& w, const LossOptions& o, const std::string& y, int64_t rank)
      : w_(w), o_(o), y_(y), rank_(rank) {}

  // Per-position loss elements (rank: the output's, less the class axis for index labels).
  std::string elements(int64_t class_axis) {
    const std::string& t = o_.label_name;
    switch (o_.kind) {
      case LossKind::kMeanSquaredError: {
        const std::string d = w_.op("Sub", {y_, t});
        return w_.op("Mul", {d, d});
      }
      case LossKind::kL1: return w_.op("Abs", {w_.op("Sub", {y_, t})});
      case LossKind::kHuber: {
        // 0.5 q^2 + delta (a - q) with a = |d|, q = min(a, delta): one formula for both pieces,
        // smooth where they meet.
        const std::string a = w_.op("Abs", {w_.op("Sub", {y_, t})});
        const std::string q = w_.op("Min", {a, w_.scalar(o_.huber_delta)});
        const std::string quadratic = w_.op("Mul", {w_.op("Mul", {q, q}), w_.scalar(0.5)});
        return w_.op("Add", {quadratic, w_.op("Mul", {w_.op("Sub", {a, q}), w_.scalar(o_.huber_delta)})});
      }
      case LossKind::kBinaryCrossEntropyWithLogits:
        // softplus(y) - y t = -(t log sigmoid(y) + (1 - t) log sigmoid(-y)), without a kink at 0
        // (a max(y, 0) + log1p(exp(-|y|)) form would differentiate through relu'(0) and abs'(0)).
        return w_.op("Sub", {w_.op("Softplus", {y_}), w_.op("Mul", {y_, t})});
      case LossKind::kSoftmaxCrossEntropy:
      case LossKind::kNegativeLogLikelihood: return class_elements(class_axis);
    }
    return {};
  }

  // Index labels equal to ignore_index: a bool mask of the others, and labels safe to gather.
  void mask_ignored() {
    mask_ = w_.op("Not", {w_.op("Equal", {o_.label_name, w_.i64(*o_.ignore_index)})});
    safe_label_ = w_.op("Where", {mask_, o_.label_name, w_.i64(0)});
  }
  const std::string& mask() const { return mask_; }

 private:
  std::string class_elements(int64_t c) {
    const std::string log_p = o_.kind == LossKind::kSoftmaxCrossEntropy
                                  ? w_.op("LogSoftmax", {y_}, {attr_i("axis", c)})
                                  : y_;  // negative log-likelihood reads log-probabilities
    const std::string axes = w_.i64s({c});
    std::string picked;  // sum_c t_c log p_c
    if (o_.probability_labels) {
      picked = w_.op("ReduceSum", {w_.op("Mul", {o_.label_name, log_p}), axes}, {attr_i("keepdims", 0)});
    } else {
      const std::string label = safe_label_.empty() ? o_.label_name : safe_label_;
      const std::string at = w_.op("Unsqueeze", {label, axes});
      picked = w_.op("Squeeze", {w_.op("GatherElements", {log_p, at}, {attr_i("axis", c)}), axes});
    }
    if (o_.label_smoothing == 0.0) return w_.op("Neg", {picked});
    // Smoothed target (1 - s) t + s / C: its sum against log p is (1 - s) picked + s mean_c log p.
    const std::string mean = w_.op("ReduceMean", {log_p, axes}, {attr_i("keepdims", 0)});
    const std::string mix = w_.op("Add", {w_.op("Mul", {picked, w_.scalar(1.0 - o_.label_smoothing)}),
                                          w_.op("Mul", {mean, w_.scalar(o_.label_smoothing)})});
    return w_.op("Neg", {mix});
  }

  GraphWriter& w_;
  const LossOptions& o_;
  std::string y_;
  int64_t rank_;
  std::string mask_, safe_label_;
};

}  // namespace

std::optional<LossKind> loss_kind_from_name(std::string_view name) {
  for (const auto& [k, n] : kLossNames)
    if (n == name) return k;
  return std::nullopt;
}

std::vector<std::string> loss_kind_names() {
  std::vector<std::string> out;
  for (const auto& [k, n] : kLossNames) out.emplace_back(n);
  return out;
}

onnx::ModelProto add_loss(const onnx::ModelProto& model, const LossOptions& o) {
  const std::string m = "loss";
  Prepared p = prepare(model, m);
  const std::string y = training::choose_output(p, m, o.output);
  const Facts yf = p.fact(y);
  const int64_t rank = yf.rank();
  const bool index_labels = classification(o.kind) && !o.probability_labels;
  if (o.probability_labels && o.kind != LossKind::kSoftmaxCrossEntropy)
    diag::fail(Error::Kind::kSelection,
               "loss: probability labels apply to softmax_cross_entropy, not " + std::string(kind_name(o.kind)) +
                   ". Fix: drop the probability-labels option, or choose softmax_cross_entropy");
  if (o.ignore_index && !index_labels)
    diag::fail(Error::Kind::kSelection,
               "loss: ignore_index applies to class-index labels (softmax_cross_entropy, "
               "nll), not to " +
                   std::string(kind_name(o.kind)) + (o.probability_labels ? " with probability labels" : "") +
                   ". Fix: drop ignore_index");
  if (o.label_smoothing < 0.0 || o.label_smoothing > 1.0 ||
      (o.label_smoothing != 0.0 && o.kind != LossKind::kSoftmaxCrossEntropy))
    diag::fail(Error::Kind::kSelection, "loss: label_smoothing is " + std::to_string(o.label_smoothing) +
                                            "; it must lie in [0, 1] and applies to softmax_cross_entropy only. "
                                            "Fix: pass a value in [0, 1] with softmax_cross_entropy");
  if (o.kind == LossKind::kHuber && !(o.huber_delta > 0.0))
    diag::fail(Error::Kind::kSelection, "loss: huber_delta is " + std::to_string(o.huber_delta) +
                                            "; it must be positive. Fix: pass a delta > 0 (default 1.0)");
  int64_t class_axis = 0;
  if (classification(o.kind)) {
    if (rank < 1)
      diag::fail(Error::Kind::kUnsupported,
                 "loss: " + std::string(kind_name(o.kind)) + " reads classes along an axis of '" + y +
                     "', whose shape is " + yf.shape_string() +
                     ". Fix: choose an output of known rank >= 1 (add a value_info shape, or run shape inference)");
    if (o.class_axis < -rank || o.class_axis >= rank)
      diag::fail(Error::Kind::kSelection, "loss: class_axis " + std::to_string(o.class_axis) +
                                              " is out of range for '" + y + "' of shape " + yf.shape_string() +
                                              " (valid: [" + std::to_string(-rank) + ", " + std::to_string(rank - 1) +
                                              "]). Fix: pass the axis that holds the classes");
    class_axis = o.class_axis < 0 ? o.class_axis + rank : o.class_axis;
  }
  const int64_t element_rank = rank < 0 ? -1 : index_labels ? rank - 1 : rank;
  if (o.example_weights && element_rank < 1)
    diag::fail(Error::Kind::kUnsupported, "loss: example weights scale the loss along axis 0 of '" + y +
                                              "', whose shape is " + yf.shape_string() +
                                              ". Fix: drop example weights, or choose an output with a batch axis");
  for (const std::string* name : {&o.label_name, &o.loss_name, o.example_weights ? &o.weight_name : nullptr})
    if (name) training::claim_name(p, m, *name);

  onnx::GraphProto& g = mutable_graph(p);
  // The label's facts: the output's, as int64 without the class axis for index labels.
  Facts label = yf;
  if (index_labels) {
    label.dtype = onnx::TensorProto::INT64;
    label.dims.erase(label.dims.begin() + class_axis);
  }
  training::add_input(g, o.label_name, label);
  if (o.example_weights) {
    Facts weight = Facts::of(yf.dtype, {});
    weight.dims.push_back(yf.dims[0]);
    training::add_input(g, o.weight_name, weight);
  }

  GraphWriter w(p.value_names, g, o.loss_name, yf.dtype);
  LossWriter lw(w, o, y, rank);
  if (o.ignore_index) lw.mask_ignored();
  std::string l = lw.elements(class_axis);
  if (o.ignore_index) l = w.op("Where", {lw.mask(), l, w.scalar(0.0)});
  if (o.example_weights) {
    std::string weight = o.weight_name;
    if (element_rank > 1) {
      std::vector<int64_t> axes;
      for (int64_t a = 1; a < element_rank; ++a) axes.push_back(a);
      weight = w.op("Unsqueeze", {weight, w.i64s(axes)});
    }
    l = w.op("Mul", {l, weight});
  }
  if (element_rank == 0) {
    w.op("Identity", {l}, {}, o.loss_name);
  } else if (o.reduction == Reduction::kSum) {
    w.op("ReduceSum", {l}, {attr_i("keepdims", 0)}, o.loss_name);
  } else if (o.ignore_index) {
    // The mean over the counted elements (0 when every label is ignored).
    const std::string count =
        w.op("ReduceSum", {w.op("Cast", {lw.mask()}, {attr_i("to", yf.dtype)})}, {attr_i("keepdims", 0)});
    const std::string total = w.op("ReduceSum", {l}, {attr_i("keepdims", 0)});
    w.op("Div", {total, w.op("Max", {count, w.scalar(1.0)})}, {}, o.loss_name);
  } else {
    w.op("ReduceMean", {l}, {attr_i("keepdims", 0)}, o.loss_name);
  }
  if (!o.keep_outputs) g.clear_output();
  training::insert_output(g, 0, o.loss_name, Facts::of(yf.dtype, {}));

  onnx::ModelProto result = std::move(*p.model);
  std::string record = "{\"kind\": " + provenance::quote(std::string(kind_name(o.kind))) +
                       ", \"output\": " + provenance::quote(y) + ", \"label\": " + provenance::quote(o.label_name) +
                       ", \"reduction\": " + provenance::quote(o.reduction == Reduction::kMean ? "mean" : "sum") +
                       (o.example_weights ? ", \"weight\": " + provenance::quote(o.weight_name) : std::string()) +
                       ", \"loss\": " + provenance::quote(o.loss_name) + "}";
  training::set_metadata(result, "onnax.loss", record);
  return result;
}

}  // namespace onnax
