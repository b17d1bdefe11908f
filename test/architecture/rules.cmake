# cmake -P script behind `architecture_rules` (see CMakeLists.txt).
#  1. Solvers choose, the host prices: no solver plugin and nothing in
#     libcpsched_search includes the plan builder or the timing model.
#  2. Nothing in the tree includes a forwarding header kept for out-of-tree
#     code (the pre-0.5 paths directly under cpsched/).
#  3. No source cites the old design document by section ("DESIGN §").
#  4. base/ is the bottom layer: its sources and headers include no other
#     concept folder of cpsched.
set(failures "")

file(GLOB_RECURSE solver_sources "${SOURCE_DIR}/plugins/*.cpp" "${SOURCE_DIR}/plugins/*.hpp"
     "${SOURCE_DIR}/core/src/search/*.cpp" "${SOURCE_DIR}/core/include/cpsched/search/*.hpp")
foreach(f IN LISTS solver_sources)
  file(STRINGS "${f}" hits ENCODING UTF-8 REGEX "#include [<\"]cpsched/(plan/builder|timing/model|plan_builder|timing)\\.hpp[>\"]")
  if(hits)
    string(APPEND failures "\n  ${f}: ${hits} (solvers ask the host's pricing service: SolveInput::pricing)")
  endif()
endforeach()

file(GLOB forwarding RELATIVE "${SOURCE_DIR}/core/include" "${SOURCE_DIR}/core/include/cpsched/*.hpp")
list(REMOVE_ITEM forwarding "cpsched/version.hpp")
file(GLOB_RECURSE our_sources "${SOURCE_DIR}/core/*.cpp" "${SOURCE_DIR}/core/*.hpp" "${SOURCE_DIR}/plugins/*.cpp"
     "${SOURCE_DIR}/plugins/*.hpp" "${SOURCE_DIR}/runtimes/*.cpp" "${SOURCE_DIR}/runtimes/*.hpp"
     "${SOURCE_DIR}/runtimes/*.cu" "${SOURCE_DIR}/tools/*.cpp" "${SOURCE_DIR}/tools/*.hpp" "${SOURCE_DIR}/python/*.cpp"
     "${SOURCE_DIR}/test/*.cpp" "${SOURCE_DIR}/test/*.hpp")
foreach(f IN LISTS our_sources)
  string(FIND "${f}" "/core/include/cpsched/" in_forwarding_dir)
  file(STRINGS "${f}" includes ENCODING UTF-8 REGEX "#include [<\"]cpsched/[a-z_]+\\.hpp[>\"]")
  foreach(line IN LISTS includes)
    string(REGEX MATCH "cpsched/[a-z_]+\\.hpp" h "${line}")
    list(FIND forwarding "${h}" at)
    if(at GREATER -1 AND NOT f MATCHES "/core/include/cpsched/[a-z_]+\\.hpp$")
      string(APPEND failures "\n  ${f}: includes the forwarding header ${h}; include its concept folder's")
    endif()
  endforeach()
  file(STRINGS "${f}" cites ENCODING UTF-8 REGEX "DESIGN §")
  if(cites)
    string(APPEND failures "\n  ${f}: cites DESIGN §n; link docs/design.md instead")
  endif()
endforeach()

file(GLOB_RECURSE base_sources "${SOURCE_DIR}/core/src/base/*.cpp" "${SOURCE_DIR}/core/src/base/*.hpp"
     "${SOURCE_DIR}/core/include/cpsched/base/*.hpp")
foreach(f IN LISTS base_sources)
  file(STRINGS "${f}" includes ENCODING UTF-8 REGEX "#include [<\"]cpsched/")
  foreach(line IN LISTS includes)
    if(NOT line MATCHES "cpsched/base/")
      string(APPEND failures "\n  ${f}: ${line} (base/ includes nothing above it)")
    endif()
  endforeach()
endforeach()

if(failures)
  message(FATAL_ERROR "architecture rules broken:${failures}")
endif()
message(STATUS "architecture rules hold (${CMAKE_CURRENT_LIST_FILE})")
