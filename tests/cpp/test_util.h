#pragma once

#include <gtest/gtest.h>
#include <onnax/onnax.h>
#include <onnx/defs/parser.h>

#include <string>

namespace onnax::testing {

inline onnx::ModelProto parse(const std::string& text) {
  onnx::ModelProto m;
  auto status = onnx::OnnxParser::Parse(m, text.c_str());
  EXPECT_TRUE(status.IsOK()) << status.ErrorMessage();
  return m;
}

// Runs `fn` and returns the onnax::Error message it throws ("" if it does not throw).
template <typename Fn>
std::string error_of(Fn&& fn, Error::Kind* kind = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "";
}

}  // namespace onnax::testing
