# MPI transport (RINGREDUCE_WITH_MPI = AUTO | ON | OFF).
#
# AUTO builds it when find_package(MPI) finds an MPI C library (mpicc on PATH,
# or MPI_HOME / MPI_C_COMPILER set); ON requires one; OFF skips it. It is its
# own extension module, ringreduce._core_mpi, linked against libmpi with the
# engine, so that _core has no MPI dependency and works where libmpi is
# absent at run time. Sets RR_WITH_MPI_VALUE (1/0) for config.h.
set(RR_WITH_MPI_VALUE 0)
string(TOUPPER "${RINGREDUCE_WITH_MPI}" _rr_mpi_mode)
if(NOT _rr_mpi_mode MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|1|0|YES|NO)$")
  message(FATAL_ERROR "RINGREDUCE_WITH_MPI must be AUTO, ON or OFF, not '${RINGREDUCE_WITH_MPI}'")
endif()

# FindMPI's C component probes with the C compiler; the project itself is C++.
if(_rr_mpi_mode STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(C)
  if(CMAKE_C_COMPILER)
    enable_language(C)
    find_package(MPI COMPONENTS C)
  endif()
elseif(RINGREDUCE_WITH_MPI)
  enable_language(C)
  find_package(MPI REQUIRED COMPONENTS C)
endif()

if(MPI_C_FOUND)
  set(RR_WITH_MPI_VALUE 1)
  message(STATUS "ringreduce: MPI transport ON (${MPI_C_LIBRARIES})")

  python_add_library(_core_mpi MODULE WITH_SOABI
    csrc/bindings/mpi_bindings.cc
    csrc/engine/mpi_communicator.cc
    csrc/transport/mpi/mpi_store.cc
    csrc/transport/mpi/mpi_channel.cc
    csrc/transport/mpi/mpi_transport.cc
  )
  target_link_libraries(_core_mpi PRIVATE rr_engine MPI::MPI_C pybind11::headers)
  target_compile_options(_core_mpi PRIVATE -Wall -Wextra)
  # Find the same libmpi after installation as at build time (a system MPI in
  # the default search path needs no entry; a wheel's or a module's does).
  set_target_properties(_core_mpi PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
  install(TARGETS _core_mpi DESTINATION ringreduce)
else()
  message(STATUS "ringreduce: MPI transport OFF (RINGREDUCE_WITH_MPI=${RINGREDUCE_WITH_MPI})")
endif()
