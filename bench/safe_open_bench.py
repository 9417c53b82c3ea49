"""A stock `safetensors` reader over a pushed rank folder against the same reader over a pre-sharded local
copy (issue 46's benchmark list: goal >= 0.8x the local copy's speed).

bench/llama_gen.py's Llama-like checkpoint (in --work); a pre-sharded copy of rank R's folder made once by
copying it out of a tpfs mount (so the bytes are the same). Each repetition, side by side:

  pushed       `tpfs mount SRC MNT --tp T --ranks R -f` (push-ahead on, its default budget), the push
               waited for until its stats say it has ended, then every tensor of MNT/rankR read with
               `safe_open(f, "numpy")` and `get_tensor` (the source cached: the pushed pages are what is read);
  pre-sharded  the same reader over the local copy, its page cache warmed by one read first.

  TAG         with --variant 'TAG=ARGS': the pushed row's mount with more arguments, e.g.
               'passthrough=--passthrough on' (the reads then go to the push's private copies; needs root)

Printed: seconds per pass for each, medians of --reps, and the ratio (pre-sharded time / pushed time: 1.0x
means as fast). Wall time: run it on a quiet machine. No root needed, but for passthrough.

python bench/safe_open_bench.py [--reps N] [--tp T] [--rank R] [--smoke] [--tpfs PATH] [--work DIR]
                                [--variant TAG=ARGS ...]
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
from safetensors import safe_open  # noqa: E402


def read_all(folder):
    """Reads every tensor of every safetensors file of folder with safe_open; returns (bytes, seconds)."""
    n = 0
    t0 = time.perf_counter()
    for f in IO.st_files(folder):
        with safe_open(f, "numpy") as st:
            for k in st.keys():
                n += st.get_tensor(k).nbytes
    return n, time.perf_counter() - t0


def warm(folder):
    for f in IO.st_files(folder):
        with open(f, "rb") as fh:
            while fh.read(1 << 20):
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="a small checkpoint, one repetition")
    ap.add_argument("--tpfs", default=os.path.join(HERE, "..", "build", "src", "tpfs"))
    ap.add_argument("--work", default=os.path.join(HERE, "..", "build", "bench"))
    ap.add_argument("--variant", action="append", default=[], metavar="TAG=ARGS",
                    help="also the pushed row with more tpfs mount arguments (repeatable)")
    a = ap.parse_args()
    rows = [("pushed", [])] + [(v.split("=", 1)[0], v.split("=", 1)[1].split()) for v in a.variant]
    os.makedirs(a.work, exist_ok=True)
    gen, c = llama_gen.ensure(a.work, a.smoke)
    root = tempfile.mkdtemp(prefix="tpfs-presharded-", dir=a.work)
    pre = os.path.join(root, "rank")
    res = {tag: [] for tag, _ in rows}
    res["pre"] = []
    try:
        m = IO.Mount(a.tpfs, gen, a.tp, "--push", "off", ranks=str(a.rank))
        try:
            shutil.copytree(m.rank(a.rank), pre)
        finally:
            m.stop()
        warm(gen)
        for rep in range(1 if a.smoke else a.reps):
            said = []
            for tag, extra in rows:
                m = IO.Mount(a.tpfs, gen, a.tp, "--push", "auto", *extra, ranks=str(a.rank))
                try:
                    line = IO.wait_push(m.mnt)
                    n, secs = read_all(m.rank(a.rank))
                    res[tag].append(secs)
                finally:
                    m.stop()
                said.append("%s %.3f s (%s)" % (tag, secs, line.split(", ")[1].split(";")[0]))
            warm(pre)
            n2, secs2 = read_all(pre)
            res["pre"].append(secs2)
            if n != n2:
                sys.exit("the two folders hold different bytes: %d against %d" % (n, n2))
            print("rep %d: %s, pre-sharded %.3f s, %.1f MB" % (rep + 1, ", ".join(said), secs2, n / 1e6), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    q = statistics.median(res["pre"])
    print("\n| safe_open + get_tensor of every tensor, T=%d rank %d | seconds (each repetition) | speed x pre-sharded |"
          % (a.tp, a.rank))
    print("| --- | --- | --- |")
    print("| pre-sharded local copy (cached) | %.3f (%s) | 1.00x |" % (q, " / ".join("%.3f" % x for x in res["pre"])))
    for tag, extra in rows:
        p = statistics.median(res[tag])
        print("| tpfs rank folder after the push%s | %.3f (%s) | %.2fx |" % (
            " (%s)" % " ".join(extra) if extra else "", p, " / ".join("%.3f" % x for x in res[tag]), q / p))
    print("Command: python bench/safe_open_bench.py --reps %d --tp %d --rank %d%s%s" % (
        len(res["pre"]), a.tp, a.rank, " --smoke" if a.smoke else "",
        "".join(" --variant '%s'" % v for v in a.variant)))


if __name__ == "__main__":
    main()
