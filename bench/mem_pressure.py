"""Memory pressure (issue 50, item 5): readers of a tpfs mount inside a memory cgroup whose limit is smaller
than the bytes the node serves, with the source's page cache dropped at random moments, for a given time.

Where the daemon runs, decided: INSIDE the cgroup, beside the readers. That is the realistic case, one
container (one cgroup) holding the engine and the tpfs it mounts (the vLLM plugin starts tpfs from the
engine's own workers), and the hard one: everything the daemon does is charged to the limit the readers
live under. The source pages it faults in are charged to that cgroup, and so are the pages the push stores
with fuse_lowlevel_notify_store (the kernel allocates them for the daemon's write to /dev/fuse), while a
reader's page-cache pages of the served files are charged to the reader. A daemon outside the cgroup would
hide both charges from the limit (and the pushed pages could then fill memory the container was never
given). So under one limit: the readers' cached rank pages, the pushed pages and the source pages compete,
and the kernel reclaims them (all are clean page cache, re-read on demand); what it cannot reclaim is
anonymous memory. When that passes the limit the cgroup's OOM killer picks the process with the largest
score in the cgroup, and the daemon, whose death fails every reader of the mount, must never be that one:
tpfs lowers its own oom_score_adj at mount where it may (fs_session.c: it needs CAP_SYS_RESOURCE, which
this machine's root lacks, as a container's root by default). `--hog N` runs N processes that each take
--hog-size of anonymous memory and then grow by half of it and shrink again (an engine's own processes and
their growth), so that OOM kills do happen; the killed are restarted. With hogs larger than the daemon the
kernel takes hogs; with hogs smaller than it (--hog 10 --hog-size 6M --hog-from-nothing: each grows from
its Python's 14 MiB to 20 MiB, the daemon is 20-35 MiB while it serves) only the lowered score keeps the
daemon alive: without it the kernel killed the daemon within seconds here (docs/PERFORMANCE.md).

What runs, for --seconds (default 300):
- a Llama-like checkpoint of about --size bytes (F32, random, several files) written to --work (a disk
  folder: on tmpfs the source pages are shared memory and cannot be dropped) and mounted at --tp ranks
  (hf view: every rank folder served), with --push SIZE|auto|off (default off; with the push on, the
  readers start once it has stored its budget, as an engine opens its files after starting up);
- the reference: for every served file, the bytes the rules say it holds (tests/py/reference.py's numpy
  slices of the source tensors, placed at the offsets of the served header, whose names, dtypes, shapes
  and offsets are checked against those slices first), written to files beside the checkpoint before
  the readers start, outside the cgroup: readers compare with those files, so they need no numpy and
  stay small;
- --readers processes in the cgroup, each looping over random served files and random ways of reading
  them: pread of a random range, a random range of an mmap, the whole file by read() in random chunk
  sizes, the whole file through mmap; every byte compared with the reference; a reader killed (by the
  OOM killer, or by SIGBUS from an mmap read that failed) is counted and restarted;
- a dropper: at random moments (every 0.1-1.5 s) POSIX_FADV_DONTNEED on every source file, on a random
  range of one, or on a served file of the mount (which drops its pages, pushed ones included);
- a monitor: the daemon's /proc status (VmRSS, RssAnon, RssFile; VmHWM at the end is the kernel's own peak)
  and the cgroup's counters; at the end, the kernel log's OOM kills in the cgroup, by kind of victim
  (daemon, reader, hog), where dmesg may be read.

Printed at the end (and written as JSON with --json FILE): reads, bytes compared, byte mismatches, errors by
kind, readers killed and how, OOM kills of the cgroup (v1 memory.oom_control oom_kill, memory.failcnt,
which this machine's kernel leaves at 0 even as usage meets the limit; v2 memory.events), the daemon's peak RSS and oom_score_adj, whether it survived (alive at the end, exit
0 at unmount). Exit status: 0 when every byte matched, no read failed and the daemon survived; 1 otherwise;
77 when no memory cgroup can be created here (not root; no memory controller, or, on cgroup v2, none
that can be enabled below this process's own cgroup: the "no internal processes" rule).

Cgroups: v1 (a child of this process's memory cgroup, memory.limit_in_bytes) and v2 (a child of this
process's cgroup when the memory controller is or can be enabled there: memory.max, memory.swap.max 0).
v2 was written to the kernel's documented interface but not run: this machine's memory controller is
bound to v1. Needs root.

python bench/mem_pressure.py [--seconds N] [--size SIZE] [--limit SIZE] [--tp T] [--readers N]
    [--push SIZE|auto|off] [--hog N] [--hog-size SIZE] [--hog-from-nothing] [--work DIR] [--keep]
    [--json FILE] [--seed S]
"""
import argparse
import errno
import json
import mmap
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "py")
MiB = 1 << 20


def parse_size(s):
    """'192M', '1G', '4096' -> bytes."""
    s = s.strip().upper()
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mul)


# ---------------------------------------------------------------- the reader and the hog (in the cgroup)

def reader(spec):
    """One reader process: until spec['until'], random reads of random served files compared with their
    reference files. Prints 'S {counters}' every half second and at the end, 'M {detail}' for each
    mismatch at once (a kill loses at most half a second of counts, never a mismatch)."""
    rnd = random.Random(spec["seed"])
    files = spec["files"]  # [[served path, reference path, size]]
    c = {"reads": 0, "bytes": 0, "mismatched_bytes": 0, "mismatched_reads": 0, "errors": {}, "ops": {}}
    last = [0.0]

    def report(force=False):
        now = time.time()
        if force or now - last[0] >= 0.5:
            print("S " + json.dumps(c), flush=True)
            last[0] = now

    def compare(what, path, ref_fd, off, got):
        want = os.pread(ref_fd, len(got), off)
        c["reads"] += 1
        c["bytes"] += len(got)
        if got != want:
            n = len(want) - len(got) if len(got) < len(want) else 0
            n += sum(1 for a, b in zip(got, want) if a != b)
            c["mismatched_bytes"] += max(n, 1)
            c["mismatched_reads"] += 1
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            print("M " + json.dumps({"file": path, "op": what, "off": off, "len": len(want), "got": len(got),
                                     "bad": n, "first": off + first}), flush=True)

    def error(what, e):
        k = "%s %s" % (what, errno.errorcode.get(e.errno, str(e.errno)) if isinstance(e, OSError) else type(e).__name__)
        c["errors"][k] = c["errors"].get(k, 0) + 1
        print("E " + json.dumps({"op": what, "error": str(e)}), flush=True)

    refs = {}
    while time.time() < spec["until"]:
        path, ref, size = rnd.choice(files)
        if ref not in refs:
            refs[ref] = os.open(ref, os.O_RDONLY)
        rfd = refs[ref]
        op = rnd.choice(["pread", "mmap-range", "read-whole", "mmap-whole"])
        c["ops"][op] = c["ops"].get(op, 0) + 1
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            error(op + " open", e)
            continue
        try:
            if op in ("pread", "mmap-range"):
                off = rnd.randrange(size)
                ln = min(size - off, int(2 ** rnd.uniform(0, 22)))  # 1 B .. 4 MiB, log-uniform
                if op == "pread":
                    compare(op, path, rfd, off, os.pread(fd, ln, off))
                else:
                    with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
                        compare(op, path, rfd, off, m[off:off + ln])
            elif op == "read-whole":
                step, off = rnd.choice([4096, 65536 + 17, MiB, 3 * MiB + 5]), 0
                while off < size and time.time() < spec["until"]:
                    got = os.read(fd, step)
                    if not got:  # short: the reference has bytes here
                        c["mismatched_bytes"] += size - off
                        c["mismatched_reads"] += 1
                        print("M " + json.dumps({"file": path, "op": op, "off": off, "short": size - off}), flush=True)
                        break
                    compare(op, path, rfd, off, got)
                    off += len(got)
            else:
                with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
                    for off in range(0, size, 4 * MiB):
                        if time.time() >= spec["until"]:
                            break
                        compare(op, path, rfd, off, m[off:off + 4 * MiB])
        except OSError as e:
            error(op, e)
        finally:
            os.close(fd)
        report()
    report(force=True)


def hog(spec):
    """One hog process, an engine's process in small: takes spec['size'] of anonymous memory at once (every
    byte written) and holds it; then, again and again until spec['until'], grows by half that in 1 MiB steps,
    holds it a random while and gives the growth back. Its growth is what pushes the cgroup past its limit.
    With spec['from_nothing'] it takes nothing at first and grows to spec['size'] each time: many such
    hogs are small processes at any moment (the case where the daemon is the largest)."""
    rnd = random.Random(spec["seed"])
    grows = spec["size"] if spec.get("from_nothing") else spec["size"] // 2  # --hog-from-nothing: no base
    base = [] if spec.get("from_nothing") else [bytearray(os.urandom(16)) * (MiB // 16) for _ in range(spec["size"] // MiB)]
    while time.time() < spec["until"]:
        grow = []
        while len(grow) * MiB < grows and time.time() < spec["until"]:
            grow.append(bytearray(os.urandom(16)) * (MiB // 16))
            time.sleep(0.01)
        time.sleep(rnd.uniform(0.2, 1.5))
        del grow
        time.sleep(rnd.uniform(0.05, 0.5))
    del base


# ---------------------------------------------------------------- the memory cgroup

class Unavailable(Exception):
    """No memory cgroup can be made here (the reason)."""


def own_cgroup(key):
    """This process's cgroup path in the hierarchy whose /proc/self/cgroup controller field is key
    ('memory' for v1, '' for v2), or None."""
    for line in open("/proc/self/cgroup"):
        _, ctl, path = line.rstrip("\n").split(":", 2)
        if ctl == key or (key and key in ctl.split(",")):
            return path
    return None


def cgroup_mount(fstype, option=None):
    """(mount point, root within the hierarchy) of the first mount of fstype ('cgroup' with the super option
    option, or 'cgroup2'), from /proc/self/mountinfo; None when there is none."""
    for line in open("/proc/self/mountinfo"):
        pre, post = line.rstrip("\n").split(" - ", 1)
        f = pre.split()
        t, _, sopts = post.split()[:3]
        if t == fstype and (option is None or option in sopts.split(",")):
            return f[4], f[3]
    return None


class MemCgroup:
    """A child memory cgroup with a limit, for the processes started through wrap()."""

    def __init__(self, limit):
        self.limit, self.v = limit, None
        if os.geteuid() != 0:
            raise Unavailable("not root: a memory cgroup cannot be created")
        name = "tpfs-mem-%d" % os.getpid()
        m1, path1 = cgroup_mount("cgroup", "memory"), own_cgroup("memory")
        if m1 and path1 is not None:
            base = os.path.join(m1[0], os.path.relpath(path1, m1[1]) if path1.startswith(m1[1]) else path1.lstrip("/"))
            self.dir, self.v = os.path.normpath(os.path.join(base, name)), 1
            try:
                os.mkdir(self.dir)
                self._write("memory.limit_in_bytes", limit)
                if os.path.exists(os.path.join(self.dir, "memory.memsw.limit_in_bytes")):
                    self._write("memory.memsw.limit_in_bytes", limit)  # no swap to escape to
            except OSError as e:
                self.remove()
                raise Unavailable("cgroup v1: cannot create %s with a memory limit: %s" % (self.dir, e))
            return
        m2, path2 = cgroup_mount("cgroup2"), own_cgroup("")
        if not m2 or path2 is None:
            raise Unavailable("no memory cgroup controller is mounted (neither a v1 'memory' hierarchy nor cgroup2)")
        base = os.path.normpath(os.path.join(m2[0], path2.lstrip("/")))
        if "memory" not in open(os.path.join(base, "cgroup.controllers")).read().split():
            raise Unavailable("cgroup v2: the memory controller is not available in %s" % base)
        if "memory" not in open(os.path.join(base, "cgroup.subtree_control")).read().split():
            try:
                with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory")
            except OSError as e:
                raise Unavailable("cgroup v2: cannot enable the memory controller below %s (%s: a cgroup that holds "
                                  "processes cannot delegate it; run this from a cgroup of its own)" % (base, e))
        self.dir, self.v = os.path.join(base, name), 2
        try:
            os.mkdir(self.dir)
            self._write("memory.max", limit)
            if os.path.exists(os.path.join(self.dir, "memory.swap.max")):
                self._write("memory.swap.max", 0)
        except OSError as e:
            self.remove()
            raise Unavailable("cgroup v2: cannot create %s with a memory limit: %s" % (self.dir, e))

    def _write(self, name, value):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(str(value))

    def _read(self, name):
        try:
            with open(os.path.join(self.dir, name)) as f:
                return f.read()
        except OSError:
            return ""

    def wrap(self):
        """A command prefix that moves the process into the cgroup before it runs the command (so its
        first allocation is charged there): sh writes its own PID, then execs."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(self.dir, "cgroup.procs")]

    def counters(self):
        """{usage, peak, failcnt, oom, oom_kill, ...} as this cgroup version says them."""
        out = {}
        if self.v == 1:
            for k, f in (("usage", "memory.usage_in_bytes"), ("peak", "memory.max_usage_in_bytes"),
                         ("failcnt", "memory.failcnt")):
                v = self._read(f).strip()
                out[k] = int(v) if v else None
            for line in self._read("memory.oom_control").splitlines():
                k, v = line.split()
                out[k] = int(v)
            for line in self._read("memory.stat").splitlines():
                k, v = line.split()
                if k in ("cache", "rss", "mapped_file"):
                    out["stat_" + k] = int(v)
        else:
            v = self._read("memory.current").strip()
            out["usage"] = int(v) if v else None
            v = self._read("memory.peak").strip()
            out["peak"] = int(v) if v else None
            for line in self._read("memory.events").splitlines():
                k, v = line.split()
                out[k] = int(v)
            for line in self._read("memory.stat").splitlines():
                k, v = line.split()
                if k in ("anon", "file", "file_mapped"):
                    out["stat_" + k] = int(v)
        return out

    def procs(self):
        return [int(p) for p in self._read("cgroup.procs").split()]

    def remove(self):
        """Removes the cgroup (its processes must have ended; waits a little for the last ones)."""
        if not getattr(self, "dir", None) or not os.path.isdir(self.dir):
            return
        for _ in range(100):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.05)
        print("could not remove cgroup %s" % self.dir, file=sys.stderr)


# ---------------------------------------------------------------- the checkpoint and its reference

DIMS = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64, intermediate_size=2048,
            vocab_size=8192)


def make_checkpoint(src, size, seed):
    """A Llama-like F32 checkpoint of about size bytes (layers added until it is reached) in src, over
    one file per ~64 MiB (at least 2). Returns (config, {name: array})."""
    sys.path.insert(0, TESTS)
    import fixtures
    import numpy as np
    c = dict(model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=False, tie_word_embeddings=False,
             rms_norm_eps=1e-6, **DIMS)
    D, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    per_layer = 4 * (2 * D * 8 * 64 + 2 * D * 4 * 64 + 3 * D * I + 2 * D)
    c["num_hidden_layers"] = max(1, (size - 4 * 2 * V * D) // per_layer)
    b = fixtures.Builder(seed)
    b.rng = np.random.default_rng(seed)
    b.add("model.embed_tokens.weight", V, D)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        fixtures._gqa(b, p, c)
        fixtures._mlp(b, p, D, I)
        fixtures._norms(b, p, D)
    b.add("model.norm.weight", D)
    b.add("lm_head.weight", V, D)
    total = sum(a.nbytes for a in b.t.values())
    fixtures.save(src, c, b.t, nfiles=max(2, total // (64 * MiB)))
    return c, b.t


def write_references(mnt, src, refdir, config, full, T):
    """For every served safetensors file of every rank: its header read through the mount, checked
    against the rules' slices (reference.py: the same names as the source file, each tensor's dtype,
    shape and byte count; the offsets tile the data), and a reference file of the header and the slices
    at their offsets. Returns [[path under mnt, reference path, size]]; raises AssertionError on a header
    that disagrees (the served bytes would be checked against a wrong reference)."""
    sys.path.insert(0, TESTS)
    import reference
    import tpfs_test as tt
    out = []
    os.makedirs(refdir, exist_ok=True)
    for r in range(T):
        rd = os.path.join(mnt, "rank%d" % r)
        for fn in sorted(f for f in os.listdir(rd) if f.endswith(".safetensors")):
            path = os.path.join(rd, fn)
            base, hdr = tt.read_header(path)
            _, src_hdr = tt.read_header(os.path.join(src, fn))
            assert sorted(hdr) == sorted(src_hdr), "%s: tensors differ from the source file's" % path
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                head = f.read(base)
            ref = os.path.join(refdir, "rank%d-%s" % (r, fn))
            at = base
            with open(ref, "wb") as f:
                f.write(head)
                for name in sorted(hdr, key=lambda n: hdr[n]["data_offsets"][0]):
                    want = reference.expected("llama", config, name, full[name], T, r)
                    e = hdr[name]
                    b, end = e["data_offsets"]
                    assert e["dtype"] == "F32" and tuple(e["shape"]) == want.shape and end - b == want.nbytes, \
                        "%s: %s is %s %s, the rules say F32 %s" % (path, name, e["dtype"], e["shape"], want.shape)
                    assert base + b == at, "%s: %s starts at %d, not at %d" % (path, name, base + b, at)
                    f.write(want.tobytes())
                    at += want.nbytes
            assert at == size, "%s: the tensors end at %d, the file at %d" % (path, at, size)
            out.append([os.path.relpath(path, mnt), ref, size])
    return out


# ---------------------------------------------------------------- the run

def proc_status(pid):
    """{VmRSS, VmHWM, RssAnon, RssFile, ...} of pid in bytes, or {} once it has gone."""
    out = {}
    try:
        for line in open("/proc/%d/status" % pid):
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "Threads"):
                w = v.split()
                out[k] = int(w[0]) * (1024 if len(w) > 1 else 1)
    except OSError:
        pass
    return out


def read_int(path):
    try:
        return int(open(path).read().strip())
    except (OSError, ValueError):
        return None


def oom_victims(cgdir, since, kinds):
    """[(victim name, pid, kind, oom_score_adj)] and {invoker name: OOMs it triggered} of the kernel log's
    OOM kills in the cgroup named by cgdir's last component, after the log's timestamp since (seconds);
    (None, None) where the log cannot be read (dmesg restricted). kinds: {pid: 'daemon', 'reader', ...}."""
    p = subprocess.run(["dmesg"], capture_output=True, text=True)
    if p.returncode != 0:
        return None, None
    name = "/" + os.path.basename(cgdir)
    victims, invokers, invoker = [], {}, None
    for line in p.stdout.splitlines():
        m = re.match(r"\[\s*([0-9.]+)\]\s*(.*)", line)
        if not m or float(m.group(1)) < since - 1:
            continue
        text = m.group(2)
        i = re.match(r"(\S+) invoked oom-killer:", text)
        if i:
            invoker = i.group(1)
        k = re.search(r"oom_memcg=(\S+?),task_memcg=\S+,task=(\S+),pid=(\d+)", text)
        if k and k.group(1).endswith(name):
            invokers[invoker] = invokers.get(invoker, 0) + 1
        v = re.search(r"Memory cgroup out of memory: Killed process (\d+) \((.*?)\).*oom_score_adj:(-?\d+)", text)
        if v:
            pid = int(v.group(1))
            if pid in kinds:
                victims.append((v.group(2), pid, kinds[pid], int(v.group(3))))
    return victims, invokers


def uptime():
    return float(open("/proc/uptime").read().split()[0])


PIDS = {}  # pid -> 'daemon', 'reader' or 'hog': every process this run put in the cgroup


class Child:
    """A reader or hog in the cgroup, restarted when it dies before the end."""

    def __init__(self, kind, cg, spec, log):
        self.kind, self.cg, self.spec, self.log = kind, cg, spec, log
        self.proc, self.last, self.done = None, {}, []
        self.deaths = {}
        self.reaped = set()  # pids counted already
        self.lock = threading.Lock()

    def start(self):
        cmd = self.cg.wrap() + [sys.executable, os.path.abspath(__file__), "--" + self.kind, json.dumps(self.spec)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        PIDS[self.proc.pid] = self.kind
        self.last = {}
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()

    def _drain(self, proc):
        for line in proc.stdout:
            tag, _, body = line.rstrip("\n").partition(" ")
            if tag == "S":
                with self.lock:
                    self.last = json.loads(body)
            elif tag in ("M", "E"):
                self.log(tag, self.kind, body)
            elif line.strip():
                self.log("O", self.kind, line.rstrip("\n"))

    def reap(self, until):
        """Restarts the child if it died before `until`; returns True while it runs."""
        rc = self.proc.poll()
        if rc is None:
            return True
        if self.proc.pid in self.reaped:
            return False
        self.reaped.add(self.proc.pid)
        time.sleep(0.05)  # its last lines
        with self.lock:
            self.done.append(self.last)
        if rc != 0:
            why = "SIGKILL" if rc == -signal.SIGKILL else "SIGBUS" if rc == -signal.SIGBUS else "exit %d" % rc
            self.deaths[why] = self.deaths.get(why, 0) + 1
        if time.time() < until - 0.5:
            time.sleep(0.1)
            self.start()
            return True
        return False

    def totals(self):
        with self.lock:
            return self.done + [self.last]


def run(a):
    sys.path.insert(0, TESTS)
    import tpfs_test as tt
    limit = parse_size(a.limit)
    cg = MemCgroup(limit)  # first: a machine without one learns it before the checkpoint is written
    result = {"cgroup": "v%d %s" % (cg.v, cg.dir), "limit": limit}
    work = a.work or os.path.join(HERE, "..", "build", "mem-pressure")
    src, refdir = os.path.join(work, "src"), os.path.join(work, "ref")
    fstype = subprocess.run(["stat", "-f", "-c", "%T", os.path.dirname(os.path.abspath(work))], capture_output=True,
                            text=True).stdout.strip()
    note = []
    if fstype == "tmpfs":
        note.append("the work folder is on tmpfs: source pages are shared memory, the drops do nothing")
    log_lines, log_lock = [], threading.Lock()

    def log(tag, kind, body):
        with log_lock:
            log_lines.append((tag, kind, body))
            if len([1 for t in log_lines if t[0] == tag]) <= 10:
                print("%s %s: %s" % ({"M": "MISMATCH", "E": "ERROR", "O": "output"}[tag], kind, body), flush=True)

    mount = None
    children = []
    try:
        shutil.rmtree(work, ignore_errors=True)
        t0 = time.time()
        config, full = make_checkpoint(src, parse_size(a.size), a.seed)
        src_files = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".safetensors"))
        src_bytes = sum(os.path.getsize(f) for f in src_files)
        print("checkpoint: %d files, %.0f MiB, %d layers (%.1f s)" % (len(src_files), src_bytes / MiB,
                                                                       config["num_hidden_layers"], time.time() - t0))
        # the reference, from a mount outside the cgroup (no push: the headers only are read)
        with tt.Mount(src, a.tp, "--push", "off") as m:
            files = write_references(m.path, src, refdir, config, full, a.tp)
        del full
        served = sum(f[2] for f in files)
        result.update(src_bytes=src_bytes, served_bytes=served, files=len(files), tp=a.tp, push=a.push,
                      readers=a.readers, hogs=a.hog, hog_size=parse_size(a.hog_size), seconds=a.seconds,
                      hog_from_nothing=a.hog_from_nothing)
        print("reference: %d served files, %.0f MiB (cgroup limit %.0f MiB: %.1fx smaller)"
              % (len(files), served / MiB, limit / MiB, served / limit))
        if served <= limit:
            note.append("the served bytes (%d) do not exceed the limit (%d)" % (served, limit))
        for f in src_files:
            tt.drop_cache(f)  # from now on the source pages are charged to the cgroup that reads them
        for f in files:
            tt.drop_cache(f[1])

        # the daemon, in the cgroup
        since = uptime()
        mount = tt.Mount(src, a.tp, "--push", a.push)
        mount.wrap = cg.wrap()
        mount.__enter__()
        pid = mount.proc.pid
        PIDS[pid] = "daemon"
        files = [[os.path.join(mount.path, rel), ref, size] for rel, ref, size in files]
        result["oom_score_adj"] = read_int("/proc/%d/oom_score_adj" % pid)
        print("daemon %d in %s, oom_score_adj %s" % (pid, cg.dir, result["oom_score_adj"]))
        if a.push != "off":  # the push fills the cache while an engine would start: the readers come after it
            t1, pushed0 = time.time(), None
            while time.time() < t1 + 60:
                line = [l.split() for l in open(os.path.join(mount.path, ".tpfs-stats")).read().splitlines()
                        if l.startswith("push: pushed ")]
                pushed0, budget0 = (int(line[0][2]), int(line[0][4])) if line else (None, None)
                if pushed0 is not None and (pushed0 >= min(budget0, served) - 4 * MiB):
                    break
                time.sleep(0.1)
            print("pushed %s MiB of a budget of %s MiB before the readers started (%.1f s)"
                  % (pushed0 and pushed0 // MiB, budget0 and budget0 // MiB, time.time() - t1))
        until = time.time() + a.seconds
        for i in range(a.readers):
            ch = Child("reader", cg, {"seed": a.seed * 1000 + i, "files": files, "until": until}, log)
            ch.start()
            children.append(ch)
        for i in range(a.hog):
            ch = Child("hog", cg, {"seed": a.seed * 1000 + 500 + i, "size": parse_size(a.hog_size), "until": until,
                                   "from_nothing": a.hog_from_nothing}, log)
            ch.start()
            children.append(ch)

        drops = {"source": 0, "source-range": 0, "served": 0}
        samples = {"rss_max": 0, "anon_max": 0, "file_max": 0, "usage_max": 0}
        rnd = random.Random(a.seed)
        next_drop = time.time() + rnd.uniform(0.1, 1.5)
        dead_at = None
        while time.time() < until:
            time.sleep(0.05)
            st = proc_status(pid)
            if mount.proc.poll() is not None and dead_at is None:
                dead_at = time.time() - (until - a.seconds)
                print("the daemon exited (%s) %.1f s into the run" % (mount.proc.returncode, dead_at), flush=True)
            samples["rss_max"] = max(samples["rss_max"], st.get("VmRSS", 0))
            samples["anon_max"] = max(samples["anon_max"], st.get("RssAnon", 0))
            samples["file_max"] = max(samples["file_max"], st.get("RssFile", 0))
            samples["usage_max"] = max(samples["usage_max"], cg.counters().get("usage") or 0)
            if st.get("VmHWM"):
                samples["hwm"] = st["VmHWM"]
            for ch in children:
                ch.reap(until)
            if time.time() >= next_drop:
                next_drop = time.time() + rnd.uniform(0.1, 1.5)
                what = rnd.choice(["source", "source", "source-range", "served"])
                try:
                    if what == "source":
                        for f in src_files:
                            tt.drop_cache(f)
                    elif what == "source-range":
                        f = rnd.choice(src_files)
                        fd = os.open(f, os.O_RDONLY)
                        sz = os.path.getsize(f)
                        off = rnd.randrange(sz)
                        os.posix_fadvise(fd, off, rnd.randrange(1, sz - off + 1), os.POSIX_FADV_DONTNEED)
                        os.close(fd)
                    else:
                        fd = os.open(rnd.choice(files)[0], os.O_RDONLY)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        os.close(fd)
                    drops[what] += 1
                except OSError as e:
                    drops["failed"] = drops.get("failed", 0) + 1
                    if drops["failed"] <= 3:
                        print("drop of %s failed: %s" % (what, e))
        # the end: the readers finish their current read (they watch the same deadline)
        end = time.time() + 60
        while any(ch.reap(0) for ch in children) and time.time() < end:
            time.sleep(0.05)
        for ch in children:
            if ch.proc.poll() is None:
                ch.proc.kill()
                ch.reap(0)
        st = proc_status(pid)
        alive = mount.proc.poll() is None
        stats_text = ""
        if alive:
            try:
                stats_text = open(os.path.join(mount.path, ".tpfs-stats")).read()
            except OSError as e:
                stats_text = "unreadable: %s" % e
        counters = cg.counters()
        mount.cleanup()
        rc = mount.proc.returncode
        unexpected = [l for l in mount.stderr().splitlines() if l and not any(p.search(l) for p in tt.ALLOWED_STDERR)]

        readers = [t for ch in children if ch.kind == "reader" for t in ch.totals() if t]
        tot = {k: sum(t.get(k, 0) for t in readers) for k in ("reads", "bytes", "mismatched_bytes", "mismatched_reads")}
        errors, ops = {}, {}
        for t in readers:
            for k, v in t.get("errors", {}).items():
                errors[k] = errors.get(k, 0) + v
            for k, v in t.get("ops", {}).items():
                ops[k] = ops.get(k, 0) + v
        deaths = {}
        for ch in children:
            for k, v in ch.deaths.items():
                deaths["%s %s" % (ch.kind, k)] = deaths.get("%s %s" % (ch.kind, k), 0) + v
        pushed = budget = None
        oom_note = None
        for line in stats_text.splitlines():
            w = line.split()
            if w[:1] == ["push:"] and len(w) > 4 and w[1] == "pushed":
                pushed, budget = int(w[2]), int(w[4])
            if line.startswith("oom_score_adj: "):
                oom_note = line[len("oom_score_adj: "):]
        result.update(tot, errors=errors, ops=ops, deaths=deaths, drops=drops, cgroup_counters=counters,
                      daemon_peak_rss=st.get("VmHWM", samples.get("hwm")), daemon_rss_sampled_max=samples["rss_max"],
                      daemon_anon_sampled_max=samples["anon_max"], daemon_file_sampled_max=samples["file_max"],
                      cgroup_usage_sampled_max=samples["usage_max"], daemon_alive=alive, daemon_exit=rc,
                      daemon_died_at=dead_at, daemon_unexpected_stderr=unexpected[:10], pushed=pushed,
                      push_budget=budget, oom_note=oom_note, daemon_stderr=mount.stderr().splitlines()[:20],
                      stats_served=sum(int(l.split()[1]) for l in stats_text.splitlines() if l.split()[:1] and
                                       l.split()[0].isdigit()),
                      notes=note)
        result["oom_kills"] = counters.get("oom_kill")
        victims, invokers = oom_victims(cg.dir, since, PIDS)
        result["oom_victims"] = None if victims is None else {
            k: sum(1 for v in victims if v[2] == k) for k in sorted({v[2] for v in victims})}
        result["oom_invokers"] = invokers
        result["daemon_oom_killed"] = None if victims is None else any(v[2] == "daemon" for v in victims)
        result["ok"] = bool(alive and rc == 0 and not result["daemon_oom_killed"] and tot["mismatched_bytes"] == 0 and not errors and
                            not any("SIGBUS" in k or "reader exit" in k for k in deaths) and tot["reads"] > 0)
        return result
    finally:
        for ch in children:
            if ch.proc and ch.proc.poll() is None:
                ch.proc.kill()
                ch.proc.wait()
        if mount is not None:
            mount.cleanup()
        cg.remove()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def show(r):
    g = lambda n: "%.1f MiB" % (n / MiB) if n is not None else "?"  # noqa: E731
    c = r["cgroup_counters"]
    print("---- memory pressure: %d s, %s, limit %s, serving %s of %s source (T=%d), push %s, %d readers, %d hogs of %s%s"
          % (r["seconds"], r["cgroup"], g(r["limit"]), g(r["served_bytes"]), g(r["src_bytes"]), r["tp"], r["push"],
             r["readers"], r["hogs"], g(r["hog_size"]), " (from nothing)" if r["hog_from_nothing"] else ""))
    print("reads %d in %d operations (%s), bytes compared %s, byte mismatches %d (in %d reads), errors %s"
          % (r["reads"], sum(r["ops"].values()), ", ".join("%s %d" % kv for kv in sorted(r["ops"].items())), g(r["bytes"]),
             r["mismatched_bytes"], r["mismatched_reads"], r["errors"] or "none"))
    print("processes killed: %s; source drops %s" % (r["deaths"] or "none", r["drops"]))
    print("cgroup: OOM kills %s, failcnt %s, under_oom %s, peak usage %s, %s"
          % (c.get("oom_kill"), c.get("failcnt", c.get("max")), c.get("under_oom", c.get("oom")),
             g(c.get("peak") or r["cgroup_usage_sampled_max"]),
             ", ".join("%s %s" % (k, v) for k, v in sorted(c.items()) if k.startswith("stat_"))))
    print("OOM kills by the kernel log: %s; the OOM killer was invoked by %s"
          % (r["oom_victims"] if r["oom_victims"] is not None else "unknown (dmesg unreadable)",
             r["oom_invokers"] if r["oom_invokers"] is not None else "?"))
    print("daemon: peak RSS (VmHWM) %s, sampled max RSS %s (anon %s, file %s), oom_score_adj %s, %s"
          % (g(r["daemon_peak_rss"]), g(r["daemon_rss_sampled_max"]), g(r["daemon_anon_sampled_max"]),
             g(r["daemon_file_sampled_max"]), r["oom_score_adj"],
             "survived (exit %s at unmount)" % r["daemon_exit"] if r["daemon_alive"] and r["daemon_exit"] == 0
             else "DID NOT SURVIVE (exit %s, gone %s)" % (r["daemon_exit"], "%.1f s into the run" % r["daemon_died_at"]
                                                           if r["daemon_died_at"] is not None else "as the run ended")))
    print("daemon: served %s through requests, pushed %s; unexpected stderr: %s"
          % (g(r["stats_served"]), "%s of a budget of %s" % (g(r["pushed"]), g(r["push_budget"]))
             if r["pushed"] is not None else "off", r["daemon_unexpected_stderr"] or "none"))
    print("daemon: stats say oom_score_adj: %s" % r["oom_note"])
    for n in r["notes"]:
        print("note: " + n)
    print("result: %s" % ("OK" if r["ok"] else "FAILED"))


def main():
    if len(sys.argv) == 3 and sys.argv[1] in ("--reader", "--hog"):
        spec = json.loads(sys.argv[2])
        (reader if sys.argv[1] == "--reader" else hog)(spec)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--size", default="768M", help="checkpoint bytes (default 768M)")
    ap.add_argument("--limit", default="192M", help="the cgroup's memory limit (default 192M)")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--push", default="off", help="the mount's --push (SIZE, auto or off; default off)")
    ap.add_argument("--hog", type=int, default=0, help="processes that allocate and hold anonymous memory")
    ap.add_argument("--hog-size", default="16M", help="what each hog holds at first (default 16M); it then grows by half")
    ap.add_argument("--hog-from-nothing", action="store_true",
                    help="hogs hold nothing at first and grow to --hog-size each time (many small processes)")
    ap.add_argument("--work", help="folder for the checkpoint and the reference (default build/mem-pressure)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--json", help="write the result here as JSON")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    try:
        r = run(a)
    except Unavailable as e:
        print("SKIP: %s" % e)
        return 77
    show(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
