#include "cli/training_commands.h"

#include <onnax/training.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <map>

#include "cli/args.h"
#include "diagnostics/error.h"
#include "io/model_io.h"
#include "training/training_parts.h"

namespace onnax::cli {
namespace {

LossKind loss_kind(const std::string& name) {
  if (auto k = loss_kind_from_name(name)) return *k;
  std::string known;
  for (const auto& n : loss_kind_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError{"--kind: unknown loss '" + name + "'; choose one of " + known};
}

// --params, --exclude, --min-size, --constants-as-params.
void add_param_options(Options& o, ParamArgs& args) {
  o.valued["--params"] = [&](const std::string& v) {
    auto entries = parse_list(v, "--params");
    args.spec.include.insert(args.spec.include.end(), entries.begin(), entries.end());
    args.given = true;
  };
  o.valued["--exclude"] = [&](const std::string& v) {
    auto entries = parse_list(v, "--exclude");
    args.spec.exclude.insert(args.spec.exclude.end(), entries.begin(), entries.end());
  };
  o.valued["--min-size"] = [&](const std::string& v) { args.spec.min_size = parse_int(v, "--min-size"); };
  o.valued["--constants-as-params"] = [&](const std::string& v) {
    args.constants_min_size = parse_int(v, "--constants-as-params");
  };
  o.valued["--stop-gradient"] = [&](const std::string& v) {
    auto entries = parse_list(v, "--stop-gradient");
    args.stop_gradient.insert(args.stop_gradient.end(), entries.begin(), entries.end());
  };
  o.valued["--surrogate"] = [&](const std::string& v) { args.surrogates.push_back(parse_surrogate(v)); };
}

}  // namespace

bool take_param_option(const std::vector<std::string>& args, size_t& i, ParamArgs& out) {
  Options o;
  add_param_options(o, out);
  auto v = o.valued.find(args[i]);
  if (v == o.valued.end()) return false;
  if (i + 1 >= args.size()) throw UsageError{args[i] + " needs a value"};
  v->second(args[++i]);
  return true;
}

std::vector<std::string> selected_params(onnx::ModelProto& model, const ParamArgs& args) {
  if (args.constants_min_size) model = constants_to_initializers(model, *args.constants_min_size);
  if (!args.stop_gradient.empty()) model = stop_gradient(model, args.stop_gradient);
  if (!args.surrogates.empty()) model = with_surrogates(model, args.surrogates);
  if (!args.given && !args.constants_min_size) return {};
  return select_params(model, args.spec);
}

int cmd_loss(const std::vector<std::string>& args) {
  LossOptions opt;
  std::string out;
  bool kind_given = false, external = false;
  Options o;
  o.valued["-o"] = [&](const std::string& v) { out = v; };
  o.flags["--external-data"] = [&] { external = true; };
  o.valued["--kind"] = [&](const std::string& v) {
    opt.kind = loss_kind(v);
    kind_given = true;
  };
  o.valued["--output"] = [&](const std::string& v) { opt.output = v; };
  o.valued["--reduction"] = [&](const std::string& v) {
    if (v != "mean" && v != "sum") throw UsageError{"--reduction: '" + v + "'; choose mean or sum"};
    opt.reduction = v == "mean" ? Reduction::kMean : Reduction::kSum;
  };
  o.flags["--probabilities"] = [&] { opt.probability_labels = true; };
  o.valued["--label-smoothing"] = [&](const std::string& v) {
    opt.label_smoothing = parse_double(v, "--label-smoothing");
  };
  o.valued["--class-axis"] = [&](const std::string& v) { opt.class_axis = parse_int(v, "--class-axis"); };
  o.valued["--ignore-index"] = [&](const std::string& v) { opt.ignore_index = parse_int(v, "--ignore-index"); };
  o.valued["--delta"] = [&](const std::string& v) { opt.huber_delta = parse_double(v, "--delta"); };
  o.flags["--example-weights"] = [&] { opt.example_weights = true; };
  o.flags["--loss-only"] = [&] { opt.keep_outputs = false; };
  o.valued["--label-name"] = [&](const std::string& v) { opt.label_name = v; };
  o.valued["--weight-name"] = [&](const std::string& v) { opt.weight_name = v; };
  o.valued["--loss-name"] = [&](const std::string& v) { opt.loss_name = v; };
  const Files f = files(parse(args, o, "loss"), out, "loss");
  if (!kind_given)
    throw UsageError{
        "loss needs --kind (mse, l1, huber, softmax_cross_entropy, "
        "binary_cross_entropy_with_logits, nll)"};
  onnx::ModelProto model;
  std::vector<std::string> data_files;
  load_model_into(f.in, model, &data_files);
  check_output_paths_usage(f.in, data_files, f.out);
  save_model(add_loss(model, opt), f.out, external);
  std::cerr << "onnax: wrote " << f.out << "\n";
  return 0;
}

int cmd_train_step(const std::vector<std::string>& args) {
  TrainStepOptions opt;
  ParamArgs params;
  std::string out, init;
  bool dp_clip = false, dp_noise = false, external = false;
  Options o;
  o.valued["-o"] = [&](const std::string& v) { out = v; };
  o.flags["--external-data"] = [&] { external = true; };
  o.valued["--init"] = [&](const std::string& v) { init = v; };
  o.valued["--loss"] = [&](const std::string& v) { opt.loss = v; };
  add_param_options(o, params);
  OptimizerOptions& op = opt.optimizer;
  o.valued["--optimizer"] = [&](const std::string& v) {
    if (v == "sgd")
      op.kind = OptimizerOptions::Kind::kSgd;
    else if (v == "adam")
      op.kind = OptimizerOptions::Kind::kAdam;
    else if (v == "adamw")
      op.kind = OptimizerOptions::Kind::kAdamW;
    else
      throw UsageError{"--optimizer: '" + v + "'; choose sgd, adam or adamw"};
  };
  o.valued["--lr"] = [&](const std::string& v) { op.learning_rate = parse_double(v, "--lr"); };
  o.valued["--momentum"] = [&](const std::string& v) { op.momentum = parse_double(v, "--momentum"); };
  o.flags["--nesterov"] = [&] { op.nesterov = true; };
  o.valued["--beta1"] = [&](const std::string& v) { op.beta1 = parse_double(v, "--beta1"); };
  o.valued["--beta2"] = [&](const std::string& v) { op.beta2 = parse_double(v, "--beta2"); };
  o.valued["--eps"] = [&](const std::string& v) { op.epsilon = parse_double(v, "--eps"); };
  o.valued["--weight-decay"] = [&](const std::string& v) { op.weight_decay = parse_double(v, "--weight-decay"); };
  o.valued["--no-decay"] = [&](const std::string& v) {
    auto entries = parse_list(v, "--no-decay");
    op.no_decay.insert(op.no_decay.end(), entries.begin(), entries.end());
  };
  o.valued["--clip-norm"] = [&](const std::string& v) { op.clip_norm = parse_double(v, "--clip-norm"); };
  o.valued["--dp-clip"] = [&](const std::string& v) {
    if (!opt.dp_sgd) opt.dp_sgd.emplace();
    opt.dp_sgd->clip_norm = parse_double(v, "--dp-clip");
    dp_clip = true;
  };
  o.valued["--noise-multiplier"] = [&](const std::string& v) {
    if (!opt.dp_sgd) opt.dp_sgd.emplace();
    opt.dp_sgd->noise_multiplier = parse_double(v, "--noise-multiplier");
    dp_noise = true;
  };
  o.valued["--noise-seed"] = [&](const std::string& v) {
    if (!opt.dp_sgd) opt.dp_sgd.emplace();
    opt.dp_sgd->noise_seed = parse_int(v, "--noise-seed");
  };
  int forms = 0;
  o.flags["--accumulate"] = [&] {
    opt.form = TrainStepOptions::Form::kAccumulate;
    ++forms;
  };
  o.flags["--apply"] = [&] {
    opt.form = TrainStepOptions::Form::kApply;
    ++forms;
  };
  const Files f = files(parse(args, o, "train-step"), out, "train-step");
  if (forms > 1) throw UsageError{"--accumulate and --apply write two different models; run train-step once with each"};
  if (dp_clip != dp_noise)
    throw UsageError{"DP-SGD needs both --dp-clip C and --noise-multiplier SIGMA (--noise-multiplier 0 for none)"};
  onnx::ModelProto model;
  std::vector<std::string> data_files;
  load_model_into(f.in, model, &data_files);
  check_output_paths_usage(f.in, data_files, f.out);
  if (!init.empty()) check_output_paths_usage(f.in, data_files, init);
  selected_params(model, params);  // (promotes Constant weights and marks stop_gradient values)
  opt.params = params.spec;
  const onnx::ModelProto step = train_step(model, opt);
  const std::vector<std::string> trained = select_params(model, opt.params);
  std::cerr << "onnax: train-step trains " << trained.size() << " parameter(s):";
  for (size_t i = 0; i < trained.size() && i < 8; ++i) std::cerr << " " << trained[i];
  std::cerr << (trained.size() > 8 ? " ..." : "") << "\n";
  if (!opt.optimizer.no_decay.empty()) {
    std::cerr << "onnax: without weight decay:";
    for (const auto& name : trained)
      for (const auto& e : opt.optimizer.no_decay)
        if (training::Matcher(e, "train-step", "--no-decay").matches(name)) {
          std::cerr << " " << name;
          break;
        }
    std::cerr << "\n";
  }
  save_model(step, f.out, external);
  std::cerr << "onnax: wrote " << f.out << "\n";
  if (!init.empty()) {
    save_model(initial_state(model, step), init, external);
    std::cerr << "onnax: wrote " << init << "\n";
  }
  return 0;
}

}  // namespace onnax::cli
