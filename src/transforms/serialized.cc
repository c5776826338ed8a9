// The serialized entry points: parse onto one arena, transform there, serialize. Every node of
// the source and the result is then carved from a few large blocks and freed with them, where
// the heap path allocates each node and string separately and frees them one by one.
#include <google/protobuf/arena.h>

#include "diagnostics/error.h"
#include "diagnostics/limits.h"
#include "io/model_io.h"
#include "transforms/prepare.h"

namespace onnax {

std::string transform_serialized(const std::string& model, const std::string& mode,
                                 const std::function<void(Prepared&)>& transform) {
  google::protobuf::Arena arena(model_arena_options());
  onnx::ModelProto& source = *google::protobuf::Arena::CreateMessage<onnx::ModelProto>(&arena);
  parse_model_into(model, source);
  std::string out;
  {
    Prepared p = prepare_in_place(source, mode);
    transform(p);
    limits::poll();  // (past a bound, nothing is returned)
    if (limits::max_output_bytes() > 0) limits::check_output_size(p.model->ByteSizeLong(), mode);
    if (!p.model->SerializeToString(&out))
      diag::fail(Error::Kind::kUnsupported,
                 mode +
                     ": the result exceeds protobuf's 2 GB limit and cannot be serialized as one message. Fix: "
                     "use the onnax command line (or, in C++, the ModelProto overload and save_model), which "
                     "writes external data files");
  }
  return out;
}

}  // namespace onnax
