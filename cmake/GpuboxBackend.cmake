# Selects the device backend. Every portable device source (.cu/.cuh) is compiled by nvcc on
# the cuda backend and as plain C++ (Thrust's OMP device system) on the cpu backend.
find_package(OpenMP REQUIRED COMPONENTS CXX)

set(GPUBOX_CUDA_ROOT "/usr/local/cuda" CACHE PATH "CUDA toolkit root (for CCCL headers and NCCL)")
find_path(GPUBOX_CCCL_INCLUDE_DIR thrust/version.h
  HINTS ${GPUBOX_CUDA_ROOT}/include/cccl ${GPUBOX_CUDA_ROOT}/include
        ${CUDAToolkit_INCLUDE_DIRS}/cccl
  PATHS /usr/local/cuda/include/cccl /usr/local/cuda/include /usr/include
  NO_DEFAULT_PATH)
if(NOT GPUBOX_CCCL_INCLUDE_DIR)
  message(FATAL_ERROR "CCCL (Thrust/CUB/libcu++) not found: install the CUDA toolkit or set "
                      "-DGPUBOX_CUDA_ROOT=<toolkit root>")
endif()

add_library(gpubox_backend INTERFACE)
add_library(gpubox::backend ALIAS gpubox_backend)

if(GPUBOX_BACKEND STREQUAL "cuda")
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  find_library(GPUBOX_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${GPUBOX_CUDA_ROOT}/lib
               ${GPUBOX_CUDA_ROOT}/lib64 REQUIRED)
  find_path(GPUBOX_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  target_compile_definitions(gpubox_backend INTERFACE GPUBOX_BACKEND_CUDA=1)
  target_compile_options(gpubox_backend INTERFACE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr --extended-lambda -Xcompiler=-fopenmp>)
  # Source lines of device code in compute-sanitizer's and Nsight's reports (scripts/gpu_check.sh):
  # line tables only, the generated code is the same. Off by default (larger binaries, and a
  # flag change rebuilds every CUDA object); scripts/bundle_cuda.sh, which builds what
  # gpu_check.sh runs, turns it on.
  option(GPUBOX_CUDA_LINEINFO "cuda backend: nvcc -lineinfo (device source lines in reports)" OFF)
  if(GPUBOX_CUDA_LINEINFO)
    target_compile_options(gpubox_backend INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
  endif()
  target_include_directories(gpubox_backend SYSTEM INTERFACE ${GPUBOX_NCCL_INCLUDE_DIR})
  target_link_libraries(gpubox_backend INTERFACE CUDA::cudart CUDA::cublas ${GPUBOX_NCCL_LIBRARY}
                        OpenMP::OpenMP_CXX)
else()
  target_compile_definitions(gpubox_backend INTERFACE GPUBOX_BACKEND_CPU=1
    THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP THRUST_HOST_SYSTEM=THRUST_HOST_SYSTEM_CPP)
  target_include_directories(gpubox_backend SYSTEM INTERFACE ${GPUBOX_CCCL_INCLUDE_DIR})
  target_link_libraries(gpubox_backend INTERFACE OpenMP::OpenMP_CXX)
endif()

# gpubox_device_sources(<file>...): portable device sources. On the cpu backend .cu files are
# compiled by the host compiler as C++ (-x c++); on cuda they stay CUDA.
function(gpubox_device_sources)
  if(GPUBOX_BACKEND STREQUAL "cpu")
    foreach(src IN LISTS ARGN)
      if(src MATCHES "\\.cu$")
        set_source_files_properties(${src} PROPERTIES LANGUAGE CXX COMPILE_OPTIONS "-xc++")
      endif()
    endforeach()
  endif()
endfunction()

# gpubox_no_fp_contract(<file>...): on the cpu backend, sources built without contraction into
# fused multiply-adds (-ffp-contract=off: g++ fuses a * b + c once a target has FMA, clang within
# an expression by default), for loops whose vectorized, per-item and per-ISA forms must give the
# same bits. It also defines GPUBOX_FP_CONTRACT_OFF, which heterps/device/isa_clones.cuh requires.
# Call it after the sources' gpubox_device_sources (which sets their COMPILE_OPTIONS). cuda:
# nothing. The root CMakeLists.txt now turns contraction off for every host source too
# (common/float_rn.hpp); this keeps the clones' sources saying what they rely on.
function(gpubox_no_fp_contract)
  if(GPUBOX_BACKEND STREQUAL "cpu")
    set_property(SOURCE ${ARGN} APPEND PROPERTY COMPILE_OPTIONS -ffp-contract=off)
    set_property(SOURCE ${ARGN} APPEND PROPERTY COMPILE_DEFINITIONS GPUBOX_FP_CONTRACT_OFF=1)
  endif()
endfunction()
