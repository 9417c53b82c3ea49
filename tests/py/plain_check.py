"""What the unit-suite Python tests that need only python3 (no venv: test_view_clash, test_view_copies,
test_view_migrate) share: the repository's paths, the built-in view files, and a failure counter.

    import plain_check as P
    P.check(ok, "what was checked")
    P.done("test_name")   # prints the count, exits 1 if any check failed
"""
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
EMBED = os.path.join(ROOT, "plans", "embed.py")
VIEWS = sorted(glob.glob(os.path.join(ROOT, "views", "*", "*.json")) +
               glob.glob(os.path.join(ROOT, "views", "*", "fragments", "*.json")))
_count = [0, 0]  # checks, failed


def check(ok, what):
    """Counts a check; prints FAIL: WHAT when ok is false."""
    _count[0] += 1
    if not ok:
        _count[1] += 1
        print("FAIL: " + what)


def done(name):
    """Prints NAME: N checks, M failed, and exits 1 if any failed, else 0."""
    print("%s: %d checks, %d failed" % (name, _count[0], _count[1]))
    sys.exit(1 if _count[1] else 0)
