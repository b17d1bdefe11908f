# Under a 1 GiB address-space limit a plan that needs far more must end with a
# message and exit 1 (not SIGABRT from an escaping bad_alloc), and must not
# leave a partial output file.
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
set(out "${DIR}/plan.json")
execute_process(COMMAND sh -c "ulimit -v 1048576 && exec \"$0\" \"$@\"" ${CPSCHED} plan ${CONFIG} --quiet -o ${out}
                        --set problem.cp_size=1024 --set "problem.mask={kind: full}" --set solver.name=owner
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "expected exit 1, got '${rc}': ${o}${e}")
endif()
if(NOT "${o}${e}" MATCHES "memory")
  message(FATAL_ERROR "the message does not say memory: ${o}${e}")
endif()
file(GLOB left "${DIR}/*" "${DIR}/.*")
if(left)
  message(FATAL_ERROR "files left behind: ${left}")
endif()
message(STATUS "ok: ${e}")
