# The Python module's bindings (csrc/bindings, one translation unit per part: bindings.h) as an
# OBJECT library, declared in the top directory before the core's layers. Ninja 1.11 (Debian 12)
# starts ready jobs in the order of build.ninja, and CMake writes the top directory's targets
# first, in the order they are declared: declared here, the bindings' compiles (the build's
# longest, those that parse torch's Python headers) start first and the core's short ones fill
# the other core, instead of the module's compile running alone at the end of a cold build.
# csrc/CMakeLists.txt links these objects into _C.
if(NOT (RIDGESCOPE_BUILD_TORCH AND RIDGESCOPE_BUILD_PYTHON))
  return()
endif()
file(GLOB _rs_bindings_sources CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/csrc/bindings/*.cpp")
# Longest first: within one target Ninja keeps the sources' order.
list(SORT _rs_bindings_sources)
foreach(_rs_first session_bindings distributed_bindings trace_bindings)
  list(FILTER _rs_bindings_sources EXCLUDE REGEX "/${_rs_first}\\.cpp$")
endforeach()
list(PREPEND _rs_bindings_sources
  "${PROJECT_SOURCE_DIR}/csrc/bindings/session_bindings.cpp"
  "${PROJECT_SOURCE_DIR}/csrc/bindings/distributed_bindings.cpp"
  "${PROJECT_SOURCE_DIR}/csrc/bindings/trace_bindings.cpp")
add_library(ridgescope_bindings OBJECT ${_rs_bindings_sources})
ridgescope_layer_private_dirs(bindings "${PROJECT_SOURCE_DIR}" _rs_bindings_dirs)
target_include_directories(ridgescope_bindings PRIVATE "${PROJECT_SOURCE_DIR}/include" ${_rs_bindings_dirs})
target_link_libraries(ridgescope_bindings PRIVATE ridgescope_torch_deps Python::Module
                      absl::flat_hash_map absl::flat_hash_set absl::hash)
target_compile_definitions(ridgescope_bindings PRIVATE TORCH_EXTENSION_NAME=_C TORCH_API_INCLUDE_EXTENSION_H
                           RIDGESCOPE_VERSION="${PROJECT_VERSION}")  # _C.VERSION
set_target_properties(ridgescope_bindings PROPERTIES CXX_VISIBILITY_PRESET hidden POSITION_INDEPENDENT_CODE ON)
add_dependencies(ridgescope_bindings ridgescope_layers)
ridgescope_set_warnings(ridgescope_bindings)
