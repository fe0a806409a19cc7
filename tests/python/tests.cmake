# Python tests (label "python"): the hook package and the example jobs' loop on Debian's CPU torch.
# Each test_*.py file is one CTest test run with unittest; they need no build output, except the
# real-library checks of test_sitecustomize.py (skipped until libactpage.so exports the C API).
set(ACTPAGE_TEST_PYTHON "/usr/bin/python3" CACHE FILEPATH
  "Python interpreter with torch (Debian's python3-torch) for the python tests")

foreach(test_name hooks sitecustomize examples compare_runs bench plan_compare micro_batches distributed)
  add_test(NAME python.${test_name}
    COMMAND "${ACTPAGE_TEST_PYTHON}" -m unittest -v test_${test_name}
    WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}")
  set_tests_properties(python.${test_name} PROPERTIES
    LABELS python
    TIMEOUT 300
    ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1;ACTPAGE_SOURCE_DIR=${PROJECT_SOURCE_DIR};ACTPAGE_TEST_PYTHON=${ACTPAGE_TEST_PYTHON};ACTPAGE_TEST_LIBRARY=${PROJECT_BINARY_DIR}/lib/libactpage.so")
endforeach()
