"""tpfs.1 (`man tpfs`, made by scripts/man.py at build time) against the program's help.

python3 test_man.py TPFS TPFS.1: renders the page with `man -l` (man-db; where man is absent, mandoc, else groff
-man: the test says which), with warnings on, and checks:
- the renderer warns about nothing and exits 0;
- every word of `tpfs --help` and of `tpfs help COMMAND` for every command the overview lists is in the page, in
  order (so no text of the help is missing or reordered: a help text edited without the page would fail here,
  were the page not made from it);
- every command has its section ("tpfs COMMAND"), and every option the help texts show (--long, -x) is in the
  rendered page, under that command's section.
A word check that could not fail would prove nothing: the same check is run on the help with one word added, and
must fail.
"""
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tpfs_test as tt  # noqa: E402


def render(page):
    """(renderer, plain text of PAGE, its warnings)."""
    env = dict(os.environ, MANWIDTH="100", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
    if shutil.which("man"):
        how, cmd = "man -l", ["man", "--warnings", "-l", page]
    elif shutil.which("mandoc"):
        how, cmd = "mandoc", ["mandoc", "-W", "warning", "-T", "utf8", page]
    else:
        how, cmd = "groff -man", ["groff", "-man", "-ww", "-T", "utf8", page]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    text = re.sub(r".\x08", "", p.stdout)  # overstrikes (bold, underline) where the renderer left them
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return how, p.returncode, text, p.stderr.strip()


def words(text):
    return text.split()


def in_order(want, have):
    """The first word of WANT not found in HAVE after the previous one (None: all found, in order)."""
    it = iter(have)
    for k, w in enumerate(want):
        if not any(w == h for h in it):
            return "word %d %r (after %r)" % (k, w, " ".join(want[max(0, k - 6):k]))
    return None


def options(text):
    return set(re.findall(r"(?<![\w.-])(--[a-z][a-z-]*|-[a-zA-Z])(?![\w])", text))


def main():
    tpfs, page = sys.argv[1], sys.argv[2]
    F = tt.Failures()
    help_ = lambda *a: subprocess.run([tpfs] + list(a), capture_output=True, text=True, check=True).stdout  # noqa: E731
    overview = help_("--help")
    commands = re.findall(r"^  ([a-z]+) ", overview.split("commands:\n")[1], re.M)
    F.check(set(commands) >= {"mount", "umount", "plan", "check", "stats"}, "commands of --help: %s" % commands)
    how, rc, text, warn = render(page)
    print("rendered with %s: %d lines" % (how, text.count("\n")))
    F.check(rc == 0 and text.strip(), "%s exited %d" % (how, rc))
    F.check(not warn, "%s warned: %s" % (how, warn[:1000]))
    have = words(text)
    texts = [("--help", overview)] + [("help " + c, help_("help", c)) for c in commands]
    for name, t in texts:
        miss = in_order(words(t), have)
        F.check(miss is None, "tpfs %s: the page lacks %s" % (name, miss))
    # the check can fail: one word added to the help is missed
    F.check(in_order(words(texts[1][1]) + ["--no-such-option"], have) is not None,
            "the word check missed a word absent from the page")
    heads = [m.start() for m in re.finditer(r"^   tpfs (%s)$" % "|".join(commands), text, re.M)]
    F.check(len(heads) == len(commands), "sections per command: %d of %d" % (len(heads), len(commands)))
    for k, (name, t) in enumerate(texts[1:]):
        sect = text[heads[k]:heads[k + 1] if k + 1 < len(heads) else len(text)] if k < len(heads) else ""
        lacking = sorted(o for o in options(t) if not re.search(r"(?<![\w-])%s(?![\w])" % re.escape(o), sect))
        F.check(not lacking, "tpfs %s: options missing from its section of the page: %s" % (name, lacking))
        print("tpfs %-12s %3d words, %2d options: in the page" % (name, len(words(t)), len(options(t))))
    F.done("man")


if __name__ == "__main__":
    main()
