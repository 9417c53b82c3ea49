"""Concurrency. 16 reader threads do random-offset, random-length reads (read() and mmap)
over every rank file of a 4-rank mount for a bounded time (TPFS_STRESS_SECONDS, default 8),
dropping the kernel's cached pages now and then so that the daemon serves them again (each mmap
lives for one read: pages mapped anywhere are not dropped), with the push (default on) racing them, and compare
every byte with the reference; then the daemon is stopped (SIGTERM) while reads are in flight and
must unmount cleanly. Prints the number of reads and of mismatches (must be 0)."""
import mmap
import os
import random
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np
from safetensors.numpy import load

import fixtures
import reference as R
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
SECONDS = float(os.environ.get("TPFS_STRESS_SECONDS", "8"))
work = tempfile.mkdtemp(prefix="tpfs-stress-")
src = os.path.join(work, "m")
c = dict(model_type="llama", hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
         intermediate_size=1536, vocab_size=4096, num_hidden_layers=3)
b = fixtures.Builder(7)
b.add("model.embed_tokens.weight", 4096, 512)
for i in range(3):
    p = "model.layers.%d." % i
    fixtures._gqa(b, p, c)
    fixtures._mlp(b, p, 512, 1536)
    fixtures._norms(b, p, 512)
b.add("model.norm.weight", 512)
b.add("lm_head.weight", 4096, 512)
fixtures.save(src, c, b.t, nfiles=3)
T = 4

err = tempfile.TemporaryFile(mode="w+")
mnt = tempfile.mkdtemp(prefix="tpfs-stress-mnt-")
proc = subprocess.Popen([tt.TPFS, "mount", src, mnt, "--tp", str(T), "-f"], stderr=err)
tt.wait_for(lambda: tt.is_mounted(mnt), what="mount")
try:
    files = [os.path.join(mnt, "rank%d" % r, fn) for r in range(T) for fn in sorted(os.listdir(src)) if fn.endswith(".safetensors")]
    ref = {}
    for path in files:
        data = open(path, "rb").read()
        r = int(path.split("rank")[1].split("/")[0])
        for k, v in load(data).items():  # the reference bytes are checked against the numpy reference first
            F.check(np.array_equal(v, R.expected("llama", c, k, b.t[k], T, r)), "%s %s matches the reference" % (path, k))
        ref[path] = data
    total = sum(len(v) for v in ref.values())
    stop = time.time() + SECONDS
    counts = {"reads": 0, "mismatches": 0, "bytes": 0, "drops": 0}
    lock = threading.Lock()

    def reader(seed):
        rng = random.Random(seed)
        fds = {p: os.open(p, os.O_RDONLY) for p in files}
        n = bad = nb = drops = 0
        while time.time() < stop:
            p = rng.choice(files)
            size = len(ref[p])
            off = rng.randrange(size)
            ln = rng.choice([1, 7, 4096, 65536, 1 << 20, rng.randrange(1, 3 << 20)])
            if rng.random() < 0.02:
                os.posix_fadvise(fds[p], 0, 0, os.POSIX_FADV_DONTNEED)
                drops += 1
            if rng.random() < 0.5:
                # mapped only for this read: DONTNEED leaves mapped pages in the cache, so a
                # mapping kept open would pin every page it touched and the drops would stop working
                with mmap.mmap(fds[p], 0, prot=mmap.PROT_READ) as m:
                    got = m[off:off + ln]
            else:
                got = os.pread(fds[p], ln, off)
            n += 1
            nb += len(got)
            if got != ref[p][off:off + ln]:
                bad += 1
        for p in files:
            os.close(fds[p])
        with lock:
            counts["reads"] += n
            counts["mismatches"] += bad
            counts["bytes"] += nb
            counts["drops"] += drops

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("stress: %d reads (%.1f MiB, %d cache drops) over %d rank files (%.1f MiB) by 16 threads in %.0f s, %d mismatches"
          % (counts["reads"], counts["bytes"] / 2 ** 20, counts["drops"], len(files), total / 2 ** 20, SECONDS, counts["mismatches"]))
    F.check(counts["mismatches"] == 0, "no mismatches")
    F.check(counts["reads"] > 1000, "enough reads were done")
    stats = tt.tpfs("stats", mnt).stdout
    served = sum(int(l.split()[3]) for l in stats.splitlines() if l[:1].isdigit())
    print("stress: the daemon served %d of those reads itself (the rest came from the page cache)" % served)
    F.check(served > 100, "the daemon served reads itself: %s" % stats)

    # SIGTERM with reads in flight
    inflight = threading.Event()
    errors = []

    def busy():
        fd = os.open(files[0], os.O_RDONLY)
        try:
            while True:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.pread(fd, 1 << 20, 0)
                inflight.set()
        except OSError as e:
            errors.append(e.errno)
        finally:
            os.close(fd)

    busy_threads = [threading.Thread(target=busy) for _ in range(4)]
    for t in busy_threads:
        t.start()
    inflight.wait(10)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    for t in busy_threads:
        t.join(timeout=30)
    F.check(rc == 0, "SIGTERM with reads in flight: the daemon exits 0 (got %s)" % rc)
    F.check(not tt.is_mounted(mnt), "SIGTERM with reads in flight: nothing left mounted")
    F.check(all(not t.is_alive() for t in busy_threads), "in-flight readers return (errors: %s)" % sorted(set(errors)))
finally:
    if tt.is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", mnt])
    if proc.poll() is None:
        proc.kill()
    err.seek(0)
    e = err.read()
    bad = [l for l in e.splitlines() if l and not l.startswith("tpfs: info:")]
    F.check(not bad, "clean daemon stderr: %s" % bad)
F.done("test_stress")
