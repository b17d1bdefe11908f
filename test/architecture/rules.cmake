# cmake -P script behind `architecture_rules` (see CMakeLists.txt).
#  1. Solvers choose, the host prices: no solver plugin and nothing in
#     libcpsched_search includes the plan builder, the timing model or the
#     host's pricing service.
#  2. Nothing in the tree includes a forwarding header kept for out-of-tree
#     code (the pre-0.5 paths directly under cpsched/, the headers that moved
#     since): one whose first comment line begins "// Forwarding header".
#  3. No source cites the old design document by section ("DESIGN §").
#  4. base/ is the bottom layer: its sources and headers include no other
#     concept folder of cpsched.
#  5. Layers above it: problem/ < hardware/ (the cluster) < plan/ < timing/
#     (which times plans) < pricing/ (the host's pricing service) < session/.
#     A folder includes none of the folders above it; the plan builder takes
#     its timer from the caller (plan/step_timer.hpp).
set(failures "")

file(GLOB_RECURSE solver_sources "${SOURCE_DIR}/plugins/*.cpp" "${SOURCE_DIR}/plugins/*.hpp"
     "${SOURCE_DIR}/core/src/search/*.cpp" "${SOURCE_DIR}/core/include/cpsched/search/*.hpp")
foreach(f IN LISTS solver_sources)
  file(STRINGS "${f}" hits ENCODING UTF-8 REGEX "#include [<\"]cpsched/(plan/builder|timing/model|pricing/host_pricing|plan_builder|timing)\\.hpp[>\"]")
  if(hits)
    string(APPEND failures "\n  ${f}: ${hits} (solvers ask the host's pricing service: SolveInput::pricing)")
  endif()
endforeach()

# Forwarding headers say so in their first comment line.
file(GLOB_RECURSE public_headers RELATIVE "${SOURCE_DIR}/core/include" "${SOURCE_DIR}/core/include/cpsched/*.hpp")
set(forwarding "")
foreach(h IN LISTS public_headers)
  file(STRINGS "${SOURCE_DIR}/core/include/${h}" head ENCODING UTF-8 LIMIT_COUNT 2)
  list(GET head -1 first_comment)  # (the line after #pragma once)
  if(first_comment MATCHES "^// Forwarding header")
    list(APPEND forwarding "${h}")
  endif()
endforeach()
file(GLOB_RECURSE our_sources "${SOURCE_DIR}/core/*.cpp" "${SOURCE_DIR}/core/*.hpp" "${SOURCE_DIR}/plugins/*.cpp"
     "${SOURCE_DIR}/plugins/*.hpp" "${SOURCE_DIR}/runtimes/*.cpp" "${SOURCE_DIR}/runtimes/*.hpp"
     "${SOURCE_DIR}/runtimes/*.cu" "${SOURCE_DIR}/tools/*.cpp" "${SOURCE_DIR}/tools/*.hpp" "${SOURCE_DIR}/python/*.cpp"
     "${SOURCE_DIR}/test/*.cpp" "${SOURCE_DIR}/test/*.hpp")
foreach(f IN LISTS our_sources)
  file(STRINGS "${f}" includes ENCODING UTF-8 REGEX "#include [<\"]cpsched/[a-z_/]+\\.hpp[>\"]")
  foreach(line IN LISTS includes)
    string(REGEX MATCH "cpsched/[a-z_/]+\\.hpp" h "${line}")
    list(FIND forwarding "${h}" at)
    file(RELATIVE_PATH f_rel "${SOURCE_DIR}/core/include" "${f}")
    list(FIND forwarding "${f_rel}" f_forwards)  # (a forwarding header may name another)
    if(at GREATER -1 AND f_forwards EQUAL -1)
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

# "folder|folders above it"
set(layers "problem|hardware plan timing pricing session" "hardware|plan timing pricing session"
    "plan|timing pricing session" "timing|pricing session" "pricing|session")
foreach(layer IN LISTS layers)
  string(REPLACE "|" ";" parts "${layer}")
  list(GET parts 0 folder)
  list(GET parts 1 above)
  string(REPLACE " " "|" above_alt "${above}")
  file(GLOB_RECURSE layer_sources "${SOURCE_DIR}/core/src/${folder}/*.cpp" "${SOURCE_DIR}/core/src/${folder}/*.hpp"
       "${SOURCE_DIR}/core/include/cpsched/${folder}/*.hpp")
  foreach(f IN LISTS layer_sources)
    file(STRINGS "${f}" hits ENCODING UTF-8 REGEX "#include [<\"](cpsched/)?(${above_alt})/")
    foreach(line IN LISTS hits)
      string(APPEND failures "\n  ${f}: ${line} (${folder}/ includes nothing above it: ${above})")
    endforeach()
  endforeach()
endforeach()

if(failures)
  message(FATAL_ERROR "architecture rules broken:${failures}")
endif()
message(STATUS "architecture rules hold (${CMAKE_CURRENT_LIST_FILE})")
