# The CUPTI source (csrc/torch/cupti_source.cpp, issue 26: memory outside PyTorch, itemised) is
# compiled with CUPTI where CUPTI's headers are found: the nvidia-cuda-cupti wheel torch depends
# on (site-packages/nvidia/cu13/include for cu130; nvidia/cuda_cupti/include for cu12), or a
# toolkit's extras/CUPTI/include. CUPTI itself is loaded at run time (dlopen), so nothing is
# linked; without the headers the source is a stub that says the layer is not itemised.
# -DRIDGESCOPE_WITH_CUPTI=OFF leaves it out; ON makes its absence an error. Needs the CUDA
# source's headers (RIDGESCOPE_HAS_CUDA_SOURCE, cmake/RidgescopeTorch.cmake or
# cmake/RidgescopeLibtorch.cmake).
set(RIDGESCOPE_WITH_CUPTI AUTO CACHE STRING "Build the CUPTI source: AUTO, ON or OFF")
set(RIDGESCOPE_HAS_CUPTI OFF)
if(RIDGESCOPE_HAS_CUDA_SOURCE AND NOT RIDGESCOPE_WITH_CUPTI STREQUAL "OFF")
  # The wheel torch depends on first (beside torch in site-packages), then the CUDA headers
  # already found, then a toolkit's.
  file(GLOB _rs_cupti_dirs LIST_DIRECTORIES true "${RIDGESCOPE_TORCH_LIB_DIR}/../../nvidia/*/include")
  list(APPEND _rs_cupti_dirs ${RIDGESCOPE_CUDA_INCLUDE_DIR})
  foreach(_rs_var CUDA_HOME CUDA_PATH)
    if(DEFINED ENV{${_rs_var}})
      list(APPEND _rs_cupti_dirs "$ENV{${_rs_var}}/extras/CUPTI/include")
    endif()
  endforeach()
  list(APPEND _rs_cupti_dirs /usr/local/cuda/extras/CUPTI/include)
  set(RIDGESCOPE_CUPTI_INCLUDE_DIR "")
  foreach(_rs_dir IN LISTS _rs_cupti_dirs)
    if(EXISTS "${_rs_dir}/cupti.h" AND EXISTS "${_rs_dir}/generated_cuda_meta.h"
       AND EXISTS "${_rs_dir}/generated_cuda_runtime_api_meta.h")
      get_filename_component(RIDGESCOPE_CUPTI_INCLUDE_DIR "${_rs_dir}" ABSOLUTE)
      break()
    endif()
  endforeach()
  if(RIDGESCOPE_CUPTI_INCLUDE_DIR)
    set(RIDGESCOPE_HAS_CUPTI ON)
    target_include_directories(ridgescope_torch_deps SYSTEM INTERFACE "${RIDGESCOPE_CUPTI_INCLUDE_DIR}")
    target_compile_definitions(ridgescope_torch_deps INTERFACE RIDGESCOPE_WITH_CUPTI=1)
    message(STATUS "ridgescope: CUPTI source ON (headers ${RIDGESCOPE_CUPTI_INCLUDE_DIR}; libcupti loaded at run time)")
  endif()
endif()
if(NOT RIDGESCOPE_HAS_CUPTI)
  if(RIDGESCOPE_WITH_CUPTI STREQUAL "ON")
    message(FATAL_ERROR "ridgescope: RIDGESCOPE_WITH_CUPTI=ON but no CUPTI headers (cupti.h with generated_cuda_meta.h) were found, or the CUDA source is off")
  endif()
  message(STATUS "ridgescope: CUPTI source OFF (no CUPTI headers, or no CUDA source): memory outside PyTorch is not itemised")
endif()
