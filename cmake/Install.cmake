include(CMakePackageConfigHelpers)
install(DIRECTORY core/include/cpsched DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS cpsched_core cpsched_search EXPORT cpschedTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT cpschedTargets NAMESPACE cpsched:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cpsched)
configure_package_config_file(cmake/cpschedConfig.cmake.in
  "${PROJECT_BINARY_DIR}/cpschedConfig.cmake"
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cpsched
  PATH_VARS CPSCHED_PLUGIN_INSTALL_DIR)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/cpschedConfigVersion.cmake"
  COMPATIBILITY ExactVersion)
install(FILES "${PROJECT_BINARY_DIR}/cpschedConfig.cmake" "${PROJECT_BINARY_DIR}/cpschedConfigVersion.cmake"
              cmake/CpschedPlugin.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cpsched)
# OPTIONAL: a tree without example configs still installs.
install(DIRECTORY configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/cpsched/configs OPTIONAL)
