# pip builds every `pip install .` in a new temporary environment, so pybind11's
# headers sit at a new path each time. Compile against a copy at a fixed place in
# the build directory, refreshed only where a header's content changed: then the
# compile commands, and the objects built from them, carry over from one install
# to the next (with tools/build_backend, which keeps the build directory).
if(CMAKE_VERSION VERSION_LESS 3.21)
  return()  # no file(COPY_FILE ... ONLY_IF_DIFFERENT): compile in place
endif()
get_target_property(_rr_pybind11_include pybind11::pybind11_headers INTERFACE_INCLUDE_DIRECTORIES)
if(NOT _rr_pybind11_include OR NOT IS_DIRECTORY "${_rr_pybind11_include}/pybind11")
  return()
endif()
set(_rr_stable "${CMAKE_CURRENT_BINARY_DIR}/pybind11-${pybind11_VERSION}/include")
file(GLOB_RECURSE _rr_headers RELATIVE "${_rr_pybind11_include}" "${_rr_pybind11_include}/*.h")
foreach(_rr_header IN LISTS _rr_headers)
  get_filename_component(_rr_dir "${_rr_stable}/${_rr_header}" DIRECTORY)
  file(MAKE_DIRECTORY "${_rr_dir}")
  file(COPY_FILE "${_rr_pybind11_include}/${_rr_header}" "${_rr_stable}/${_rr_header}"
       ONLY_IF_DIFFERENT)
endforeach()
set_property(TARGET pybind11::pybind11_headers PROPERTY INTERFACE_INCLUDE_DIRECTORIES
                                                        "${_rr_stable}")
