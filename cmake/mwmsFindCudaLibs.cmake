# mwmsFindCudaLibs.cmake: NCCL and cuDNN as IMPORTED targets (mwms::nccl, mwms::cudnn), used by
# the libmwms build (cmake/mwms_cuda.cmake) and, for a static libmwms.a, by mwmsConfig.cmake.
# Needs find_package(CUDAToolkit) first. Sets MWMS_NCCL_FOUND / MWMS_CUDNN_FOUND.
#
# Note [cuda library search]: each library is looked for, in this order, (1) next to the CUDA
# toolkit (CUDAToolkit_INCLUDE_DIRS / CUDAToolkit_LIBRARY_DIR: Debian's and NVIDIA's packages put
# NCCL and cuDNN there), (2) under NCCL_ROOT / CUDNN_ROOT (CMake variable, then environment),
# (3) in the pip wheels' trees (site-packages/nvidia/{nccl,cudnn}/{include,lib}). The library may
# exist only as its versioned name (libnccl.so.2, libcudnn.so.9: the wheels and runtime-only
# packages ship no unversioned .so), so both names are searched; the IMPORTED target then links the
# file by path, which needs no libnccl.so symlink.
include_guard(GLOBAL)

set(_mwms_wheel_roots "")
find_package(Python3 QUIET COMPONENTS Interpreter)
if(Python3_EXECUTABLE)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c
    "import site,sys; print(';'.join(site.getsitepackages() + [site.getusersitepackages()]))"
    OUTPUT_VARIABLE _mwms_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(_rc EQUAL 0)
    set(_mwms_wheel_roots ${_mwms_site})
  endif()
endif()

# mwms_find_cuda_lib(NAME HEADER WHEEL LIBNAMES...): mwms::<name> when HEADER and a library are
# found (Note [cuda library search]).
function(mwms_find_cuda_lib name header wheel)
  string(TOUPPER ${name} up)
  set(hints_inc ${CUDAToolkit_INCLUDE_DIRS})
  set(hints_lib ${CUDAToolkit_LIBRARY_DIR})
  foreach(root ${${up}_ROOT} $ENV{${up}_ROOT})
    list(APPEND hints_inc ${root}/include)
    list(APPEND hints_lib ${root}/lib ${root}/lib64)
  endforeach()
  foreach(site ${_mwms_wheel_roots})
    list(APPEND hints_inc ${site}/nvidia/${wheel}/include)
    list(APPEND hints_lib ${site}/nvidia/${wheel}/lib)
  endforeach()
  find_path(MWMS_${up}_INCLUDE_DIR ${header} HINTS ${hints_inc})
  find_library(MWMS_${up}_LIBRARY NAMES ${ARGN} HINTS ${hints_lib})
  if(MWMS_${up}_INCLUDE_DIR AND MWMS_${up}_LIBRARY)
    if(NOT TARGET mwms::${name})
      add_library(mwms::${name} SHARED IMPORTED)
      set_target_properties(mwms::${name} PROPERTIES
        IMPORTED_LOCATION ${MWMS_${up}_LIBRARY}
        INTERFACE_INCLUDE_DIRECTORIES ${MWMS_${up}_INCLUDE_DIR})
    endif()
    set(MWMS_${up}_FOUND TRUE PARENT_SCOPE)
  else()
    set(MWMS_${up}_FOUND FALSE PARENT_SCOPE)
  endif()
endfunction()

mwms_find_cuda_lib(nccl nccl.h nccl nccl libnccl.so.2)
mwms_find_cuda_lib(cudnn cudnn.h cudnn cudnn libcudnn.so.9)
