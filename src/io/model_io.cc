// Loading and saving .onnx files, including external data and models over 2 GB.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnax/onnax.h>

#include <climits>
#include <filesystem>
#include <fstream>
#include <functional>

#include "diagnostics/error.h"

namespace onnax {
namespace fs = std::filesystem;
namespace {

// Protobuf messages cannot exceed 2 GB; beyond this size tensors go to an external file.
constexpr size_t kMaxInlineBytes = size_t{2} * 1024 * 1024 * 1024 - 64 * 1024 * 1024;
constexpr size_t kExternalThreshold = 1024;  // tensors at least this big move out

void for_each_tensor(onnx::GraphProto& g, const std::function<void(onnx::TensorProto&)>& fn) {
  for (auto& t : *g.mutable_initializer()) fn(t);
  for (auto& s : *g.mutable_sparse_initializer()) {
    fn(*s.mutable_values());
    fn(*s.mutable_indices());
  }
  for (auto& n : *g.mutable_node())
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_t()) fn(*a.mutable_t());
      for (auto& t : *a.mutable_tensors()) fn(t);
      if (a.has_g()) for_each_tensor(*a.mutable_g(), fn);
      for (auto& sg : *a.mutable_graphs()) for_each_tensor(sg, fn);
    }
}

void for_each_tensor(onnx::ModelProto& m, const std::function<void(onnx::TensorProto&)>& fn) {
  if (m.has_graph()) for_each_tensor(*m.mutable_graph(), fn);
  for (auto& f : *m.mutable_functions())
    for (auto& n : *f.mutable_node())
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_t()) fn(*a.mutable_t());
        if (a.has_g()) for_each_tensor(*a.mutable_g(), fn);
      }
}

void load_external(onnx::TensorProto& t, const fs::path& base) {
  if (t.data_location() != onnx::TensorProto::EXTERNAL) return;
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = std::stoll(kv.value());
    else if (kv.key() == "length") length = std::stoll(kv.value());
  }
  const fs::path rel(location);
  if (location.empty() || rel.is_absolute() || location.find("..") != std::string::npos)
    diag::fail(Error::Kind::kInvalidModel,
               "tensor '" + t.name() + "' has external data at '" + location +
                   "', which is not a relative path inside the model's directory. Fix: store external data next to "
                   "the model with a relative location");
  const fs::path file = base / rel;
  std::ifstream in(file, std::ios::binary);
  if (!in)
    diag::fail(Error::Kind::kIo, "tensor '" + t.name() + "': cannot open its external data file '" + file.string() +
                                     "'. Fix: keep the data file next to the model (expected relative location '" +
                                     location + "')");
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  if (length < 0) length = size - offset;
  if (offset < 0 || offset + length > size)
    diag::fail(Error::Kind::kInvalidModel, "tensor '" + t.name() + "': external data range [" +
                                               std::to_string(offset) + ", " + std::to_string(offset + length) +
                                               ") exceeds the file '" + file.string() + "' of " +
                                               std::to_string(size) + " bytes. Fix: the data file is truncated or "
                                               "does not belong to this model");
  std::string data(static_cast<size_t>(length), '\0');
  in.seekg(offset);
  in.read(data.data(), length);
  t.set_raw_data(std::move(data));
  t.clear_external_data();
  t.set_data_location(onnx::TensorProto::DEFAULT);
}

void parse_or_fail(onnx::ModelProto& m, google::protobuf::io::ZeroCopyInputStream& stream, const std::string& what) {
  google::protobuf::io::CodedInputStream coded(&stream);
  coded.SetTotalBytesLimit(INT_MAX);
  if (!m.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage())
    diag::fail(Error::Kind::kInvalidModel,
               what + " is not a valid ONNX model: protobuf parsing failed (the file is truncated, corrupted, or not "
                      "an ONNX ModelProto). Fix: re-export or re-download the model; `onnax check` reports details");
  if (!m.has_graph())
    diag::fail(Error::Kind::kInvalidModel,
               what + " parsed as protobuf but has no graph, so it is not an ONNX model. Fix: pass a .onnx model file");
}

}  // namespace

onnx::ModelProto parse_model(const std::string& bytes) {
  onnx::ModelProto m;
  google::protobuf::io::ArrayInputStream stream(bytes.data(), static_cast<int>(bytes.size()));
  parse_or_fail(m, stream, "the given bytes");
  return m;
}

onnx::ModelProto load_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in || fs::is_directory(path))
    diag::fail(Error::Kind::kIo, "cannot open '" + path + "' for reading. Fix: check the path");
  onnx::ModelProto m;
  google::protobuf::io::IstreamInputStream stream(&in);
  parse_or_fail(m, stream, "'" + path + "'");
  const fs::path base = fs::absolute(fs::path(path)).parent_path();
  for_each_tensor(m, [&](onnx::TensorProto& t) { load_external(t, base); });
  return m;
}

void save_model(const onnx::ModelProto& model, const std::string& path, bool external_data) {
  const fs::path out_path(path);
  std::error_code ec;
  if (out_path.has_parent_path()) fs::create_directories(out_path.parent_path(), ec);
  const onnx::ModelProto* to_write = &model;
  onnx::ModelProto copy;
  if (external_data || model.ByteSizeLong() > kMaxInlineBytes) {
    copy = model;
    const std::string data_name = out_path.filename().string() + ".data";
    const fs::path data_path = out_path.parent_path() / data_name;
    std::ofstream data(data_path, std::ios::binary | std::ios::trunc);
    if (!data) diag::fail(Error::Kind::kIo, "cannot write '" + data_path.string() + "'. Fix: check permissions");
    int64_t offset = 0;
    for_each_tensor(copy, [&](onnx::TensorProto& t) {
      if (!t.has_raw_data() || t.raw_data().size() < kExternalThreshold) return;
      const int64_t pad = (4096 - offset % 4096) % 4096;  // page-aligned for memory mapping
      data.write(std::string(static_cast<size_t>(pad), '\0').data(), pad);
      offset += pad;
      const std::string& raw = t.raw_data();
      data.write(raw.data(), static_cast<std::streamsize>(raw.size()));
      auto add = [&](const char* k, const std::string& v) {
        auto* e = t.add_external_data();
        e->set_key(k);
        e->set_value(v);
      };
      add("location", data_name);
      add("offset", std::to_string(offset));
      add("length", std::to_string(raw.size()));
      offset += static_cast<int64_t>(raw.size());
      t.clear_raw_data();
      t.set_data_location(onnx::TensorProto::EXTERNAL);
    });
    if (!data) diag::fail(Error::Kind::kIo, "writing '" + data_path.string() + "' failed. Fix: check free disk space");
    to_write = &copy;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) diag::fail(Error::Kind::kIo, "cannot open '" + path + "' for writing. Fix: check the path and permissions");
  if (!to_write->SerializeToOstream(&out) || !out.flush())
    diag::fail(Error::Kind::kIo, "writing '" + path + "' failed. Fix: check free disk space");
}

}  // namespace onnax
