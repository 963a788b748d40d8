# CUDA and NCCL detection for the libmwms build, included from the top-level CMakeLists.txt.
# Sets MWMS_HAVE_CUDA / MWMS_HAVE_NCCL (0/1) and, when CUDA is in, the targets CUDA::cudart,
# CUDA::cublas, mwms::nccl (and mwms::cudnn when found).
#
# Note [cuda build]: MWMS_WITH_CUDA is AUTO (on when nvcc, cuBLAS and NCCL are all found), ON
# (fail if one is missing: CI uses it so GPU code always compiles and links) or OFF (the CPU-only
# build, as before). Only the runtime API is used: libmwms links libcudart, libnccl and nothing
# else of CUDA, and never libcuda (the driver): a program linked against libcuda.so.1 cannot even
# start on a machine without a driver, whereas cudart loads the driver lazily and reports
# cudaErrorInsufficientDriver (the unit:no-libcuda test checks the NEEDED entries). The default
# architectures are 80;90 (A100, H100/H200) and a user may override them, but never with
# "native" or "all": "native" asks the build machine's GPU, which CI machines do not have, and
# the build would silently differ from machine to machine.
set(MWMS_WITH_CUDA AUTO CACHE STRING "CUDA kernels and the NCCL backend: AUTO, ON or OFF")
set_property(CACHE MWMS_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
set(MWMS_HAVE_CUDA 0)
set(MWMS_HAVE_NCCL 0)

string(TOUPPER "${MWMS_WITH_CUDA}" _mwms_cuda_mode)
if(_mwms_cuda_mode STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit QUIET)
    include(${CMAKE_CURRENT_LIST_DIR}/mwmsFindCudaLibs.cmake)
  endif()
  if(CMAKE_CUDA_COMPILER AND TARGET CUDA::cublas AND TARGET CUDA::cudart AND MWMS_NCCL_FOUND)
    set(_mwms_cuda_on TRUE)
  else()
    set(_mwms_cuda_on FALSE)
    message(STATUS "MWMS_WITH_CUDA=AUTO: off (nvcc '${CMAKE_CUDA_COMPILER}', cuBLAS and NCCL "
                   "are all needed; NCCL found: ${MWMS_NCCL_FOUND})")
  endif()
elseif(_mwms_cuda_mode STREQUAL "ON" OR _mwms_cuda_mode STREQUAL "TRUE" OR _mwms_cuda_mode STREQUAL "1")
  set(_mwms_cuda_on TRUE)
else()
  set(_mwms_cuda_on FALSE)
endif()

if(_mwms_cuda_on)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures (default 80;90)")
  endif()
  if(CMAKE_CUDA_ARCHITECTURES MATCHES "native|all")
    message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES}: name the "
                        "architectures (default 80;90); see Note [cuda build] in cmake/mwms_cuda.cmake")
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  include(${CMAKE_CURRENT_LIST_DIR}/mwmsFindCudaLibs.cmake)
  if(NOT TARGET CUDA::cublas)
    message(FATAL_ERROR "MWMS_WITH_CUDA=ON but cuBLAS was not found next to ${CUDAToolkit_LIBRARY_DIR}")
  endif()
  if(NOT MWMS_NCCL_FOUND)
    message(FATAL_ERROR "MWMS_WITH_CUDA=ON but NCCL (nccl.h, libnccl.so[.2]) was not found: set "
                        "NCCL_ROOT (Note [cuda library search] in cmake/mwmsFindCudaLibs.cmake)")
  endif()
  set(MWMS_HAVE_CUDA 1)
  set(MWMS_HAVE_NCCL 1)
  message(STATUS "CUDA ${CUDAToolkit_VERSION} (architectures ${CMAKE_CUDA_ARCHITECTURES}), "
                 "NCCL ${MWMS_NCCL_LIBRARY}, cuDNN ${MWMS_CUDNN_FOUND}")
endif()
