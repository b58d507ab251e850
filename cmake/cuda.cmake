# Optional CUDA backend. LLMTRAIN_CUDA: AUTO builds it when nvcc, cuBLAS(Lt) and NCCL are all
# found; ON fails clearly when one is missing; OFF never builds it; SIM builds the .cu files with the
# host compiler against the SIMT simulator (kernels/cuda/sim/, docs/cuda.md): no nvcc, cuBLAS or
# NCCL, only CUDA's headers (cuda_bf16.h, cuda_fp16.h, cuda_runtime_api.h).
set(LLMTRAIN_HAVE_CUDA OFF)
set(LLMTRAIN_CUDA_SIM OFF)
string(TOUPPER "${LLMTRAIN_CUDA}" _lt_cuda)
if(NOT _lt_cuda MATCHES "^(AUTO|ON|OFF|SIM)$")
  message(FATAL_ERROR "LLMTRAIN_CUDA=${LLMTRAIN_CUDA}: expected AUTO, ON, OFF or SIM")
endif()

if(_lt_cuda STREQUAL "SIM")
  find_path(LLMTRAIN_CUDA_SIM_INCLUDE cuda_bf16.h HINTS /usr/local/cuda/include ENV CUDA_HOME PATH_SUFFIXES include)
  if(NOT LLMTRAIN_CUDA_SIM_INCLUDE)
    message(FATAL_ERROR "LLMTRAIN_CUDA=SIM needs CUDA's headers (cuda_bf16.h, cuda_runtime_api.h), not found under "
                        "/usr/local/cuda/include or $CUDA_HOME/include. Install the CUDA toolkit's headers, or set "
                        "LLMTRAIN_CUDA_SIM_INCLUDE to their folder.")
  endif()
  set(LLMTRAIN_CUDA_SIM ON)
  message(STATUS "llmtrain: CUDA backend on the SIMT simulator (CUDA headers ${LLMTRAIN_CUDA_SIM_INCLUDE})")
elseif(NOT _lt_cuda STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  set(_lt_missing "")
  if(NOT CMAKE_CUDA_COMPILER)
    list(APPEND _lt_missing "nvcc (set CMAKE_CUDA_COMPILER or install the CUDA toolkit)")
  else()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(NOT CUDAToolkit_FOUND)
      list(APPEND _lt_missing "the CUDA toolkit libraries")
    elseif(NOT TARGET CUDA::cublasLt)
      list(APPEND _lt_missing "cuBLASLt")
    endif()
    find_path(LLMTRAIN_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(LLMTRAIN_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    if(NOT LLMTRAIN_NCCL_INCLUDE OR NOT LLMTRAIN_NCCL_LIB)
      list(APPEND _lt_missing "NCCL (nccl.h and libnccl)")
    endif()
  endif()

  if(_lt_missing)
    if(_lt_cuda STREQUAL "ON")
      string(JOIN ", " _lt_list ${_lt_missing})
      message(FATAL_ERROR "LLMTRAIN_CUDA=ON but missing: ${_lt_list}. "
                          "Install them, or configure with -DLLMTRAIN_CUDA=OFF for a CPU-only build.")
    endif()
    message(STATUS "llmtrain: CUDA backend off (missing: ${_lt_missing})")
  else()
    set(LLMTRAIN_HAVE_CUDA ON)
    # C++20, as the host code: the kernels' entry points include kernels/ops.h (std::span,
    # __VA_OPT__, designated initializers). Debian's CMake 3.25 does not know nvcc's flag for it
    # (nvcc has taken -std=c++20 since CUDA 12), so it is told.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    add_library(llmtrain_nccl UNKNOWN IMPORTED)
    set_target_properties(llmtrain_nccl PROPERTIES IMPORTED_LOCATION ${LLMTRAIN_NCCL_LIB}
                                                   INTERFACE_INCLUDE_DIRECTORIES ${LLMTRAIN_NCCL_INCLUDE})
    message(STATUS "llmtrain: CUDA backend on (archs ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${LLMTRAIN_NCCL_LIB})")
  endif()
endif()

if(LLMTRAIN_HAVE_CUDA)
  set(LLMTRAIN_HAVE_CUDA_INT 1)
  string(JOIN " " LLMTRAIN_CUDA_ARCHS_STRING ${CMAKE_CUDA_ARCHITECTURES})
else()
  set(LLMTRAIN_HAVE_CUDA_INT 0)
  set(LLMTRAIN_CUDA_ARCHS_STRING "")
endif()
