# LibTorch from the `torch` wheel in the project's Python environment.
#
# deploy/setup.sh installs a pinned PyPI `torch` into LORAPLEX_VENV. Unless
# the configure names another LibTorch (-DTorch_DIR=... or
# -DLORAPLEX_TORCH_FROM_VENV=OFF, e.g. for Debian's libtorch-dev), this points
# find_package(Torch) at the wheel's CMake files and makes sure nothing of
# another LibTorch or CUDA installation on the machine is picked up instead.
option(LORAPLEX_TORCH_FROM_VENV
       "Build against the torch wheel in LORAPLEX_VENV when it has one" ON)

set(LORAPLEX_TORCH_WHEEL_DIR "")
if(Torch_DIR)
  # Given, or found by an earlier configure: a wheel's when it lies in one
  # (site-packages/torch/share/cmake/Torch).
  get_filename_component(_loraplex_torch_dir "${Torch_DIR}/../../.." ABSOLUTE)
  if(EXISTS "${_loraplex_torch_dir}/lib/libtorch_cpu.so"
     AND EXISTS "${_loraplex_torch_dir}/__init__.py")
    set(LORAPLEX_TORCH_WHEEL_DIR "${_loraplex_torch_dir}")
  endif()
elseif(LORAPLEX_TORCH_FROM_VENV AND EXISTS "${LORAPLEX_VENV}/bin/python")
  execute_process(
    COMMAND "${LORAPLEX_VENV}/bin/python" -c
            "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE _loraplex_torch_dir
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _loraplex_torch_rc
    ERROR_QUIET)
  if(_loraplex_torch_rc EQUAL 0
     AND EXISTS "${_loraplex_torch_dir}/share/cmake/Torch/TorchConfig.cmake")
    set(LORAPLEX_TORCH_WHEEL_DIR "${_loraplex_torch_dir}")
  endif()
endif()

if(LORAPLEX_TORCH_WHEEL_DIR)
  message(STATUS "LibTorch: the torch wheel in ${LORAPLEX_TORCH_WHEEL_DIR}")
  list(PREPEND CMAKE_PREFIX_PATH "${LORAPLEX_TORCH_WHEEL_DIR}/share/cmake")
  # TorchConfig looks for libc10, libtorch, ... with the system directories
  # first: with Debian's libtorch installed it would mix the two releases
  # (test discovery then aborts in c10's DispatchKeySet).
  list(PREPEND CMAKE_LIBRARY_PATH "${LORAPLEX_TORCH_WHEEL_DIR}/lib")
  # The wheel's CUDA libraries (cuBLAS, cuDNN, NCCL, the CUDA runtime, ...)
  # live in site-packages/nvidia/*/lib. The linker must resolve
  # libtorch_cuda's dependencies there, not in the CUDA toolkit, whose NCCL
  # can be older (undefined ncclCommResume, ...), and the programs must load
  # them from there first (these flags precede CMake's own -rpath), so they
  # run with the libraries LibTorch was built with.
  get_filename_component(_loraplex_site "${LORAPLEX_TORCH_WHEEL_DIR}" DIRECTORY)
  file(GLOB _loraplex_nvidia_libs LIST_DIRECTORIES true
       "${_loraplex_site}/nvidia/*/lib")
  foreach(_dir IN LISTS _loraplex_nvidia_libs)
    if(IS_DIRECTORY "${_dir}")
      add_link_options("LINKER:-rpath-link,${_dir}" "LINKER:-rpath,${_dir}")
    endif()
  endforeach()
endif()

# After find_package(Torch): the LibTorch found is one release, and CUDA is
# there when it was asked for.
function(loraplex_check_torch)
  get_filename_component(_lib_dir "${TORCH_LIBRARY}" DIRECTORY)
  foreach(_lib IN ITEMS c10_LIBRARY C10_CUDA_LIBRARY)
    if(${_lib})
      get_filename_component(_dir "${${_lib}}" DIRECTORY)
      if(NOT _dir STREQUAL _lib_dir)
        message(FATAL_ERROR "LibTorch's ${${_lib}} is not next to "
          "${TORCH_LIBRARY}: two LibTorch installations are mixed; give "
          "-DTorch_DIR= of the one to use")
      endif()
    endif()
  endforeach()
  if(TORCH_CUDA_LIBRARIES)
    set(LORAPLEX_TORCH_HAS_CUDA ON PARENT_SCOPE)
    message(STATUS "LibTorch ${Torch_VERSION} at ${_lib_dir}, with CUDA")
  else()
    set(LORAPLEX_TORCH_HAS_CUDA OFF PARENT_SCOPE)
    message(STATUS "LibTorch ${Torch_VERSION} at ${_lib_dir}, CPU only")
  endif()
endfunction()
