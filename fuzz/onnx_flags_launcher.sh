#!/bin/sh
# The launcher of build-fuzz/'s custom commands (cmake/fuzz.cmake sets it): runs each command
# as it is, except that ONNX's configure step (the command that passes -DONNX_ML=ON) gets
# CXXFLAGS=$1, the fuzzer's instrumentation flags, which CMake then keeps in ONNX's cache.
# protobuf's steps and everything else run without them.
flags=$1
shift
case " $* " in
  *" -DONNX_ML=ON "*)
    CXXFLAGS=$flags
    export CXXFLAGS
    ;;
esac
exec "$@"
