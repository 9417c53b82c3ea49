"""Two tpfs binaries' read path side by side: is a change's read path slower (issue 47: "measure that reads are
not slower")?

Each repetition mounts SRC with binary A, then binary B (each with --push off, so every byte is a FUSE read that
reaches the daemon; --view VIEW when given), reads every served safetensors file of every rank once with 1 MiB
read() calls (the source cached: a first warm-up read of the source), unmounts, and times the read. The order
alternates between repetitions. Printed: each repetition's seconds, the medians, B's speed as a multiple of
A's (1.00x: the same), and the daemon's CPU seconds (from /proc/PID/stat) of each. The bytes of both must agree
(sha256 of every file, first repetition). Wall time: run it on a quiet machine. No root needed.

python bench/read_ab.py A_TPFS B_TPFS [--src DIR] [--tp T] [--view vllm] [--reps N]
"""
import argparse
import glob
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import io_bench as IO  # noqa: E402
import llama_gen  # noqa: E402


def served(mnt):
    return sorted(glob.glob(os.path.join(mnt, "rank*", "*.safetensors")) +
                  glob.glob(os.path.join(mnt, "model-rank-*.safetensors")))


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        w = f.read().rsplit(")", 1)[1].split()
    return (int(w[11]) + int(w[12])) / os.sysconf("SC_CLK_TCK")


def one(tpfs, src, tp, view, want_digest):
    """Mounts, reads every served file once, unmounts: (seconds, daemon CPU s, {file: sha256} or None)."""
    mnt = tempfile.mkdtemp(prefix="tpfs-ab-")
    extra = ["--view", view] if view else []
    p = subprocess.Popen([tpfs, "mount", src, mnt, "--tp", str(tp), "--push", "off", "-f"] + extra,
                         stderr=subprocess.DEVNULL)
    try:
        end = time.time() + 120
        while not os.path.ismount(mnt):
            if p.poll() is not None or time.time() > end:
                sys.exit("%s: the mount failed" % tpfs)
            time.sleep(0.02)
        files = served(mnt)
        dig = {}
        t0 = time.perf_counter()
        for f in files:
            h = hashlib.sha256() if want_digest else None
            with open(f, "rb", buffering=0) as fh:
                while True:
                    b = fh.read(1 << 20)
                    if not b:
                        break
                    if h:
                        h.update(b)
            if h:
                dig[os.path.relpath(f, mnt)] = h.hexdigest()
        secs = time.perf_counter() - t0
        cpu = cpu_s(p.pid)
        return secs, cpu, dig if want_digest else None
    finally:
        subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
        p.wait(timeout=60)
        os.rmdir(mnt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--src", default=os.path.join(HERE, "..", "build", "bench", "llama-io"))
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--view", default=None)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.src, "config.json")):
        llama_gen.write(a.src, llama_gen.config())
    for f in IO.st_files(a.src):  # the source cached, so that the daemon's read path is what is timed
        with open(f, "rb") as fh:
            while fh.read(1 << 20):
                pass
    res = {"A": [], "B": []}
    cpu = {"A": [], "B": []}
    digests = {}
    for rep in range(a.reps):
        order = ("A", "B") if rep % 2 == 0 else ("B", "A")
        for who in order:
            secs, c, dig = one(a.a if who == "A" else a.b, a.src, a.tp, a.view, rep == 0)
            res[who].append(secs)
            cpu[who].append(c)
            if dig is not None:
                digests[who] = dig
        print("rep %d: A %.3f s, B %.3f s" % (rep + 1, res["A"][-1], res["B"][-1]), flush=True)
    if digests["A"] != digests["B"]:
        sys.exit("the two binaries served different bytes")
    ma, mb = statistics.median(res["A"]), statistics.median(res["B"])
    print("\n| read() of every served file, T=%d%s, --push off | seconds (each repetition) | median | daemon CPU s, median | speed x A |"
          % (a.tp, ", --view " + a.view if a.view else ""))
    print("| --- | --- | --- | --- | --- |")
    for who, path, m in (("A", a.a, ma), ("B", a.b, mb)):
        print("| %s (%s) | %s | %.3f s | %.2f | %.2fx |" % (who, path, " / ".join("%.3f" % x for x in res[who]), m,
                                                           statistics.median(cpu[who]), ma / m))
    print("Same bytes: %d files. Command: python bench/read_ab.py A B --tp %d%s --reps %d" % (
        len(digests["A"]), a.tp, " --view " + a.view if a.view else "", a.reps))


if __name__ == "__main__":
    main()
