# Small helpers so that each folder's CMakeLists.txt stays a few lines long.
#
# paraplan_library(NAME [DEPS ...])
#   A static library from every *.cpp in the current folder except *_test.cpp, with the
#   repository root on the include path (headers are included as "compiler/base/checked.h").
# paraplan_unit_tests(NAME [DEPS ...])
#   A doctest executable from every *_test.cpp in the current folder, registered with CTest.

set(PARAPLAN_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)

function(paraplan_library name)
  cmake_parse_arguments(ARG "" "" "DEPS;EXTRA_SOURCES" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  list(FILTER srcs EXCLUDE REGEX "_test\\.cpp$")
  list(FILTER srcs EXCLUDE REGEX "_main\\.cpp$")
  list(FILTER srcs EXCLUDE REGEX "_fuzz\\.cpp$")
  if(srcs OR ARG_EXTRA_SOURCES)
    add_library(${name} STATIC ${srcs} ${ARG_EXTRA_SOURCES})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${PARAPLAN_WARNINGS}>)
    target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${name} INTERFACE ${ARG_DEPS})
  endif()
endfunction()

function(paraplan_unit_tests name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_test.cpp)
  if(NOT srcs)
    return()
  endif()
  add_executable(${name} ${srcs})
  target_compile_options(${name} PRIVATE ${PARAPLAN_WARNINGS})
  target_link_libraries(${name} PRIVATE paraplan_doctest_main ${ARG_DEPS})
  add_test(NAME ${name} COMMAND ${name} --no-version=true)
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "PARAPLAN_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()
