// Model I/O: lossless load/save round trips, external data, models over 2 GB, and clear
// errors (never a crash) for truncated, malformed or unsafe files.
#include <google/protobuf/unknown_field_set.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "test_util.h"

namespace onnax {
namespace {
namespace fs = std::filesystem;
using testing::error_of;
using testing::parse;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A fresh directory under /tmp, removed with everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("onnax_model_io_" + std::string(info ? info->name() : "test") + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Byte equality that reports the sizes and first difference instead of dumping binary data.
::testing::AssertionResult same_bytes(const std::string& actual, const std::string& expected) {
  if (actual == expected) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < actual.size() && i < expected.size() && actual[i] == expected[i]) ++i;
  return ::testing::AssertionFailure() << "bytes differ: " << actual.size() << " vs " << expected.size()
                                       << " bytes, first difference at offset " << i;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

// Deterministic, position-dependent bytes so a misplaced offset shows up.
std::string pattern_bytes(size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  return s;
}

// A model that uses everything a round trip must keep: model/graph/node/function doc strings,
// metadata_props, value_info, a model-local function, a sparse-free initializer set, and
// unknown fields at model, graph and node level.
onnx::ModelProto rich_model() {
  auto m = parse(R"(
<ir_version: 10, opset_import: ["" : 18, "local" : 1], producer_name: "onnax-test", producer_version: "1.2", domain: "ai.test", model_version: 7>
main (float[N, 3] x, float[3] w) => (float[N, 3] y) <float[3] bias = {0.5, -1.0, 2.0}> {
  t = Mul(x, w)
  u = local.AddBias(t, bias)
  y = Tanh(u)
}
<domain: "local", opset_import: ["" : 18]>
AddBias (a, b) => (c) {
  c = Add(a, b)
}
)");
  m.set_doc_string("model doc string");
  m.mutable_graph()->set_doc_string("graph doc string");
  m.mutable_graph()->mutable_node(0)->set_doc_string("node doc string");
  m.mutable_graph()->mutable_node(0)->set_name("scale");
  m.mutable_functions(0)->set_doc_string("function doc string");
  m.mutable_graph()->mutable_input(0)->set_doc_string("input doc string");
  for (auto [k, v] : {std::pair{"author", "onnax tests"}, std::pair{"license", "none"}}) {
    auto* p = m.add_metadata_props();
    p->set_key(k);
    p->set_value(v);
  }
  auto* vi = m.mutable_graph()->add_value_info();
  vi->set_name("t");
  vi->set_doc_string("value_info doc string");
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("N");
  tt->mutable_shape()->add_dim()->set_dim_value(3);
  // Fields a newer ONNX might define: protobuf keeps them as unknown fields.
  m.GetReflection()->MutableUnknownFields(&m)->AddVarint(9001, 42);
  m.GetReflection()->MutableUnknownFields(&m)->AddLengthDelimited(9002, "future model field");
  auto* g = m.mutable_graph();
  g->GetReflection()->MutableUnknownFields(g)->AddFixed32(9003, 0xdeadbeef);
  auto* n = g->mutable_node(1);
  n->GetReflection()->MutableUnknownFields(n)->AddLengthDelimited(9004, "future node field");
  return m;
}

// A model with initializers big enough to move to external data (>= 1 KiB) and one that
// stays inline.
onnx::ModelProto model_with_weights() {
  auto m = parse(R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[1024] x) => (float[1024] y) {
  a = Mul(x, w_big)
  b = Add(a, w_small_broadcast)
  idx_as_float = Cast<to = 1>(idx)
  y = Add(b, idx_as_float)
}
)");
  auto* g = m.mutable_graph();
  auto add_init = [&](const std::string& name, int32_t dtype, int64_t n, size_t elem_size, unsigned seed) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(dtype);
    t->add_dims(n);
    t->set_raw_data(pattern_bytes(static_cast<size_t>(n) * elem_size, seed));
  };
  add_init("w_big", onnx::TensorProto::FLOAT, 1024, 4, 1);
  add_init("w_small_broadcast", onnx::TensorProto::FLOAT, 1, 4, 2);
  add_init("idx", onnx::TensorProto::INT64, 1024, 8, 3);
  return m;
}

const onnx::TensorProto* find_initializer(const onnx::ModelProto& m, const std::string& name) {
  for (const auto& t : m.graph().initializer())
    if (t.name() == name) return &t;
  return nullptr;
}

void set_external(onnx::TensorProto& t, const std::string& location, int64_t offset, int64_t length) {
  t.clear_raw_data();
  t.clear_external_data();
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* k, const std::string& v) {
    auto* e = t.add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  add("location", location);
  if (offset >= 0) add("offset", std::to_string(offset));
  if (length >= 0) add("length", std::to_string(length));
}

// ---------------------------------------------------------------------------------------
// Round trips

TEST(ModelIo, RoundTripIsByteIdenticalAndKeepsEverything) {
  TempDir dir;
  const onnx::ModelProto m = rich_model();
  const std::string bytes = m.SerializeAsString();
  write_bytes(dir / "in.onnx", bytes);

  const onnx::ModelProto loaded = load_model((dir / "in.onnx").string());
  EXPECT_TRUE(same_bytes(loaded.SerializeAsString(), bytes));
  EXPECT_EQ(loaded.doc_string(), "model doc string");
  EXPECT_EQ(loaded.graph().doc_string(), "graph doc string");
  EXPECT_EQ(loaded.graph().node(0).doc_string(), "node doc string");
  EXPECT_EQ(loaded.functions_size(), 1);
  EXPECT_EQ(loaded.functions(0).doc_string(), "function doc string");
  ASSERT_EQ(loaded.metadata_props_size(), 2);
  EXPECT_EQ(loaded.metadata_props(1).key(), "license");
  ASSERT_EQ(loaded.graph().value_info_size(), 1);
  EXPECT_EQ(loaded.graph().value_info(0).doc_string(), "value_info doc string");
  EXPECT_EQ(loaded.GetReflection()->GetUnknownFields(loaded).field_count(), 2);
  EXPECT_EQ(loaded.graph().GetReflection()->GetUnknownFields(loaded.graph()).field_count(), 1);
  EXPECT_EQ(loaded.graph().node(1).GetReflection()->GetUnknownFields(loaded.graph().node(1)).field_count(), 1);

  save_model(loaded, (dir / "out.onnx").string());
  EXPECT_TRUE(same_bytes(read_bytes(dir / "out.onnx"), bytes));
  EXPECT_FALSE(fs::exists(dir / "out.onnx.data")) << "a small model is saved inline by default";

  // parse_model agrees with load_model.
  EXPECT_TRUE(same_bytes(parse_model(bytes).SerializeAsString(), bytes));
}

TEST(ModelIo, SaveAndVmapDoNotMutateTheSource) {
  TempDir dir;
  const onnx::ModelProto m = model_with_weights();
  const std::string before = m.SerializeAsString();
  save_model(m, (dir / "ext.onnx").string(), /*external_data=*/true);
  EXPECT_TRUE(same_bytes(m.SerializeAsString(), before)) << "save_model with external data changed its source";
  save_model(m, (dir / "inline.onnx").string());
  EXPECT_TRUE(same_bytes(m.SerializeAsString(), before));

  const onnx::ModelProto rich = rich_model();
  const std::string rich_before = rich.SerializeAsString();
  VmapOptions opt;
  opt.in_axes_form = VmapOptions::InAxesForm::kPerInput;
  opt.in_axes = {Axis{0}, std::nullopt};
  const std::string first = vmap(rich, opt).SerializeAsString();
  EXPECT_TRUE(same_bytes(rich.SerializeAsString(), rich_before)) << "vmap changed its source";
  EXPECT_TRUE(same_bytes(vmap(rich, opt).SerializeAsString(), first)) << "vmap is not deterministic";
}

TEST(ModelIo, SaveCreatesMissingDirectories) {
  TempDir dir;
  const auto out = dir / "a" / "b" / "model.onnx";
  save_model(model_with_weights(), out.string());
  EXPECT_TRUE(fs::exists(out));
  EXPECT_TRUE(same_bytes(load_model(out.string()).SerializeAsString(), model_with_weights().SerializeAsString()));
}

// ---------------------------------------------------------------------------------------
// External data

TEST(ModelIo, ExternalDataRoundTrip) {
  TempDir dir;
  const onnx::ModelProto m = model_with_weights();
  const auto path = dir / "model.onnx";
  save_model(m, path.string(), /*external_data=*/true);
  ASSERT_TRUE(fs::exists(dir / "model.onnx.data"));
  EXPECT_GE(fs::file_size(dir / "model.onnx.data"), 1024u * 4 + 1024u * 8);

  // On disk, large tensors point at the data file by a relative location; small ones stay.
  const onnx::ModelProto on_disk = parse_model(read_bytes(path));
  const auto* big = find_initializer(on_disk, "w_big");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->data_location(), onnx::TensorProto::EXTERNAL);
  EXPECT_FALSE(big->has_raw_data());
  bool has_location = false;
  for (const auto& kv : big->external_data())
    if (kv.key() == "location") {
      has_location = true;
      EXPECT_EQ(kv.value(), "model.onnx.data");
    }
  EXPECT_TRUE(has_location);
  const auto* small = find_initializer(on_disk, "w_small_broadcast");
  ASSERT_NE(small, nullptr);
  EXPECT_NE(small->data_location(), onnx::TensorProto::EXTERNAL);
  EXPECT_EQ(small->raw_data().size(), 4u);

  // Loading resolves external data: the result equals the source, and is self-contained.
  const onnx::ModelProto loaded = load_model(path.string());
  EXPECT_TRUE(same_bytes(loaded.SerializeAsString(), m.SerializeAsString()));

  // Moving the pair of files elsewhere keeps it loadable (locations are relative).
  fs::create_directories(dir / "moved");
  fs::rename(path, dir / "moved" / "model.onnx");
  fs::rename(dir / "model.onnx.data", dir / "moved" / "model.onnx.data");
  EXPECT_TRUE(
      same_bytes(load_model((dir / "moved" / "model.onnx").string()).SerializeAsString(), m.SerializeAsString()));
}

TEST(ModelIo, ExternalDataCoversEveryTensorAndKeepsUnknownFields) {
  TempDir dir;
  auto m = parse(R"(
<ir_version: 10, opset_import: ["" : 18, "local" : 1]>
g (float[256] x) => (float[256] y) {
  c = Constant<value = float[256] {0.0}>()
  a = Add(x, c)
  y = local.Scale(a)
}
<domain: "local", opset_import: ["" : 18]>
Scale (v) => (r) {
  k = Constant<value = float[256] {0.0}>()
  r = Mul(v, k)
}
)");
  // Large tensors in a node attribute, a function body, a function attribute default and a
  // subgraph; each with bytes of its own and an unknown field.
  std::vector<onnx::TensorProto*> tensors = {
      m.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_t(),
      m.mutable_functions(0)->mutable_node(0)->mutable_attribute(0)->mutable_t()};
  auto* default_attr = m.mutable_functions(0)->add_attribute_proto();
  default_attr->set_name("unused_default");
  default_attr->set_type(onnx::AttributeProto::TENSOR);
  tensors.push_back(default_attr->mutable_t());
  auto* sub_attr = m.mutable_graph()->mutable_node(1)->add_attribute();
  sub_attr->set_name("unused_subgraph");
  sub_attr->set_type(onnx::AttributeProto::GRAPH);
  auto* sub_init = sub_attr->mutable_g()->add_initializer();
  sub_init->set_name("inner");
  tensors.push_back(sub_init);
  unsigned seed = 10;
  for (auto* t : tensors) {
    t->clear_float_data();
    t->clear_dims();
    t->add_dims(256);
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->set_raw_data(pattern_bytes(1024, seed++));
    t->GetReflection()->MutableUnknownFields(t)->AddVarint(7777, seed);
  }
  const std::string bytes = m.SerializeAsString();
  const auto path = dir / "m.onnx";
  save_model(m, path.string(), /*external_data=*/true);
  EXPECT_TRUE(same_bytes(m.SerializeAsString(), bytes)) << "save_model changed its source";
  EXPECT_GE(fs::file_size(dir / "m.onnx.data"), 4u * 1024);
  EXPECT_LT(fs::file_size(path), 4u * 1024) << "all four tensors should be in the data file";
  EXPECT_TRUE(same_bytes(load_model(path.string()).SerializeAsString(), bytes));
}

TEST(ModelIo, HandWrittenRelativeExternalDataLoads) {
  TempDir dir;
  const onnx::ModelProto m = model_with_weights();
  const std::string big = find_initializer(m, "w_big")->raw_data();
  const std::string idx = find_initializer(m, "idx")->raw_data();

  // One file next to the model holding two tensors at offsets, one in a subdirectory whose
  // name contains dots, with no offset/length (the whole file).
  write_bytes(dir / "weights.bin", std::string(100, 'x') + big + std::string(7, 'y') + idx);
  fs::create_directories(dir / "sub.dir");
  write_bytes(dir / "sub.dir" / "w..small.bin", find_initializer(m, "w_small_broadcast")->raw_data());

  onnx::ModelProto ext = m;
  for (auto& t : *ext.mutable_graph()->mutable_initializer()) {
    if (t.name() == "w_big") set_external(t, "weights.bin", 100, static_cast<int64_t>(big.size()));
    if (t.name() == "idx") set_external(t, "weights.bin", 100 + static_cast<int64_t>(big.size()) + 7, -1);
    if (t.name() == "w_small_broadcast") set_external(t, "sub.dir/w..small.bin", -1, -1);
  }
  write_bytes(dir / "model.onnx", ext.SerializeAsString());

  // Loaded through a relative path from another working directory too.
  const onnx::ModelProto loaded = load_model((dir / "model.onnx").string());
  EXPECT_TRUE(same_bytes(loaded.SerializeAsString(), m.SerializeAsString()));
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path().parent_path());
  onnx::ModelProto from_relative;
  std::string msg = error_of([&] { from_relative = load_model((dir.path().filename() / "model.onnx").string()); });
  fs::current_path(cwd);
  EXPECT_EQ(msg, "");
  EXPECT_TRUE(same_bytes(from_relative.SerializeAsString(), m.SerializeAsString()));
}

// Writes a model whose 'w_big' initializer points at `location` (offset/length -1: absent).
fs::path model_pointing_at(const TempDir& dir, const std::string& location, int64_t offset, int64_t length) {
  onnx::ModelProto m = model_with_weights();
  for (auto& t : *m.mutable_graph()->mutable_initializer())
    if (t.name() == "w_big") set_external(t, location, offset, length);
  const auto path = dir / "model.onnx";
  write_bytes(path, m.SerializeAsString());
  return path;
}

TEST(ModelIo, MissingExternalDataFileIsAClearError) {
  TempDir dir;
  const auto path = model_pointing_at(dir, "weights.bin", 0, 4096);
  Error::Kind kind{};
  const std::string msg = error_of([&] { load_model(path.string()); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kIo);
  EXPECT_TRUE(contains(msg, "'w_big'")) << msg;
  EXPECT_TRUE(contains(msg, "weights.bin")) << msg;
  EXPECT_TRUE(contains(msg, "Fix:")) << msg;
}

TEST(ModelIo, TruncatedExternalDataFileIsAClearError) {
  TempDir dir;
  const auto path = model_pointing_at(dir, "weights.bin", 0, 4096);
  write_bytes(dir / "weights.bin", pattern_bytes(1000, 1));
  Error::Kind kind{};
  std::string msg = error_of([&] { load_model(path.string()); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kInvalidModel);
  EXPECT_TRUE(contains(msg, "'w_big'")) << msg;
  EXPECT_TRUE(contains(msg, "[0, 4096)")) << msg;
  EXPECT_TRUE(contains(msg, "1000 bytes")) << msg;
  EXPECT_TRUE(contains(msg, "Fix:")) << msg;
  // The message never carries tensor contents.
  EXPECT_FALSE(contains(msg, pattern_bytes(1000, 1).substr(0, 16))) << msg;

  // An offset past the end with no explicit length.
  model_pointing_at(dir, "weights.bin", 5000, -1);
  msg = error_of([&] { load_model(path.string()); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kInvalidModel);
  EXPECT_TRUE(contains(msg, "'w_big'")) << msg;
  EXPECT_TRUE(contains(msg, "Fix:")) << msg;
}

TEST(ModelIo, ExternalDataOutsideTheModelDirectoryIsRejected) {
  TempDir dir;
  write_bytes(dir.path().parent_path() / ("onnax_outside_" + std::to_string(::getpid()) + ".bin"),
              pattern_bytes(4096, 1));
  const std::string outside = "../onnax_outside_" + std::to_string(::getpid()) + ".bin";
  for (const std::string& location :
       {outside, std::string("sub/../../x.bin"), std::string("/etc/passwd"), std::string("")}) {
    const auto path = model_pointing_at(dir, location, 0, 4096);
    Error::Kind kind{};
    const std::string msg = error_of([&] { load_model(path.string()); }, &kind);
    EXPECT_EQ(kind, Error::Kind::kInvalidModel) << location << ": " << msg;
    EXPECT_TRUE(contains(msg, "'w_big'")) << msg;
    EXPECT_TRUE(contains(msg, "'" + location + "'")) << msg;
    EXPECT_TRUE(contains(msg, "relative path inside the model's directory")) << msg;
    EXPECT_TRUE(contains(msg, "Fix:")) << msg;
  }
  fs::remove(dir.path().parent_path() / ("onnax_outside_" + std::to_string(::getpid()) + ".bin"));
}

TEST(ModelIo, MalformedExternalDataEntriesAreClearErrors) {
  TempDir dir;
  write_bytes(dir / "weights.bin", pattern_bytes(4096, 1));
  fs::create_directories(dir / "a_directory");
  struct Case {
    std::string location, offset, length;
  };
  const Case cases[] = {
      {"weights.bin", "abc", "4096"},
      {"weights.bin", "0", "4k"},
      {"weights.bin", "99999999999999999999999", "4096"},
      {"weights.bin", "-8", "4096"},
      {"weights.bin", "0", "-8"},
      {"weights.bin", "9223372036854775000", "9223372036854775000"},
      {"weights.bin", "4096", "9223372036854775807"},
      {"a_directory", "0", "4096"},
      {"a_directory", "", ""},
      {"weights.bin", "0", "2048"},
      {"weights.bin", "100", ""},
  };
  for (const auto& c : cases) {
    onnx::ModelProto m = model_with_weights();
    for (auto& t : *m.mutable_graph()->mutable_initializer()) {
      if (t.name() != "w_big") continue;
      set_external(t, c.location, -1, -1);
      auto add = [&](const char* k, const std::string& v) {
        if (v.empty()) return;
        auto* e = t.add_external_data();
        e->set_key(k);
        e->set_value(v);
      };
      add("offset", c.offset);
      add("length", c.length);
    }
    write_bytes(dir / "model.onnx", m.SerializeAsString());
    const std::string what = c.location + " offset=" + c.offset + " length=" + c.length;
    try {
      load_model((dir / "model.onnx").string());
      ADD_FAILURE() << what << ": loaded without an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(contains(msg, "'w_big'")) << what << ": " << msg;
      EXPECT_TRUE(contains(msg, "Fix:")) << what << ": " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": threw a non-onnax exception: " << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------
// Malformed files

TEST(ModelIo, MissingFileAndDirectoryAreIoErrors) {
  TempDir dir;
  Error::Kind kind{};
  std::string msg = error_of([&] { load_model((dir / "nope.onnx").string()); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kIo);
  EXPECT_TRUE(contains(msg, "nope.onnx")) << msg;
  EXPECT_TRUE(contains(msg, "does not exist")) << msg;
  EXPECT_TRUE(contains(msg, "Fix:")) << msg;

  msg = error_of([&] { load_model(dir.path().string()); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kIo);
  EXPECT_TRUE(contains(msg, "is a directory")) << msg;
  EXPECT_TRUE(contains(msg, "Fix:")) << msg;
}

TEST(ModelIo, EmptyFileIsAnInvalidModel) {
  TempDir dir;
  write_bytes(dir / "empty.onnx", "");
  Error::Kind kind{};
  std::string msg = error_of([&] { load_model((dir / "empty.onnx").string()); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kInvalidModel);
  EXPECT_TRUE(contains(msg, "empty")) << msg;
  EXPECT_TRUE(contains(msg, "Fix:")) << msg;
  msg = error_of([&] { parse_model(""); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kInvalidModel);
  EXPECT_TRUE(contains(msg, "Fix:")) << msg;
}

TEST(ModelIo, TruncatedFilesAreInvalidModelsNeverCrashes) {
  TempDir dir;
  const std::string bytes = rich_model().SerializeAsString();
  // The graph field spans bytes whose truncation can never parse; find it by serializing the
  // model without its graph (fields are written in field-number order; graph is field 7).
  onnx::ModelProto head = rich_model();
  head.clear_graph();
  head.clear_opset_import();
  head.clear_metadata_props();
  head.clear_functions();
  head.GetReflection()->MutableUnknownFields(&head)->Clear();
  const size_t graph_start = head.ByteSizeLong();
  const size_t graph_end = graph_start + [&] {
    onnx::ModelProto only_graph;
    *only_graph.mutable_graph() = rich_model().graph();
    return only_graph.ByteSizeLong();
  }();
  ASSERT_EQ(bytes.substr(0, graph_start), head.SerializeAsString());

  size_t rejected = 0;
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    const std::string prefix = bytes.substr(0, cut);
    const auto path = dir / "cut.onnx";
    write_bytes(path, prefix);
    for (int via_bytes = 0; via_bytes < 2; ++via_bytes) {
      try {
        if (via_bytes)
          parse_model(prefix);
        else
          load_model(path.string());
        // Only a cut at a field boundary outside the graph can still parse.
        EXPECT_TRUE(cut >= graph_end) << "a file cut at " << cut << " inside the graph loaded";
      } catch (const Error& e) {
        ++rejected;
        EXPECT_EQ(e.kind(), Error::Kind::kInvalidModel) << "cut at " << cut << ": " << e.what();
        EXPECT_TRUE(contains(e.what(), "Fix:")) << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "cut at " << cut << ": non-onnax exception " << e.what();
      }
    }
  }
  EXPECT_GE(rejected, 2 * (graph_end - graph_start));
}

TEST(ModelIo, RandomBytesAreInvalidModels) {
  TempDir dir;
  for (unsigned seed = 0; seed < 64; ++seed) {
    std::mt19937 rng(seed);
    const size_t n = 1 + rng() % 4096;
    std::string bytes(n, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng() & 0xff);
    const auto path = dir / "random.onnx";
    write_bytes(path, bytes);
    Error::Kind kind{};
    std::string msg = error_of([&] { load_model(path.string()); }, &kind);
    EXPECT_EQ(kind, Error::Kind::kInvalidModel) << "seed " << seed << ": " << msg;
    EXPECT_TRUE(contains(msg, "Fix:")) << msg;
    EXPECT_LT(msg.size(), 600u) << "the message should not echo the file contents";
    msg = error_of([&] { parse_model(bytes); }, &kind);
    EXPECT_EQ(kind, Error::Kind::kInvalidModel) << "seed " << seed << ": " << msg;
  }
}

TEST(ModelIo, SaveToAnUnwritablePathIsAnIoError) {
  TempDir dir;
  write_bytes(dir / "file", "x");
  Error::Kind kind{};
  // A path below a regular file cannot be created.
  const std::string msg = error_of([&] { save_model(rich_model(), (dir / "file" / "m.onnx").string()); }, &kind);
  EXPECT_EQ(kind, Error::Kind::kIo);
  EXPECT_TRUE(contains(msg, "m.onnx")) << msg;
  EXPECT_TRUE(contains(msg, "Fix:")) << msg;
}

// ---------------------------------------------------------------------------------------
// Models over 2 GB (own suite so it can be filtered: --gtest_filter=-ModelIoLarge.*)

TEST(ModelIoLarge, OverTwoGigabytesSavesWithExternalDataAndReloads) {
  const auto start = std::chrono::steady_clock::now();
  TempDir dir;
  constexpr size_t kBytes = size_t{1100} * 1000 * 1000;  // 1.1 GB per initializer, 2.2 GB in all
  const size_t spots[] = {0, 1, 4095, 4096, kBytes / 3, kBytes / 2, kBytes - 4097, kBytes - 1};
  auto spot_value = [](size_t i, int which) { return static_cast<char>((i * 2654435761u + which * 97 + 1) & 0xff); };
  const auto path = dir / "big.onnx";
  {
    auto m = parse(R"(
<ir_version: 10, opset_import: ["" : 18]>
g (float[N] x) => (float[N] y) {
  a = Add(x, x)
  y = Mul(a, a)
}
)");
    for (int which = 0; which < 2; ++which) {
      auto* t = m.mutable_graph()->add_initializer();
      t->set_name(which ? "second" : "first");
      t->set_data_type(onnx::TensorProto::UINT8);
      t->add_dims(static_cast<int64_t>(kBytes));
      std::string* raw = t->mutable_raw_data();
      raw->resize(kBytes, static_cast<char>(which + 1));
      for (size_t i : spots) (*raw)[i] = spot_value(i, which);
    }
    ASSERT_GT(m.ByteSizeLong(), size_t{1} << 31);
    save_model(m, path.string());  // no flag: the size alone must trigger external data
  }
  ASSERT_TRUE(fs::exists(path.string() + ".data"));
  EXPECT_LT(fs::file_size(path), 1u << 20) << "tensors should have moved to the data file";
  EXPECT_GE(fs::file_size(path.string() + ".data"), 2 * kBytes);

  const onnx::ModelProto loaded = load_model(path.string());
  ASSERT_EQ(loaded.graph().initializer_size(), 2);
  for (int which = 0; which < 2; ++which) {
    const auto& t = loaded.graph().initializer(which);
    EXPECT_EQ(t.name(), which ? "second" : "first");
    EXPECT_NE(t.data_location(), onnx::TensorProto::EXTERNAL);
    EXPECT_EQ(t.external_data_size(), 0);
    ASSERT_EQ(t.raw_data().size(), kBytes);
    ASSERT_EQ(t.dims_size(), 1);
    EXPECT_EQ(t.dims(0), static_cast<int64_t>(kBytes));
    for (size_t i : spots) EXPECT_EQ(t.raw_data()[i], spot_value(i, which)) << "initializer " << which << " byte " << i;
    for (size_t i : {size_t{2}, size_t{4097}, kBytes / 4, kBytes - 2})
      EXPECT_EQ(t.raw_data()[i], static_cast<char>(which + 1)) << "initializer " << which << " byte " << i;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 60.0) << "saving and loading 2.2 GB took too long";
}

}  // namespace
}  // namespace onnax
