# The Python module's bindings (csrc/bindings, one source file per part: bindings.h) as an
# OBJECT library, declared in the top directory before the core's layers, and compiled as one
# unity translation unit.
# - Declared first: Ninja 1.11 (Debian 12) starts ready jobs in the order of build.ninja, and
#   CMake writes the top directory's targets first, in the order they are declared. The
#   bindings' compile, the build's longest (torch's Python headers, pybind11), then starts at
#   once and the core's short compiles fill the other core, instead of it running alone at the
#   end of a cold build.
# - One unity unit: each part parsed alone repeats pybind11's and torch's headers (measured:
#   six units cost 81 s of compiler time where one costs 38 s), so the parts are split in the
#   source tree and joined for the compiler.
# csrc/CMakeLists.txt links these objects into _C.
if(NOT (RIDGESCOPE_BUILD_TORCH AND RIDGESCOPE_BUILD_PYTHON))
  return()
endif()
file(GLOB _rs_bindings_sources CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/csrc/bindings/*.cpp")
# The parts that include torch's headers first, so that those come before pybind11's own.
list(SORT _rs_bindings_sources)
foreach(_rs_first session_bindings distributed_bindings)
  list(FILTER _rs_bindings_sources EXCLUDE REGEX "/${_rs_first}\\.cpp$")
endforeach()
list(PREPEND _rs_bindings_sources
  "${PROJECT_SOURCE_DIR}/csrc/bindings/session_bindings.cpp"
  "${PROJECT_SOURCE_DIR}/csrc/bindings/distributed_bindings.cpp")
add_library(ridgescope_bindings OBJECT ${_rs_bindings_sources})
ridgescope_layer_private_dirs(bindings "${PROJECT_SOURCE_DIR}" _rs_bindings_dirs)
target_include_directories(ridgescope_bindings PRIVATE "${PROJECT_SOURCE_DIR}/include" ${_rs_bindings_dirs})
target_link_libraries(ridgescope_bindings PRIVATE ridgescope_torch_deps Python::Module
                      absl::flat_hash_map absl::flat_hash_set absl::hash)
target_compile_definitions(ridgescope_bindings PRIVATE TORCH_EXTENSION_NAME=_C TORCH_API_INCLUDE_EXTENSION_H
                           RIDGESCOPE_VERSION="${PROJECT_VERSION}")  # _C.VERSION
set_target_properties(ridgescope_bindings PROPERTIES CXX_VISIBILITY_PRESET hidden POSITION_INDEPENDENT_CODE ON
  UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
add_dependencies(ridgescope_bindings ridgescope_layers)
ridgescope_set_warnings(ridgescope_bindings)
ridgescope_set_codegen(ridgescope_bindings)
