# FindCudnnFrontend: the cuDNN frontend, cuDNN's header-only C++ graph API
# (cudnn_frontend.h). tools/install_deps.sh installs it from PyPI into
# build/deps/cudnn_frontend-<version>/; also searched: CUDNN_FRONTEND_HOME
# (environment or cache), the system, and the wheel's include/ folder of the
# Python on PATH. Defines
#   CudnnFrontend_FOUND, CUDNN_FRONTEND_INCLUDE_DIR, CudnnFrontend_VERSION
#   CUDNN::frontend   imported interface target (SYSTEM headers; JSON
#                     serialisation left out, so no second nlohmann copy)
include(FindPackageHandleStandardArgs)

set(_fe_hints "")
if(DEFINED CUDNN_FRONTEND_HOME)
  list(APPEND _fe_hints "${CUDNN_FRONTEND_HOME}")
endif()
if(DEFINED ENV{CUDNN_FRONTEND_HOME})
  list(APPEND _fe_hints "$ENV{CUDNN_FRONTEND_HOME}")
endif()
file(GLOB _fe_deps LIST_DIRECTORIES true "${PROJECT_SOURCE_DIR}/build/deps/cudnn_frontend-*")
list(SORT _fe_deps COMPARE NATURAL ORDER DESCENDING)
list(APPEND _fe_hints ${_fe_deps})
find_program(_fe_python NAMES python3 python)
if(_fe_python)
  execute_process(COMMAND "${_fe_python}" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
                  OUTPUT_VARIABLE _fe_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(_rc EQUAL 0 AND IS_DIRECTORY "${_fe_site}")
    list(APPEND _fe_hints "${_fe_site}")
  endif()
endif()

find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${_fe_hints} PATH_SUFFIXES include)
if(CUDNN_FRONTEND_INCLUDE_DIR AND EXISTS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h")
  file(STRINGS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h" _fe_defs
       REGEX "#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "CUDNN_FRONTEND_${_part}_VERSION ([0-9]+)" _m "${_fe_defs}")
    set(_fe_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(CudnnFrontend_VERSION "${_fe_MAJOR}.${_fe_MINOR}.${_fe_PATCH}")
endif()

find_package_handle_standard_args(CudnnFrontend REQUIRED_VARS CUDNN_FRONTEND_INCLUDE_DIR
                                  VERSION_VAR CudnnFrontend_VERSION)
mark_as_advanced(CUDNN_FRONTEND_INCLUDE_DIR)

if(CudnnFrontend_FOUND AND NOT TARGET CUDNN::frontend)
  add_library(CUDNN::frontend INTERFACE IMPORTED GLOBAL)
  set_target_properties(CUDNN::frontend PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${CUDNN_FRONTEND_INCLUDE_DIR}"
                                                   INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_FRONTEND_INCLUDE_DIR}"
                                                   INTERFACE_COMPILE_DEFINITIONS CUDNN_FRONTEND_SKIP_JSON_LIB)
endif()
