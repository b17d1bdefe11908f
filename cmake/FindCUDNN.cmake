# FindCUDNN: cuDNN's headers and library (libcudnn, the dispatcher that loads
# the engine libraries at run time).
#
# Searched in CUDNN_HOME / CUDNN_ROOT (environment or cache), the CUDA
# toolkit, the system, and the pip wheel nvidia-cudnn-cu* of the Python on
# PATH (PyTorch's images carry cuDNN only there). Defines
#   CUDNN_FOUND, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION (x.y.z)
#   CUDNN::cudnn   imported target
include(FindPackageHandleStandardArgs)

set(_cudnn_hints "")
foreach(_v CUDNN_HOME CUDNN_ROOT)
  if(DEFINED ${_v})
    list(APPEND _cudnn_hints "${${_v}}")
  endif()
  if(DEFINED ENV{${_v}})
    list(APPEND _cudnn_hints "$ENV{${_v}}")
  endif()
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _cudnn_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
list(APPEND _cudnn_hints /usr/local/cuda)
# The wheel: <site-packages>/nvidia/cudnn/{include,lib}.
find_program(_cudnn_python NAMES python3 python)
if(_cudnn_python)
  execute_process(COMMAND "${_cudnn_python}" -c "import nvidia.cudnn as m; print(list(m.__path__)[0])"
                  OUTPUT_VARIABLE _cudnn_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(_rc EQUAL 0 AND IS_DIRECTORY "${_cudnn_wheel}")
    list(APPEND _cudnn_hints "${_cudnn_wheel}")
  endif()
endif()

find_path(CUDNN_INCLUDE_DIR cudnn_version.h HINTS ${_cudnn_hints} PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${_cudnn_hints} PATH_SUFFIXES lib64 lib lib/x64)

if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_defs REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
  foreach(_part MAJOR MINOR PATCHLEVEL)
    string(REGEX MATCH "CUDNN_${_part} ([0-9]+)" _m "${_cudnn_defs}")
    set(_cudnn_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(CUDNN_VERSION "${_cudnn_MAJOR}.${_cudnn_MINOR}.${_cudnn_PATCHLEVEL}")
endif()

find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_INCLUDE_DIR CUDNN_LIBRARY VERSION_VAR CUDNN_VERSION)
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)

if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED GLOBAL)
  set_target_properties(CUDNN::cudnn PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
                                                INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
