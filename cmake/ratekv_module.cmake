# ratekv_module(NAME DEPS dep...) — a static library built from every
# src/NAME/*.cpp (globbed, so adding a file needs no CMake edit).
function(ratekv_module name)
  cmake_parse_arguments(M "" "" "DEPS" ${ARGN})
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${name}/*.cpp)
  if(NOT _srcs)
    add_library(ratekv_${name} INTERFACE)
    target_include_directories(ratekv_${name} INTERFACE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(ratekv_${name} INTERFACE ${M_DEPS})
    return()
  endif()
  add_library(ratekv_${name} STATIC ${_srcs})
  target_include_directories(ratekv_${name} PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(ratekv_${name} PUBLIC ${M_DEPS})
  set_target_properties(ratekv_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

# ratekv_test(MODULE DEPS dep...) — one GoogleTest executable test_MODULE from
# tests/MODULE/*.cpp, registered with CTest. Tests find assets through the
# RATEKV_ASSETS environment variable (see tools/fetch_assets.sh).
function(ratekv_test name)
  cmake_parse_arguments(T "" "" "DEPS" ${ARGN})
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${name}/*.cpp)
  if(NOT _srcs)
    return()
  endif()
  add_executable(test_${name} ${_srcs})
  target_link_libraries(test_${name} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(test_${name} PRIVATE RATEKV_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  gtest_discover_tests(test_${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS ${name})
endfunction()
