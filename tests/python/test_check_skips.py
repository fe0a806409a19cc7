"""scripts/check_skips.py: a test CTest reports skipped fails the run unless tests/may_skip.txt allows it."""

import os
import subprocess
import sys
import tempfile
import unittest

import helpers

sys.path.insert(0, os.path.join(helpers.SOURCE_DIR, "scripts"))
import check_skips  # noqa: E402

SCRIPT = os.path.join(helpers.SOURCE_DIR, "scripts", "check_skips.py")

# As CTest prints it (-j 2: starts and ends interleave), with its summary list at the end.
CTEST_OUTPUT = """\
        Start 432: FakeDriver.MissingFunctionsAreNamed
        Start 433: DriverApi.TheToolkitStubDriverIsRejected
432/661 Test #432: FakeDriver.MissingFunctionsAreNamed ...........................***Skipped   0.00 sec
433/661 Test #433: DriverApi.TheToolkitStubDriverIsRejected ......................***Skipped   0.00 sec
434/661 Test #434: HostPool.BlocksAreRoundedAndAligned ...........................   Passed    0.01 sec
435/661 Test #435: TorchrunJob.AJobWithoutRankLogsWithoutOne .....................***Skipped   0.00 sec

The following tests did not run:
\t432 - FakeDriver.MissingFunctionsAreNamed (Skipped)
"""


class CheckSkipsTest(unittest.TestCase):
    def run_script(self, output, allowed):
        with tempfile.TemporaryDirectory() as folder:
            log = os.path.join(folder, "ctest.log")
            with open(log, "w") as stream:
                stream.write(output)
            listed = os.path.join(folder, "may_skip.txt")
            with open(listed, "w") as stream:
                stream.write(allowed)
            return subprocess.run([sys.executable, SCRIPT, log, "--allowed", listed], capture_output=True, text=True)

    def test_reads_the_skipped_tests_from_ctest_output_once_each(self):
        self.assertEqual(check_skips.skipped_tests(CTEST_OUTPUT),
                         ["FakeDriver.MissingFunctionsAreNamed", "DriverApi.TheToolkitStubDriverIsRejected",
                          "TorchrunJob.AJobWithoutRankLogsWithoutOne"])

    def test_a_skip_the_list_does_not_allow_fails_and_is_named(self):
        result = self.run_script(CTEST_OUTPUT, "DriverApi\\.TheToolkitStubDriverIsRejected  # no stub\nTorchrunJob\\..*\n")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("1 test(s) skipped that may not skip", result.stderr)
        self.assertIn("FakeDriver.MissingFunctionsAreNamed", result.stderr)
        self.assertNotIn("TorchrunJob", result.stderr)

    def test_allowed_skips_pass_and_are_counted(self):
        result = self.run_script(CTEST_OUTPUT, "# comment line\n\nFakeDriver\\..*\nDriverApi\\..*\nTorchrunJob\\..*\n")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("3 test(s) skipped, each allowed", result.stdout)

    def test_a_pattern_matches_the_whole_name_only(self):
        patterns = check_skips.allowed_patterns("FakeDriver\n")
        self.assertEqual(check_skips.unexpected_skips(["FakeDriver.X", "FakeDriver"], patterns), ["FakeDriver.X"])

    def test_a_bad_pattern_names_its_line(self):
        result = self.run_script(CTEST_OUTPUT, "ok\n[unclosed\n")
        self.assertEqual(result.returncode, 2)
        self.assertIn("line 2", result.stderr)

    def test_the_shipped_list_allows_none_of_the_fake_driver_tests(self):
        with open(os.path.join(helpers.SOURCE_DIR, "tests", "may_skip.txt")) as stream:
            patterns = check_skips.allowed_patterns(stream.read())
        self.assertTrue(patterns)
        self.assertEqual(check_skips.unexpected_skips(["FakeDriver.MissingFunctionsAreNamed"], patterns),
                         ["FakeDriver.MissingFunctionsAreNamed"])
        self.assertEqual(check_skips.unexpected_skips(["DriverApi.TheToolkitStubDriverIsRejected"], patterns), [])


if __name__ == "__main__":
    unittest.main()
