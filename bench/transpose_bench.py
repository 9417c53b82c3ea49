"""The transposed read path (TP_RUN_TRANSPOSE, issue 28) side by side with the plain one.

python bench/transpose_bench.py [--tp T] [--reps N] [--experts E] [--hidden H] [--inter I] [--work DIR]

Writes a gpt-oss-shaped BF16 checkpoint of one decoder layer (experts gate_up_proj [E, H, 2I] and down_proj
[E, I, H], random bytes; by default E=8, H=I=2880 as gpt-oss's: 398 MB of experts), then per repetition, with
the source in the page cache:
  - hf view    rank 0's rank folder through tpfs (`tpfs mount SRC MNT --tp T`): the experts cut by columns and
               rows, served as cut (TP_RUN_SRC runs);
  - vllm view  rank 0's sharded_state file (`--view vllm`): the same cuts served transposed, as vLLM's
               w13_weight [E, 2I/T, H] and w2_weight [E, H, I/T] (TP_RUN_TRANSPOSE runs, the CPU gather);
  - numpy      what a pre-sharding script does for the same bytes: mmap the source (safetensors' safe_open),
               slice, transpose and copy into contiguous arrays (np.ascontiguousarray), no file written.
Each read is the daemon's first (a fresh mount per repetition); throughputs are rank bytes over wall time;
the ratios are taken within a repetition, then the median. Prints a Markdown table for docs/PERFORMANCE.md.

Then, from a cold page cache (the source's pages dropped with POSIX_FADV_DONTNEED: no root needed), each view's
rank 0 files are read once and the source bytes left in the page cache (mincore) are set beside the page-touch
minimum `tpfs plan --io --ranks 0` gives for that view: what the daemon's prefetch fetched (a node's storage
reads). With columns cut at T >= 4, whole pages lie between a rank's rows: a prefetch that fetched whole
matrices would show about twice the minimum.
"""
import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
import fixtures  # noqa: E402
import tpfs_test as tt  # noqa: E402
from io_bench import read_files as read_all  # noqa: E402  (bench/ is this script's folder: on sys.path)


def page_touch(src, T, extra):
    """`tpfs plan --io --ranks 0`'s page-touch minimum of rank 0, in bytes."""
    out = tt.tpfs("plan", src, "--tp", str(T), "--io", "--ranks", "0", *extra).stdout
    for line in out.splitlines():
        w = line.split()
        if w and w[0] == "0":
            return int(w[3])
    raise RuntimeError("no rank 0 line in tpfs plan --io:\n" + out)


def timed(fn):
    t = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - t


def numpy_cut(src, T, E, H, I):
    """Rank 0's transposed experts as a script makes them: mmap, slice, transpose, copy."""
    path = os.path.join(src, "model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    base = (8 + n) // 2

    def tensor(k):
        a, b = hdr[k]["data_offsets"]
        return mm[base + a // 2: base + b // 2].reshape(hdr[k]["shape"])
    gu = tensor("model.layers.0.mlp.experts.gate_up_proj")[:, :, : 2 * I // T]
    dn = tensor("model.layers.0.mlp.experts.down_proj")[:, : I // T, :]
    w13 = np.ascontiguousarray(gu.transpose(0, 2, 1))
    w2 = np.ascontiguousarray(dn.transpose(0, 2, 1))
    return w13.nbytes + w2.nbytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2880)
    ap.add_argument("--inter", type=int, default=2880)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="tpfs-tbench-")
    src = os.path.join(work, "src")
    total = fixtures.gpt_oss_layer(src, a.experts, a.hidden, a.inter)
    read_all([os.path.join(src, "model.safetensors")])  # into the page cache
    experts = a.experts * a.hidden * a.inter * 3 * 2  # gate_up + down, BF16
    rows = {"hf view (cut, served as cut)": [], "vllm view (cut, served transposed)": [],
            "numpy (slice, transpose, copy; no file)": []}
    ratios = []
    for rep in range(a.reps):
        got = {}
        for name, extra in (("hf view (cut, served as cut)", ()), ("vllm view (cut, served transposed)", ("--view", "vllm"))):
            with tt.Mount(src, a.tp, *extra) as m:
                if extra:
                    files = [os.path.join(m.path, f) for f in sorted(os.listdir(m.path)) if f.startswith("model-rank-0-")]
                else:
                    files = [os.path.join(m.path, "rank0", "model.safetensors")]
                n, s = timed(lambda: read_all(files))
            got[name] = (n, s)
            rows[name].append(n / s / 1e9)
        n, s = timed(lambda: numpy_cut(src, a.tp, a.experts, a.hidden, a.inter))
        rows["numpy (slice, transpose, copy; no file)"].append(n / s / 1e9)
        ratios.append(rows["vllm view (cut, served transposed)"][-1] / rows["hf view (cut, served as cut)"][-1])
        print("rep %d: %s" % (rep, ", ".join("%s %.2f GB/s" % (k, v[-1]) for k, v in rows.items())), file=sys.stderr)
    print("Checkpoint: one gpt-oss layer, BF16, experts E=%d, H=%d, I=%d (%.0f MB of experts, %.0f MB in all); T=%d, "
          "rank 0; source in the page cache; medians of %d repetitions.\n"
          % (a.experts, a.hidden, a.inter, experts / 1e6, total / 1e6, a.tp, a.reps))
    print("| reader of rank 0 | median | ratio |")
    print("| --- | --- | --- |")
    hf = statistics.median(rows["hf view (cut, served as cut)"])
    for k, v in rows.items():
        m = statistics.median(v)
        print("| %s | %.2f GB/s | %.2fx hf view |" % (k, m, m / hf))
    print("\nvllm view / hf view, per repetition: %s (median %.2f)" % (", ".join("%.2f" % r for r in ratios),
                                                                       statistics.median(ratios)))
    path = os.path.join(src, "model.safetensors")
    print("\nFrom a cold page cache, rank 0 read once (T=%d): source bytes the read left in the page cache against "
          "`tpfs plan --io --ranks 0`'s page-touch minimum.\n" % a.tp)
    print("| reader of rank 0 | source fetched | page-touch minimum | ratio |")
    print("| --- | --- | --- | --- |")
    for name, extra in (("hf view", ()), ("vllm view (transposed)", ("--view", "vllm"))):
        with tt.Mount(src, a.tp, *extra) as m:
            files = ([os.path.join(m.path, f) for f in sorted(os.listdir(m.path)) if f.startswith("model-rank-0-")]
                     if extra else [os.path.join(m.path, "rank0", "model.safetensors")])
            tt.drop_cache(path)
            before = tt.resident(path)
            read_all(files)
            got = tt.resident(path) - before
        need = page_touch(src, a.tp, extra)
        print("| %s | %.1f MB | %.1f MB | %.2fx |" % (name, got / 1e6, need / 1e6, got / need))


if __name__ == "__main__":
    main()
