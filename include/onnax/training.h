// onnax training: from an exported model to a training step in plain ONNX.
//
// add_loss attaches a scalar loss to a model's output; select_params picks parameters in bulk;
// train_step writes one pure-functional ONNX graph per optimizer step (parameters, optimizer
// state and the step count in; loss, updated parameters and state out), optionally
// differentially private (DP-SGD) or split into gradient accumulation and an apply step;
// initial_state writes the first step's fed-back inputs. Like every transform, none of them
// modifies its source, and the same input gives byte-identical output.
#pragma once

#include <onnax/onnax.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace onnax {

// ---- Losses ------------------------------------------------------------------------------

enum class LossKind {
  kMeanSquaredError,              // (y - t)^2
  kL1,                            // |y - t|
  kHuber,                         // 0.5 d^2 where |d| <= delta, else delta (|d| - 0.5 delta)
  kSoftmaxCrossEntropy,           // -sum_c t_c log softmax(y)_c (t: class indices or probabilities)
  kBinaryCrossEntropyWithLogits,  // softplus(y) - y t
  kNegativeLogLikelihood,         // -y[t]: y holds log-probabilities, t class indices
  kCrossEntropy,                  // -sum_c t_c log y_c: y holds probabilities (a Softmax's output)
  kBinaryCrossEntropy,            // -(t log y + (1 - t) log(1 - y)): y holds probabilities
};
enum class Reduction { kMean, kSum };

struct LossOptions {
  LossKind kind = LossKind::kMeanSquaredError;
  // The model output the loss reads; empty: the model's only float output.
  std::string output;
  // kMean: the mean over every loss element (every position of a regression output; every
  // position but the class axis of a classification one); kSum: their sum.
  Reduction reduction = Reduction::kMean;
  // Softmax cross-entropy and cross-entropy: labels are probabilities shaped like the output
  // instead of int64 class indices.
  bool probability_labels = false;
  // Softmax cross-entropy: the target is (1 - s) t + s / C.
  double label_smoothing = 0.0;
  // Classification losses: the axis of the classes (default: the last).
  int64_t class_axis = -1;
  // Index labels equal to this contribute nothing and are not counted by the mean. (Other
  // labels must lie in [0, C): a negative one fails when the model runs, as does a label whose
  // shape is not the output's, less the class axis for index labels.)
  std::optional<int64_t> ignore_index;
  double huber_delta = 1.0;
  // Adds an input of per-example weights, one per index of the output's axis 0, that scale
  // each example's loss elements (the mean still divides by the number of elements).
  bool example_weights = false;
  std::string label_name = "label";
  std::string weight_name = "example_weight";
  std::string loss_name = "loss";
  // Keep the model's own outputs after the loss (false: the loss is the only output, so a
  // training step returns no predictions).
  bool keep_outputs = true;
};

// The model with a label input (and a weight input) appended and the rank-0 loss as its first
// output, followed by the model's own outputs. The label has the output's symbolic dims
// (without the class axis for index labels).
onnx::ModelProto add_loss(const onnx::ModelProto& model, const LossOptions& options);
// "mse", "l1", "huber", "softmax_cross_entropy", "binary_cross_entropy_with_logits", "nll",
// "cross_entropy", "binary_cross_entropy". Probabilities are clipped to [1e-7, 1 - 1e-7] before
// their log, as Keras does.
std::optional<LossKind> loss_kind_from_name(std::string_view name);
std::vector<std::string> loss_kind_names();

// ---- Parameters ----------------------------------------------------------------------------

// Selects parameters among the main graph's float initializers of rank >= 1.
struct ParamSpec {
  // Each entry: "all" (every candidate), an exact name, a glob pattern (* ? [...]) matched
  // against the whole name, or "re:REGEX" (ECMAScript, whole name). Empty: "all". An entry
  // that selects nothing is an error naming the candidates.
  std::vector<std::string> include;
  // Names or patterns (as above) removed from the selection: frozen parameters.
  std::vector<std::string> exclude;
  // Only candidates with at least this many elements.
  int64_t min_size = 0;
};
// The selected names, in the graph's initializer order.
std::vector<std::string> select_params(const onnx::ModelProto& model, const ParamSpec& spec);

// The model with every float Constant node of its main graph (after inlining local functions)
// that holds a tensor of rank >= 1 and at least `min_size` elements turned into an initializer
// of the same name, so weights exporters write as Constant nodes (jax2onnx) can be selected as
// parameters.
onnx::ModelProto constants_to_initializers(const onnx::ModelProto& model, int64_t min_size = 2);

// ---- Training steps ------------------------------------------------------------------------

struct OptimizerOptions {
  enum class Kind { kSgd, kAdam, kAdamW };
  Kind kind = Kind::kAdamW;
  // The default of the step's learning-rate input (feed another value for a schedule).
  double learning_rate = 1e-3;
  // SGD: heavy-ball momentum (PyTorch's form, no dampening); Nesterov's variant.
  double momentum = 0.0;
  bool nesterov = false;
  // Adam/AdamW.
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  // SGD and Adam add weight_decay * p to the gradient (L2); AdamW decays the parameter
  // directly (decoupled: p -= lr * weight_decay * p).
  double weight_decay = 0.0;
  // Parameters (names or patterns, as in ParamSpec) exempt from weight decay (biases, norms).
  std::vector<std::string> no_decay;
  // Rescales the gradient to this global L2 norm when it is larger; 0: off. The step then also
  // outputs the norm before clipping ("grad_norm").
  double clip_norm = 0.0;
};

// Differentially private SGD: each example's gradient is clipped to L2 norm `clip_norm`, the
// clipped gradients are summed, Gaussian noise of standard deviation noise_multiplier *
// clip_norm is added (from one standard-normal input per parameter, "<p>_noise", or drawn in
// the graph with noise_seed), and the sum
// is divided by the batch size before the optimizer update. Per-example gradients are
// vmap(grad) of the loss model evaluated on batches of one example, so the model's batch
// dims must be symbolic. The step also outputs every example's gradient norm before clipping.
struct DpSgdOptions {
  double clip_norm = 1.0;
  double noise_multiplier = 1.0;
  // Draw the noise inside the graph (RandomNormalLike seeded with noise_seed + the parameter's
  // index) instead of reading "<p>_noise" inputs. A runtime then advances its generator from
  // run to run (ONNX Runtime does); the sequence is the runtime's, not reproducible elsewhere.
  std::optional<int64_t> noise_seed;
};

struct TrainStepOptions {
  // The rank-0 loss output; unset: the model's only rank-0 float output.
  std::optional<std::string> loss;
  ParamSpec params;
  OptimizerOptions optimizer;
  std::optional<DpSgdOptions> dp_sgd;
  // kStep: gradient and update in one graph. kAccumulate: the gradient added into one
  // accumulator per parameter ("<p>_grad_sum"), no update. kApply: the update from accumulated
  // gradients divided by a count of accumulated batches ("accumulated"), no loss.
  enum class Form { kStep, kAccumulate, kApply };
  Form form = Form::kStep;
};

// The training step of `loss_model`. Inputs: the model's runtime inputs, then the parameters
// (lifted from initializers, same names), the optimizer state, the step count ("step", int64
// scalar: steps taken so far) and the learning rate ("learning_rate", with a default). Outputs:
// the loss model's outputs, then the updated parameters ("<p>_new"), state and step count.
// metadata_props["onnax.train_state"] lists, as JSON, every input the next step reads from an
// output ({"input", "output", "init": "param" | "zeros"}), for training loops and initial_state.
onnx::ModelProto train_step(const onnx::ModelProto& loss_model, const TrainStepOptions& options);

// A model without inputs whose outputs, named as `step_model`'s fed-back inputs, are their
// first values: the parameters as stored in `loss_model`, zeros for the optimizer state and
// accumulators, 0 for the step count. Run it once to get the first step's feeds.
onnx::ModelProto initial_state(const onnx::ModelProto& loss_model, const onnx::ModelProto& step_model);

}  // namespace onnax
