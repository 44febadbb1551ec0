# libFuzzer targets whose seed corpora also run as ordinary ctest tests.
#
#   cloister_fuzz_target(NAME fuzz_spdm SOURCES spdm_fuzz.cc LIBS cloister_attest
#                        CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/spdm_corpus)
#
# The source defines `extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t)`.
# Normal builds link tests/fuzz/replay_main.cc, which feeds every file of the corpus to that
# function, and register the ctest test NAME (label fuzz). With -DCLOISTER_FUZZ=ON and clang,
# the target links libFuzzer instead (-fsanitize=fuzzer,address,undefined) for real fuzzing:
#   CC=clang CXX=clang++ cmake -B build-fuzz -DCLOISTER_FUZZ=ON && ninja -C build-fuzz NAME
#   build-fuzz/.../NAME -max_total_time=600 CORPUS_DIR
option(CLOISTER_FUZZ "Build fuzz targets with libFuzzer (needs clang)" OFF)

function(cloister_fuzz_target)
  cmake_parse_arguments(F "" "NAME;CORPUS" "SOURCES;LIBS" ${ARGN})
  if(CLOISTER_FUZZ)
    add_executable(${F_NAME} ${F_SOURCES})
    target_compile_options(${F_NAME} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(${F_NAME} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(${F_NAME} PRIVATE ${F_LIBS})
  elseif(CLOISTER_BUILD_TESTS)
    add_executable(${F_NAME} ${F_SOURCES} ${PROJECT_SOURCE_DIR}/tests/fuzz/replay_main.cc)
    target_link_libraries(${F_NAME} PRIVATE ${F_LIBS})
    add_test(NAME ${F_NAME} COMMAND ${F_NAME} ${F_CORPUS})
    set_tests_properties(${F_NAME} PROPERTIES LABELS fuzz TIMEOUT 120)
  endif()
endfunction()
