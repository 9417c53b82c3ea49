"""Mounting and reading rank folders: a Llama-style checkpoint split over 2 files with an index:

- at T = 1 every tensor equals the original; at T = 1, 2, 4 every tensor of every rank equals the
  numpy slice the independent reference computes; column- and row-split tensors concatenated over
  the ranks give back the original; safe_open (mmap) and plain read() both work;
- the index is rewritten per rank; other files are served unchanged; exact sizes, no write bits,
  stable inodes and mtimes; every write gets EROFS; reading past the end returns nothing;
- `cp -r MNT/rank1 out/` gives a folder that loads without tpfs.
"""
import errno
import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

import fixtures
import reference as R
import tpfs_test as tt

tt.Mount.pin = ("--push", "off")  # this test measures the stats' per-rank counters of the read path: no push-ahead

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-test-")
src = os.path.join(work, "llama")
cfg, full = fixtures.make("llama", src)
files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))


def load_rank(path, mmap):
    out = {}
    for fn in files:
        p = os.path.join(path, fn)
        if mmap:
            with safe_open(p, framework="np") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
        else:
            out.update(load_file(p))
    return out


for T in (1, 2, 4):
    with tt.Mount(src, T) as m:
        ranks = []
        for r in range(T):
            by_mmap = load_rank(m.rank(r), mmap=True)
            by_read = load_rank(m.rank(r), mmap=False)
            F.check(set(by_mmap) == set(full), "T=%d r=%d: tensor names" % (T, r))
            for k, x in full.items():
                want = R.expected("llama", cfg, k, x, T, r)
                F.check(np.array_equal(by_mmap[k], want), "T=%d r=%d %s: safe_open (mmap) value" % (T, r, k))
                F.check(np.array_equal(by_read[k], want), "T=%d r=%d %s: read() value" % (T, r, k))
                if T == 1:
                    F.check(np.array_equal(by_mmap[k], x), "T=1 %s equals the original" % k)
            ranks.append(by_mmap)
            # the index: same tensors, total_size = local tensor bytes
            idx = json.load(open(os.path.join(m.rank(r), "model.safetensors.index.json")))
            src_idx = json.load(open(os.path.join(src, "model.safetensors.index.json")))
            F.check(idx["weight_map"] == src_idx["weight_map"], "T=%d r=%d: weight_map" % (T, r))
            F.check(idx["metadata"]["total_size"] == sum(v.nbytes for v in by_mmap.values()),
                    "T=%d r=%d: total_size %s" % (T, r, idx["metadata"]["total_size"]))
            # other files unchanged
            for fn in ("tokenizer_config.json", "generation_config.json"):
                F.check(open(os.path.join(m.rank(r), fn), "rb").read() == open(os.path.join(src, fn), "rb").read(),
                        "T=%d r=%d: %s unchanged" % (T, r, fn))
            F.check(sorted(os.listdir(m.rank(r))) == sorted(os.listdir(src)), "T=%d r=%d: listing" % (T, r))
        # column- and row-split tensors concatenate back to the original
        for k, x in full.items():
            if k.endswith("q_proj.weight") or k.endswith("gate_proj.weight") or k == "lm_head.weight":
                F.check(np.array_equal(np.concatenate([rk[k] for rk in ranks], axis=0), x), "T=%d concat rows %s" % (T, k))
            if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
                F.check(np.array_equal(np.concatenate([rk[k] for rk in ranks], axis=1), x), "T=%d concat cols %s" % (T, k))
        F.check(sorted(os.listdir(m.path)) == [".tpfs-stats", "config.json"] + ["rank%d" % r for r in range(T)],
                "T=%d: top level" % T)

with tt.Mount(src, 2) as m:
    r1 = m.rank(1)
    # exact sizes, read-only modes, stable inodes, source mtimes
    for fn in os.listdir(r1):
        p = os.path.join(r1, fn)
        st = os.stat(p)
        data = open(p, "rb").read()
        F.check(st.st_size == len(data), "size of %s in stat (%d) equals its bytes (%d)" % (fn, st.st_size, len(data)))
        F.check(st.st_mode & 0o222 == 0, "%s has no write bits" % fn)
        F.check(os.stat(p).st_ino == st.st_ino, "%s: inode stable" % fn)
        F.check(int(st.st_mtime) == int(os.stat(os.path.join(src, fn)).st_mtime), "%s: mtime of the source" % fn)
    F.check(os.stat(r1).st_mode & 0o222 == 0, "rank folder has no write bits")
    inodes = {fn: os.stat(os.path.join(r1, fn)).st_ino for fn in os.listdir(r1)}
    # read-only: every write gets EROFS
    f0 = os.path.join(r1, files[0])
    attempts = {
        "open for write": lambda: os.open(f0, os.O_WRONLY),
        "create": lambda: os.open(os.path.join(r1, "new"), os.O_CREAT | os.O_WRONLY, 0o644),
        "unlink": lambda: os.unlink(f0),
        "rename": lambda: os.rename(f0, os.path.join(r1, "x")),
        "chmod": lambda: os.chmod(f0, 0o777),
        "mkdir": lambda: os.mkdir(os.path.join(r1, "d")),
        "truncate": lambda: os.truncate(f0, 0),
        "setxattr": lambda: os.setxattr(f0, "user.x", b"1"),
        "symlink": lambda: os.symlink("a", os.path.join(r1, "l")),
        "rmdir": lambda: os.rmdir(r1),
    }
    for what, fn in attempts.items():
        try:
            fn()
            F.check(False, "%s succeeded on a read-only mount" % what)
        except OSError as e:
            F.check(e.errno == errno.EROFS, "%s gives EROFS (got %s)" % (what, errno.errorcode.get(e.errno)))
    # reading past the end returns nothing
    fd = os.open(f0, os.O_RDONLY)
    size = os.fstat(fd).st_size
    F.check(os.pread(fd, 100, size) == b"", "read at the end returns 0 bytes")
    F.check(os.pread(fd, 100, size + 12345) == b"", "read past the end returns 0 bytes")
    F.check(len(os.pread(fd, 100, size - 10)) == 10, "a read across the end is short")
    os.close(fd)
    # cp -r rank1 out/ loads without tpfs
    out = os.path.join(work, "copied")
    shutil.copytree(r1, out)
    stats = open(os.path.join(m.path, ".tpfs-stats")).read()
    F.check("rank" in stats and "bytes_served" in stats, "stats file readable")
    st = tt.tpfs("stats", m.path)
    F.check(st.returncode == 0 and "source_bytes" in st.stdout, "tpfs stats MNT")
    served1 = [l.split() for l in st.stdout.splitlines() if l.startswith("1 ")]
    F.check(bool(served1) and int(served1[0][1]) > 0, "rank 1 bytes_served counted: %s" % served1)
copied = load_rank(out, mmap=True)
for k, x in full.items():
    F.check(np.array_equal(copied[k], R.expected("llama", cfg, k, x, 2, 1)), "copied rank1 %s" % k)

# stable inode numbers across a remount
with tt.Mount(src, 2) as m:
    again = {fn: os.stat(os.path.join(m.rank(1), fn)).st_ino for fn in os.listdir(m.rank(1))}
    F.check(again == inodes, "inode numbers are the same after a remount")

shutil.rmtree(work)
F.done("test_mount")
