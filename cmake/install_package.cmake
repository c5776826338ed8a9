# The C++ package: `cmake --install build --prefix P` writes the onnax headers, libonnax.a, the
# `onnax` command, the static protobuf and ONNX libraries with their headers (under
# onnax-third-party/, so they never shadow another copy in P), and onnaxConfig.cmake, so that
# an application does
#   find_package(onnax CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE onnax::onnax)
# with -DCMAKE_PREFIX_PATH=P and needs nothing else installed. The Python extension is not
# part of it (component `python`, installed only by the wheel build).
include(CMakePackageConfigHelpers)

set(onnax_config_dir lib/cmake/onnax)
install(TARGETS onnax_core ARCHIVE DESTINATION lib COMPONENT development)
install(TARGETS onnax RUNTIME DESTINATION bin COMPONENT development)
install(DIRECTORY include/onnax DESTINATION include COMPONENT development)
install(FILES ${onnax_onnx_prefix}/lib/libonnx.a ${onnax_onnx_prefix}/lib/libonnx_proto.a
              ${onnax_protobuf_library}
        DESTINATION lib/onnax-third-party COMPONENT development)
install(DIRECTORY ${onnax_onnx_prefix}/include/onnx ${onnax_protobuf_include}/google
        DESTINATION include/onnax-third-party COMPONENT development
        FILES_MATCHING PATTERN "*.h" PATTERN "*.inc" PATTERN "*.proto"
        PATTERN "*unittest*" EXCLUDE PATTERN "*test_util*" EXCLUDE PATTERN "testing" EXCLUDE)

configure_package_config_file(cmake/onnaxConfig.cmake.in ${CMAKE_BINARY_DIR}/onnaxConfig.cmake
                              INSTALL_DESTINATION ${onnax_config_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/onnaxConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/onnaxConfig.cmake ${CMAKE_BINARY_DIR}/onnaxConfigVersion.cmake
        DESTINATION ${onnax_config_dir} COMPONENT development)
