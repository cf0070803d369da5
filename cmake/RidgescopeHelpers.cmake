# Shared build helpers: one place for warning flags.
function(ridgescope_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(RIDGESCOPE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# How the code that goes into the shared products (_C, libridgescope) is generated: one place.
# Calls between ridgescope's own functions are direct, not through the PLT and the GOT: the
# recording's hot path (an allocator callback: the CPU source, the site capture, the recorder,
# the codec) crosses a dozen functions in several translation units for every event, and each
# PLT stub and GOT slot is one more instruction line and one more data line to fetch, after the
# user's kernels have evicted them (docs/performance.md, "Where the training thread's time goes:
# instruction fetches"). Objects: -fno-semantic-interposition (a call to an exported function of
# the same unit may be direct or inlined; nothing interposes ridgescope's functions).
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-fno-semantic-interposition RIDGESCOPE_HAS_NO_SEMANTIC_INTERPOSITION)
function(ridgescope_set_codegen target)
  if(RIDGESCOPE_HAS_NO_SEMANTIC_INTERPOSITION)
    target_compile_options(${target} PRIVATE -fno-semantic-interposition)
  endif()
endfunction()
# Shared products: references to functions they define bind to those definitions at link time
# (-Bsymbolic-functions; data, typeinfo and inline functions' statics keep one definition per
# process), so that the linker makes every call between their objects a direct one.
function(ridgescope_set_shared_link target)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    target_link_options(${target} PRIVATE "LINKER:-Bsymbolic-functions")
  endif()
endfunction()

# One OBJECT library for a layer of cmake/RidgescopeLayers.cmake: every .cpp of its folder,
# with the include directories of the layers it may see and no others.
function(ridgescope_add_layer layer)
  set(_dir "${PROJECT_SOURCE_DIR}/${RIDGESCOPE_LAYER_${layer}_DIR}")
  file(GLOB _sources CONFIGURE_DEPENDS "${_dir}/*.cpp")
  add_library(ridgescope_layer_${layer} OBJECT ${_sources})
  ridgescope_layer_private_dirs(${layer} "${PROJECT_SOURCE_DIR}" _private_dirs)
  target_include_directories(ridgescope_layer_${layer}
    PUBLIC "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>"
    PRIVATE ${_private_dirs})
  target_link_libraries(ridgescope_layer_${layer} PUBLIC absl::flat_hash_map absl::flat_hash_set absl::hash Threads::Threads)
  add_dependencies(ridgescope_layer_${layer} ridgescope_layers)
  ridgescope_set_warnings(ridgescope_layer_${layer})
  ridgescope_set_codegen(ridgescope_layer_${layer})
endfunction()
