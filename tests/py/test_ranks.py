"""Multi-node serving: --ranks, and source reads no larger than the served ranks need.

- `--ranks LIST` serves exactly the named rank folders of a --tp N split (the others are absent
  from the listing and from lookups), and every file they hold has the bytes of a full mount;
- a malformed or out-of-range list is refused before anything is mounted (exit 2, the list and
  the rule in the message, no mount left); a split that cannot be served is refused with the
  same message with or without --ranks;
- `tpfs plan --io` prints page-touch minima equal to an independent computation: the reference
  slicing (reference.py) applied to arrays of element indices gives each rank's source bytes,
  hence the 4 KiB source pages they touch;
- storage bytes: with the page cache dropped, reading every file of rank 0 at T = 8 (a generated
  Llama-like checkpoint whose down_proj slices are 4 KiB per rank and row) makes the daemon read
  at most 1.15x rank 0's page-touch minimum from storage (read_bytes of /proc/PID/io). Skips
  (77) only where the page cache cannot be dropped.
"""
import hashlib
import os
import subprocess
import sys
import tempfile

import numpy as np

import reference as R
import tpfs_test as tt

tt.Mount.pin = ("--push", "off")  # this test counts the storage bytes a rank's reads fetch: no push-ahead

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import llama_gen  # noqa: E402

tt.require_fuse()
F = tt.Failures()
PAGE = 4096


def storage_dir():
    """A folder on a block device (reads show in read_bytes): the temp folder, else the build."""
    for d in (tempfile.gettempdir(), os.path.dirname(os.path.abspath(tt.TPFS))):
        out = subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip()
        if out not in ("tmpfs", "ramfs", "overlayfs", "fuseblk", "fuse"):
            return d
    return tempfile.gettempdir()


work = tempfile.mkdtemp(prefix="tpfs-ranks-", dir=storage_dir())
src = os.path.join(work, "llama")
cfg = llama_gen.config(layers=2, hidden=512, heads=8, head_dim=64, kv_heads=2, inter=16384, vocab=8192)
llama_gen.write(src, cfg, nfiles=2)
files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))


class Mount(tt.Mount):
    """tt.Mount for a --ranks mount: waits for the first served rank instead of rank0."""

    def __init__(self, src, tp, *extra, first=0):
        super().__init__(src, tp, *extra)
        self.first = first

    def __enter__(self):
        self.errfile = tempfile.TemporaryFile(mode="w+")
        cmd = [tt.TPFS, "mount", self.src, self.path, "--tp", str(self.tp), "-f"] + self.extra
        self.proc = subprocess.Popen(cmd, stderr=self.errfile, stdout=subprocess.DEVNULL)
        try:
            tt.wait_for(lambda: tt.is_mounted(self.path) or self.proc.poll() is not None, what="the mount")
            if self.proc.poll() is not None:
                raise AssertionError("tpfs exited (%d) before mounting: %s" % (self.proc.returncode, self.stderr()))
            os.stat(self.rank(self.first))
        except BaseException:
            self.cleanup()
            raise
        return self


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tree(root):
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = digest(p)
    return out


# ---- --ranks serves exactly the named folders, with a full mount's bytes ----
with tt.Mount(src, 8) as full:
    want = {r: tree(full.rank(r)) for r in range(8)}
with tt.Mount(src, 2) as full:
    want2 = {r: tree(full.rank(r)) for r in range(2)}
for T, lst, ranks in ((8, "4-7", [4, 5, 6, 7]), (8, "0,3", [0, 3]), (8, "5", [5]), (8, "6,0-1", [0, 1, 6]),
                      (2, "1", [1])):
    with Mount(src, T, "--ranks", lst, first=ranks[0]) as m:
        names = sorted(os.listdir(m.path))
        F.check(names == sorted([".tpfs-stats", "config.json"] + ["rank%d" % r for r in ranks]),
                "--tp %d --ranks %s lists %s" % (T, lst, names))
        for r in range(T + 2):
            F.check(os.path.exists(m.rank(r)) == (r in ranks), "--tp %d --ranks %s: rank%d %s" % (
                T, lst, r, "missing" if r in ranks else "present"))
        for r in ranks:
            got = tree(m.rank(r))
            F.check(got == (want if T == 8 else want2)[r],
                    "--tp %d --ranks %s: rank%d's files and bytes equal a full mount's" % (T, lst, r))
        st = os.stat(m.path)
        F.check(st.st_nlink == 2 + len(ranks), "root link count %d for %d ranks" % (st.st_nlink, len(ranks)))
        with open(os.path.join(m.path, ".tpfs-stats")) as f:
            rows = [l.split()[0] for l in f.read().splitlines() if l[:1].isdigit()]
        F.check(rows == [str(r) for r in ranks], "stats list the served ranks: %s" % rows)
    if lst == "6,0-1":  # the log names the served set
        F.check("as ranks 0-1,6 of 8 ranks" in m.stderr(), "--ranks 6,0-1 logged: %r" % m.stderr()[-300:])

# ---- bad lists are refused before mounting ----
mnt = tempfile.mkdtemp(prefix="tpfs-ranks-mnt-")
for lst in ("", "8", "0-8", "3-1", "1,,2", "a", "1-", "-1", "1,1", "0-3,2", " 1", "1.5", "99999999999"):
    p = tt.tpfs("mount", src, mnt, "--tp", "8", "--ranks", lst)
    F.check(p.returncode == 2 and "--ranks" in p.stderr, "--ranks '%s' refused with usage (%d: %s)" % (
        lst, p.returncode, p.stderr.splitlines()[:1]))
    F.check(not tt.is_mounted(mnt), "--ranks '%s': nothing mounted" % lst)
# a repeated --ranks is refused (it used to serve the last list only), by mount and plan --io
for cmd in (["mount", src, mnt], ["plan", src, "--io"]):
    p = tt.tpfs(*cmd, "--tp", "8", "--ranks", "0", "--ranks", "1")
    F.check(p.returncode == 2 and "--ranks given twice" in p.stderr, "%s --ranks 0 --ranks 1 refused (%d: %s)" % (
        cmd[0], p.returncode, p.stderr.splitlines()[:1]))
    F.check(not tt.is_mounted(mnt), "--ranks twice: nothing mounted")
    if tt.is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", mnt])
p = tt.tpfs("mount", src, mnt, "--tp", "8", "--ranks", "8")
F.check("out of range" in p.stderr, "out of range said: %s" % p.stderr.splitlines()[:1])
# a split that cannot be served: the same refusal with or without --ranks
a = tt.tpfs("mount", src, mnt, "--tp", "3")
b = tt.tpfs("mount", src, mnt, "--tp", "3", "--ranks", "0")
F.check(a.returncode == 1 and b.returncode == 1 and a.stderr == b.stderr and "over 3 ranks" in a.stderr,
        "--tp 3 refused the same with --ranks 0: %r / %r" % (a.stderr[:200], b.stderr[:200]))
F.check(not tt.is_mounted(mnt), "nothing mounted after the refusals")
os.rmdir(mnt)


# ---- the page-touch minimum, computed independently ----
header = tt.read_header


def pages_of(T, ranks):
    """Source pages holding any byte of the ranks' tensors, by the reference slicing of index arrays."""
    total = 0
    for fn in files:
        start, h = header(os.path.join(src, fn))
        pages = set()
        for name, v in h.items():
            shape, (b, _) = tuple(v["shape"]), v["data_offsets"]
            idx = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
            for r in ranks:
                got = R.expected("llama", cfg, name, idx, T, r)
                off = start + b + got.reshape(-1) * 2  # F16: an element never straddles a page
                pages.update(np.unique(off // PAGE).tolist())
        total += len(pages)
    return total * PAGE


def plan_io(T, lst=None):
    p = tt.tpfs("plan", src, "--tp", T, "--io", *(["--ranks", lst] if lst else []), check=True)
    rows = {}
    for line in p.stdout.splitlines():
        w = line.split()
        if len(w) == 5 and (w[0].isdigit() or w[0] == "served") and w[1].isdigit():
            rows[w[0]] = [int(x) for x in w[1:4]]
    return rows


io8 = plan_io(8)
min0 = pages_of(8, [0])
F.check(io8["0"][2] == min0, "plan --io rank 0 page-touch minimum %d, reference %d" % (io8["0"][2], min0))
F.check(io8["5"][2] == pages_of(8, [5]), "plan --io rank 5 page-touch minimum")
sel = plan_io(8, "2,6-7")
F.check(sel["served"][2] == pages_of(8, [2, 6, 7]), "plan --io --ranks 2,6-7: union %d, reference %d" % (
    sel["served"][2], pages_of(8, [2, 6, 7])))
F.check(set(sel) == {"2", "6", "7", "served"}, "plan --io --ranks lists the named ranks: %s" % sorted(sel))
with tt.Mount(src, 8, "--ranks", "0") as m:
    served0 = sum(os.path.getsize(os.path.join(m.rank(0), f)) for f in files)
F.check(io8["0"][0] == served0, "plan --io rank 0's rank-file bytes %d = served %d" % (io8["0"][0], served0))


# ---- storage bytes with the page cache dropped ----
def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_bytes(pid):
    with open("/proc/%d/io" % pid) as f:
        return int([l for l in f if l.startswith("read_bytes:")][0].split()[1])


try:
    drop_caches()
except OSError as e:
    print("SKIP (storage bytes): the page cache cannot be dropped here: %s" % e)
    F.done("test_ranks")
    sys.exit(tt.SKIP)

# the measurement itself works here: a plain read of a dropped source file shows in read_bytes
b0 = read_bytes(os.getpid())
with open(os.path.join(src, files[0]), "rb") as f:
    while f.read(1 << 20):
        pass
got = read_bytes(os.getpid()) - b0
size0 = os.path.getsize(os.path.join(src, files[0]))
F.check(got >= 0.9 * size0, "read_bytes sees storage reads under %s (%d of %d bytes)" % (work, got, size0))

for extra in ([], ["--ranks", "0"]):
    with tt.Mount(src, 8, *extra) as m:
        paths = [os.path.join(m.rank(0), f) for f in files]
        drop_caches()
        before = read_bytes(m.proc.pid)
        n = 0
        for p in paths:
            with open(p, "rb") as f:
                while True:
                    k = len(f.read(1 << 20))
                    if not k:
                        break
                    n += k
        fetched = read_bytes(m.proc.pid) - before
        what = "T=8 %s rank 0: served %d, storage %d bytes = %.2fx the page-touch minimum %d" % (
            " ".join(extra) or "(all ranks)", n, fetched, fetched / min0, min0)
        print(what)
        F.check(n == served0, "rank 0 served %d bytes" % n)
        F.check(fetched <= 1.15 * min0, what + " (limit 1.15x)")
        F.check(fetched >= 0.5 * min0, what + " (the measurement sees the reads)")

subprocess.run(["rm", "-rf", work])
F.done("test_ranks")
