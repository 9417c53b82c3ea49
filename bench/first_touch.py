"""How slow the first write to fresh memory is on this machine (docs/PERFORMANCE.md, stop 57): the CPU seconds
of a memset of GIB GiB of new anonymous memory (transparent huge pages asked for), in two states:
  cold      right after the page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`, root) and SETTLE seconds
            of waiting: on a VM that reports freed memory to its host (virtio balloon's free page reporting),
            that memory has gone back to the host and the first write to each page faults there;
  recycled  memory this process freed a moment before (the same size, allocated again at once);
and a second memset of the same memory (every page already present), for scale. Every figure is a median of
--reps repetitions. The tpfs daemon's copies into new page-cache or tmpfs pages, and every loader's copy of the
weights into fresh memory, pay the cold figure where it applies.

python bench/first_touch.py [--gib N] [--settle S] [--reps N]
"""
import argparse
import ctypes
import mmap
import os
import statistics
import sys
import time

libc = ctypes.CDLL(None)
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]


def touch(n):
    """(CPU s of the first memset of n new bytes, CPU s of a second one)."""
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    t0 = time.process_time()
    libc.memset(addr, 1, n)
    t1 = time.process_time()
    libc.memset(addr, 2, n)
    t2 = time.process_time()
    m.close()
    return t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=int, default=1)
    ap.add_argument("--settle", type=float, default=20.0)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (drop_caches)")
    n = a.gib << 30
    cold, again, recycled = [], [], []
    for _ in range(a.reps):
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        time.sleep(a.settle)
        c, g = touch(n)
        cold.append(c)
        again.append(g)
        recycled.append(touch(n)[0])
    print("memset of %d GiB of new memory, CPU s (medians of %d): cold (page cache dropped, %g s of waiting) %.2f "
          "[%s]; recycled (freed a moment before) %.2f [%s]; the same memory again %.2f" % (
              a.gib, a.reps, a.settle, statistics.median(cold), " / ".join("%.2f" % x for x in cold),
              statistics.median(recycled), " / ".join("%.2f" % x for x in recycled), statistics.median(again)))


if __name__ == "__main__":
    main()
