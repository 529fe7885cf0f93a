# Common warnings for every GPUBox target.
add_library(gpubox_warnings INTERFACE)
target_compile_options(gpubox_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
# CI's builds (GPUBOX_WERROR=1 scripts/build.sh ...): a warning fails the build, so none lands.
option(GPUBOX_WERROR "Treat the project's own warnings as errors" OFF)
if(GPUBOX_WERROR)
  target_compile_options(gpubox_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror --Werror=all-warnings>)
endif()

# Test binaries run with GoogleTest's main, not gpubox_train's, so nothing calls
# device::use_passive_cpu_waits: libgomp would spin its idle threads (OMP_WAIT_POLICY active),
# and OpenMP-heavy tests run side by side by `ctest -j` on a 2-vCPU machine take each other's
# cores (pass_manager_test: 3.5 s alone, over 60 s beside two copies of itself). Passive, as
# the product binaries wait.
set(GPUBOX_TEST_ENV "OMP_WAIT_POLICY=passive")

# gpubox_add_test(<name> SOURCES <files> LIBS <targets> [LABELS <labels>] [TIMEOUT s])
# One GoogleTest binary; .cu sources are portable device sources.
function(gpubox_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  gpubox_device_sources(${T_SOURCES})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main gpubox_warnings)
  if(GPUBOX_BACKEND STREQUAL "cpu")
    # The cpu build runs every test; the cuda build only compiles and links them.
    add_test(NAME ${name} COMMAND ${name})
    if(NOT T_TIMEOUT)
      set(T_TIMEOUT 300)
    endif()
    # GPUBOX_DEVICE_CHECK: the device layer checks pointers handed to copies and collectives
    # and fails on an allocation while a collective is in flight (heterps/device/card.hpp).
    set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
                                            ENVIRONMENT "GPUBOX_DEVICE_CHECK=1;${GPUBOX_TEST_ENV}")
  endif()
endfunction()

# gpubox_add_order_check(<test> [FILTER <gtest filter>] [SEEDS <n>...] [TIMEOUT s])
# Runs the test binary <test> again with GPUBOX_DEVICE_CHECK=defer, and once per seed with
# defer:<seed> (heterps/device/deferred.hpp: streams run their work only when a wait demands it,
# so a missing or wrong stream/event wait gives wrong values on the cpu as on a GPU). Label
# device_order: `ctest -L device_order`.
function(gpubox_add_order_check name)
  cmake_parse_arguments(O "" "FILTER;TIMEOUT" "SEEDS" ${ARGN})
  if(NOT GPUBOX_BACKEND STREQUAL "cpu")
    return()
  endif()
  set(args)
  if(O_FILTER)
    list(APPEND args "--gtest_filter=${O_FILTER}")
  endif()
  if(NOT O_TIMEOUT)
    set(O_TIMEOUT 300)
  endif()
  set(modes defer)
  foreach(seed ${O_SEEDS})
    list(APPEND modes "defer:${seed}")
  endforeach()
  foreach(mode ${modes})
    string(REPLACE ":" "_" suffix "${mode}")
    add_test(NAME ${name}_${suffix} COMMAND ${name} ${args})
    set_tests_properties(${name}_${suffix} PROPERTIES TIMEOUT ${O_TIMEOUT} LABELS device_order
                                                      ENVIRONMENT "GPUBOX_DEVICE_CHECK=${mode};${GPUBOX_TEST_ENV}")
  endforeach()
endfunction()
