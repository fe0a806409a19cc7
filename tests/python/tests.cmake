# Python tests (label "python"): the hook package and the example jobs' loop on Debian's CPU torch.
# Each test_*.py file is one CTest test run with unittest; they need no build output, except the
# real-library checks of test_sitecustomize.py (skipped until libactpage.so exports the C API).
set(ACTPAGE_TEST_PYTHON "/usr/bin/python3" CACHE FILEPATH
  "Python interpreter with torch (Debian's python3-torch) for the python tests")

# The tests import the package from the build tree (<build>/python: the copied sources and the C
# forward and saved-tensor hooks, actpage_hooks._fastrange and ._fastsaved, where they were built).
# test_fastrange's end-to-end check also runs a job under libactpage.so with the fake CUDA libraries
# of tests/integration/preload.
set(ACTPAGE_TEST_FAKE_CUDA_PATH "")
if(TARGET actpage_fake_cuda AND TARGET actpage_fake_cudart)
  set(ACTPAGE_TEST_FAKE_CUDA_PATH "$<TARGET_FILE_DIR:actpage_fake_cuda>:$<TARGET_FILE_DIR:actpage_fake_cudart>")
endif()
set(actpage_python_test_env
  "PYTHONDONTWRITEBYTECODE=1"
  "ACTPAGE_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
  "ACTPAGE_TEST_PYTHON=${ACTPAGE_TEST_PYTHON}"
  "ACTPAGE_TEST_PYTHON_DIR=${PROJECT_BINARY_DIR}/python"
  "ACTPAGE_TEST_LIBRARY=${PROJECT_BINARY_DIR}/lib/libactpage.so"
  "ACTPAGE_TEST_CLI=$<TARGET_FILE:actpage>"
  "ACTPAGE_TEST_FAKE_CUDA_PATH=${ACTPAGE_TEST_FAKE_CUDA_PATH}")

foreach(test_name hooks saved saved_scope saved_watch sitecustomize fingerprint examples compare_runs thread_stats bench plan_compare micro_batches distributed fastrange
    copy_timeline peak_holders check_skips zoo zoo_models zoo_loops)
  add_test(NAME python.${test_name}
    COMMAND "${ACTPAGE_TEST_PYTHON}" -m unittest -v test_${test_name}
    WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}")
  set_tests_properties(python.${test_name} PROPERTIES
    LABELS python
    TIMEOUT 300
    ENVIRONMENT "${actpage_python_test_env}")
endforeach()

# The zoo's Trainer run needs transformers, which the CPU machine lacks: run as a script, the file
# exits 77 without it, which CTest reports as Skipped (tests/may_skip.txt allows it), so the skip is
# seen rather than passed silently as a unittest skip would be.
add_test(NAME python.zoo_trainer_run
  COMMAND "${ACTPAGE_TEST_PYTHON}" test_zoo_trainer_run.py
  WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}")
set_tests_properties(python.zoo_trainer_run PROPERTIES
  LABELS python
  TIMEOUT 300
  SKIP_RETURN_CODE 77
  ENVIRONMENT "${actpage_python_test_env}")
