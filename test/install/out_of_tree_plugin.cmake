# cmake -P script behind the `install_out_of_tree_plugin` test (see CMakeLists.txt).
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
  message(STATUS "${what}: ok")
endfunction()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")

run("install into ${prefix}" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f "${LIBDIR}/cmake/cpsched/cpschedConfig.cmake" "${LIBDIR}/cmake/cpsched/CpschedPlugin.cmake"
          "include/cpsched/plugin.hpp" "include/cpsched/plugin/plugin.hpp" "${LIBDIR}/cpsched/plugins/libcpsched_owner.so")
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "the installation lacks ${f}")
  endif()
endforeach()

# The example through the new include paths and through the old ones (the
# forwarding headers kept for one minor version).
foreach(variant new old)
  set(build "${WORK_DIR}/build-${variant}")
  set(old_includes OFF)
  if(variant STREQUAL "old")
    set(old_includes ON)
  endif()
  run("configure the example against the installation (${variant} include paths)"
      "${CMAKE_COMMAND}" -S "${EXAMPLE_DIR}" -B "${build}" -G "${GENERATOR}"
      "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
      -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}" "-DROUND_ROBIN_OLD_INCLUDES=${old_includes}"
      # Only the installation may provide cpsched, never this build tree.
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
  file(STRINGS "${build}/CMakeCache.txt" found REGEX "^cpsched_DIR:")
  if(NOT found MATCHES "${prefix}/")
    message(FATAL_ERROR "the example found cpsched elsewhere: ${found}")
  endif()
  run("build the example (${variant} include paths)" "${CMAKE_COMMAND}" --build "${build}")
  # LD_LIBRARY_PATH wins over the checker's RUNPATH: the installed libcpsched
  # serves the checker and the plugins alike.
  run("load and run the example plugin (${variant} include paths) and the installed ones"
      "${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${prefix}/${LIBDIR}" "${CHECKER}"
      "${build}/libcpsched_round_robin.so" "${prefix}/${LIBDIR}/cpsched/plugins")
endforeach()
