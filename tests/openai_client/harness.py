"""The test runner the client scripts share (no pytest): `@test` registers a test in order,
`main()` runs them all, prints one line each and a closing `N passed, M failed`, and exits
non-zero if any failed."""

import sys
import traceback

TESTS = []


def test(f):
    TESTS.append(f)
    return f


def main():
    passed = failed = 0
    for t in TESTS:
        try:
            t()
            passed += 1
            print(f"PASS {t.__name__}", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__}\n{traceback.format_exc()}", flush=True)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
