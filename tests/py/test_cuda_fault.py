"""A source that fails under the CUDA backend's gather.

The outer mount serves, with --gather cuda, the rank folder of an inner tpfs mount. When the inner
mount's own source is rewritten, the inner daemon fails its reads with EIO, while the file the outer
daemon mapped keeps its size and mtime: the outer daemon's copy of source bytes into the CUDA
staging buffer faults (SIGBUS) inside the gather, with the CUDA module's lock held. The read must
fail with EIO, and later gathers (of another file) must still run: the lock was released.
Exits 77 where no CUDA device is usable. TPFS_FAULT_GATHER=cpu runs the same test on the CPU
backend (for machines without a GPU).
"""
import errno
import os
import random
import shutil
import subprocess
import sys
import tempfile

import fixtures
import tpfs_test as tt

tt.require_fuse()
GATHER = os.environ.get("TPFS_FAULT_GATHER", "cuda")
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-cudafault-")
src = os.path.join(work, "src")
fixtures.make("llama", src)
A, B = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
ALLOW = [r"^tpfs: error: .*: the source changed since it was mounted \(.*\); its rank files now fail with EIO",
         r"^tpfs: info: "]

if GATHER == "cuda":
    probe = tempfile.mkdtemp(prefix="tpfs-cudafault-probe-")
    p = subprocess.run([tt.TPFS, "mount", src, probe, "--tp", "2", "--gather", "cuda"], capture_output=True,
                       text=True, timeout=120)
    if tt.is_mounted(probe):
        subprocess.run(["fusermount3", "-u", "-z", probe])
    os.rmdir(probe)
    if p.returncode != 0:
        print("SKIP: --gather cuda is not usable here: " + p.stderr.strip())
        shutil.rmtree(work)
        sys.exit(tt.SKIP)


def read_file(path):
    """Reads a whole file in a child process (a hang shows as a timeout, not as a stuck test)."""
    try:
        p = subprocess.run([sys.executable, "-c", "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())",
                            path], capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "hung", b""
    if p.returncode == 0:
        return "ok", p.stdout
    return ("eio" if "Input/output error" in p.stderr.decode(errors="replace") else p.stderr.decode()[-200:]), b""


with tt.Mount(src, 1, allow_stderr=ALLOW) as inner:
    with tt.Mount(inner.rank(0), 2, "--gather", GATHER, "--readahead", "0", "--reply", "copy",
                  allow_stderr=ALLOW) as outer:
        before = {}
        for fn in (A, B):
            st, before[fn] = read_file(os.path.join(outer.rank(1), fn))
            F.check(st == "ok", "%s: read before the fault (%s)" % (fn, st))
        stats = open(os.path.join(outer.path, ".tpfs-stats")).read()
        gpu = [l.split() for l in stats.splitlines() if l.startswith("1 ")]
        F.check(GATHER != "cuda" or (gpu and int(gpu[0][-1]) > 0), "the reads went through the CUDA backend: %s" % gpu)
        # the inner source changes in place: the inner daemon now answers EIO, the outer's mapping faults
        with open(os.path.join(src, A), "r+b") as f:
            f.seek(4096)
            f.write(random.Random(1).randbytes(4096))
        # the outer mount's cached pages of its rank file go (a change behind another FUSE mount
        # sends no inotify event, so the outer daemon only learns of it when its mapping faults)
        for r in range(2):
            fd = os.open(os.path.join(outer.rank(r), A), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        st, _ = read_file(os.path.join(outer.rank(1), A))
        F.check(st == "eio", "%s: the read through the faulting source fails with EIO (%s)" % (A, st))
        st, again = read_file(os.path.join(outer.rank(1), B))
        F.check(st == "ok" and again == before[B], "%s: a later gather still runs: the lock was released (%s)" % (B, st))
        st, _ = read_file(os.path.join(outer.rank(0), B))
        F.check(st == "ok", "%s rank 0: served (%s)" % (B, st))
        F.check(outer.proc.poll() is None, "the outer daemon is alive")
        err = outer.stderr()
        F.check("unreadable under its mapping" in err or "shorter than planned" in err,
                "the outer daemon logged the fault: %r" % err[-300:])

shutil.rmtree(work)
F.done("cuda_fault (%s)" % GATHER)
