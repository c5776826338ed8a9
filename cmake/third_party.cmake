# The two C++ libraries onnax links statically, built from pinned, hash-checked sources into
# the build tree, so the Python extension, the command and the installed C++ package need no
# shared library beyond the C++ runtime:
#   protobuf 3.21.12 (Debian's upstream tarball; Debian's own libprotobuf.a is not
#     position-independent, so it cannot go into the extension);
#   ONNX (the source distribution of the `onnx` version pinned in requirements.txt, which
#     tests/python/test_packaging.py keeps equal to ONNAX_ONNX_VERSION).
# Downloads go to ONNAX_DOWNLOAD_DIR; a tarball already there (with the right hash) is reused,
# which is also how to build offline.
include(ExternalProject)

set(ONNAX_PROTOBUF_VERSION 3.21.12)
set(ONNAX_PROTOBUF_URL
    https://deb.debian.org/debian/pool/main/p/protobuf/protobuf_${ONNAX_PROTOBUF_VERSION}.orig.tar.gz)
set(ONNAX_PROTOBUF_SHA256 930c2c3b5ecc6c9c12615cf5ad93f1cd6e12d0aba862b572e076259970ac3a53)

set(ONNAX_ONNX_VERSION 1.23.2)
set(ONNAX_ONNX_URL
    https://files.pythonhosted.org/packages/3f/62/bc2dfadb63ecf04cb2d65a6b17751863039d36c65de51d6a3128ab35f1e7/onnx-${ONNAX_ONNX_VERSION}.tar.gz)
set(ONNAX_ONNX_SHA256 008cb0467b2bbee41448acc7da8b6f4e704624cb0d327a2d5adafc7ce19bc5b8)

set(ONNAX_DOWNLOAD_DIR "${CMAKE_BINARY_DIR}/_downloads" CACHE PATH
    "Where the protobuf and ONNX source tarballs are downloaded to (or found, for offline builds)")

find_package(Threads REQUIRED)
find_package(Python3 REQUIRED COMPONENTS Interpreter)

# protoc must generate code for the protobuf runtime linked here. A protoc of the same minor
# release (Debian 12's protobuf-compiler is 3.21.12) is used as is; otherwise protoc is built
# from the same sources.
find_program(ONNAX_SYSTEM_PROTOC protoc)
set(onnax_protoc_matches OFF)
if(ONNAX_SYSTEM_PROTOC)
  execute_process(COMMAND ${ONNAX_SYSTEM_PROTOC} --version OUTPUT_VARIABLE onnax_protoc_version
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" onnax_runtime_minor "${ONNAX_PROTOBUF_VERSION}")
  string(REGEX MATCH "^libprotoc ([0-9]+\\.[0-9]+)" _ "${onnax_protoc_version}")
  if(CMAKE_MATCH_1 STREQUAL onnax_runtime_minor)
    set(onnax_protoc_matches ON)
  endif()
endif()
if(onnax_protoc_matches)
  set(onnax_build_protoc OFF)
  set(ONNAX_PROTOC ${ONNAX_SYSTEM_PROTOC})
else()
  message(STATUS "onnax: no protoc ${ONNAX_PROTOBUF_VERSION} on the PATH; building it from source")
  set(onnax_build_protoc ON)
endif()

set(ONNAX_THIRD_PARTY_DIR ${CMAKE_BINARY_DIR}/third_party)
# protobuf is used from its build tree: only the targets needed are built (not the lite
# library, not the tests), so there is nothing to install.
set(onnax_protobuf_source ${ONNAX_THIRD_PARTY_DIR}/protobuf-src)
set(onnax_protobuf_build ${ONNAX_THIRD_PARTY_DIR}/protobuf-build)
set(onnax_protobuf_include ${onnax_protobuf_source}/src)
set(onnax_protobuf_library ${onnax_protobuf_build}/libprotobuf.a)
set(onnax_onnx_prefix ${ONNAX_THIRD_PARTY_DIR}/onnx)
set(onnax_protobuf_targets --target libprotobuf)
if(NOT onnax_protoc_matches)
  set(ONNAX_PROTOC ${onnax_protobuf_build}/protoc)
  list(APPEND onnax_protobuf_targets --target protoc)
endif()

set(onnax_common_cmake_args
    -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON
    -DCMAKE_INSTALL_LIBDIR=lib
    # protobuf 3.21 declares CMake 3.5 compatibility, which CMake 4 only accepts with this.
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5)

ExternalProject_Add(
  protobuf_external
  URL ${ONNAX_PROTOBUF_URL}
  URL_HASH SHA256=${ONNAX_PROTOBUF_SHA256}
  DOWNLOAD_DIR ${ONNAX_DOWNLOAD_DIR}
  DOWNLOAD_EXTRACT_TIMESTAMP TRUE
  PREFIX ${ONNAX_THIRD_PARTY_DIR}/protobuf-stamps
  SOURCE_DIR ${onnax_protobuf_source}
  BINARY_DIR ${onnax_protobuf_build}
  CMAKE_ARGS ${onnax_common_cmake_args}
             -Dprotobuf_BUILD_TESTS=OFF
             -Dprotobuf_BUILD_SHARED_LIBS=OFF
             -Dprotobuf_WITH_ZLIB=OFF
             -Dprotobuf_BUILD_PROTOC_BINARIES=${onnax_build_protoc}
             -Dprotobuf_BUILD_LIBPROTOC=${onnax_build_protoc}
  BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> ${onnax_protobuf_targets}
  INSTALL_COMMAND ""
  BUILD_BYPRODUCTS ${onnax_protobuf_library}
  USES_TERMINAL_DOWNLOAD TRUE
  USES_TERMINAL_BUILD TRUE)

ExternalProject_Add(
  onnx_external
  DEPENDS protobuf_external
  URL ${ONNAX_ONNX_URL}
  URL_HASH SHA256=${ONNAX_ONNX_SHA256}
  DOWNLOAD_DIR ${ONNAX_DOWNLOAD_DIR}
  DOWNLOAD_EXTRACT_TIMESTAMP TRUE
  PREFIX ${ONNAX_THIRD_PARTY_DIR}/onnx-build
  INSTALL_DIR ${onnax_onnx_prefix}
  CMAKE_ARGS ${onnax_common_cmake_args}
             -DCMAKE_INSTALL_PREFIX=<INSTALL_DIR>
             -DONNX_ML=ON
             -DONNX_NAMESPACE=onnx
             -DONNX_USE_LITE_PROTO=OFF
             -DONNX_USE_PROTOBUF_SHARED_LIBS=OFF
             -DBUILD_SHARED_LIBS=OFF
             -DONNX_BUILD_TESTS=OFF
             -DONNX_BUILD_PYTHON=OFF
             -DONNX_GEN_PB_TYPE_STUBS=OFF
             -DPython3_EXECUTABLE=${Python3_EXECUTABLE}
             -DProtobuf_PROTOC_EXECUTABLE=${ONNAX_PROTOC}
             -DProtobuf_INCLUDE_DIR=${onnax_protobuf_include}
             -DProtobuf_LIBRARY=${onnax_protobuf_library}
  BUILD_BYPRODUCTS <INSTALL_DIR>/lib/libonnx.a <INSTALL_DIR>/lib/libonnx_proto.a
  USES_TERMINAL_DOWNLOAD TRUE
  USES_TERMINAL_BUILD TRUE)

# Include directories must exist when targets using them are generated, before the external
# builds have run.
file(MAKE_DIRECTORY ${onnax_protobuf_include} ${onnax_onnx_prefix}/include)

add_library(onnx_cpp INTERFACE)
add_dependencies(onnx_cpp onnx_external)
target_include_directories(onnx_cpp SYSTEM INTERFACE ${onnax_onnx_prefix}/include
                                                     ${onnax_protobuf_include})
target_compile_definitions(onnx_cpp INTERFACE ONNX_ML=1 ONNX_NAMESPACE=onnx)
target_link_libraries(
  onnx_cpp INTERFACE ${onnax_onnx_prefix}/lib/libonnx.a ${onnax_onnx_prefix}/lib/libonnx_proto.a
                     ${onnax_protobuf_library} Threads::Threads)
