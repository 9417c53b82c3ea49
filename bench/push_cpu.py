"""The cold push's CPU (issue 46, item 2): the daemon's CPU seconds per GB it pushes from a cold source.

The storage is io_bench.py's SlowStore (an ext4 image on a loop device with direct I/O, reads limited by
a cgroup, 200 MB/s by default) holding bench/llama_gen.py's Llama-like checkpoint (about 1.2 GB). Each
measurement: the page cache dropped, `tpfs mount SRC MNT --tp 2 -f --view vllm --ranks 1` started (the
push on: its default budget), nothing reads the mount, and the daemon waited for until its stats say the
push has ended. Printed per variant: the bytes pushed (the stats' push line), the bytes fetched from the
loop device, the seconds until the push ended, and the daemon's CPU seconds (user + system, from
/proc/PID/stat at that moment: the whole daemon from its start, mount setup included) per GB pushed;
and the push's own, less the CPU of mounting alone (a `--push off` mount, measured in each repetition).
Variants run side by side, each repetition of every variant in turn; medians of --reps (default 3).

A variant is NAME=ARGS (extra `tpfs mount` arguments, split on spaces); the default pair compares the
push's source reads through the mapping (`--push-io map`: MADV_WILLNEED prefetch, then the copy from the
mapping) with direct reads into the push buffer (`--push-io direct`). CPU seconds, not wall time: they
hold under other load. Needs root (loop device, mount, cgroup, drop_caches).

python bench/push_cpu.py [--reps N] [--rate MBPS] [--variant NAME=ARGS ...] [--tpfs PATH] [--work DIR] [--smoke]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import io_bench as IO  # noqa: E402
import llama_gen  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """User + system CPU seconds of process PID so far (/proc/PID/stat, fields 14 and 15)."""
    with open("/proc/%d/stat" % pid) as f:
        w = f.read().rsplit(")", 1)[1].split()
    return (int(w[11]) + int(w[12])) / TICK


def pushed_bytes(line):
    """The bytes pushed of a stats push line ("push: pushed N of B bytes, STATE; ...")."""
    return int(line.split()[2])


def one(tpfs, src, extra, store):
    """One cold push: (bytes pushed, bytes fetched, seconds to the push's end, daemon CPU seconds, state)."""
    IO.drop_caches()
    s0 = store.sectors()
    mnt = tempfile.mkdtemp(prefix="tpfs-bench-")
    t0 = time.perf_counter()
    proc = subprocess.Popen([tpfs, "mount", src, mnt, "--tp", "2", "-f", "--view", "vllm", "--ranks", "1"] + extra,
                            stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        while not os.path.ismount(mnt):
            if proc.poll() is not None:
                raise RuntimeError("tpfs mount failed (rc %s)" % proc.returncode)
            time.sleep(0.01)
        line = IO.wait_push(mnt)
        secs = time.perf_counter() - t0
        cpu = cpu_s(proc.pid)
        fetched = (store.sectors() - s0) * 512
    finally:
        subprocess.run(["fusermount3", "-u", "-z", mnt])
        proc.wait(timeout=60)
        os.rmdir(mnt)
    return pushed_bytes(line), fetched, secs, cpu, line.split(", ")[1].split(";")[0]


def setup_cpu(tpfs, src):
    """The daemon's CPU seconds to mount (`--push off`, the page cache dropped): until MNT answers and
    its stats file has been read once (planning and the sources' headers)."""
    IO.drop_caches()
    mnt = tempfile.mkdtemp(prefix="tpfs-bench-")
    proc = subprocess.Popen([tpfs, "mount", src, mnt, "--tp", "2", "-f", "--view", "vllm", "--ranks", "1", "--push",
                             "off"], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        while not os.path.ismount(mnt):
            if proc.poll() is not None:
                raise RuntimeError("tpfs mount failed (rc %s)" % proc.returncode)
            time.sleep(0.01)
        open(os.path.join(mnt, ".tpfs-stats")).read()
        time.sleep(0.2)
        return cpu_s(proc.pid)
    finally:
        subprocess.run(["fusermount3", "-u", "-z", mnt])
        proc.wait(timeout=60)
        os.rmdir(mnt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200.0, help="storage read limit, MB/s")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                    help="extra tpfs mount arguments of a variant (default: map and direct)")
    ap.add_argument("--smoke", action="store_true", help="a small checkpoint, one repetition")
    ap.add_argument("--tpfs", default=os.path.join(HERE, "..", "build", "src", "tpfs"))
    ap.add_argument("--work", default=os.path.join(HERE, "..", "build", "bench"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (loop device, mount, cgroup, drop_caches)")
    variants = [(v.partition("=")[0], v.partition("=")[2].split()) for v in a.variant] or [
        ("map", ["--push-io", "map"]), ("direct", ["--push-io", "direct"])]
    os.makedirs(a.work, exist_ok=True)
    gen, c = llama_gen.ensure(a.work, a.smoke)
    size = sum(os.path.getsize(p) for p in IO.st_files(gen))
    scratch = tempfile.mkdtemp(dir=a.work)
    store = IO.SlowStore(scratch, int(size * 1.3) + (256 << 20), a.rate)
    res = {name: [] for name, _ in variants}
    setup = []
    try:
        src = os.path.join(store.mnt, "src")
        shutil.copytree(gen, src, ignore=shutil.ignore_patterns(".complete"))
        subprocess.run(["sync"])
        store.limit()
        for rep in range(1 if a.smoke else a.reps):
            setup.append(setup_cpu(a.tpfs, src))
            print("rep %d: mounting alone (--push off) %.2f CPU s" % (rep + 1, setup[-1]), flush=True)
            for name, extra in variants:
                r = one(a.tpfs, src, extra, store)
                res[name].append(r)
                print("rep %d %s: pushed %.1f MB (%s), fetched %.1f MB, %.2f s, CPU %.2f s: %.2f CPU s/GB" % (
                    rep + 1, name, r[0] / 1e6, r[4], r[1] / 1e6, r[2], r[3], r[3] / (r[0] / 1e9)), flush=True)
        pmin, _ = IO.page_touch(a.tpfs, src, 2, "1")
    finally:
        store.close()
        for d in (store.mnt, scratch):  # the image is gone: the empty mount point and its folder are left
            try:
                os.rmdir(d)
            except OSError:
                pass
    su = statistics.median(setup)
    print("\nCold push, `--view vllm --tp 2 --ranks 1`, %s; page cache dropped before each mount; page-touch "
          "minimum %.1f MB; medians of %d. The daemon's CPU is counted from its start (mounting: %.2f s, the "
          "median of a `--push off` mount's, %s); the push's own is the rest." % (
              "reads limited to %.0f MB/s" % a.rate if store.limited else store.note, pmin / 1e6, len(setup), su,
              " / ".join("%.2f" % x for x in setup)))
    print("| variant | mount arguments | pushed | fetched | push ended after | daemon CPU | CPU s per GB pushed, "
          "whole daemon (each repetition) | the push's own (daemon less mounting) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, extra in variants:
        v = res[name]
        per = [x[3] / (x[0] / 1e9) for x in v]
        own = [(x[3] - su) / (x[0] / 1e9) for x in v]
        print("| %s | `%s` | %.1f MB | %.1f MB | %.2f s | %.2f s | %.2f (%s) | %.2f |" % (
            name, " ".join(extra), statistics.median(x[0] for x in v) / 1e6, statistics.median(x[1] for x in v) / 1e6,
            statistics.median(x[2] for x in v), statistics.median(x[3] for x in v), statistics.median(per),
            " / ".join("%.2f" % p for p in per), statistics.median(own)))


if __name__ == "__main__":
    main()
