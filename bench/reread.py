"""Cached re-reads through tpfs against the source's, side by side (issue 21).

python bench/reread.py SRC [--tp T] [--reps N]: mounts SRC at T (default 1), then per repetition
reads every source safetensors file twice (native, cached), drops rank 0's cached pages, reads its
rank files once through the daemon (first read) and twice more from the page cache (re-read),
and prints the throughputs and the re-read / native ratio. No request reaches the daemon on a
re-read: what it measures is the kernel's FUSE page cache against the source's.
"""
import argparse
import glob
import os
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


if __name__ == "__main__":
    main()
