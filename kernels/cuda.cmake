# Finds nvcc and enables CUDA for the kernels (CUDA 13, sm_90 for the H200 unless
# CMAKE_CUDA_ARCHITECTURES says otherwise). Sets KVPOOL_HAVE_CUDA. Included by the root
# CMakeLists.txt and by kernels/CMakeLists.txt when that is the top-level project.
option(KVPOOL_WITH_CUDA "Build the CUDA kernels when nvcc is found" ON)
set(KVPOOL_HAVE_CUDA OFF)
if(KVPOOL_WITH_CUDA)
  include(CheckLanguage)
  if(NOT DEFINED ENV{CUDACXX} AND NOT DEFINED CMAKE_CUDA_COMPILER
     AND EXISTS /usr/local/cuda/bin/nvcc)
    set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 for nvcc; the .cu files need 17
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(KVPOOL_HAVE_CUDA ON)
    message(STATUS "kvpool: CUDA kernels enabled (${CMAKE_CUDA_COMPILER}, sm_${CMAKE_CUDA_ARCHITECTURES})")
  else()
    message(STATUS "kvpool: nvcc not found; building the kernels' CPU references only")
  endif()
endif()
