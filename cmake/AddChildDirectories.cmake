# cpsched_add_child_directories(): add_subdirectory() for every folder beside
# the calling CMakeLists.txt that has its own CMakeLists.txt, so a new plugin,
# runtime or test suite only needs its own folder.
function(cpsched_add_child_directories)
  file(GLOB children LIST_DIRECTORIES true CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/*")
  foreach(child IN LISTS children)
    if(IS_DIRECTORY "${child}" AND EXISTS "${child}/CMakeLists.txt")
      add_subdirectory("${child}")
    endif()
  endforeach()
endfunction()
