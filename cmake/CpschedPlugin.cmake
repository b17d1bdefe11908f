# cpsched_add_plugin(<target> SOURCES <files>... [LIBS <libs>...] [OUTPUT_DIR <dir>] [NO_INSTALL])
# Builds a plugin shared object that links the core library and lands in the
# plugin folder (or OUTPUT_DIR). Used in tree and, installed, by third parties.
function(cpsched_add_plugin target)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIR" "SOURCES;LIBS" ${ARGN})
  add_library(${target} MODULE ${ARG_SOURCES})
  if(TARGET cpsched::core)
    target_link_libraries(${target} PRIVATE cpsched::core ${ARG_LIBS})
  else()
    target_link_libraries(${target} PRIVATE cpsched_core ${ARG_LIBS})
  endif()
  if(TARGET cpsched_warnings)
    target_link_libraries(${target} PRIVATE cpsched_warnings)
  endif()
  # INSTALL_RPATH_USE_LINK_PATH: an installed plugin still finds the libraries
  # it links from outside the system folders (CUDA, NCCL, ...).
  set_target_properties(${target} PROPERTIES PREFIX "lib" CXX_VISIBILITY_PRESET hidden
                                             VISIBILITY_INLINES_HIDDEN ON
                                             INSTALL_RPATH_USE_LINK_PATH ON)
  if(ARG_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIR}")
  elseif(DEFINED CPSCHED_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${CPSCHED_PLUGIN_OUTPUT_DIR}")
  endif()
  if(DEFINED CPSCHED_PLUGIN_INSTALL_DIR AND NOT ARG_NO_INSTALL)
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/../..")
    install(TARGETS ${target} LIBRARY DESTINATION "${CPSCHED_PLUGIN_INSTALL_DIR}")
  endif()
endfunction()
