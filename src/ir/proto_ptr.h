// Owning pointers to protobuf messages that may live on an arena.
#pragma once

#include <google/protobuf/arena.h>
#include <google/protobuf/message_lite.h>
#include <onnx/onnx_pb.h>

#include <memory>

namespace onnax {

// Deletes a message unless an arena owns it: the serialized-model entry points parse onto a
// protobuf arena, and what a transform makes from such a model lives there too.
struct ProtoDelete {
  void operator()(google::protobuf::MessageLite* m) const {
    if (m && !m->GetArena()) delete m;
  }
};
template <typename T>
using ProtoPtr = std::unique_ptr<T, ProtoDelete>;
using NodePtr = ProtoPtr<onnx::NodeProto>;
// A new message on `arena` (nullptr: the heap).
template <typename T>
ProtoPtr<T> make_proto(google::protobuf::Arena* arena) {
  return ProtoPtr<T>(google::protobuf::Arena::CreateMessage<T>(arena));
}

}  // namespace onnax
