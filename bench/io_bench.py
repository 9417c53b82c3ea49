"""The slow-storage benchmark (issue 16): bytes a node pulls from storage for the ranks it serves.

The script makes its own slow storage: an ext4 image on a loop device (direct I/O to the image, so
the host's cache of the image does not help), mounted, with a cgroup blkio read limit (cgroup v1
blkio.throttle.read_bps_device, or cgroup v2 io.max) on that device for this process and its
children (the tpfs daemons included). The page cache is dropped before every measurement. On it:
the Llama-like checkpoint of issue 16 (bench/llama_gen.py, about 1 GiB) and pre-sharded copies
of its ranks for T = 2 and 8 (copied from a tpfs mount: the bytes a pre-sharding script writes).

For each T and served-rank set (one node's --ranks), the ranks read their files at once, one
thread per rank, and we count the bytes the loop device read (/sys/block/loopN/stat) and time it:
  - tpfs --ranks SET (the default source reads: no readahead, exact prefetch);
  - tpfs --ranks SET --source-io readahead (the kernel's readahead on the source: before issue 16);
  - (a) every rank reads the whole source files (what engines' default loaders do);
  - (b) every rank reads its files from a pre-sharded copy on the same storage;
against the page-touch minimum of the set (`tpfs plan --io --ranks SET`).

Needs root (loop devices, mounts, cgroups, drop_caches). Called by bench.py; alone:
    scripts/bench.sh --only storage [--smoke] [--storage-rate MBPS]
"""
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import llama_gen

MB = 1e6


def sh(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, **kw).stdout.strip()


def st_files(d):
    return [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".safetensors")]


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_files(paths, buf=1 << 20):
    b = bytearray(buf)
    mv = memoryview(b)
    n = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                k = f.readinto(mv)
                if not k:
                    break
                n += k
    return n


def parallel(lists):
    """Reads each list of files in its own thread (one per rank); returns bytes, seconds."""
    out = [0] * len(lists)

    def one(i):
        out[i] = read_files(lists[i])
    t0 = time.perf_counter()
    th = [threading.Thread(target=one, args=(i,)) for i in range(len(lists))]
    [t.start() for t in th]
    [t.join() for t in th]
    return sum(out), time.perf_counter() - t0


def block_dev(dev):
    """(the name under /sys/block, "major:minor") of block device path DEV."""
    name = os.path.basename(dev)
    with open("/sys/block/%s/dev" % name) as f:
        return name, f.read().strip()


def sectors_of(dev):
    """512-byte sectors read so far from block device path DEV (/sys/block/NAME/stat)."""
    with open("/sys/block/%s/stat" % block_dev(dev)[0]) as f:
        return int(f.read().split()[2])


class SlowStore:
    """An ext4 image on a loop device, mounted, read-limited by a cgroup for this process."""

    def __init__(self, work, size, rate_mbps, iops=0):
        self.img = os.path.join(work, "slow.img")
        self.mnt = os.path.join(work, "slowfs")
        self.loop = self.cg = None
        self.note = ""
        os.makedirs(self.mnt, exist_ok=True)
        with open(self.img, "wb") as f:
            f.truncate(size)
        sh("mkfs.ext4", "-q", "-F", self.img)
        self.loop = sh("losetup", "--direct-io=on", "-f", "--show", self.img)
        sh("mount", self.loop, self.mnt)
        self.rate, self.iops = rate_mbps, iops
        self.limited = False

    def limit(self):
        """Puts this process (and the children it starts from now on) under the read limit."""
        self.limit_devices([self.loop])

    def limit_devices(self, devs):
        """The same for every block device of DEVS (paths), each limited on its own (vllm_nodes.py: one
        device per node over the same image)."""
        bps = int(self.rate * MB)
        majmins = [block_dev(d)[1] for d in devs]
        v1 = "/sys/fs/cgroup/blkio"
        v2 = "/sys/fs/cgroup/unified" if os.path.exists("/sys/fs/cgroup/unified/cgroup.controllers") else "/sys/fs/cgroup"
        if os.path.exists(os.path.join(v1, "blkio.throttle.read_bps_device")):
            self.cg = tempfile.mkdtemp(prefix="tpfs-bench-", dir=v1)
            for mm in majmins:
                with open(os.path.join(self.cg, "blkio.throttle.read_bps_device"), "w") as f:
                    f.write("%s %d\n" % (mm, bps))
                if self.iops:
                    with open(os.path.join(self.cg, "blkio.throttle.read_iops_device"), "w") as f:
                        f.write("%s %d\n" % (mm, self.iops))
            self.root = v1
        elif "io" in open(os.path.join(v2, "cgroup.controllers")).read().split():
            self.cg = tempfile.mkdtemp(prefix="tpfs-bench-", dir=v2)
            for mm in majmins:
                with open(os.path.join(self.cg, "io.max"), "w") as f:
                    f.write("%s rbps=%d%s\n" % (mm, bps, " riops=%d" % self.iops if self.iops else ""))
            self.root = v2
        else:
            self.note = "no cgroup read limit available here: the loop device runs at the disk's speed"
            return
        with open(os.path.join(self.cg, "cgroup.procs"), "w") as f:
            f.write("%d\n" % os.getpid())
        self.limited = True

    def unlimit(self):
        if self.cg:
            try:
                with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
                    f.write("%d\n" % os.getpid())
                os.rmdir(self.cg)
            except OSError as e:
                print("could not remove cgroup %s: %s" % (self.cg, e))
            self.cg = None

    def sectors(self):
        return sectors_of(self.loop)

    def close(self):
        self.unlimit()
        if self.loop:
            subprocess.run(["umount", self.mnt])
            subprocess.run(["losetup", "-d", self.loop])
            self.loop = None
        if os.path.exists(self.img):
            os.unlink(self.img)


class Mount:
    """A foreground tpfs mount for benchmarking (the daemon's pid known, for its RSS): ready_s is the
    seconds until its first served rank folder answered; ranks is --ranks LIST, or None for all.
    These benchmarks measure the read path: push-ahead (on by default) is off unless EXTRA names
    --push."""

    def __init__(self, tpfs, src, T, *extra, ranks=None):
        self.mnt = tempfile.mkdtemp(prefix="tpfs-bench-")
        self.err = tempfile.TemporaryFile(mode="w+")
        self.T = T
        t0 = time.perf_counter()
        cmd = [tpfs, "mount", src, self.mnt, "--tp", str(T), "-f"] + (["--ranks", ranks] if ranks else []) + list(extra)
        cmd += [] if "--push" in extra else ["--push", "off"]
        self.proc = subprocess.Popen(cmd, stderr=self.err)
        end = time.time() + 600
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.time() > end:
                self.err.seek(0)
                raise RuntimeError("tpfs mount failed: " + self.err.read())
            time.sleep(0.02)
        os.stat(self.rank(rank_list(ranks)[0] if ranks else 0))
        self.ready_s = time.perf_counter() - t0

    def rank(self, r):
        return os.path.join(self.mnt, "rank%d" % r)

    def stop(self):
        subprocess.run(["fusermount3", "-u", "-z", self.mnt])
        self.proc.wait(timeout=60)
        os.rmdir(self.mnt)


def wait_push(mnt, timeout=600):
    """Waits until the push-ahead of the mount at MNT has ended (its stats line says done or
    stopped); returns that line."""
    end = time.time() + timeout
    while True:
        line = [l for l in open(os.path.join(mnt, ".tpfs-stats")).read().splitlines() if l.startswith("push:")][0]
        if ", running;" not in line or time.time() > end:
            return line
        time.sleep(0.05)


def rank_list(s):
    out = []
    for part in s.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def page_touch(tpfs, src, T, ranks):
    out = sh(tpfs, "plan", src, "--tp", T, "--io", "--ranks", ranks)
    for line in out.splitlines():
        w = line.split()
        if w and w[0] == "served":
            return int(w[3]), int(w[1])
    raise RuntimeError("no served line in tpfs plan --io")


def run(tpfs, work, smoke=False, reps=3, rate=200.0, iops=0, log=print):
    """Runs the benchmark; returns (markdown lines, rank 0 at T=8 figures)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # so that the storage is taken down
    gen, c = llama_gen.ensure(work, smoke, log)
    size = sum(os.path.getsize(p) for p in st_files(gen))
    store = SlowStore(work, int(size * 3.3) + (256 << 20), rate, iops)
    sets = {2: ["0", "0-1"], 8: ["0", "0-3", "0-7"]}
    res = {}
    try:
        src = os.path.join(store.mnt, "src")
        shutil.copytree(gen, src, ignore=shutil.ignore_patterns(".complete"))
        for T in sets:
            m = Mount(tpfs, gen, T)
            try:
                for r in range(T):
                    shutil.copytree(m.rank(r), os.path.join(store.mnt, "pre%d" % T, "rank%d" % r))
            finally:
                m.stop()
        subprocess.run(["sync"])
        store.limit()
        log("slow storage: %s on %s, %s" % (store.loop, store.mnt, "reads limited to %.0f MB/s%s" % (
            rate, " and %d IOPS" % iops if iops else "") if store.limited else store.note))
        for rep in range(1 if smoke else reps):
            for T, lists in sets.items():
                for ranks in lists:
                    rl = rank_list(ranks)
                    contenders = [
                        ("tpfs", lambda: Mount(tpfs, src, T, ranks=ranks)),
                        ("tpfs_ra", lambda: Mount(tpfs, src, T, "--source-io", "readahead", ranks=ranks)),
                        ("whole", None),
                        ("pre", None),
                    ]
                    for key, mk in contenders:
                        m = mk() if mk else None
                        try:
                            if m:
                                lists_ = [st_files(m.rank(r)) for r in rl]
                            elif key == "whole":
                                lists_ = [st_files(src) for r in rl]
                            else:
                                lists_ = [st_files(os.path.join(store.mnt, "pre%d" % T, "rank%d" % r)) for r in rl]
                            drop_caches()
                            s0 = store.sectors()
                            n, secs = parallel(lists_)
                            fetched = (store.sectors() - s0) * 512
                        finally:
                            if m:
                                m.stop()
                        res.setdefault((T, ranks, key), []).append((fetched, secs, n))
                    log("rep %d T=%d ranks %s: tpfs %.0f MB in %.2f s, before %.0f MB, whole %.0f MB in %.2f s, "
                        "pre-sharded %.0f MB in %.2f s" % (rep + 1, T, ranks, res[(T, ranks, "tpfs")][-1][0] / MB,
                                                          res[(T, ranks, "tpfs")][-1][1], res[(T, ranks, "tpfs_ra")][-1][0] / MB,
                                                          res[(T, ranks, "whole")][-1][0] / MB, res[(T, ranks, "whole")][-1][1],
                                                          res[(T, ranks, "pre")][-1][0] / MB, res[(T, ranks, "pre")][-1][1]))
        mins = {(T, r): page_touch(tpfs, src, T, r) for T, lists in sets.items() for r in lists}
    finally:
        store.close()

    def medians(T, ranks, key):
        v = res[(T, ranks, key)]
        return statistics.median(x[0] for x in v), statistics.median(x[1] for x in v), v[0][2]

    names = {"tpfs": "tpfs `--ranks %s`", "tpfs_ra": "tpfs, kernel readahead on the source (before)",
             "whole": "(a) each rank reads the whole source files", "pre": "(b) each rank reads a pre-sharded copy"}
    lines = ["| T | served ranks | reader | bytes fetched | x page-touch minimum | time to read | x pre-sharded time |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    rank0_t8 = None
    for T, lists in sets.items():
        for ranks in lists:
            pmin, files = mins[(T, ranks)]
            _, t_pre, _ = medians(T, ranks, "pre")
            lines.append("| %d | %s | page-touch minimum (`tpfs plan --io`); rank files %.1f MB | %.1f MB | 1.00x | | |"
                         % (T, ranks, files / MB, pmin / MB))
            for key in ("tpfs", "tpfs_ra", "whole", "pre"):
                f, t, n = medians(T, ranks, key)
                lines.append("| %d | %s | %s | %.1f MB | %.2fx | %.2f s | %.2fx |" % (
                    T, ranks, names[key] % ranks if "%" in names[key] else names[key], f / MB, f / pmin, t, t / t_pre))
                if T == 8 and ranks == "0" and key in ("tpfs", "tpfs_ra"):
                    rank0_t8 = rank0_t8 or {"min": pmin, "files": files}
                    rank0_t8[key] = f
    head = ("Storage: an ext4 image on a loop device (direct I/O), %s; page cache dropped before every "
            "measurement; the ranks of a set read at once (one thread per rank); medians of %d repetitions. "
            "Bytes fetched: sectors read by the loop device. Checkpoint: Llama-like FP16, %s, %.2f GB in 4 files."
            % ("reads limited to %.0f MB/s%s by a cgroup" % (rate, " and %d IOPS" % iops if iops else "") if store.limited
               else store.note, 1 if smoke else reps,
               "%d layers, hidden %d, %d heads x %d, %d KV heads, intermediate %d, vocab %d" % (
                   c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"], c["head_dim"],
                   c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"]), size / 1e9))
    return [head, ""] + lines, rank0_t8
