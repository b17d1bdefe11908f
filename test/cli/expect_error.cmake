# Runs ${CPSCHED} ${ARGS} and requires exit code ${EXPECT_CODE} and output
# (stdout + stderr) matching ${EXPECT_REGEX}.
execute_process(COMMAND ${CPSCHED} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT rc STREQUAL EXPECT_CODE)
  message(FATAL_ERROR "expected exit code ${EXPECT_CODE}, got '${rc}'; output:\n${all}")
endif()
if(NOT all MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "output does not match '${EXPECT_REGEX}':\n${all}")
endif()
message(STATUS "ok (exit ${rc}): ${all}")
