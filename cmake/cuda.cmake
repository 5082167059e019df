# CUDA kernels (RINGREDUCE_WITH_CUDA = AUTO | ON | OFF).
#
# AUTO builds them when a CUDA compiler is found, ON fails the configure step
# when none is, OFF never builds them. The result is RR_WITH_CUDA_VALUE for the
# generated config.h. The CUDA runtime is linked statically so that _core
# imports on machines with no GPU and no driver: the kernels then report
# cudaErrorNoDevice / cudaErrorInsufficientDriver and cuda_device_count() is 0.
#
# The compiler is taken from CMAKE_CUDA_COMPILER or CUDACXX, else nvcc on PATH,
# else the toolkit's usual install path. Machine code for sm_80 (A100) and
# sm_90 (H100/H200), plus sm_90 PTX that newer GPUs JIT-compile at load time;
# override with -DCMAKE_CUDA_ARCHITECTURES=... or CUDAARCHS.
set(RR_WITH_CUDA_VALUE 0)
string(TOUPPER "${RINGREDUCE_WITH_CUDA}" _rr_cuda_mode)

if(NOT _rr_cuda_mode STREQUAL "OFF")
  # check_language() configures a scratch project that sees only the
  # environment, so the compiler fallback and the architectures go there.
  # Without the architectures, CMake < 3.26 fails to find a default one with
  # nvcc 13 and reports no compiler at all.
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(_rr_nvcc_on_path nvcc NO_CMAKE_PATH NO_CMAKE_ENVIRONMENT_PATH
                 NO_CMAKE_SYSTEM_PATH NO_PACKAGE_ROOT_PATH)
    if(NOT _rr_nvcc_on_path AND EXISTS /usr/local/cuda/bin/nvcc)
      set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
    endif()
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
    set(CMAKE_CUDA_ARCHITECTURES "80-real;90-real;90-virtual")
    set(ENV{CUDAARCHS} "${CMAKE_CUDA_ARCHITECTURES}")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(RR_WITH_CUDA_VALUE 1)
  elseif(_rr_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR
      "RINGREDUCE_WITH_CUDA=ON but no CUDA compiler was found: install the CUDA toolkit, "
      "put nvcc on PATH or set CUDACXX, or build with RINGREDUCE_WITH_CUDA=OFF.")
  else()
    message(STATUS "ringreduce: no CUDA compiler found, building without the CUDA kernels")
  endif()
endif()

if(RR_WITH_CUDA_VALUE)
  # The runtime comes from CUDA::cudart_static below, for every target alike.
  set(CMAKE_CUDA_RUNTIME_LIBRARY None)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "ringreduce: CUDA kernels with nvcc ${CMAKE_CUDA_COMPILER_VERSION} "
                 "for ${CMAKE_CUDA_ARCHITECTURES}")

  # No --use_fast_math: the float16 conversions need IEEE rounding and
  # subnormals, and the kernels must give the same bits as the CPU ones.
  # testing/flag_probe.cu is bench/gpu_flag_probe.py's (_core.testing).
  add_library(rr_cuda_kernels STATIC csrc/reduce/cuda_kernels.cu csrc/kernels/codec_cuda.cu
              csrc/testing/flag_probe.cu)
  set_target_properties(rr_cuda_kernels PROPERTIES
    CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON
    POSITION_INDEPENDENT_CODE ON)
  target_include_directories(rr_cuda_kernels PUBLIC csrc)
  target_compile_options(rr_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
  # The codec kernels must give the CPU loops' bits: no multiply-add may be fused
  # anywhere in them (their own arithmetic is explicitly rounded already; this
  # covers what they inline, such as the dither's scaling).
  set_source_files_properties(csrc/kernels/codec_cuda.cu PROPERTIES COMPILE_OPTIONS "--fmad=false")
  target_link_libraries(rr_cuda_kernels PUBLIC CUDA::cudart_static)
  target_link_libraries(_core PRIVATE rr_cuda_kernels)

  # The engine's Device for CUDA arrays in the collectives (streams, events,
  # pinned staging); every extension that links the engine gets it, so the
  # MPI transport stages device buffers the same way as TCP.
  target_sources(rr_engine PRIVATE csrc/executor/cuda_device.cc)
  target_link_libraries(rr_engine PUBLIC rr_cuda_kernels)

  # Keep the static runtime's symbols private to each extension, so they never
  # stand in for those of the libcudart that torch or cupy load into the same
  # process.
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    target_link_options(_core PRIVATE "LINKER:--exclude-libs,ALL")
    if(TARGET _core_mpi)
      target_link_options(_core_mpi PRIVATE "LINKER:--exclude-libs,ALL")
    endif()
  endif()
endif()
