// The checks behind onnax::Limits (include/onnax/limits.h): the transforms poll between nodes
// and bodies; the writers check the result's size before anything is written.
#pragma once

#include <onnax/limits.h>

#include <cstdint>
#include <string>

namespace onnax::limits {

// Stops the transform (Error of kind kLimit) when the thread's Limits ran out of time or were
// cancelled. Cheap enough for every node (a flag, and the clock when there is a time limit).
void poll();

// The thread's bound on a result's serialized bytes (0: none): a writer that has to compute the
// size for it does so only when there is one.
uint64_t max_output_bytes();

// Fails (kind kLimit) when a result of `bytes` exceeds the thread's max_output_bytes; `mode`
// names the transform in the message.
void check_output_size(uint64_t bytes, const std::string& mode);

}  // namespace onnax::limits
