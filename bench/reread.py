"""Cached re-reads through tpfs against the source's, side by side (issue 21).

python bench/reread.py SRC [--tp T] [--reps N]: mounts SRC at T (default 1), then per repetition
reads every source safetensors file twice (native, cached), drops rank 0's cached pages, reads its
rank files once through the daemon (first read) and twice more from the page cache (re-read),
and prints the throughputs and the re-read / native ratio. No request reaches the daemon on a
re-read: what it measures is the kernel's FUSE page cache against the source's.

As root it also prints the sizes of the page-cache folios that hold the first source file and the
first rank file (mapped, touched, then looked up in /proc/self/pagemap and /proc/kpageflags): the
per-folio cost of a cached read() is the gap, and a kernel that gives FUSE files large folios shows
it here first.
"""
import argparse
import collections
import glob
import mmap
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
import tpfs_test as tt  # noqa: E402


def read(p, buf=1 << 20):
    b = bytearray(buf)
    mv, n = memoryview(b), 0
    with open(p, "rb", buffering=0) as f:
        while True:
            k = f.readinto(mv)
            if not k:
                return n
            n += k


def gbps(files):
    t = time.perf_counter()
    n = sum(read(f) for f in files)
    return n / (time.perf_counter() - t) / 1e9


def drop(files):
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def folio_sizes(path, limit=256 << 20):
    """{folio size in KiB: count} of the page-cache folios holding the first `limit` bytes of path
    (root: /proc/kpageflags). Touches every page through a shared mapping first, which finds the
    folios a read() left or makes them as a page fault would."""
    page = mmap.PAGESIZE
    with open(path, "rb") as f:
        size = min(os.fstat(f.fileno()).st_size, limit) // page * page
        m = mmap.mmap(f.fileno(), size, mmap.MAP_SHARED, mmap.PROT_READ)
    n = size // page
    for i in range(n):
        m[i * page]
    start = None
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith(real):
                start = int(line.split("-")[0], 16)
                break
    out, run = collections.Counter(), 0
    with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
        pm.seek(start // page * 8)
        for e in struct.unpack("%dQ" % n, pm.read(8 * n)):
            if not e >> 63:
                continue
            kf.seek((e & ((1 << 55) - 1)) * 8)
            flags = struct.unpack("Q", kf.read(8))[0]
            if flags >> 16 & 1 and not flags >> 15 & 1:  # a tail page: the same folio as the last
                run += 1
                continue
            if run:
                out[run * page >> 10] += 1
            run = 1
    if run:
        out[run * page >> 10] += 1
    m.close()
    return dict(sorted(out.items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    src = sorted(glob.glob(os.path.join(a.src, "*.safetensors")))
    with tt.Mount(a.src, a.tp) as m:
        rank = sorted(glob.glob(os.path.join(m.rank(0), "*.safetensors")))
        for rep in range(a.reps):
            nat = max(gbps(src) for _ in range(2))
            drop(rank)
            first = gbps(rank)
            again = max(gbps(rank) for _ in range(2))
            print("rep %d: native %.2f GB/s, first read %.2f GB/s, re-read %.2f GB/s (%.2fx native)"
                  % (rep + 1, nat, first, again, again / nat), flush=True)
        if os.geteuid() == 0:
            for what, p in (("source", src[0]), ("rank file", rank[0])):
                print("page-cache folios of the %s %s (KiB: count): %s"
                      % (what, os.path.basename(p), folio_sizes(p)), flush=True)


if __name__ == "__main__":
    main()
