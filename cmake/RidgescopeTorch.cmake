# Locates torch from the Python interpreter that will import the module, the way
# torch.utils.cpp_extension does. find_package(Torch) is not used: with a CUDA build of torch it
# insists on a CUDA toolkit, which CPU machines do not have.
find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import torch, torch.utils.cpp_extension as c; print(','.join(c.include_paths())); print(c.library_paths()[0]); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)"
  OUTPUT_VARIABLE _rs_torch_out
  ERROR_VARIABLE _rs_torch_err
  RESULT_VARIABLE _rs_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _rs_torch_rc EQUAL 0)
  message(FATAL_ERROR "ridgescope: cannot import torch with ${Python_EXECUTABLE}: ${_rs_torch_err}\n"
                      "Install torch into that interpreter, or configure with -DRIDGESCOPE_BUILD_TORCH=OFF for a core-only build.")
endif()
string(REPLACE "\n" ";" _rs_torch_lines "${_rs_torch_out}")
list(GET _rs_torch_lines 0 _rs_inc)
list(GET _rs_torch_lines 1 RIDGESCOPE_TORCH_LIB_DIR)
list(GET _rs_torch_lines 2 _rs_abi)
list(GET _rs_torch_lines 3 RIDGESCOPE_TORCH_VERSION)
string(REPLACE "," ";" RIDGESCOPE_TORCH_INCLUDE_DIRS "${_rs_inc}")
message(STATUS "ridgescope: torch ${RIDGESCOPE_TORCH_VERSION} at ${RIDGESCOPE_TORCH_LIB_DIR} (CXX11 ABI ${_rs_abi})")
# Everything linked into one module must agree with torch's libstdc++ ABI.
add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${_rs_abi})

add_library(ridgescope_torch_deps INTERFACE)
target_include_directories(ridgescope_torch_deps SYSTEM INTERFACE ${RIDGESCOPE_TORCH_INCLUDE_DIRS})
foreach(_lib c10 torch_cpu torch)
  find_library(_rs_lib_${_lib} NAMES ${_lib} PATHS "${RIDGESCOPE_TORCH_LIB_DIR}" NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(ridgescope_torch_deps INTERFACE "${_rs_lib_${_lib}}")
endforeach()
find_library(RIDGESCOPE_TORCH_PYTHON_LIB NAMES torch_python PATHS "${RIDGESCOPE_TORCH_LIB_DIR}" NO_DEFAULT_PATH REQUIRED)
