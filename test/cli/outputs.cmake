# Outputs (docs/hardening.md, "The rules the code keeps"): written only after everything succeeded, all or nothing;
# an output equal to an input or to another output is refused.
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
function(run_expect code regex)
  execute_process(COMMAND ${CPSCHED} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc STREQUAL code)
    message(FATAL_ERROR "${ARGN}: expected exit ${code}, got ${rc}:\n${o}${e}")
  endif()
  if(NOT "${o}${e}" MATCHES "${regex}")
    message(FATAL_ERROR "${ARGN}: output does not match '${regex}':\n${o}${e}")
  endif()
endfunction()
function(expect_text file text)
  file(READ "${file}" got)
  if(NOT got STREQUAL text)
    message(FATAL_ERROR "${file} changed: '${got}'")
  endif()
endfunction()

# -o P.json --svg /dev/full: the SVG fails, P.json keeps its previous content.
set(plan "${DIR}/P.json")
file(WRITE "${plan}" "previous plan")
if(EXISTS /dev/full)
  run_expect(1 "/dev/full" plan ${CONFIG} --quiet -o ${plan} --svg /dev/full)
  expect_text("${plan}" "previous plan")
endif()
# -o X --svg X: refused before solving, nothing written.
run_expect(1 "--output '.*X' and --svg '.*X' name the same file" plan ${CONFIG} --quiet -o ${DIR}/X --svg ${DIR}/X)
if(EXISTS "${DIR}/X")
  message(FATAL_ERROR "${DIR}/X was written")
endif()
# -o CONFIG: refused, the config left as it was.
configure_file(${CONFIG} ${DIR}/config.yaml COPYONLY)
get_filename_component(config_dir "${CONFIG}" DIRECTORY)
file(COPY "${config_dir}/data" DESTINATION "${DIR}")  # the histogram it names
file(READ "${DIR}/config.yaml" before)
run_expect(1 "--output '.*config.yaml' is the config" plan ${DIR}/config.yaml --quiet -o ${DIR}/config.yaml)
expect_text("${DIR}/config.yaml" "${before}")
# Another spelling of the config, as --svg of run.
run_expect(1 "--svg '.*config.yaml' is the config" run ${DIR}/config.yaml --svg ${DIR}/./config.yaml)
expect_text("${DIR}/config.yaml" "${before}")
# A histogram the config reads is an input too.
run_expect(1 "is the file of problem.mask.histogram" plan ${CONFIG} --quiet --svg ${HISTOGRAM})
# --groups without --svg: a usage error, not silently ignored.
run_expect(2 "--groups selects the head groups of --svg" plan ${CONFIG} --quiet --groups 0,1)
# Both outputs on success, and nothing else in the folder.
run_expect(0 "wrote" plan ${CONFIG} --quiet -o ${plan} --svg ${DIR}/P.svg)
file(READ "${plan}" head LIMIT 26)
if(NOT head STREQUAL "{\"format\":\"cpsched-plan/1\"")
  message(FATAL_ERROR "not a plan: '${head}'")
endif()
file(GLOB left "${DIR}/.*" "${DIR}/data/.*")
if(left)
  message(FATAL_ERROR "temporaries left: ${left}")
endif()
message(STATUS "ok")
