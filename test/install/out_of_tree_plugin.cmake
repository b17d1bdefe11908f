# cmake -P script behind the `install_out_of_tree_plugin` test (see CMakeLists.txt).
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
  message(STATUS "${what}: ok")
endfunction()

set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")

run("install into ${prefix}" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f "${LIBDIR}/cmake/cpsched/cpschedConfig.cmake" "${LIBDIR}/cmake/cpsched/CpschedPlugin.cmake"
          "include/cpsched/plugin.hpp" "${LIBDIR}/cpsched/plugins/libcpsched_owner.so")
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "the installation lacks ${f}")
  endif()
endforeach()

run("configure the example against the installation"
    "${CMAKE_COMMAND}" -S "${EXAMPLE_DIR}" -B "${build}" -G "${GENERATOR}"
    "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}"
    # Only the installation may provide cpsched, never this build tree.
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
file(STRINGS "${build}/CMakeCache.txt" found REGEX "^cpsched_DIR:")
if(NOT found MATCHES "${prefix}/")
  message(FATAL_ERROR "the example found cpsched elsewhere: ${found}")
endif()
run("build the example" "${CMAKE_COMMAND}" --build "${build}")
# LD_LIBRARY_PATH wins over the checker's RUNPATH: the installed libcpsched
# serves the checker and the plugins alike.
run("load and run the example plugin and the installed ones"
    "${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${prefix}/${LIBDIR}" "${CHECKER}" "${build}/libcpsched_round_robin.so" "${prefix}/${LIBDIR}/cpsched/plugins")
