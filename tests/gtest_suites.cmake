# Writes the ctest entries of one GoogleTest program: one entry per test
# suite (one process runs all its cases), so the suite does not pay a
# process start — LibTorch's loading among it — for every case. A suite
# whose cases are partly in the NUMERICS filter gets two entries, so the
# `numerics` label stays exact: "<Suite>" and "<Suite>[numerics]". Cases in
# the CUDA filter (those that need a GPU and skip without one) get their own
# entry "<Suite>[cuda]" with the label `cuda`.
#
# Run after every build of the program (see loraplex_test in
# CMakeLists.txt):
#   cmake -D TEST_EXECUTABLE=... -D CTEST_FILE=... -D NUMERICS=<gtest filter>
#         -D CUDA=<gtest filter> -D TIMEOUT=<seconds> -D WORKING_DIR=...
#         -P gtest_suites.cmake
# One case of a suite runs on its own with the program's --gtest_filter.

execute_process(
  COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
  OUTPUT_VARIABLE listing
  ERROR_VARIABLE listing_error
  RESULT_VARIABLE listed
  TIMEOUT 120)
if(NOT listed EQUAL 0)
  message(FATAL_ERROR
    "${TEST_EXECUTABLE} --gtest_list_tests failed (${listed}):\n"
    "${listing}${listing_error}")
endif()

# A gtest filter ("A.*:B.c?") as one anchored regular expression.
function(filter_to_regex filter out)
  if(filter STREQUAL "")
    set(${out} "" PARENT_SCOPE)
    return()
  endif()
  string(REPLACE ":" ";" patterns "${filter}")
  set(alternatives)
  foreach(pattern IN LISTS patterns)
    string(REGEX REPLACE "([][.+^$(){}|\\\\])" "\\\\\\1" escaped "${pattern}")
    string(REPLACE "*" ".*" escaped "${escaped}")
    string(REPLACE "?" "." escaped "${escaped}")
    list(APPEND alternatives "${escaped}")
  endforeach()
  list(JOIN alternatives "|" joined)
  set(${out} "^(${joined})$" PARENT_SCOPE)
endfunction()

filter_to_regex("${NUMERICS}" numerics_regex)
filter_to_regex("${CUDA}" cuda_regex)

# Lines: "Suite." (maybe "  # TypeParam = ..."), then "  Case" (maybe
# "  # GetParam() = ...") for each of its cases.
string(REPLACE "\n" ";" lines "${listing}")
set(suites)
set(suite "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE "  #.*$" "" line "${line}")
  if(line MATCHES "^([^ ].*)\\.$")
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    set(plain_${suite})
    set(numeric_${suite})
    set(cuda_${suite})
  elseif(line MATCHES "^  ([^ ]+)$" AND NOT suite STREQUAL "")
    set(name "${suite}.${CMAKE_MATCH_1}")
    if(NOT cuda_regex STREQUAL "" AND name MATCHES "${cuda_regex}")
      list(APPEND cuda_${suite} "${name}")
    elseif(NOT numerics_regex STREQUAL "" AND name MATCHES "${numerics_regex}")
      list(APPEND numeric_${suite} "${name}")
    else()
      list(APPEND plain_${suite} "${name}")
    endif()
  endif()
endforeach()

set(script "")
# Adds one entry running `cases` (all of the suite's when `whole`).
function(add_entry entry cases whole labels)
  if(whole)
    set(filter "${suite}.*")
  else()
    list(JOIN cases ":" filter)
  endif()
  string(APPEND script
    "add_test([==[${entry}]==] [==[${TEST_EXECUTABLE}]==] "
    "[==[--gtest_filter=${filter}]==])\n"
    "set_tests_properties([==[${entry}]==] PROPERTIES TIMEOUT ${TIMEOUT} "
    "WORKING_DIRECTORY [==[${WORKING_DIR}]==]")
  if(NOT labels STREQUAL "")
    string(APPEND script " LABELS ${labels}")
  endif()
  string(APPEND script ")\n")
  set(script "${script}" PARENT_SCOPE)
endfunction()

foreach(suite IN LISTS suites)
  set(groups)
  foreach(group IN ITEMS plain numeric cuda)
    if(${group}_${suite})
      list(APPEND groups ${group})
    endif()
  endforeach()
  set(label_plain "")
  set(label_numeric numerics)
  set(label_cuda cuda)
  list(LENGTH groups count)
  if(count EQUAL 1)
    add_entry("${suite}" "" TRUE "${label_${groups}}")
  else()
    # By name: "Suite.*" would run the other groups' cases too.
    foreach(group IN LISTS groups)
      set(entry "${suite}")
      if(NOT group STREQUAL "plain")
        set(entry "${suite}[${label_${group}}]")
      endif()
      add_entry("${entry}" "${${group}_${suite}}" FALSE "${label_${group}}")
    endforeach()
  endif()
endforeach()

file(WRITE "${CTEST_FILE}" "${script}")
