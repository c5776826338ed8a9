// libFuzzer target over onnax's entry points for untrusted models (docs/untrusted.md).
//
// Input: an 8-byte header, then a serialized ModelProto (so real models are seeds):
//   [0] entry point (kEntries below, modulo their count)
//   [1] flags: 1 select inputs (mask [3]), 2 select outputs (mask [4]), 4 the entry's variant
//       (jacfwd/jacrev, external data, ...), 8 add a name the model lacks to the selections,
//       16 give out_axes, 0x60 vmap's in_axes form (all / per input / by name / all), 0x80 an
//       axis name taken from the model's symbolic dims
//   [2] vmap's in_axis (axis_of)
//   [3] bit mask over the candidate inputs (graph inputs, then initializers)
//   [4] bit mask over the candidate outputs (graph outputs, then node outputs)
//   [5] [6] [7] the entry's parameters (per-input axes, loss kind, optimizer, opset, ...)
// Names are chosen by index into the parsed model, so a mutation of the header keeps pointing
// at names the model has. fuzz/make_corpus.py writes seeds in this format; scripts/fuzz.sh
// builds and runs the target (docs/untrusted.md, "Fuzzing").
//
// Expected outcomes are a result or onnax::Error (the contract's diagnostic). Any other
// exception is reported and aborts, as do sanitizer reports, so libFuzzer records the input.
#include <google/protobuf/arena.h>
#include <onnax/onnax.h>
#include <onnax/training.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include "check/model_check.h"
#include "io/model_io.h"
#include "model_mutator.h"

namespace {

constexpr size_t kHeader = 8;

enum Entry : uint8_t {
  kVmapSerialized,
  kJvpSerialized,
  kVjpSerialized,
  kGradSerialized,
  kJacobian,
  kHessian,
  kInPlaceAndSave,  // the onnax command's path: arena, *_in_place, convert_opset, save_model
  kLoadSave,        // load_model from a file, save_model
  kStopGradient,
  kScan,
  kStep,
  kSignature,
  kSurrogates,
  kAddLoss,
  kTrainStep,
  kParams,  // constants_to_initializers, select_params
  kConvertOpset,
  kCheck,  // onnax check's checks
  kEntryCount
};

const char* const kEntryNames[] = {"vmap_serialized", "jvp_serialized", "vjp_serialized", "grad_serialized",
                                   "jacobian",        "hessian",        "in_place+save",  "load+save",
                                   "stop_gradient",   "scan",           "step",           "signature",
                                   "surrogates",      "add_loss",       "train_step",     "params",
                                   "convert_opset",   "check"};
static_assert(sizeof(kEntryNames) / sizeof(kEntryNames[0]) == kEntryCount);

// -3..3, or 7: none (shared).
onnax::Axis axis_of(uint8_t b) {
  const int v = b % 8;
  if (v == 7) return std::nullopt;
  return v - 3;
}

// The names selected by `mask` among `candidates` (bit i: candidate i), plus one the model does
// not have when asked.
std::vector<std::string> pick(const std::vector<std::string>& candidates, uint8_t mask, bool add_unknown) {
  std::vector<std::string> out;
  for (size_t i = 0; i < candidates.size() && i < 8; ++i)
    if (mask & (1u << i)) out.push_back(candidates[i]);
  if (add_unknown) out.push_back("onnax_fuzz_missing");
  return out;
}

struct Names {
  std::vector<std::string> inputs;   // graph inputs, then initializers
  std::vector<std::string> outputs;  // graph outputs, then node outputs
  std::vector<std::string> dims;     // symbolic dims of graph inputs
  size_t graph_inputs = 0;
};

Names names_of(const onnx::ModelProto& m) {
  Names n;
  const onnx::GraphProto& g = m.graph();
  for (const auto& v : g.input()) n.inputs.push_back(v.name());
  n.graph_inputs = n.inputs.size();
  for (const auto& t : g.initializer()) n.inputs.push_back(t.name());
  for (const auto& v : g.output()) n.outputs.push_back(v.name());
  for (const auto& node : g.node())
    for (const auto& o : node.output()) n.outputs.push_back(o);
  for (const auto& v : g.input())
    if (v.type().has_tensor_type())
      for (const auto& d : v.type().tensor_type().shape().dim())
        if (d.has_dim_param()) n.dims.push_back(d.dim_param());
  return n;
}

// A private folder for load_model and save_model (one per process: libFuzzer's fork mode
// runs several), removed when the run ends normally (a crash leaves it, with the input's files).
const std::filesystem::path& scratch() {
  // Never destroyed, so the exit handler can still read it.
  static const std::filesystem::path* const dir = [] {
    std::string templ = (std::filesystem::temp_directory_path() / "onnax-fuzz-XXXXXX").string();
    if (!mkdtemp(templ.data())) std::abort();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch(), ec);
    });
    return new std::filesystem::path(templ);
  }();
  return *dir;
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A result must read back as a model (what a caller does next with it): onnax refuses to
// return or write one that protobuf readers would reject (docs/untrusted.md), so failing to
// read it is a finding, not a diagnostic.
template <typename Read>
void must_read_back(Entry entry, Read&& read) {
  try {
    read();
  } catch (const onnax::Error& e) {
    std::fprintf(stderr, "onnax_fuzz: %s returned a result that does not read back: %s\n", kEntryNames[entry],
                 e.what());
    std::abort();
  }
}

void serialized_result(Entry entry, const std::string& out) {
  must_read_back(entry, [&] { (void)onnax::parse_model(out); });
}

void model_result(Entry entry, const onnx::ModelProto& out) {
  serialized_result(entry, out.SerializeAsString());
}

void run(Entry entry, const uint8_t* h, const std::string& bytes) {
  const uint8_t flags = h[1];
  const bool variant = flags & 4, unknown = flags & 8;
  onnx::ModelProto parsed;
  // The selections index the model as parsed; a model that does not parse still goes to the
  // entry point (its parse error is the diagnostic under test).
  const Names names = parsed.ParseFromString(bytes) ? names_of(parsed) : Names{};
  std::optional<std::vector<std::string>> inputs, outputs;
  if (flags & 1) inputs = pick(names.inputs, h[3], unknown);
  if (flags & 2) outputs = pick(names.outputs, h[4], unknown);
  const onnax::Selection selection{inputs, outputs};
  const std::optional<std::string> output =
      outputs && !outputs->empty() ? std::optional<std::string>(outputs->front()) : std::nullopt;

  onnax::VmapOptions vopt;
  switch ((flags >> 5) & 3) {
    case 1:
      vopt.in_axes_form = onnax::VmapOptions::InAxesForm::kPerInput;
      // One axis per runtime input, from a byte stream seeded by [5]; an extra entry with
      // `unknown` so a wrong count is tried too.
      for (size_t i = 0; i < names.graph_inputs + (unknown ? 1 : 0); ++i)
        vopt.in_axes.push_back(axis_of(static_cast<uint8_t>(h[5] >> (i % 8) | h[5] << (8 - i % 8))));
      break;
    case 2:
      vopt.in_axes_form = onnax::VmapOptions::InAxesForm::kByName;
      for (size_t i = 0; i < names.inputs.size() && i < 8; ++i)
        if (h[3] & (1u << i)) vopt.in_axes_by_name[names.inputs[i]] = axis_of(static_cast<uint8_t>(h[5] + i));
      if (unknown) vopt.in_axes_by_name["onnax_fuzz_missing"] = 0;
      break;
    default: vopt.in_axis = axis_of(h[2]);
  }
  if (flags & 16) {
    const size_t n = h[6] & 1 ? 1 : names.outputs.size();
    for (size_t i = 0; i < n && i < 64; ++i) vopt.out_axes.push_back(axis_of(static_cast<uint8_t>(h[6] >> 1) + i));
  }
  if (flags & 128 && !names.dims.empty()) vopt.axis_name = names.dims[h[7] % names.dims.size()];

  switch (entry) {
    case kVmapSerialized: return serialized_result(entry, onnax::vmap_serialized(bytes, vopt));
    case kJvpSerialized: return serialized_result(entry, onnax::jvp_serialized(bytes, selection));
    case kVjpSerialized: return serialized_result(entry, onnax::vjp_serialized(bytes, selection));
    case kGradSerialized: return serialized_result(entry, onnax::grad_serialized(bytes, inputs, output));
    case kJacobian:
      return model_result(entry, variant ? onnax::jacfwd(onnax::parse_model(bytes), selection)
                                         : onnax::jacrev(onnax::parse_model(bytes), selection));
    case kHessian: return model_result(entry, onnax::hessian(onnax::parse_model(bytes), inputs, output));
    case kInPlaceAndSave: {
      google::protobuf::Arena arena(onnax::model_arena_options());
      onnx::ModelProto& m = *google::protobuf::Arena::CreateMessage<onnx::ModelProto>(&arena);
      onnax::parse_model_into(bytes, m);
      switch (h[5] % 4) {
        case 0: onnax::vmap_in_place(m, vopt); break;
        case 1: onnax::jvp_in_place(m, selection); break;
        case 2: onnax::vjp_in_place(m, selection); break;
        default: onnax::grad_in_place(m, inputs, output);
      }
      // Opsets 7..28 (the supported range) and a few outside it.
      if (h[6] & 1) onnax::convert_opset_in_place(m, 5 + h[6] / 2 % 26);
      const std::filesystem::path out = scratch() / "out.onnx";
      onnax::save_model(m, out.string(), variant);
      must_read_back(entry, [&] { (void)onnax::load_model(out.string()); });
      return;
    }
    case kLoadSave: {
      const std::filesystem::path in = scratch() / "in.onnx", out = scratch() / "out.onnx";
      write_file(in, bytes);
      // External data the model names is looked up next to it: give it one file to find.
      write_file(scratch() / "w.data", std::string(reinterpret_cast<const char*>(h), kHeader) + bytes.substr(0, 256));
      std::vector<std::string> data_files;
      onnx::ModelProto m;
      onnax::load_model_into(in.string(), m, &data_files);
      onnax::check_output_paths(in.string(), data_files, out.string());
      onnax::save_model(m, out.string(), variant);
      must_read_back(entry, [&] { (void)onnax::load_model(out.string()); });
      return;
    }
    case kStopGradient:
      return model_result(
          entry, onnax::grad(onnax::stop_gradient(onnax::parse_model(bytes), outputs.value_or(names.outputs)), inputs,
                             std::nullopt));
    case kScan: {
      onnax::ScanOptions o;
      if (flags & 1) o.roles.state = inputs;
      if (outputs && inputs)
        for (size_t i = 0; i < inputs->size() && i < outputs->size(); ++i)
          o.roles.next_state[(*inputs)[i]] = (*outputs)[i];
      if (h[5] & 1) o.roles.constants = pick(names.inputs, h[5] >> 1, false);
      if (h[6] & 1) o.length = h[6] / 2 % 8;
      if (h[6] & 2) o.truncate = h[7] % 8 - 1;
      if (variant && !names.dims.empty()) o.length_name = names.dims.front();
      return model_result(entry, onnax::scan(onnax::parse_model(bytes), o));
    }
    case kStep: return model_result(entry, onnax::step(onnax::parse_model(bytes)));
    case kSignature: {
      onnax::StepRoles roles;
      if (flags & 1) roles.state = inputs;
      (void)onnax::signature_json(onnax::signature(onnax::parse_model(bytes), roles));
      return;
    }
    case kSurrogates: {
      static const std::array<const char*, 8> specs = {
          "superspike", "arctan:alpha=2",   "triangular:k=3",        "boxcar:width=1,height=2",
          "tanh",       "straight_through", "fast_sigmoid:slope=-1", "boxcar:width=0"};
      onnax::Surrogate s = onnax::parse_surrogate(specs[h[5] % specs.size()]);
      if (output) s.value = *output;
      return model_result(entry,
                          onnax::grad(onnax::with_surrogates(onnax::parse_model(bytes), {s}), inputs, std::nullopt));
    }
    case kAddLoss: {
      const std::vector<std::string> kinds = onnax::loss_kind_names();
      onnax::LossOptions o;
      o.kind = *onnax::loss_kind_from_name(kinds[h[5] % kinds.size()]);
      if (output) o.output = *output;
      o.reduction = h[6] & 1 ? onnax::Reduction::kSum : onnax::Reduction::kMean;
      o.probability_labels = h[6] & 2;
      o.label_smoothing = h[6] & 4 ? 0.1 : 0.0;
      o.class_axis = static_cast<int64_t>(h[7] % 6) - 3;
      if (h[6] & 8) o.ignore_index = -100;
      o.example_weights = h[6] & 16;
      o.keep_outputs = !(h[6] & 32);
      if (variant && !names.inputs.empty()) o.label_name = names.inputs.front();  // a clash
      return model_result(entry,
                          onnax::grad(onnax::add_loss(onnax::parse_model(bytes), o), std::nullopt, std::nullopt));
    }
    case kTrainStep: {
      onnax::TrainStepOptions o;
      o.loss = output;
      if (inputs) o.params.include = *inputs;
      o.optimizer.kind = static_cast<onnax::OptimizerOptions::Kind>(h[5] % 3);
      o.optimizer.momentum = h[5] & 4 ? 0.9 : 0.0;
      o.optimizer.nesterov = h[5] & 8;
      o.optimizer.clip_norm = h[5] & 16 ? 1.0 : 0.0;
      o.optimizer.weight_decay = h[5] & 32 ? 0.01 : 0.0;
      if (h[6] & 1) {
        o.dp_sgd.emplace();
        if (h[6] & 2) o.dp_sgd->noise_seed = 7;
      }
      o.form = static_cast<onnax::TrainStepOptions::Form>(h[6] / 4 % 3);
      const onnx::ModelProto source = onnax::parse_model(bytes);
      const onnx::ModelProto stepped = onnax::train_step(source, o);
      model_result(entry, stepped);
      if (variant) model_result(entry, onnax::initial_state(source, stepped));
      return;
    }
    case kParams: {
      const onnx::ModelProto m = onnax::constants_to_initializers(onnax::parse_model(bytes), h[5] % 4);
      onnax::ParamSpec spec;
      if (inputs) spec.include = *inputs;
      if (variant) spec.include.push_back("re:.*[0-9]+");
      spec.min_size = h[6] % 4;
      (void)onnax::select_params(m, spec);
      return;
    }
    case kConvertOpset: {
      onnx::ModelProto m = onnax::parse_model(bytes);
      onnax::convert_opset_in_place(m, 5 + h[5] % 26);
      return model_result(entry, m);
    }
    case kCheck: {
      const onnx::ModelProto m = onnax::parse_model(bytes);
      (void)onnax::check::structure_checker(m);
      // As `onnax check` runs them: ONNX's strict inference only on a model its checker passes
      // (on others ONNX's inference dereferences missing types, which onnax does not call it on).
      if (onnax::check::checker(m).empty()) (void)onnax::check::strict_shape_inference(m);
      (void)onnax::check::embedded_weights(m, pick(names.inputs, h[3], unknown));
      return;
    }
    case kEntryCount: return;
  }
}

}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// A quarter of the mutations are libFuzzer's own, on the whole input (the parser's error paths,
// and byte patterns no structural change makes); an eighth change the header (another entry
// point or option for the same model); the rest change the model through its structure.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::minstd_rand rng(seed);
  const unsigned pick = rng() % 8;
  if (size < kHeader || max_size <= kHeader || pick < 2) return LLVMFuzzerMutate(data, size, max_size);
  if (pick == 2) {
    data[rng() % kHeader] = static_cast<uint8_t>(rng());
    return size;
  }
  const size_t n = onnax_fuzz::mutate_model(data + kHeader, size - kHeader, max_size - kHeader, rng());
  return n ? kHeader + n : LLVMFuzzerMutate(data, size, max_size);
}

// The first input's header and model, with a piece (a node, an initializer, ...) of the
// second's model.
extern "C" size_t LLVMFuzzerCustomCrossOver(const uint8_t* data1, size_t size1, const uint8_t* data2, size_t size2,
                                            uint8_t* out, size_t max_out_size, unsigned int seed) {
  if (size1 < kHeader || size2 < kHeader || max_out_size <= kHeader) return 0;
  const size_t n = onnax_fuzz::cross_models(data1 + kHeader, size1 - kHeader, data2 + kHeader, size2 - kHeader,
                                            out + kHeader, max_out_size - kHeader, seed);
  if (n == 0) return 0;
  std::memcpy(out, data1, kHeader);
  return kHeader + n;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Notices (opset upgrades, per-example loops) are expected output, not findings.
  onnax::set_notice_sink([](const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kHeader) return 0;
  const auto entry = static_cast<Entry>(data[0] % kEntryCount);
  const std::string bytes(reinterpret_cast<const char*>(data) + kHeader, size - kHeader);
  try {
    run(entry, data, bytes);
  } catch (const onnax::Error&) {
    // The contract's diagnostic: expected for malformed models and selections.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "onnax_fuzz: %s threw a %s that is not onnax::Error: %s\n", kEntryNames[entry],
                 typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "onnax_fuzz: %s threw a non-std exception\n", kEntryNames[entry]);
    std::abort();
  }
  return 0;
}
