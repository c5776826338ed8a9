#include "model_mutator.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

// libFuzzer's own byte-level mutation, for the contents of strings and raw tensor data.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace onnax_fuzz {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using Rng = std::minstd_rand;

size_t below(Rng& rng, size_t n) {
  return n == 0 ? 0 : rng() % n;
}
bool one_in(Rng& rng, size_t n) {
  return below(rng, n) == 0;
}

// Every message in the tree, parents before children (the model itself first).
void collect(Message& m, std::vector<Message*>& out) {
  out.push_back(&m);
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(m, f); ++i) collect(*r->MutableRepeatedMessage(&m, f, i), out);
    } else {
      collect(*r->MutableMessage(&m, f), out);
    }
  }
}

// Names the model already uses (so a changed reference points at something that exists), and
// every operator ONNX knows (so an op_type changes to a real one).
std::vector<std::string> strings_of(const std::vector<Message*>& messages) {
  std::vector<std::string> out;
  for (const Message* m : messages) {
    const Reflection* r = m->GetReflection();
    std::vector<const FieldDescriptor*> fields;
    r->ListFields(*m, &fields);
    for (const FieldDescriptor* f : fields) {
      if (f->type() != FieldDescriptor::TYPE_STRING) continue;
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(*m, f) && i < 16; ++i) out.push_back(r->GetRepeatedString(*m, f, i));
      } else {
        out.push_back(r->GetString(*m, f));
      }
    }
  }
  return out;
}

const std::vector<std::string>& operator_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& schema : onnx::OpSchemaRegistry::get_all_schemas()) v.push_back(schema.Name());
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  }();
  return names;
}

int64_t interesting_int(Rng& rng, int64_t current) {
  static const int64_t values[] = {0,
                                   1,
                                   -1,
                                   2,
                                   3,
                                   -2,
                                   4,
                                   7,
                                   8,
                                   16,
                                   255,
                                   4096,
                                   65536,
                                   int64_t{1} << 31,
                                   int64_t{1} << 32,
                                   int64_t{1} << 40,
                                   std::numeric_limits<int32_t>::max(),
                                   std::numeric_limits<int32_t>::min(),
                                   std::numeric_limits<int64_t>::max(),
                                   std::numeric_limits<int64_t>::min()};
  switch (below(rng, 3)) {
    case 0: return values[below(rng, sizeof(values) / sizeof(values[0]))];
    case 1:  // a step to either side, wrapping (as unsigned: no overflow)
      return static_cast<int64_t>(static_cast<uint64_t>(current) + below(rng, 5) - 2);
    default: return static_cast<int64_t>(below(rng, 64)) - 8;
  }
}

double interesting_double(Rng& rng) {
  static const double values[] = {0.0,
                                  -0.0,
                                  1.0,
                                  -1.0,
                                  0.5,
                                  2.0,
                                  1e-7,
                                  1e38,
                                  -1e38,
                                  1e308,
                                  std::numeric_limits<double>::infinity(),
                                  std::numeric_limits<double>::quiet_NaN()};
  return values[below(rng, sizeof(values) / sizeof(values[0]))];
}

std::string mutated_string(Rng& rng, const std::string& current, const std::string& field,
                           const std::vector<std::string>& pool) {
  if (field == "op_type" && !one_in(rng, 4)) return operator_names()[below(rng, operator_names().size())];
  switch (below(rng, 4)) {
    case 0: return "";
    case 1:
    case 2:
      if (!pool.empty()) return pool[below(rng, pool.size())];
      [[fallthrough]];
    default: {
      // Einsum equations, dim names, external-data keys: libFuzzer edits the bytes.
      std::string s = current.empty() ? std::string("a") : current;
      const size_t size = s.size(), max = std::max<size_t>(size * 2, 32);
      s.resize(max);
      s.resize(LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(s.data()), size, max));
      return s;
    }
  }
}

void set_scalar(Message& m, const FieldDescriptor* f, int index, Rng& rng, const std::vector<std::string>& pool) {
  const Reflection* r = m.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      const int64_t cur = rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
      const auto v = static_cast<int32_t>(interesting_int(rng, cur));
      rep ? r->SetRepeatedInt32(&m, f, index, v) : r->SetInt32(&m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      const int64_t cur = rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
      const int64_t v = interesting_int(rng, cur);
      rep ? r->SetRepeatedInt64(&m, f, index, v) : r->SetInt64(&m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      const auto v = static_cast<uint32_t>(interesting_int(rng, 0));
      rep ? r->SetRepeatedUInt32(&m, f, index, v) : r->SetUInt32(&m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      const auto v = static_cast<uint64_t>(interesting_int(rng, 0));
      rep ? r->SetRepeatedUInt64(&m, f, index, v) : r->SetUInt64(&m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      // Doubles beyond float's range would be undefined to convert: those become infinity.
      const double d = interesting_double(rng);
      const auto v = std::isfinite(d) && std::fabs(d) > std::numeric_limits<float>::max()
                         ? std::copysign(std::numeric_limits<float>::infinity(), static_cast<float>(d > 0 ? 1 : -1))
                         : static_cast<float>(d);
      rep ? r->SetRepeatedFloat(&m, f, index, v) : r->SetFloat(&m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      const double v = interesting_double(rng);
      rep ? r->SetRepeatedDouble(&m, f, index, v) : r->SetDouble(&m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const bool v = rep ? !r->GetRepeatedBool(m, f, index) : !r->GetBool(m, f);
      rep ? r->SetRepeatedBool(&m, f, index, v) : r->SetBool(&m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      // onnx.proto is proto2: its enums are closed, so only declared values can be set.
      const auto* e = f->enum_type();
      const auto* v = e->value(static_cast<int>(below(rng, static_cast<size_t>(e->value_count()))));
      rep ? r->SetRepeatedEnum(&m, f, index, v) : r->SetEnum(&m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string cur = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      std::string v;
      if (f->type() == FieldDescriptor::TYPE_BYTES) {
        // Raw tensor data: cut short, or bytes changed.
        v = cur;
        if (one_in(rng, 2))
          v.resize(below(rng, cur.size() + 1));
        else if (!v.empty())
          v[below(rng, v.size())] = static_cast<char>(rng());
      } else {
        v = mutated_string(rng, cur, f->name(), pool);
      }
      rep ? r->SetRepeatedString(&m, f, index, v) : r->SetString(&m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE: break;
  }
}

// A message of the same type as `like` from `messages` (not `like` itself, when there is
// another).
const Message* same_type(const std::vector<Message*>& messages, const google::protobuf::Descriptor* type, Rng& rng) {
  std::vector<const Message*> matches;
  for (const Message* m : messages)
    if (m->GetDescriptor() == type) matches.push_back(m);
  return matches.empty() ? nullptr : matches[below(rng, matches.size())];
}

void mutate_field(Message& m, const FieldDescriptor* f, const std::vector<Message*>& messages, Rng& rng,
                  const std::vector<std::string>& pool) {
  const Reflection* r = m.GetReflection();
  const bool is_message = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
  if (!f->is_repeated()) {
    if (is_message) {
      const Message* other = same_type(messages, f->message_type(), rng);
      if (other && !one_in(rng, 3)) {
        // Through a copy: `other` may contain `m`.
        std::unique_ptr<Message> copy(other->New());
        copy->CopyFrom(*other);
        r->MutableMessage(&m, f)->CopyFrom(*copy);
      } else {
        r->ClearField(&m, f);
      }
    } else if (r->HasField(m, f) && one_in(rng, 6)) {
      r->ClearField(&m, f);
    } else {
      set_scalar(m, f, 0, rng, pool);
    }
    return;
  }
  const int n = r->FieldSize(m, f);
  switch (n == 0 ? 3 : below(rng, 6)) {
    case 0:  // remove one
    {
      r->SwapElements(&m, f, static_cast<int>(below(rng, static_cast<size_t>(n))), n - 1);
      r->RemoveLast(&m, f);
      return;
    }
    case 1:  // swap two
      r->SwapElements(&m, f, static_cast<int>(below(rng, static_cast<size_t>(n))),
                      static_cast<int>(below(rng, static_cast<size_t>(n))));
      return;
    case 2:  // duplicate one (a repeated input, node, initializer, dim)
      if (is_message) {
        std::unique_ptr<Message> copy(
            r->GetRepeatedMessage(m, f, static_cast<int>(below(rng, static_cast<size_t>(n)))).New());
        copy->CopyFrom(r->GetRepeatedMessage(m, f, static_cast<int>(below(rng, static_cast<size_t>(n)))));
        r->AddMessage(&m, f)->CopyFrom(*copy);
        return;
      }
      [[fallthrough]];
    case 3:  // add one
      if (is_message) {
        Message* added = r->AddMessage(&m, f);
        if (const Message* other = same_type(messages, f->message_type(), rng); other && other != added) {
          std::unique_ptr<Message> copy(other->New());
          copy->CopyFrom(*other);
          added->CopyFrom(*copy);
        }
        return;
      }
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32: r->AddInt32(&m, f, 0); break;
        case FieldDescriptor::CPPTYPE_INT64: r->AddInt64(&m, f, 0); break;
        case FieldDescriptor::CPPTYPE_UINT32: r->AddUInt32(&m, f, 0); break;
        case FieldDescriptor::CPPTYPE_UINT64: r->AddUInt64(&m, f, 0); break;
        case FieldDescriptor::CPPTYPE_FLOAT: r->AddFloat(&m, f, 0); break;
        case FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(&m, f, 0); break;
        case FieldDescriptor::CPPTYPE_BOOL: r->AddBool(&m, f, false); break;
        case FieldDescriptor::CPPTYPE_ENUM: r->AddEnum(&m, f, f->enum_type()->value(0)); break;
        case FieldDescriptor::CPPTYPE_STRING:
          r->AddString(&m, f, pool.empty() ? std::string() : pool[below(rng, pool.size())]);
          break;
        case FieldDescriptor::CPPTYPE_MESSAGE: break;
      }
      set_scalar(m, f, r->FieldSize(m, f) - 1, rng, pool);
      return;
    default:  // change one element (elements that are messages are picked on their own)
      if (!is_message) set_scalar(m, f, static_cast<int>(below(rng, static_cast<size_t>(n))), rng, pool);
      return;
  }
}

size_t write(const onnx::ModelProto& model, uint8_t* out, size_t max_size) {
  const size_t n = model.ByteSizeLong();
  if (n > max_size || !model.SerializeToArray(out, static_cast<int>(n))) return 0;
  return n;
}

}  // namespace

size_t mutate_model(uint8_t* data, size_t size, size_t max_size, uint32_t seed) {
  onnx::ModelProto model;
  if (!model.ParseFromArray(data, static_cast<int>(size))) return 0;
  Rng rng(seed);
  const size_t steps = 1 + below(rng, 3);
  for (size_t step = 0; step < steps; ++step) {
    std::vector<Message*> messages;
    collect(model, messages);
    const std::vector<std::string> pool = strings_of(messages);
    Message& m = *messages[below(rng, messages.size())];
    const google::protobuf::Descriptor* type = m.GetDescriptor();
    // Mostly fields that are set (what this model is about), sometimes any field of the type.
    std::vector<const FieldDescriptor*> fields;
    m.GetReflection()->ListFields(m, &fields);
    if (fields.empty() || one_in(rng, 4)) {
      fields.clear();
      for (int i = 0; i < type->field_count(); ++i) fields.push_back(type->field(i));
    }
    if (fields.empty()) continue;
    mutate_field(m, fields[below(rng, fields.size())], messages, rng, pool);
  }
  return write(model, data, max_size);
}

size_t cross_models(const uint8_t* data1, size_t size1, const uint8_t* data2, size_t size2, uint8_t* out,
                    size_t max_size, uint32_t seed) {
  onnx::ModelProto into, from;
  if (!into.ParseFromArray(data1, static_cast<int>(size1)) || !from.ParseFromArray(data2, static_cast<int>(size2)))
    return 0;
  Rng rng(seed);
  std::vector<Message*> targets, sources;
  collect(into, targets);
  collect(from, sources);
  // A message of the second model (not the model itself) into a list of its type in the first.
  for (int attempt = 0; attempt < 8 && sources.size() > 1; ++attempt) {
    const Message& piece = *sources[1 + below(rng, sources.size() - 1)];
    std::vector<std::pair<Message*, const FieldDescriptor*>> places;
    for (Message* t : targets) {
      const google::protobuf::Descriptor* type = t->GetDescriptor();
      for (int i = 0; i < type->field_count(); ++i) {
        const FieldDescriptor* f = type->field(i);
        if (f->is_repeated() && f->message_type() == piece.GetDescriptor()) places.emplace_back(t, f);
      }
    }
    if (places.empty()) continue;
    auto [target, field] = places[below(rng, places.size())];
    const Reflection* r = target->GetReflection();
    r->AddMessage(target, field)->CopyFrom(piece);
    // Somewhere in the list, not always last (nodes run in order).
    const int n = r->FieldSize(*target, field);
    r->SwapElements(target, field, n - 1, static_cast<int>(below(rng, static_cast<size_t>(n))));
    return write(into, out, max_size);
  }
  return 0;
}

}  // namespace onnax_fuzz
