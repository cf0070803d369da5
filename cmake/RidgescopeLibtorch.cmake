# Locates libtorch without Python (RIDGESCOPE_BUILD_PYTHON=OFF), the way a libtorch C++ project
# does: the TorchConfig.cmake of a libtorch distribution (-DCMAKE_PREFIX_PATH=/path/to/libtorch),
# of a torch wheel (-DCMAKE_PREFIX_PATH=<site-packages>/torch/share/cmake), or the folder that
# holds it (-DTorch_DIR=...). No Python interpreter is looked for or run.
#
# * A CPU libtorch, or a CUDA libtorch with a complete CUDA toolkit: find_package(Torch).
# * A CUDA libtorch without one: its TorchConfig.cmake would fail (Caffe2Config.cmake demands
#   the toolkit; a configure-only probe tells), so its include/ and lib/ are used directly, as
#   the Python route (cmake/RidgescopeTorch.cmake) does, and the CUDA allocator source is
#   compiled in where the CUDA runtime headers are found (a toolkit's, or the nvidia wheels'
#   beside a torch wheel).
#
# Sets what cmake/RidgescopeTorch.cmake sets (ridgescope_torch_deps, RIDGESCOPE_TORCH_VERSION,
# RIDGESCOPE_TORCH_LIB_DIR, RIDGESCOPE_TORCH_INCLUDE_DIRS, _rs_abi, RIDGESCOPE_HAS_CUDA_SOURCE)
# and, for the installed package config, RIDGESCOPE_TORCH_FROM ("find_package": consumers
# re-find Torch; "directories": consumers link the recorded directories) and
# RIDGESCOPE_TORCH_CMAKE_DIR (the folder of the TorchConfig.cmake used).

# 1. The TorchConfig.cmake, found where find_package(Torch CONFIG) would look in these two
#    layouts (<prefix>/share/cmake/Torch and <prefix>/Torch), without running it yet.
string(REPLACE ":" ";" _rs_env_prefixes "$ENV{CMAKE_PREFIX_PATH}")
set(RIDGESCOPE_TORCH_CMAKE_DIR "")
foreach(_rs_root IN LISTS Torch_DIR ENV{Torch_DIR} CMAKE_PREFIX_PATH _rs_env_prefixes)
  foreach(_rs_sub "" "/Torch" "/share/cmake/Torch")
    if(_rs_root AND NOT RIDGESCOPE_TORCH_CMAKE_DIR AND EXISTS "${_rs_root}${_rs_sub}/TorchConfig.cmake")
      get_filename_component(RIDGESCOPE_TORCH_CMAKE_DIR "${_rs_root}${_rs_sub}" ABSOLUTE)
    endif()
  endforeach()
endforeach()
if(NOT RIDGESCOPE_TORCH_CMAKE_DIR)
  message(FATAL_ERROR
    "ridgescope: RIDGESCOPE_BUILD_PYTHON=OFF builds against a libtorch found by its "
    "TorchConfig.cmake, and none is under CMAKE_PREFIX_PATH (${CMAKE_PREFIX_PATH}) or Torch_DIR.\n"
    "Point -DCMAKE_PREFIX_PATH at a libtorch distribution (the folder holding share/cmake/Torch) "
    "or at a torch wheel's torch/share/cmake, or build the Python package (RIDGESCOPE_BUILD_PYTHON=ON).")
endif()
get_filename_component(_rs_torch_prefix "${RIDGESCOPE_TORCH_CMAKE_DIR}/../../.." ABSOLUTE)
set(RIDGESCOPE_TORCH_LIB_DIR "${_rs_torch_prefix}/lib")

# torch's libstdc++ ABI: older TorchConfig.cmake files set TORCH_CXX_FLAGS to
# -D_GLIBCXX_USE_CXX11_ABI=0 or 1; recent ones carry none (2.13.0 and 2.14.1, whose libraries
# export std::__cxx11 symbols) and the ABI is the compiler's default, 1, as Debian's Abseil has.
file(READ "${RIDGESCOPE_TORCH_CMAKE_DIR}/TorchConfig.cmake" _rs_torch_config)
set(_rs_abi 1)
if(_rs_torch_config MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
  set(_rs_abi "${CMAKE_MATCH_1}")
endif()
if(NOT _rs_abi EQUAL 1)
  message(WARNING "ridgescope: this libtorch uses the pre-C++11 libstdc++ ABI (_GLIBCXX_USE_CXX11_ABI=0); "
                  "the Abseil it is linked with must have been built the same way")
endif()
add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${_rs_abi})

# 2. find_package(Torch), unless it cannot succeed: a CUDA libtorch needs a complete CUDA
#    toolkit for that (Caffe2Config.cmake fails without one, and leaves NOTFOUND libraries with
#    a partial one). For a CUDA libtorch a configure-only probe (cmake/torch_probe) tells.
set(_rs_cuda_torch OFF)
set(_rs_use_find_package ON)
if(EXISTS "${RIDGESCOPE_TORCH_LIB_DIR}/libc10_cuda.so")
  set(_rs_cuda_torch ON)
  # ridgescope compiles no CUDA code, but Caffe2's cuda.cmake enables the CUDA language with the
  # C++ standard (20), whose flags CMake before 3.26 does not know for nvcc: ask for 17.
  if(NOT DEFINED CMAKE_CUDA_STANDARD)
    set(CMAKE_CUDA_STANDARD 17)
  endif()
  # the answer is kept in the cache for this libtorch (a re-configure does not probe again)
  if(NOT _RIDGESCOPE_TORCH_PROBED STREQUAL RIDGESCOPE_TORCH_CMAKE_DIR)
    set(_rs_probe_dir "${CMAKE_BINARY_DIR}/ridgescope_torch_probe")
    file(REMOVE_RECURSE "${_rs_probe_dir}")
    # the probe sets up what this project does before find_package(Torch): compiler, C++20
    set(_rs_probe_args "-DTorch_DIR=${RIDGESCOPE_TORCH_CMAKE_DIR}" "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}"
        "-DCMAKE_CXX_STANDARD=${CMAKE_CXX_STANDARD}" "-DCMAKE_CXX_EXTENSIONS=${CMAKE_CXX_EXTENSIONS}"
        "-DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}" "-DCMAKE_CUDA_STANDARD=${CMAKE_CUDA_STANDARD}")
    # what the user said about CUDA (-DCUDA_TOOLKIT_ROOT_DIR=..., -DCMAKE_CUDA_COMPILER=...)
    get_cmake_property(_rs_cache_vars CACHE_VARIABLES)
    foreach(_rs_var IN LISTS _rs_cache_vars)
      if(_rs_var MATCHES "^(CMAKE_MAKE_PROGRAM|CUDA_.*|CUDAToolkit_.*|CMAKE_CUDA_.*|TORCH_CUDA_.*)$")
        list(APPEND _rs_probe_args "-D${_rs_var}=${${_rs_var}}")
      endif()
    endforeach()
    message(STATUS "ridgescope: a CUDA libtorch: probing find_package(Torch)")
    execute_process(
      COMMAND "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/torch_probe" -B "${_rs_probe_dir}"
              -G "${CMAKE_GENERATOR}" ${_rs_probe_args}
      RESULT_VARIABLE _rs_probe_rc OUTPUT_QUIET ERROR_VARIABLE _rs_probe_err)
    file(REMOVE_RECURSE "${_rs_probe_dir}")
    set(_rs_probe_reason "")
    if(NOT _rs_probe_rc EQUAL 0)
      string(REGEX MATCH "CMake Error[^\n]*\n+[^\n]*\n[^\n]*" _rs_probe_reason "${_rs_probe_err}")
      string(REGEX REPLACE "[\n ]+" " " _rs_probe_reason "failed: ${_rs_probe_reason}")
    endif()
    set(_RIDGESCOPE_TORCH_PROBED "${RIDGESCOPE_TORCH_CMAKE_DIR}" CACHE INTERNAL "")
    set(_RIDGESCOPE_TORCH_PROBE_REASON "${_rs_probe_reason}" CACHE INTERNAL "")
  endif()
  if(_RIDGESCOPE_TORCH_PROBE_REASON)
    set(_rs_use_find_package OFF)
  endif()
endif()
add_library(ridgescope_torch_deps INTERFACE)
if(_rs_use_find_package)
  find_package(Torch CONFIG REQUIRED PATHS "${RIDGESCOPE_TORCH_CMAKE_DIR}" NO_DEFAULT_PATH)
  set(RIDGESCOPE_TORCH_FROM "find_package")
  set(RIDGESCOPE_TORCH_VERSION "${Torch_VERSION}")
  set(RIDGESCOPE_TORCH_INCLUDE_DIRS ${TORCH_INCLUDE_DIRS})
  target_link_libraries(ridgescope_torch_deps INTERFACE ${TORCH_LIBRARIES})
  # Under add_subdirectory(ridgescope) the parent project evaluates torch's generator
  # expressions ($<TARGET_PROPERTY:torch_cpu,...>), where the imported targets of this directory
  # are not visible unless global.
  if(NOT CMAKE_CURRENT_SOURCE_DIR STREQUAL CMAKE_SOURCE_DIR)
    if(CMAKE_VERSION VERSION_LESS 3.21)
      set(_rs_imported torch torch_library torch_cpu torch_cpu_library c10 headeronly caffe2::mkl
          caffe2::mkldnn torch_cuda torch_cuda_library c10_cuda torch::cudart torch::nvtoolsext)
    else()
      get_directory_property(_rs_imported IMPORTED_TARGETS)
    endif()
    foreach(_rs_target IN LISTS _rs_imported)
      if(TARGET ${_rs_target})
        get_target_property(_rs_global ${_rs_target} IMPORTED_GLOBAL)
        if(NOT _rs_global)
          set_target_properties(${_rs_target} PROPERTIES IMPORTED_GLOBAL TRUE)
        endif()
      endif()
    endforeach()
  endif()
else()
  set(RIDGESCOPE_TORCH_FROM "directories")
  file(STRINGS "${RIDGESCOPE_TORCH_CMAKE_DIR}/TorchConfigVersion.cmake" _rs_version_line
       REGEX "set\\(PACKAGE_VERSION \"")
  string(REGEX REPLACE ".*PACKAGE_VERSION \"([^\"]*)\".*" "\\1" RIDGESCOPE_TORCH_VERSION "${_rs_version_line}")
  set(RIDGESCOPE_TORCH_INCLUDE_DIRS "${_rs_torch_prefix}/include" "${_rs_torch_prefix}/include/torch/csrc/api/include")
  target_include_directories(ridgescope_torch_deps SYSTEM INTERFACE ${RIDGESCOPE_TORCH_INCLUDE_DIRS})
  foreach(_lib c10 torch_cpu torch)
    find_library(_rs_lib_${_lib} NAMES ${_lib} PATHS "${RIDGESCOPE_TORCH_LIB_DIR}" NO_DEFAULT_PATH REQUIRED)
    target_link_libraries(ridgescope_torch_deps INTERFACE "${_rs_lib_${_lib}}")
  endforeach()
  message(STATUS "ridgescope: find_package(Torch) does not succeed with this CUDA libtorch here "
                 "(the probe ${_RIDGESCOPE_TORCH_PROBE_REASON}): torch's include/ and lib/ are used directly")
endif()
message(STATUS "ridgescope: torch ${RIDGESCOPE_TORCH_VERSION} at ${RIDGESCOPE_TORCH_LIB_DIR} "
               "(${RIDGESCOPE_TORCH_FROM}, no Python, CXX11 ABI ${_rs_abi})")

# 3. The CUDA caching-allocator source, as in cmake/RidgescopeTorch.cmake: compiled in when torch
#    has CUDA and the CUDA runtime headers (with the compiler's crt/ headers and the cuBLAS,
#    cuSPARSE and cuSOLVER headers ATen/cuda includes) are found. No GPU or CUDA compiler needed.
set(RIDGESCOPE_WITH_CUDA AUTO CACHE STRING "Build the CUDA allocator source: AUTO, ON or OFF")
set(RIDGESCOPE_HAS_CUDA_SOURCE OFF)
if(_rs_cuda_torch AND NOT RIDGESCOPE_WITH_CUDA STREQUAL "OFF")
  set(_rs_dirs ${CUDAToolkit_INCLUDE_DIRS})
  foreach(_rs_var CUDA_HOME CUDA_PATH)
    if(DEFINED ENV{${_rs_var}})
      list(APPEND _rs_dirs "$ENV{${_rs_var}}/include")
    endif()
  endforeach()
  # a torch wheel: the nvidia-* wheels (nvidia/cu13/include, nvidia/cuda_runtime/include) and
  # triton's bundled crt/ headers lie beside it in site-packages
  get_filename_component(_rs_site "${_rs_torch_prefix}/.." ABSOLUTE)
  file(GLOB _rs_wheel_dirs LIST_DIRECTORIES true "${_rs_site}/nvidia/*/include")
  list(SORT _rs_wheel_dirs)
  list(APPEND _rs_dirs /usr/local/cuda/include ${_rs_wheel_dirs} "${_rs_site}/triton/backends/nvidia/include")
  set(_rs_runtime "")
  set(_rs_crt "")
  set(_rs_blas "")
  foreach(_rs_d IN LISTS _rs_dirs)
    if(NOT _rs_runtime AND EXISTS "${_rs_d}/cuda_runtime_api.h")
      set(_rs_runtime "${_rs_d}")
    endif()
    if(NOT _rs_crt AND EXISTS "${_rs_d}/crt/host_config.h")
      set(_rs_crt "${_rs_d}")
    endif()
    if(NOT _rs_blas AND EXISTS "${_rs_d}/cublas_v2.h" AND EXISTS "${_rs_d}/cublasLt.h"
       AND EXISTS "${_rs_d}/cusparse.h" AND EXISTS "${_rs_d}/cusolverDn.h")
      set(_rs_blas "${_rs_d}")
    endif()
  endforeach()
  if(_rs_runtime AND _rs_crt AND _rs_blas)
    set(RIDGESCOPE_CUDA_INCLUDE_DIR "${_rs_runtime}" "${_rs_crt}" "${_rs_blas}")
    list(REMOVE_DUPLICATES RIDGESCOPE_CUDA_INCLUDE_DIR)
    set(RIDGESCOPE_C10_CUDA_LIB "${RIDGESCOPE_TORCH_LIB_DIR}/libc10_cuda.so")
    set(RIDGESCOPE_HAS_CUDA_SOURCE ON)
    target_include_directories(ridgescope_torch_deps SYSTEM INTERFACE ${RIDGESCOPE_CUDA_INCLUDE_DIR})
    target_link_libraries(ridgescope_torch_deps INTERFACE "${RIDGESCOPE_C10_CUDA_LIB}")
    target_compile_definitions(ridgescope_torch_deps INTERFACE RIDGESCOPE_WITH_CUDA=1)
    message(STATUS "ridgescope: CUDA allocator source ON (${RIDGESCOPE_C10_CUDA_LIB}, headers ${RIDGESCOPE_CUDA_INCLUDE_DIR})")
  elseif(RIDGESCOPE_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ridgescope: RIDGESCOPE_WITH_CUDA=ON but no CUDA runtime, crt/ and cuBLAS headers were found")
  else()
    message(STATUS "ridgescope: CUDA allocator source OFF (no CUDA runtime headers found)")
  endif()
elseif(RIDGESCOPE_WITH_CUDA STREQUAL "ON")
  message(FATAL_ERROR "ridgescope: RIDGESCOPE_WITH_CUDA=ON but this libtorch has no libc10_cuda")
else()
  message(STATUS "ridgescope: CUDA allocator source OFF (torch without CUDA)")
endif()
