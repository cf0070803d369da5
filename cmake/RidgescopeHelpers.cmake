# Shared build helpers: one place for warning flags.
function(ridgescope_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(RIDGESCOPE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
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
endfunction()
