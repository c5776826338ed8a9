// Structure-aware mutations of a serialized ModelProto for the libFuzzer target: byte-level
// mutations of protobuf mostly break its length prefixes, so most of them test the parser only.
// These parse the model, change one thing through protobuf reflection (a number, a name, an
// enum, an element of a list, a whole submessage), and serialize it again.
#pragma once

#include <cstddef>
#include <cstdint>

namespace onnax_fuzz {

// Mutates the model in data[0, size) in place; returns its new size (at most max_size), or 0
// when the bytes are not a model or the result would not fit.
size_t mutate_model(uint8_t* data, size_t size, size_t max_size, uint32_t seed);

// Writes into `out` the first model with one element (a node, initializer, value info,
// attribute, ...) copied in from the second model; returns its size, or 0 as above.
size_t cross_models(const uint8_t* data1, size_t size1, const uint8_t* data2, size_t size2, uint8_t* out,
                    size_t max_size, uint32_t seed);

}  // namespace onnax_fuzz
