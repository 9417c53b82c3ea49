"""Byte identity across a change of the read path (issue 31): the SHA-256 of every file a mount
serves, for every fixture family of tests/py/fixtures.py (plain and quantized) at T = 2, 3, 4 and 8,
as rank folders and, where the family's plan has one, under --view vllm. A (family, T, form) that
tpfs refuses is listed with the first line of its message, so a change that turns a refusal into
bytes (or back) shows too.

    python bench/digests.py OUT [--tpfs PATH] [--work DIR]

Run it with the binary before a change and after, then `diff` the two lists: empty means every
served byte, header, config and index is unchanged.
"""
import argparse
import hashlib
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def tree(root):
    """(relative path, digest) of every regular file under root, sorted; the stats file left out."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)
            if rel == ".tpfs-stats":
                continue
            out.append((rel, sha(p)))
    return out


def mount_lines(tt, src, T, extra, tag, err_line=0):
    """Mounts SRC at T with EXTRA options (tt: tests/py/tpfs_test), and returns "TAG PATH DIGEST" for every
    file it serves, or ["TAG refused: LINE"] with line ERR_LINE of its stderr when it refuses."""
    mnt = tempfile.mkdtemp(prefix="tpfs-dg-")
    p = subprocess.Popen([tt.TPFS, "mount", src, mnt, "--tp", str(T), "-f"] + extra,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        tt.wait_for(lambda: tt.is_mounted(mnt) or p.poll() is not None, what="the mount")
        if p.poll() is not None:
            err = p.stderr.read().strip().splitlines()
            return ["%s refused: %s" % (tag, err[err_line] if err else "exit %d" % p.returncode)]
        return ["%s %s %s" % (tag, rel, d) for rel, d in tree(mnt)]
    finally:
        if tt.is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
        if p.poll() is None:
            p.wait(timeout=30)
        os.rmdir(mnt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tpfs", default=os.path.join(HERE, "..", "build", "src", "tpfs"))
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    os.environ["TPFS_BIN"] = os.path.abspath(a.tpfs)
    import fixtures
    import tpfs_test as tt
    work = a.work or tempfile.mkdtemp(prefix="tpfs-digests-")
    fams = {}
    for name in fixtures.FAMILIES:
        src = os.path.join(work, name)
        if not os.path.exists(os.path.join(src, "config.json")):
            fixtures.make(name, src)
        fams[name] = src
    for name, fn in fixtures.QUANTIZED.items():
        src = os.path.join(work, name)
        if not os.path.exists(os.path.join(src, "config.json")):
            c, t = fn()
            fixtures.save_raw(src, c, t)
        fams[name] = src
    lines = []
    for name, src in sorted(fams.items()):
        for T in (2, 3, 4, 8):
            for form in ("hf", "vllm"):
                extra = ["--view", "vllm"] if form == "vllm" else []
                lines += mount_lines(tt, src, T, extra, "%s T=%d %s" % (name, T, form))
        print("%s: done" % name, flush=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("%d lines to %s" % (len(lines), a.out))


if __name__ == "__main__":
    main()
