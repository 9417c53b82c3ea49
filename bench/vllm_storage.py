"""Slow storage under `--view vllm` (issue 21): the bytes one node pulls from storage when it serves
only rank 1 of TP=2 to vLLM, against what vLLM's default loader pulls on that node.

The storage is io_bench.py's: an ext4 image on a loop device (direct I/O), read-limited by a cgroup,
the page cache dropped before every measurement, bytes fetched counted by the loop device. On it,
the Llama-like checkpoint of bench/llama_gen.py (about 1 GiB, 4 files). Side by side, in one run:

  tpfs --view vllm --ranks 1   the node's rank-1 process reads what vLLM's sharded_state loader
                               reads on rank 1: every byte of MNT/model-rank-1-part-*.safetensors;
  default loader               vLLM's default loader on that node's rank 1 reads every tensor of every
                               source file (safetensors_weights_iterator), then slices it in its
                               weight loaders: every byte of SRC's safetensors files;
  page-touch minimum           the source pages rank 1's cuts touch (`tpfs plan --io --ranks 1`).

The readers are the loaders' read patterns (whole files, one rank), not vLLM itself: a TP=2 vLLM
cannot start one rank alone on one machine. Needs root. python bench/vllm_storage.py [--reps N]
[--rate MBPS] [--smoke] [--tpfs PATH] [--work DIR]
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import io_bench as IO  # noqa: E402
import llama_gen  # noqa: E402


class ViewMount(IO.Mount):
    """io_bench's foreground mount, for --view vllm (no rank folders: ready when MNT is a mount)."""

    def __init__(self, tpfs, src, T, ranks):
        self.mnt = tempfile.mkdtemp(prefix="tpfs-bench-")
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = IO.subprocess.Popen([tpfs, "mount", src, self.mnt, "--tp", str(T), "-f", "--view", "vllm",
                                         "--ranks", ranks], stderr=self.err, stdout=IO.subprocess.DEVNULL)
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None:
                self.err.seek(0)
                raise RuntimeError("tpfs mount failed: " + self.err.read())
            IO.time.sleep(0.02)


def rank_parts(mnt, r):
    return [os.path.join(mnt, f) for f in sorted(os.listdir(mnt))
            if f.startswith("model-rank-%d-part-" % r) and f.endswith(".safetensors")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200.0, help="storage read limit, MB/s")
    ap.add_argument("--smoke", action="store_true", help="a small checkpoint, one repetition")
    ap.add_argument("--tpfs", default=os.path.join(HERE, "..", "build", "src", "tpfs"))
    ap.add_argument("--work", default=os.path.join(HERE, "..", "build", "bench"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (loop device, mount, cgroup, drop_caches)")
    os.makedirs(a.work, exist_ok=True)
    gen, c = llama_gen.ensure(a.work, a.smoke)
    size = sum(os.path.getsize(p) for p in IO.st_files(gen))
    store = IO.SlowStore(tempfile.mkdtemp(dir=a.work), int(size * 1.3) + (256 << 20), a.rate)
    res = {"view": [], "whole": []}
    try:
        src = os.path.join(store.mnt, "src")
        shutil.copytree(gen, src, ignore=shutil.ignore_patterns(".complete"))
        IO.subprocess.run(["sync"])
        store.limit()
        for rep in range(1 if a.smoke else a.reps):
            for key in ("view", "whole"):
                m = ViewMount(a.tpfs, src, 2, "1") if key == "view" else None
                try:
                    files = rank_parts(m.mnt, 1) if m else IO.st_files(src)
                    IO.drop_caches()
                    s0 = store.sectors()
                    n, secs = IO.parallel([files])
                    res[key].append(((store.sectors() - s0) * 512, secs, n))
                finally:
                    if m:
                        m.stop()
            print("rep %d: view %.1f MB fetched in %.2f s; default loader %.1f MB in %.2f s" % (
                rep + 1, res["view"][-1][0] / IO.MB, res["view"][-1][1], res["whole"][-1][0] / IO.MB,
                res["whole"][-1][1]), flush=True)
        pmin, files = IO.page_touch(a.tpfs, src, 2, "1")
    finally:
        store.close()
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v), v[0][2]) for k, v in res.items()}
    print("\nStorage: loop device, %s; page cache dropped before each read; medians of %d; checkpoint %.2f GB "
          "(Llama-like FP16, %d layers, hidden %d)." % (
              "reads limited to %.0f MB/s" % a.rate if store.limited else store.note, len(res["view"]), size / 1e9,
              c["num_hidden_layers"], c["hidden_size"]))
    print("| TP=2, node serving rank 1 | bytes read by the loader | bytes fetched from storage | x page-touch "
          "minimum | time | x default loader's time |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("| page-touch minimum (`tpfs plan --io --ranks 1`) | | %.1f MB | 1.00x | | |" % (pmin / IO.MB))
    for key, label in (("view", "sharded_state on `tpfs mount --view vllm --ranks 1`"),
                       ("whole", "vLLM's default loader (every source file)")):
        f, t, n = med[key]
        print("| %s | %.1f MB | %.1f MB | %.2fx | %.2f s | %.2fx |" % (label, n / IO.MB, f / IO.MB, f / pmin, t,
                                                                      t / med["whole"][1]))


if __name__ == "__main__":
    main()
