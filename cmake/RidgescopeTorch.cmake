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
                      "Install torch into that interpreter, configure with -DRIDGESCOPE_BUILD_PYTHON=OFF "
                      "-DCMAKE_PREFIX_PATH=<libtorch> for the C++ package without Python (docs/cpp.md), "
                      "or with -DRIDGESCOPE_BUILD_TORCH=OFF for a core-only build.")
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

# The CUDA caching-allocator source (csrc/torch/cuda_allocator_source.cpp) is compiled in when
# torch has CUDA: libc10_cuda beside torch's libraries and the CUDA runtime headers, from a CUDA
# toolkit (CUDA_HOME, CUDA_PATH, /usr/local/cuda) or from the nvidia-cuda-runtime wheel torch
# depends on (site-packages/nvidia/cu13/include for cu130; nvidia/cuda_runtime/include for cu12).
# No GPU and no CUDA compiler are needed. -DRIDGESCOPE_WITH_CUDA=OFF leaves it out; ON makes its
# absence an error.
set(RIDGESCOPE_WITH_CUDA AUTO CACHE STRING "Build the CUDA allocator source: AUTO, ON or OFF")
set(RIDGESCOPE_HAS_CUDA_SOURCE OFF)
if(NOT RIDGESCOPE_WITH_CUDA STREQUAL "OFF")
  find_library(RIDGESCOPE_C10_CUDA_LIB NAMES c10_cuda PATHS "${RIDGESCOPE_TORCH_LIB_DIR}" NO_DEFAULT_PATH)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c [=[
import glob, os, torch
# The runtime headers (cuda_runtime_api.h) and the compiler's crt/ headers that cuda_runtime.h
# includes: a toolkit has both; a wheel may ship crt/ separately (triton bundles it).
dirs = []
if torch.version.cuda:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.environ[var], "include"))
    dirs.append("/usr/local/cuda/include")
    try:
        import nvidia
        for root in nvidia.__path__:
            dirs += sorted(glob.glob(os.path.join(root, "*", "include")))
    except ImportError:
        pass
    try:
        import importlib.util
        spec = importlib.util.find_spec("triton")
        if spec and spec.origin:
            dirs.append(os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "include"))
    except Exception:
        pass
has = lambda d, f: os.path.isfile(os.path.join(d, f))
both = [d for d in dirs if has(d, "cuda_runtime_api.h") and has(d, "crt/host_config.h")]
runtime = [d for d in dirs if has(d, "cuda_runtime_api.h")]
crt = [d for d in dirs if has(d, "crt/host_config.h")]
out = both[0] if both else (runtime[0] + ";" + crt[0] if runtime and crt else "")
# The cuBLAS, cuSPARSE and cuSOLVER headers (ATen/cuda/CUDAContextLight.h, for the workspace
# maps): a runtime-only toolkit lacks them, the nvidia wheels torch depends on have them.
blas = lambda d: all(has(d, f) for f in ("cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h"))
if out and not any(blas(d) for d in out.split(";")):
    extra = [d for d in dirs if blas(d)]
    if extra:
        out += ";" + extra[0]
print(out)
]=]
    OUTPUT_VARIABLE RIDGESCOPE_CUDA_INCLUDE_DIR
    OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_QUIET)
  if(RIDGESCOPE_C10_CUDA_LIB AND RIDGESCOPE_CUDA_INCLUDE_DIR)
    set(RIDGESCOPE_HAS_CUDA_SOURCE ON)
    target_include_directories(ridgescope_torch_deps SYSTEM INTERFACE "${RIDGESCOPE_CUDA_INCLUDE_DIR}")
    target_link_libraries(ridgescope_torch_deps INTERFACE "${RIDGESCOPE_C10_CUDA_LIB}")
    target_compile_definitions(ridgescope_torch_deps INTERFACE RIDGESCOPE_WITH_CUDA=1)
    message(STATUS "ridgescope: CUDA allocator source ON (${RIDGESCOPE_C10_CUDA_LIB}, headers ${RIDGESCOPE_CUDA_INCLUDE_DIR})")
  elseif(RIDGESCOPE_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ridgescope: RIDGESCOPE_WITH_CUDA=ON but torch has no libc10_cuda or no CUDA runtime headers were found")
  else()
    message(STATUS "ridgescope: CUDA allocator source OFF (torch without CUDA, or no CUDA runtime headers)")
  endif()
endif()
