# Runs `MPIEXEC NP_FLAG NP FLAGS PROGRAM SCENARIO` and fails unless the job ends by itself
# within FAILURE_SECONDS of the failure the program announces ("fails at unix time T"): the time
# bound is measured from the failure, so the speed of the machine does not matter (MAX_SECONDS,
# from the start, is only a hang guard for a job that never reaches its failure), with exit code EXPECT_CODE and EXPECT_TEXT in its output: a
# rank that fails after start-up must end the whole job, never leave it hanging.
#   cmake -DMPIEXEC=... -DNP_FLAG=-n -DNP=2 -DFLAGS=--oversubscribe -DPROGRAM=... -DSCENARIO=recv
#         -DEXPECT_CODE=3 "-DEXPECT_TEXT=..." -DMAX_SECONDS=600 -DFAILURE_SECONDS=60 -P expect_abort.cmake

foreach(v MPIEXEC NP_FLAG NP PROGRAM SCENARIO EXPECT_CODE EXPECT_TEXT MAX_SECONDS FAILURE_SECONDS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "expect_abort.cmake: -D${v}=... is required")
  endif()
endforeach()

string(TIMESTAMP start "%s" UTC)
execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} ${NP} ${FLAGS} ${PROGRAM} ${SCENARIO}
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP end "%s" UTC)
math(EXPR elapsed "${end} - ${start}")
set(all "${out}${err}")

if(NOT code MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself within ${MAX_SECONDS} s (${code}); output:\n${all}")
endif()
if(code EQUAL 0)
  message(FATAL_ERROR "the job exited with 0 although rank ${NP} - 1 failed; output:\n${all}")
endif()
if(NOT code EQUAL EXPECT_CODE)
  message(FATAL_ERROR "the job exited with ${code}, expected the failing rank's code ${EXPECT_CODE}; output:\n${all}")
endif()
string(REGEX MATCH "fails at unix time ([0-9]+)" failed_at "${all}")
if(NOT failed_at)
  message(FATAL_ERROR "the failing rank never reached its failure (no 'fails at unix time'); output:\n${all}")
endif()
math(EXPR after_failure "${end} - ${CMAKE_MATCH_1}")
if(after_failure GREATER FAILURE_SECONDS)
  message(FATAL_ERROR "the job ended ${after_failure} s after the failure (limit ${FAILURE_SECONDS} s); output:\n${all}")
endif()
string(FIND "${all}" "${EXPECT_TEXT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the output lacks the failing rank's report '${EXPECT_TEXT}'; output:\n${all}")
endif()
message(STATUS "scenario ${SCENARIO} on ${NP} ranks: exit code ${code}, ${after_failure} s after the failure, "
               "${elapsed} s in all")
