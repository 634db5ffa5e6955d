# LibTorch from the `torch` wheel in the project's Python environment.
#
# deploy/setup.sh installs a pinned PyPI `torch` into LORAPLEX_VENV. Unless
# -DLORAPLEX_TORCH_FROM_VENV=OFF (then -DTorch_DIR= or CMAKE_PREFIX_PATH
# names the LibTorch, e.g. Debian's libtorch-dev or a GPU machine's own
# torch), this points find_package(Torch) at the wheel's CMake files and
# makes sure nothing of another LibTorch or CUDA installation on the machine
# is picked up instead.
option(LORAPLEX_TORCH_FROM_VENV
       "Build against the torch wheel in LORAPLEX_VENV when it has one" ON)

# The torch package directory (site-packages/torch) that LibTorch CMake
# directory `cmake_dir` (.../torch/share/cmake/Torch) lies in, or "".
function(loraplex_wheel_of cmake_dir out)
  get_filename_component(_dir "${cmake_dir}/../../.." ABSOLUTE)
  if(EXISTS "${_dir}/lib/libtorch_cpu.so" AND EXISTS "${_dir}/__init__.py")
    set(${out} "${_dir}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

set(_loraplex_venv_torch "")
if(LORAPLEX_TORCH_FROM_VENV AND EXISTS "${LORAPLEX_VENV}/bin/python")
  execute_process(
    COMMAND "${LORAPLEX_VENV}/bin/python" -c
            "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE _loraplex_torch_dir
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _loraplex_torch_rc
    ERROR_QUIET)
  if(_loraplex_torch_rc EQUAL 0
     AND EXISTS "${_loraplex_torch_dir}/share/cmake/Torch/TorchConfig.cmake")
    set(_loraplex_venv_torch "${_loraplex_torch_dir}")
  endif()
endif()

set(LORAPLEX_TORCH_WHEEL_DIR "")
if(Torch_DIR)
  # Given, or found by an earlier configure.
  loraplex_wheel_of("${Torch_DIR}" LORAPLEX_TORCH_WHEEL_DIR)
  if(_loraplex_venv_torch
     AND NOT LORAPLEX_TORCH_WHEEL_DIR STREQUAL _loraplex_venv_torch)
    message(FATAL_ERROR "Torch_DIR is ${Torch_DIR}, not the torch in "
      "${LORAPLEX_VENV} (${_loraplex_venv_torch}). To build against it, give "
      "-DLORAPLEX_TORCH_FROM_VENV=OFF; to use the venv's, start from a fresh "
      "build directory (deploy/setup.sh does when it switches).")
  endif()
elseif(_loraplex_venv_torch)
  set(LORAPLEX_TORCH_WHEEL_DIR "${_loraplex_venv_torch}")
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
  # The wheel ships part of protobuf's headers in its include directory,
  # which comes before the system's: the service's generated code and
  # libprotobuf need the headers of the Protobuf found (torch 2.15.0 ships
  # 3.21.12, Debian 12's release; torch 2.11 ships 3.13). Where the two
  # differ, a directory holding only google/protobuf (a link to the found
  # release's headers) goes first on every include path: LibTorch's own
  # headers that loraplex includes use no protobuf.
  foreach(_include IN LISTS TORCH_INCLUDE_DIRS)
    set(_common "${_include}/google/protobuf/stubs/common.h")
    if(EXISTS "${_common}")
      file(STRINGS "${_common}" _line
           REGEX "^#define GOOGLE_PROTOBUF_VERSION [0-9]+")
      string(REGEX MATCH "[0-9]+$" _theirs "${_line}")
      string(REPLACE "." ";" _parts "${Protobuf_VERSION}")
      list(GET _parts 0 _major)
      list(GET _parts 1 _minor)
      list(GET _parts 2 _patch)
      math(EXPR _ours "${_major} * 1000000 + ${_minor} * 1000 + ${_patch}")
      if(NOT _theirs STREQUAL _ours)
        list(GET Protobuf_INCLUDE_DIRS 0 _protobuf_include)
        set(_shadow "${CMAKE_BINARY_DIR}/protobuf-first")
        file(MAKE_DIRECTORY "${_shadow}/google")
        file(CREATE_LINK "${_protobuf_include}/google/protobuf"
             "${_shadow}/google/protobuf" SYMBOLIC)
        include_directories(BEFORE "${_shadow}")
        message(STATUS "LibTorch carries protobuf headers ${_theirs}, "
          "Protobuf ${Protobuf_VERSION} is found: its headers "
          "(${_protobuf_include}) come first through ${_shadow}")
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
