# Coverage-guided fuzzing (issue 29; docs/untrusted.md, "Fuzzing"): the libFuzzer target
# onnax_fuzz (fuzz/onnax_fuzz.cc) over onnax's entry points, with onnax's sources compiled
# again with AddressSanitizer, UndefinedBehaviorSanitizer and coverage. It needs clang and a
# build tree of its own (scripts/fuzz.sh configures build-fuzz/), never the regular build,
# whose objects stay uninstrumented:
#   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DONNAX_FUZZ=ON \
#         -DONNAX_BUILD_PYTHON=OFF -DONNAX_BUILD_TESTS=OFF
#   cmake --build build-fuzz --target onnax_fuzz
option(ONNAX_FUZZ "Build the libFuzzer target onnax_fuzz (clang only)" OFF)
# Where protobuf and ONNX come from. Empty (the default): built in this tree (by
# cmake/third_party.cmake, with this tree's clang), and ONNX instrumented like onnax (below).
# A path: the third_party/ folder of another build tree (scripts/fuzz.sh --ci passes the
# regular build/'s), linked as it is, uninstrumented; nothing is built or written there.
set(ONNAX_FUZZ_THIRD_PARTY_DIR "" CACHE PATH "onnax_fuzz: link protobuf and ONNX from this build's third_party/")
# ONNX's checker, shape inference and version converter run on the untrusted model before and
# while onnax transforms it, and were where several of issue 29's crashes and hangs were. With
# this on, libFuzzer steers by ONNX's branches too and the sanitizers see its memory accesses.
# protobuf stays uninstrumented: its parser is fuzzed upstream, its branches would crowd the
# coverage signal, and it has a known benign UB report (memcpy from a null pointer of size 0
# in parse_context.h) that would stop every run.
option(ONNAX_FUZZ_INSTRUMENT_ONNX "onnax_fuzz: instrument the ONNX built in this tree as well" ON)
# Code generation for the instrumented sources. Empty: the build type's (-O3 for Release).
# scripts/fuzz.sh --ci builds with -O0 and no line tables, which compiles about 3x faster and
# is enough for its short run.
set(ONNAX_FUZZ_CODEGEN_FLAGS "-gline-tables-only" CACHE STRING
    "onnax_fuzz: optimization and debug flags for the instrumented sources")
if(NOT ONNAX_FUZZ)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "ONNAX_FUZZ needs clang (libFuzzer); CMAKE_CXX_COMPILER is ${CMAKE_CXX_COMPILER_ID}. "
                      "Fix: configure a separate build tree with -DCMAKE_CXX_COMPILER=clang++ (scripts/fuzz.sh does)")
endif()

# UB aborts instead of printing and going on, so libFuzzer keeps the input.
set(onnax_fuzz_sanitize address,undefined)
separate_arguments(onnax_fuzz_codegen UNIX_COMMAND "${ONNAX_FUZZ_CODEGEN_FLAGS}")
set(onnax_fuzz_compile_flags -fsanitize=fuzzer-no-link,${onnax_fuzz_sanitize} -fno-sanitize-recover=undefined
                             -fno-omit-frame-pointer ${onnax_fuzz_codegen})

if(ONNAX_FUZZ_THIRD_PARTY_DIR)
  set(onnax_fuzz_tp ${ONNAX_FUZZ_THIRD_PARTY_DIR})
  foreach(lib onnx/lib/libonnx.a onnx/lib/libonnx_proto.a protobuf-build/libprotobuf.a)
    if(NOT EXISTS ${onnax_fuzz_tp}/${lib})
      message(FATAL_ERROR "ONNAX_FUZZ_THIRD_PARTY_DIR: no ${onnax_fuzz_tp}/${lib}. Fix: build that tree first "
                          "(./build.sh for build/), or leave ONNAX_FUZZ_THIRD_PARTY_DIR empty")
    endif()
  endforeach()
  add_library(onnax_fuzz_third_party INTERFACE)
  target_include_directories(onnax_fuzz_third_party SYSTEM INTERFACE ${onnax_fuzz_tp}/onnx/include
                                                                     ${onnax_fuzz_tp}/protobuf-src/src)
  target_compile_definitions(onnax_fuzz_third_party INTERFACE ONNX_ML=1 ONNX_NAMESPACE=onnx)
  target_link_libraries(onnax_fuzz_third_party INTERFACE ${onnax_fuzz_tp}/onnx/lib/libonnx.a
                        ${onnax_fuzz_tp}/onnx/lib/libonnx_proto.a ${onnax_fuzz_tp}/protobuf-build/libprotobuf.a Threads::Threads)
else()
  add_library(onnax_fuzz_third_party INTERFACE)
  target_link_libraries(onnax_fuzz_third_party INTERFACE onnx_cpp)
  if(ONNAX_FUZZ_INSTRUMENT_ONNX)
    # ONNX's ExternalProject takes its flags from CXXFLAGS when it first configures, at build
    # time. Ninja honours a launcher for custom commands per directory only (not per target),
    # so the launcher is this directory's, and it sets CXXFLAGS for ONNX's configure step alone.
    list(JOIN onnax_fuzz_compile_flags " " onnax_fuzz_flag_string)
    set_property(DIRECTORY PROPERTY RULE_LAUNCH_CUSTOM
                                    "${CMAKE_CURRENT_SOURCE_DIR}/fuzz/onnx_flags_launcher.sh '${onnax_fuzz_flag_string}'")
  endif()
endif()

# onnax's sources compiled once more, instrumented (the regular onnax_core of this tree is not
# built by the onnax_fuzz target), with onnax_core's settings.
add_library(onnax_fuzz_core STATIC ${ONNAX_CORE_SOURCES})
target_include_directories(onnax_fuzz_core PUBLIC include src)
target_link_libraries(onnax_fuzz_core PUBLIC onnax_fuzz_third_party)
target_compile_options(onnax_fuzz_core PRIVATE ${ONNAX_WARNINGS} ${onnax_fuzz_compile_flags})
target_compile_definitions(onnax_fuzz_core PRIVATE ONNAX_VERSION="${PROJECT_VERSION}")

add_executable(onnax_fuzz fuzz/onnax_fuzz.cc fuzz/model_mutator.cc)
target_link_libraries(onnax_fuzz PRIVATE onnax_fuzz_core)
target_compile_options(onnax_fuzz PRIVATE ${ONNAX_WARNINGS} ${onnax_fuzz_compile_flags})
target_link_options(onnax_fuzz PRIVATE -fsanitize=fuzzer,${onnax_fuzz_sanitize})
