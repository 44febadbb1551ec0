# cloister_discover_tests(TARGET [gtest_discover_tests arguments...]): gtest_discover_tests with
# a listing timeout of 60 s unless the call names one. CMake's default of 5 s is too short for
# test binaries that load the CUDA libraries on start when the page cache is cold (a fresh CI
# machine): the listing runs as a post-build step, so a timeout there fails the build.
function(cloister_discover_tests target)
  if("DISCOVERY_TIMEOUT" IN_LIST ARGN)
    gtest_discover_tests(${target} ${ARGN})
  else()
    gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60 ${ARGN})
  endif()
endfunction()
