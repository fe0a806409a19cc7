#!/usr/bin/env python3
"""Fails when CTest reported a test skipped that may not skip on this machine.

Some tests skip themselves where the machine lacks what they need (no /usr/bin/python3, no CUDA
toolkit stub, a GPU present...); tests/may_skip.txt lists them. Any other skip is a test that did not
run without anyone deciding so: a fatal failure in a GoogleTest suite's set-up skips its tests, and
CTest counts them skipped, not failed (19 FakeDriver tests went unrun that way from session 19 to 21).
GPU tests are left out by label (scripts/test.sh), so they never show here as skipped.

Usage: check_skips.py CTEST_OUTPUT [--allowed FILE]   (scripts/test.sh runs it after CTest)
Exit status 1 when a test skipped that the list does not allow, 0 otherwise.
Standard library only.
"""

import argparse
import os
import re
import sys

# "432/661 Test #432: FakeDriver.MissingFunctionsAreNamed ......***Skipped   0.00 sec"
_SKIPPED = re.compile(r"Test +#\d+: (\S+) \.+\*\*\*Skipped")


def skipped_tests(ctest_output):
    """The names of the tests CTest reported skipped, in the order it printed them."""
    return [match.group(1) for match in _SKIPPED.finditer(ctest_output)]


def allowed_patterns(text):
    """One regular expression a line, matched against the whole test name; '#' starts a comment."""
    patterns = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            patterns.append(re.compile(line))
        except re.error as error:
            raise ValueError("line %d: %r is not a regular expression: %s" % (number, line, error))
    return patterns


def unexpected_skips(skipped, patterns):
    return [name for name in skipped if not any(pattern.fullmatch(name) for pattern in patterns)]


def main(argv=None):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ctest_output", help="what CTest printed")
    parser.add_argument("--allowed", default=os.path.join(root, "tests", "may_skip.txt"),
                        help="the tests that may skip (default tests/may_skip.txt)")
    args = parser.parse_args(argv)
    with open(args.ctest_output, encoding="utf-8", errors="replace") as stream:
        skipped = skipped_tests(stream.read())
    try:
        with open(args.allowed, encoding="utf-8") as stream:
            patterns = allowed_patterns(stream.read())
    except ValueError as error:
        print("check_skips: %s: %s" % (args.allowed, error), file=sys.stderr)
        return 2
    unexpected = unexpected_skips(skipped, patterns)
    if unexpected:
        print("check_skips: %d test(s) skipped that may not skip (%s lists those that may):" %
              (len(unexpected), args.allowed), file=sys.stderr)
        for name in unexpected:
            print("  " + name, file=sys.stderr)
        return 1
    if skipped:
        print("check_skips: %d test(s) skipped, each allowed by %s" % (len(skipped), args.allowed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
