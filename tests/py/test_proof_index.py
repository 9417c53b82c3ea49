"""docs/PROOF.md's test index names only tests, files, functions and texts that exist, and every meson test.

python3 test_proof_index.py BUILD_DIR: reads the table under "## Test index" (guarantee | test | file | where)
and, for each row, checks that
- the meson test exists: in BUILD_DIR's meson-info/intro-tests.json (the tests this build runs), or, for one
  this build leaves out by an option (the sanitized build has no valgrind or plugin tests, a build without
  cmocka no unit tests in C), in tests/meson.build (a test('NAME', ...) or a name of its foreach lists);
- the file exists, and a tests/py/test_*.py or tests/unit/test_*.c file is the one that meson test runs (a
  helper such as vllm_probe.py may be named for any test);
- `where` is there: `NAME` a function the file defines (def NAME( or a C function NAME(), "TEXT" a text the file
  contains;
and that every test of the build appears in the table, so that a new test is indexed by what it proves.
Run from the unit suite (plain python3, no venv).
"""
import json
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
fails = []


def check(ok, msg):
    if not ok:
        fails.append(msg)
        print("FAIL:", msg, flush=True)


def index_rows(text):
    """The rows of the table under '## Test index': [(line number, guarantee, test, file, where)]."""
    rows, inside = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            inside = line.strip() == "## Test index"
            continue
        if not inside or not line.startswith("|") or line.startswith("| ---") or line.startswith("| guarantee |"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 4:
            check(False, "docs/PROOF.md:%d: a row of 4 cells (guarantee | test | file | where), got %d" % (n, len(cells)))
            continue
        rows.append((n, *cells))
    return rows


def defines(text, name, path):
    if path.endswith(".py"):
        return re.search(r"^\s*def %s\(" % re.escape(name), text, re.M) is not None
    return re.search(r"^(static )?[a-z_ ]+[ *]%s\(" % re.escape(name), text, re.M) is not None


def runs_file(test, path):
    """Whether meson test `test` (its intro-tests.json entries) runs `path`: a Python test whose command names the
    file, or a C test whose executable is the file's stem."""
    for t in test:
        cmd = t["cmd"]
        if any(c.endswith("/" + path) or c == os.path.join(ROOT, path) for c in cmd):
            return True
        if path.endswith(".c") and os.path.basename(cmd[0]) == os.path.splitext(os.path.basename(path))[0]:
            return True
    return False


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: test_proof_index.py BUILD_DIR")
    with open(os.path.join(sys.argv[1], "meson-info", "intro-tests.json")) as f:
        built = {}
        for t in json.load(f):
            built.setdefault(t["name"], []).append(t)
    with open(os.path.join(ROOT, "tests", "meson.build")) as f:
        build_text = f.read()
    # the tests tests/meson.build declares, those an option leaves out of this build included: test('NAME', ...)
    # and the names of its foreach lists (the unit tests without cmocka, the mount tests with -Dtests=disabled)
    declared = set(re.findall(r"\btest\('(\w+)'", build_text))
    for names in re.findall(r"foreach t : \[(.*?)\]", build_text, re.S):
        declared |= set(re.findall(r"'(\w+)'", names))
    with open(os.path.join(ROOT, "docs", "PROOF.md")) as f:
        rows = index_rows(f.read())
    check(len(rows) > 50, "docs/PROOF.md's test index has %d rows" % len(rows))
    named = set()
    for n, guarantee, test, path, where in rows:
        what = "docs/PROOF.md:%d (%s)" % (n, guarantee[:60])
        named.add(test)
        check(test in built or test in declared, "%s: no meson test named %r" % (what, test))
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            check(False, "%s: no file %s" % (what, path))
            continue
        base = os.path.basename(path)
        if test in built and re.match(r"test_\w+\.(py|c)$", base):
            check(runs_file(built[test], path), "%s: meson test %r does not run %s" % (what, test, path))
        with open(full, errors="replace") as f:
            text = f.read()
        if where.startswith("`") and where.endswith("`") and len(where) > 2:
            check(defines(text, where[1:-1], path), "%s: %s defines no %s" % (what, path, where))
        elif where.startswith('"') and where.endswith('"') and len(where) > 2:
            check(where[1:-1] in text, "%s: %s does not contain %s" % (what, path, where))
        else:
            check(False, "%s: 'where' is `a function` or \"a text\", not %r" % (what, where))
    for test in sorted(set(built) - named):
        check(False, "meson test %r is missing from docs/PROOF.md's test index" % test)
    if fails:
        sys.exit("%d problems in docs/PROOF.md's test index" % len(fails))
    print("docs/PROOF.md: %d rows, %d meson tests, every one found" % (len(rows), len(named)))


main()
