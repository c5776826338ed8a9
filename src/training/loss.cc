// add_loss: a scalar loss attached to a model output, written from elementary ONNX ops so
// every transform differentiates, batches and composes it like the model itself.
#include <onnax/training.h>

#include <array>
#include <utility>

#include "diagnostics/error.h"
#include "emit/graph_writer.h"
#include "ir/graph_edit.h"
#include "notice.h"
#include "training/training_parts.h"
#include "transforms/lower_opset.h"
#include "transforms/prepare.h"
#include "transforms/provenance.h"

namespace onnax {
namespace {

constexpr std::array<std::pair<LossKind, std::string_view>, 8> kLossNames{{
    {LossKind::kMeanSquaredError, "mse"},
    {LossKind::kL1, "l1"},
    {LossKind::kHuber, "huber"},
    {LossKind::kSoftmaxCrossEntropy, "softmax_cross_entropy"},
    {LossKind::kBinaryCrossEntropyWithLogits, "binary_cross_entropy_with_logits"},
    {LossKind::kNegativeLogLikelihood, "nll"},
    {LossKind::kCrossEntropy, "cross_entropy"},
    {LossKind::kBinaryCrossEntropy, "binary_cross_entropy"},
}};

// Probabilities are clipped to [eps, 1 - eps] before their log, as Keras does.
constexpr double kProbabilityEpsilon = 1e-7;

std::string_view kind_name(LossKind kind) {
  for (const auto& [k, name] : kLossNames)
    if (k == kind) return name;
  return "?";
}

bool classification(LossKind kind) {
  return kind == LossKind::kSoftmaxCrossEntropy || kind == LossKind::kNegativeLogLikelihood ||
         kind == LossKind::kCrossEntropy;
}

// Losses whose labels may be probabilities over the classes instead of indices.
bool takes_probability_labels(LossKind kind) {
  return kind == LossKind::kSoftmaxCrossEntropy || kind == LossKind::kCrossEntropy;
}

// What the loss expects the output to be, and which producing ops betray another meaning.
struct Expectation {
  std::string_view reads;    // "logits", "probabilities", "log-probabilities", "values"
  std::string_view suspect;  // an op whose output is not that, or ""
  std::string_view instead;  // the kind to use for the suspect's output
};
Expectation expectation(LossKind kind) {
  switch (kind) {
    case LossKind::kSoftmaxCrossEntropy: return {"logits", "Softmax", "cross_entropy"};
    case LossKind::kBinaryCrossEntropyWithLogits: return {"logits", "Sigmoid", "binary_cross_entropy"};
    case LossKind::kNegativeLogLikelihood: return {"log-probabilities", "Softmax", "cross_entropy"};
    case LossKind::kCrossEntropy: return {"probabilities", "LogSoftmax", "nll"};
    case LossKind::kBinaryCrossEntropy: return {"probabilities", "", ""};
    default: return {"values", "", ""};
  }
}

// The loss elements' writer: y is the model output, the label and weight inputs are named by
// the options.
class LossWriter {
 public:
  LossWriter(GraphWriter& w, const LossOptions& o, const std::string& y) : w_(w), o_(o), y_(y) {}

  // Per-position loss elements (rank: the output's, less the class axis for index labels).
  std::string elements(int64_t class_axis) {
    const std::string& t = label_;
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
      case LossKind::kBinaryCrossEntropy: {
        // -(t log p + (1 - t) log(1 - p)), p clipped away from 0 and 1.
        const std::string p = w_.op("Clip", {y_, w_.scalar(kProbabilityEpsilon), w_.scalar(1 - kProbabilityEpsilon)});
        const std::string one = w_.scalar(1.0);
        const std::string pos = w_.op("Mul", {t, w_.op("Log", {p})});
        const std::string neg = w_.op("Mul", {w_.op("Sub", {one, t}), w_.op("Log", {w_.op("Sub", {one, p})})});
        return w_.op("Neg", {w_.op("Add", {pos, neg})});
      }
      case LossKind::kSoftmaxCrossEntropy:
      case LossKind::kNegativeLogLikelihood:
      case LossKind::kCrossEntropy: return class_elements(class_axis);
    }
    return {};
  }

  // The label as the loss reads it: reshaped to the shape the output implies (`expected`, a
  // run-time shape), so a label of another size fails when the model runs instead of being
  // broadcast or read in part; index labels below 0 (other than ignore_index) are sent out of
  // range, so the gather fails instead of wrapping around to the last classes.
  void check_label(const std::string& expected, bool index_labels) {
    label_ = w_.op("Reshape", {o_.label_name, expected}, {}, o_.label_name + "_checked");
    if (!index_labels) return;
    if (o_.ignore_index) {
      mask_ = w_.op("Not", {w_.op("Equal", {label_, w_.i64(*o_.ignore_index)})});
      label_ = w_.op("Where", {mask_, label_, w_.i64(0)});
    }
    label_ = w_.op("Where", {w_.op("Less", {label_, w_.i64(0)}), w_.i64(int64_t{1} << 62), label_});
  }

  // Index labels other than ignore_index (after check_label).
  const std::string& mask() const { return mask_; }

 private:
  std::string class_elements(int64_t c) {
    std::string log_p = y_;  // negative log-likelihood reads log-probabilities
    if (o_.kind == LossKind::kSoftmaxCrossEntropy) log_p = w_.op("LogSoftmax", {y_}, {attr_i("axis", c)});
    if (o_.kind == LossKind::kCrossEntropy)
      log_p = w_.op("Log", {w_.op("Clip", {y_, w_.scalar(kProbabilityEpsilon), w_.scalar(1.0)})});
    const std::string axes = w_.i64s({c});
    std::string picked;  // sum_c t_c log p_c
    if (o_.probability_labels) {
      picked = w_.op("ReduceSum", {w_.op("Mul", {label_, log_p}), axes}, {attr_i("keepdims", 0)});
    } else {
      const std::string at = w_.op("Unsqueeze", {label_, axes});
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
  std::string label_, mask_;
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
  if (o.probability_labels && !takes_probability_labels(o.kind))
    diag::fail(Error::Kind::kSelection,
               "loss: probability labels apply to softmax_cross_entropy and cross_entropy, not " +
                   std::string(kind_name(o.kind)) + ". Fix: drop the probability-labels option");
  if (o.ignore_index && !index_labels)
    diag::fail(Error::Kind::kSelection,
               "loss: ignore_index applies to class-index labels (softmax_cross_entropy, "
               "nll), not to " +
                   std::string(kind_name(o.kind)) + (o.probability_labels ? " with probability labels" : "") +
                   ". Fix: drop ignore_index");
  if (o.label_smoothing < 0.0 || o.label_smoothing > 1.0 ||
      (o.label_smoothing != 0.0 && !takes_probability_labels(o.kind)))
    diag::fail(Error::Kind::kSelection, "loss: label_smoothing is " + std::to_string(o.label_smoothing) +
                                            "; it must lie in [0, 1] and applies to softmax_cross_entropy and "
                                            "cross_entropy only. Fix: pass a value in [0, 1] with one of them");
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
  training::claim_name(p, m, o.label_name, "--label-name / label_name");
  training::claim_name(p, m, o.loss_name, "--loss-name / loss_name");
  if (o.example_weights) training::claim_name(p, m, o.weight_name, "--weight-name / weight_name");
  // A loss that reads logits given probabilities (or the reverse) trains, but on another loss.
  const Expectation expects = expectation(o.kind);
  for (const auto& n : p.graph->node())
    if (!expects.suspect.empty() && n.op_type() == expects.suspect && n.output_size() > 0 && n.output(0) == y)
      notice("loss: output '" + y + "' is computed by " + n.op_type() + ", but " + std::string(kind_name(o.kind)) +
             " reads " + std::string(expects.reads) + ". Fix: use --kind " + std::string(expects.instead) +
             " for this output, or name the output before the " + n.op_type() + " (--output)");

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
  LossWriter lw(w, o, y);
  // The label's expected shape, from the output's at run time.
  std::string expected = w.op("Shape", {y});
  if (index_labels) {
    const std::string before = w.op("Shape", {y}, {attr_i("start", 0), attr_i("end", class_axis)});
    const std::string after = w.op("Shape", {y}, {attr_i("start", class_axis + 1)});
    expected = w.op("Concat", {before, after}, {attr_i("axis", 0)});
  }
  lw.check_label(expected, index_labels);
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
  return_to_source_opset(result, p.source_opset, m);
  std::string record = "{\"kind\": " + provenance::quote(std::string(kind_name(o.kind))) +
                       ", \"output\": " + provenance::quote(y) + ", \"label\": " + provenance::quote(o.label_name) +
                       ", \"reduction\": " + provenance::quote(o.reduction == Reduction::kMean ? "mean" : "sum") +
                       (o.example_weights ? ", \"weight\": " + provenance::quote(o.weight_name) : std::string()) +
                       ", \"loss\": " + provenance::quote(o.loss_name) + "}";
  training::set_metadata(result, "onnax.loss", record);
  return result;
}

}  // namespace onnax
