// Loading and saving .onnx files, including external data and models over 2 GB.
#include "io/model_io.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/unknown_field_set.h>
#include <onnax/onnax.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <unordered_map>
#include <vector>

#include "diagnostics/error.h"
#include "diagnostics/limits.h"

namespace onnax {
namespace fs = std::filesystem;
namespace {

// Protobuf messages cannot exceed 2 GB; beyond this size tensors go to an external file.
constexpr size_t kMaxInlineBytes = size_t{2} * 1024 * 1024 * 1024 - 64 * 1024 * 1024;
constexpr size_t kExternalThreshold = 1024;  // tensors at least this big move out

void for_each_tensor(onnx::GraphProto& g, const std::function<void(onnx::TensorProto&)>& fn);

void for_each_tensor(google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes,
                     const std::function<void(onnx::TensorProto&)>& fn) {
  for (auto& n : nodes)
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_t()) fn(*a.mutable_t());
      for (auto& t : *a.mutable_tensors()) fn(t);
      if (a.has_sparse_tensor()) {
        fn(*a.mutable_sparse_tensor()->mutable_values());
        fn(*a.mutable_sparse_tensor()->mutable_indices());
      }
      for (auto& s : *a.mutable_sparse_tensors()) {
        fn(*s.mutable_values());
        fn(*s.mutable_indices());
      }
      if (a.has_g()) for_each_tensor(*a.mutable_g(), fn);
      for (auto& sg : *a.mutable_graphs()) for_each_tensor(sg, fn);
    }
}

void for_each_tensor(onnx::GraphProto& g, const std::function<void(onnx::TensorProto&)>& fn) {
  for (auto& t : *g.mutable_initializer()) fn(t);
  for (auto& s : *g.mutable_sparse_initializer()) {
    fn(*s.mutable_values());
    fn(*s.mutable_indices());
  }
  for_each_tensor(*g.mutable_node(), fn);
}

void for_each_tensor(onnx::ModelProto& m, const std::function<void(onnx::TensorProto&)>& fn) {
  if (m.has_graph()) for_each_tensor(*m.mutable_graph(), fn);
  for (auto& f : *m.mutable_functions()) {
    for_each_tensor(*f.mutable_node(), fn);
    for (auto& a : *f.mutable_attribute_proto()) {  // attribute defaults
      if (a.has_t()) fn(*a.mutable_t());
      for (auto& t : *a.mutable_tensors()) fn(t);
    }
  }
}

// Bytes of raw_data a tensor of this type and element count needs; nullopt when unknown
// (strings, undefined types) or when the count overflows.
std::optional<uint64_t> raw_bytes_needed(int32_t dtype, uint64_t count) {
  uint64_t bits = 0;
  switch (dtype) {
    case onnx::TensorProto::BOOL:
    case onnx::TensorProto::INT8:
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::FLOAT8E4M3FN:
    case onnx::TensorProto::FLOAT8E4M3FNUZ:
    case onnx::TensorProto::FLOAT8E5M2:
    case onnx::TensorProto::FLOAT8E5M2FNUZ:
    case onnx::TensorProto::FLOAT8E8M0: bits = 8; break;
    case onnx::TensorProto::INT16:
    case onnx::TensorProto::UINT16:
    case onnx::TensorProto::FLOAT16:
    case onnx::TensorProto::BFLOAT16: bits = 16; break;
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::UINT32:
    case onnx::TensorProto::FLOAT: bits = 32; break;
    case onnx::TensorProto::INT64:
    case onnx::TensorProto::UINT64:
    case onnx::TensorProto::DOUBLE:
    case onnx::TensorProto::COMPLEX64: bits = 64; break;
    case onnx::TensorProto::COMPLEX128: bits = 128; break;
    case onnx::TensorProto::INT4:
    case onnx::TensorProto::UINT4:
    case onnx::TensorProto::FLOAT4E2M1: bits = 4; break;
    case onnx::TensorProto::INT2:
    case onnx::TensorProto::UINT2: bits = 2; break;
    default: return std::nullopt;
  }
  if (count > std::numeric_limits<uint64_t>::max() / bits) return std::nullopt;
  return (count * bits + 7) / 8;
}

// A non-negative decimal integer (the whole string), or nullopt.
std::optional<int64_t> parse_size(const std::string& s) {
  int64_t v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc() || ptr != end || v < 0) return std::nullopt;
  return v;
}

// A fresh name next to `target` for writing before renaming onto it.
fs::path temporary_next_to(const fs::path& target) {
  static std::atomic<unsigned> counter{0};
  // (Appended piece by piece: GCC 12 warns falsely on "literal" + std::string temporaries.)
  std::string name = ".";
  name += target.filename().string();
  name += ".onnax-";
  name += std::to_string(::getpid());
  name += "-";
  name += std::to_string(counter++);
  name += ".tmp";
  return target.parent_path() / name;
}

void load_external(onnx::TensorProto& t, const fs::path& base, std::vector<std::string>* data_files) {
  if (t.data_location() != onnx::TensorProto::EXTERNAL) return;
  const std::string who = "tensor '" + t.name() + "'";
  std::string location;
  std::optional<int64_t> offset = 0, length;
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location") {
      location = kv.value();
    } else if (kv.key() == "offset" || kv.key() == "length") {
      const std::optional<int64_t> v = parse_size(kv.value());
      if (!v)
        diag::fail(Error::Kind::kInvalidModel,
                   who + ": external data " + kv.key() + " '" + kv.value() +
                       "' is not a non-negative integer that fits in 64 bits. Fix: the model file is corrupted or "
                       "was written by a faulty exporter; re-export it");
      (kv.key() == "offset" ? offset : length) = v;
    }
  }
  // Only plain relative paths below the model's directory: no absolute paths, no '..'.
  const fs::path rel(location);
  bool inside = !location.empty() && !rel.is_absolute() && !rel.has_root_name() && !rel.has_root_directory();
  for (const auto& part : rel)
    if (part == "..") inside = false;
  if (!inside)
    diag::fail(Error::Kind::kInvalidModel,
               who + " has external data at '" + location +
                   "', which is not a relative path inside the model's directory. Fix: store external data next to "
                   "the model with a relative location");
  const fs::path file = base / rel;
  std::error_code ec;
  // No symbolic link on the way (as onnx.load refuses them): a link would let a model read any
  // file the user can (a credentials file, say) into the result.
  fs::path walked = base;
  for (const auto& part : rel) {
    walked /= part;
    if (fs::is_symlink(fs::symlink_status(walked, ec)))
      diag::fail(Error::Kind::kInvalidModel,
                 who + ": its external data location '" + location + "' goes through the symbolic link '" +
                     walked.string() +
                     "'; onnax (like onnx.load) reads external data only from regular files inside the model's "
                     "directory. Fix: copy the data file itself next to the model");
  }
  const auto status = fs::status(file, ec);
  if (!fs::exists(status))
    diag::fail(Error::Kind::kIo, who + ": its external data file '" + file.string() +
                                     "' does not exist. Fix: keep the data file next to the model (expected relative "
                                     "location '" +
                                     location + "')");
  if (!fs::is_regular_file(status))
    diag::fail(Error::Kind::kInvalidModel, who + ": its external data location '" + location + "' (" + file.string() +
                                               ") is not a regular file. Fix: point the location at the data file");
  if (data_files) data_files->push_back(file.string());
  const uintmax_t file_size = fs::file_size(file, ec);
  std::ifstream in(file, std::ios::binary);
  if (ec || !in)
    diag::fail(Error::Kind::kIo,
               who + ": cannot open its external data file '" + file.string() + "'. Fix: check the file's permissions");
  const auto size = static_cast<int64_t>(file_size);
  if (*offset > size)
    diag::fail(Error::Kind::kInvalidModel, who + ": external data offset " + std::to_string(*offset) +
                                               " is past the end of '" + file.string() + "' (" + std::to_string(size) +
                                               " bytes). Fix: the data file is truncated or does not belong to this "
                                               "model");
  if (!length) length = size - *offset;
  if (*length > size - *offset)
    diag::fail(Error::Kind::kInvalidModel,
               who + ": external data range [" + std::to_string(*offset) + ", " +
                   std::to_string(static_cast<uint64_t>(*offset) + static_cast<uint64_t>(*length)) +
                   ") exceeds the file '" + file.string() + "' of " + std::to_string(size) +
                   " bytes. Fix: the data file is truncated or does not belong to this model");
  // The byte count must match the declared shape and type (when it is fixed-width).
  uint64_t count = 1;
  bool known = true;
  for (int64_t d : t.dims()) {
    if (d < 0 || (d > 0 && count > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)))
      known = false;
    else
      count *= static_cast<uint64_t>(d);
  }
  const std::optional<uint64_t> needed = known ? raw_bytes_needed(t.data_type(), count) : std::nullopt;
  if (needed && *needed != static_cast<uint64_t>(*length))
    diag::fail(Error::Kind::kInvalidModel, who + " (" + diag::dtype_name(t.data_type()) + ", " + std::to_string(count) +
                                               " elements) needs " + std::to_string(*needed) +
                                               " bytes, but its external data in '" + location + "' has " +
                                               std::to_string(*length) +
                                               " bytes. Fix: the data file or the tensor's offset/length entries "
                                               "do not belong to this model; re-export it");
  std::string data(static_cast<size_t>(*length), '\0');
  in.seekg(*offset);
  in.read(data.data(), *length);
  if (!in || in.gcount() != *length)
    diag::fail(Error::Kind::kIo, who + ": reading " + std::to_string(*length) + " bytes of external data from '" +
                                     file.string() + "' failed. Fix: check the file and the disk");
  t.set_raw_data(std::move(data));
  t.clear_external_data();
  t.clear_data_location();  // DEFAULT, left unset as in a model saved without external data
}

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using LargeRaw = std::unordered_map<onnx::TensorProto*, const std::string*>;

// Copies one non-message field of `src` into `dst` (messages of the same type).
void copy_plain_field(const Message& src, Message& dst, const FieldDescriptor* f) {
  const auto* r = src.GetReflection();
  const auto* w = dst.GetReflection();
  const int n = f->is_repeated() ? r->FieldSize(src, f) : 1;
  for (int i = 0; i < n; ++i) {
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: {
        const auto v = rep ? r->GetRepeatedInt32(src, f, i) : r->GetInt32(src, f);
        rep ? w->AddInt32(&dst, f, v) : w->SetInt32(&dst, f, v);
      } break;
      case FieldDescriptor::CPPTYPE_INT64: {
        const auto v = rep ? r->GetRepeatedInt64(src, f, i) : r->GetInt64(src, f);
        rep ? w->AddInt64(&dst, f, v) : w->SetInt64(&dst, f, v);
      } break;
      case FieldDescriptor::CPPTYPE_UINT32: {
        const auto v = rep ? r->GetRepeatedUInt32(src, f, i) : r->GetUInt32(src, f);
        rep ? w->AddUInt32(&dst, f, v) : w->SetUInt32(&dst, f, v);
      } break;
      case FieldDescriptor::CPPTYPE_UINT64: {
        const auto v = rep ? r->GetRepeatedUInt64(src, f, i) : r->GetUInt64(src, f);
        rep ? w->AddUInt64(&dst, f, v) : w->SetUInt64(&dst, f, v);
      } break;
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        const auto v = rep ? r->GetRepeatedDouble(src, f, i) : r->GetDouble(src, f);
        rep ? w->AddDouble(&dst, f, v) : w->SetDouble(&dst, f, v);
      } break;
      case FieldDescriptor::CPPTYPE_FLOAT: {
        const auto v = rep ? r->GetRepeatedFloat(src, f, i) : r->GetFloat(src, f);
        rep ? w->AddFloat(&dst, f, v) : w->SetFloat(&dst, f, v);
      } break;
      case FieldDescriptor::CPPTYPE_BOOL: {
        const auto v = rep ? r->GetRepeatedBool(src, f, i) : r->GetBool(src, f);
        rep ? w->AddBool(&dst, f, v) : w->SetBool(&dst, f, v);
      } break;
      case FieldDescriptor::CPPTYPE_ENUM: {
        const auto v = rep ? r->GetRepeatedEnumValue(src, f, i) : r->GetEnumValue(src, f);
        rep ? w->AddEnumValue(&dst, f, v) : w->SetEnumValue(&dst, f, v);
      } break;
      case FieldDescriptor::CPPTYPE_STRING: {
        std::string v = rep ? r->GetRepeatedString(src, f, i) : r->GetString(src, f);
        rep ? w->AddString(&dst, f, std::move(v)) : w->SetString(&dst, f, std::move(v));
      } break;
      case FieldDescriptor::CPPTYPE_MESSAGE: break;  // handled by the caller
    }
  }
}

// Copies `src` into `dst` (same type) without copying the raw_data of tensors that go to the
// external data file: those are recorded in `large` (copied tensor -> source bytes). This
// keeps the memory of saving a model over 2 GB at one copy of its weights, not two.
void copy_without_large_raw(const Message& src, Message& dst, LargeRaw& large) {
  const auto* d = src.GetDescriptor();
  // Only these message types can hold a tensor; anything else is copied whole.
  if (d != onnx::ModelProto::descriptor() && d != onnx::GraphProto::descriptor() &&
      d != onnx::NodeProto::descriptor() && d != onnx::AttributeProto::descriptor() &&
      d != onnx::FunctionProto::descriptor() && d != onnx::SparseTensorProto::descriptor() &&
      d != onnx::TensorProto::descriptor()) {
    dst.CopyFrom(src);
    return;
  }
  const auto* r = src.GetReflection();
  const auto* w = dst.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(src, &fields);
  for (const auto* f : fields) {
    if (d == onnx::TensorProto::descriptor() && f->number() == onnx::TensorProto::kRawDataFieldNumber) {
      const auto& raw = static_cast<const onnx::TensorProto&>(src).raw_data();
      if (raw.size() >= kExternalThreshold) {
        large[static_cast<onnx::TensorProto*>(&dst)] = &raw;
        continue;
      }
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE)
      copy_plain_field(src, dst, f);
    else if (!f->is_repeated())
      copy_without_large_raw(r->GetMessage(src, f), *w->MutableMessage(&dst, f), large);
    else
      for (int i = 0; i < r->FieldSize(src, f); ++i)
        copy_without_large_raw(r->GetRepeatedMessage(src, f, i), *w->AddMessage(&dst, f), large);
  }
  w->MutableUnknownFields(&dst)->MergeFrom(r->GetUnknownFields(src));
}

void parse_or_fail(onnx::ModelProto& m, google::protobuf::io::ZeroCopyInputStream& stream, const std::string& what) {
  google::protobuf::io::CodedInputStream coded(&stream);
  coded.SetTotalBytesLimit(INT_MAX);
  if (!m.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage())
    diag::fail(Error::Kind::kInvalidModel,
               what +
                   " is not a valid ONNX model: protobuf parsing failed (the file is truncated, corrupted, or not "
                   "an ONNX ModelProto). Fix: re-export or re-download the model");
  if (!m.has_graph())
    diag::fail(Error::Kind::kInvalidModel,
               what + " parsed as protobuf but has no graph, so it is not an ONNX model. Fix: pass a .onnx model file");
}

}  // namespace

onnx::ModelProto parse_model(const std::string& bytes) {
  onnx::ModelProto m;
  parse_model_into(bytes, m);
  return m;
}

google::protobuf::ArenaOptions model_arena_options() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 64 * 1024;
  options.max_block_size = 4 * 1024 * 1024;
  return options;
}

void parse_model_into(const std::string& bytes, onnx::ModelProto& m) {
  google::protobuf::io::ArrayInputStream stream(bytes.data(), static_cast<int>(bytes.size()));
  parse_or_fail(m, stream, "the given bytes");
}

onnx::ModelProto load_model(const std::string& path) {
  onnx::ModelProto m;
  load_model_into(path, m);
  return m;
}

void load_model_into(const std::string& path, onnx::ModelProto& m, std::vector<std::string>* data_files) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status))
    diag::fail(Error::Kind::kIo, "the model file '" + path + "' does not exist. Fix: check the path");
  if (fs::is_directory(status))
    diag::fail(Error::Kind::kIo, "'" + path + "' is a directory, not a model file. Fix: pass the path of a .onnx file");
  if (!fs::is_regular_file(status))  // (a FIFO or device would block or never end)
    diag::fail(Error::Kind::kIo, "'" + path +
                                     "' is not a regular file (a pipe, socket or device). Fix: save the model to a "
                                     "file and pass its path");
  std::ifstream in(path, std::ios::binary);
  if (!in) diag::fail(Error::Kind::kIo, "cannot open '" + path + "' for reading. Fix: check the file's permissions");
  if (fs::is_regular_file(status) && fs::file_size(path, ec) == 0 && !ec)
    diag::fail(
        Error::Kind::kInvalidModel,
        "'" + path + "' is empty (0 bytes), so it is not an ONNX model. Fix: re-export or re-download the model");
  google::protobuf::io::IstreamInputStream stream(&in);
  parse_or_fail(m, stream, "'" + path + "'");
  const fs::path base = fs::absolute(fs::path(path)).parent_path();
  for_each_tensor(m, [&](onnx::TensorProto& t) { load_external(t, base, data_files); });
}

void check_output_paths(const std::string& in, const std::vector<std::string>& data_files, const std::string& out) {
  std::error_code ec;
  if (fs::is_directory(out, ec))
    diag::fail(Error::Kind::kIo, "the output path '" + out + "' is a directory. Fix: name a file in it, such as '" +
                                     (fs::path(out) / "model.onnx").string() + "'");
  const std::string out_data = out + ".data";
  for (const std::string& read : data_files)
    for (const std::string& written : {out, out_data})
      if (fs::equivalent(read, written, ec))
        diag::fail(Error::Kind::kIo, "writing '" + written + "' would overwrite '" + read +
                                         "', external data the input model '" + in +
                                         "' reads. Fix: write the result to another file name or folder");
  if (fs::equivalent(in, out_data, ec))
    diag::fail(Error::Kind::kIo, "the result's external data file '" + out_data +
                                     "' would overwrite the input model '" + in + "'. Fix: choose another output path");
}

namespace {

int type_depth(const onnx::TypeProto& t) {
  if (t.has_tensor_type()) return 3;  // TypeProto, Tensor, TensorShapeProto (+ Dimension below)
  if (t.has_sequence_type()) return 2 + type_depth(t.sequence_type().elem_type());
  if (t.has_optional_type()) return 2 + type_depth(t.optional_type().elem_type());
  if (t.has_map_type()) return 2 + type_depth(t.map_type().value_type());
  return 1;
}

// The deepest message nesting of `g` counted from the graph itself (protobuf parsers refuse
// input nested past their recursion limit, 100 by default).
int graph_depth(const onnx::GraphProto& g) {
  int deepest = 1;
  auto infos = [&](const auto& list) {
    for (const auto& vi : list) deepest = std::max(deepest, 2 + type_depth(vi.type()) + 1);
  };
  infos(g.input());
  infos(g.output());
  infos(g.value_info());
  for (const auto& n : g.node())
    for (const auto& a : n.attribute()) {
      if (a.has_g()) deepest = std::max(deepest, 3 + graph_depth(a.g()));
      for (const auto& sg : a.graphs()) deepest = std::max(deepest, 3 + graph_depth(sg));
    }
  return deepest;
}

}  // namespace

void save_model(const onnx::ModelProto& model, const std::string& path, bool external_data) {
  constexpr int kProtobufDepthLimit = 100;
  if (const int depth = 1 + graph_depth(model.graph()); depth > kProtobufDepthLimit)
    diag::fail(Error::Kind::kUnsupported,
               "the result nests " + std::to_string(depth) +
                   " protobuf messages deep (Loop/Scan/If bodies within bodies), past the " +
                   std::to_string(kProtobufDepthLimit) +
                   " that protobuf readers accept, so no runtime could load the file; nothing was written. Fix: "
                   "flatten the model's control flow (fewer nested bodies) before transforming it");
  limits::poll();  // (past a bound, nothing is written)
  if (limits::max_output_bytes() > 0) limits::check_output_size(model.ByteSizeLong(), "writing '" + path + "'");
  const fs::path out_path(path);
  std::error_code ec;
  if (out_path.has_parent_path()) fs::create_directories(out_path.parent_path(), ec);
  const onnx::ModelProto* to_write = &model;
  onnx::ModelProto copy;
  fs::path data_path, data_tmp;
  if (external_data || model.ByteSizeLong() > kMaxInlineBytes) {
    LargeRaw large;
    copy_without_large_raw(model, copy, large);
    const std::string data_name = out_path.filename().string() + ".data";
    data_path = out_path.parent_path() / data_name;
    data_tmp = temporary_next_to(data_path);
    std::ofstream data(data_tmp, std::ios::binary | std::ios::trunc);
    if (!data) diag::fail(Error::Kind::kIo, "cannot write '" + data_path.string() + "'. Fix: check permissions");
    int64_t offset = 0;
    for_each_tensor(copy, [&](onnx::TensorProto& t) {
      const auto it = large.find(&t);
      if (it == large.end()) return;
      const int64_t pad = (4096 - offset % 4096) % 4096;  // page-aligned for memory mapping
      data.write(std::string(static_cast<size_t>(pad), '\0').data(), pad);
      offset += pad;
      const std::string& raw = *it->second;
      large.erase(it);
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
    for (auto& [t, raw] : large) t->set_raw_data(*raw);  // a tensor outside for_each_tensor's reach stays inline
    if (!data.flush()) {
      fs::remove(data_tmp, ec);
      diag::fail(Error::Kind::kIo, "writing '" + data_path.string() + "' failed. Fix: check free disk space");
    }
    to_write = &copy;
  }
  // Written to a temporary file next to the target, then renamed over it: a full disk, a file
  // size limit or a kill leaves the earlier result (or nothing) in place, never a truncated file.
  const fs::path tmp = temporary_next_to(out_path);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      diag::fail(Error::Kind::kIo, "cannot open '" + path + "' for writing. Fix: check the path and permissions");
    if (!to_write->SerializeToOstream(&out) || !out.flush()) {
      out.close();
      fs::remove(tmp, ec);
      if (!data_tmp.empty()) fs::remove(data_tmp, ec);
      diag::fail(Error::Kind::kIo, "writing '" + path + "' failed. Fix: check free disk space");
    }
  }
  if (!data_tmp.empty()) fs::rename(data_tmp, data_path, ec);
  if (!ec) fs::rename(tmp, out_path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    diag::fail(Error::Kind::kIo, "cannot replace '" + path + "' with the result. Fix: check the folder's permissions");
  }
}

}  // namespace onnax
