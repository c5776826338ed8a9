// onnax's errors and notices: what the library reports to its caller.
#pragma once

#include <stdexcept>
#include <string>

namespace onnax {

// The one error type the library throws for user-reachable failures. Its message follows the
// diagnostics contract: what failed, actual versus expected, and a concrete fix.
class Error : public std::runtime_error {
 public:
  enum class Kind {
    kInvalidModel,  // malformed file, cycle, dangling input, failed inference
    kSelection,     // bad in_axes/out_axes/inputs/outputs
    kVersion,       // unsupported opset or IR version
    kUnsupported,   // operator or construct without a rule
    kIo,            // file system
    kLimit,         // a bound onnax::Limits set: time, size of the result, cancelled
  };
  Error(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

// Receives notices (for example "upgraded opset 17 to 18"). Default: stderr.
using NoticeSink = void (*)(const std::string& message);
void set_notice_sink(NoticeSink sink);

}  // namespace onnax
