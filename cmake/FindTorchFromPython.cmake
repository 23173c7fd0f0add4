# Lets find_package(Torch) work without arguments when a Python with torch is
# on the PATH (the usual case): asks that torch where its CMake config lives.
if(NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR})
  find_program(TORCH_MONITOR_PYTHON NAMES python3 python)
  if(TORCH_MONITOR_PYTHON)
    execute_process(
      COMMAND "${TORCH_MONITOR_PYTHON}" -c
              "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _torch_prefix
      OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _torch_result
      ERROR_QUIET)
    if(_torch_result EQUAL 0)
      list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
    endif()
  endif()
endif()
