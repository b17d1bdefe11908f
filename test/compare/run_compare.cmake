# Runs `cpsched compare CONFIG --out OUT [--set S ...]` into a fresh folder,
# so that the checker never reads files left by an earlier run.
#   cmake -DCPSCHED=... -DCONFIG=... -DOUT=... [-DSETS="a=1;b=2"] -P run_compare.cmake
file(REMOVE_RECURSE "${OUT}")
set(args compare "${CONFIG}" --out "${OUT}")
foreach(s IN LISTS SETS)
  list(APPEND args --set "${s}")
endforeach()
execute_process(COMMAND "${CPSCHED}" ${args} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cpsched compare exited with ${rc}")
endif()
