"""Passthrough copies (`--passthrough on`): the push writes each served file, whole, into a private copy in a
huge-page tmpfs, and the kernel serves opens of the file from that copy (FUSE passthrough), so a loader's
reads cost what a local file's do (docs/PERFORMANCE.md). Checked here, on the hf view (rank folders) and on
--view vllm, at T=2 and 4:
- every served file gets a copy before any read (the stats count the copies, and the memory they hold in
  whole 2 MiB pages, which is how a copy counts against the budget: nothing was stored into FUSE's page
  cache);
- each file opened and read once: the bytes equal, byte for byte, a `--push off` mount's and the rules'
  slices (reference.py), every open was served from a copy (the stats) and no read reached the daemon;
- a second open at once is served from the copy too (safetensors opens a file twice in a row); with
  `--passthrough-keep 1`, a second after the last open is closed the copies move into the page cache: the
  stats say every copy moved and the push done with every served byte, the source bytes read stay those of
  the copies (the move reads the copies, not the source again), and a second read gives the same bytes;
- with the default keep (600 s), the copies are still there 12 s after the last close: a new open is
  served from its copy and nothing moved;
- a source rewritten after the copies are made: a file opened before the change reads either its old bytes
  or end-of-file (read) once the watcher has seen it, never other bytes; a new open fails with EIO;
- a budget below a file's whole pages makes no copy of it (the push fills the page cache as without
  the option); `--passthrough off` says so in the stats; `--passthrough maybe` is refused;
- an unmount while a file is open from its copy is clean;
- memory short (a memory cgroup made for the daemon, whose room a filler process brings below an eighth of
  its limit): the copies used move into the page cache after their 10 s grace, long before their keep, no new
  copy is made, and every file reads the same. Where no memory cgroup can be made (a container runtime's
  own), that part says so and does not run.
Needs a kernel that offers FUSE passthrough (6.9+) and CAP_SYS_ADMIN: without either the test exits 77,
after checking that the stats say why the copies are not used.
"""
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

from safetensors.numpy import load_file

import fixtures
import reference
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-pass-")
CHANGED = [r"^tpfs: error: .*: the source changed since it was mounted"]
HUGE = 2 << 20


def stats_line(mnt, key):
    """The stats file's line that starts with key + ':'."""
    for line in open(os.path.join(mnt, ".tpfs-stats")).read().splitlines():
        if line.startswith(key + ":"):
            return line
    raise AssertionError("no %s line in the stats" % key)


def pass_counts(mnt):
    """(copies made, opens served from them, moved into the page cache, dropped at a change), or None when not
    used."""
    w = stats_line(mnt, "passthrough").split()
    return None if w[1] in ("off", "not") else (int(w[1]), int(w[4]), int(w[9]), int(w[19]))


def source_used(mnt):
    return int(stats_line(mnt, "source_used").split()[1])


def pushed(mnt):
    w = stats_line(mnt, "push").split()
    return int(w[2])


def raw(mnt):
    """{path under mnt: sha256} of every served safetensors file, each opened and read once."""
    out = {}
    for fn in tt.tensor_files(mnt):
        with open(fn, "rb") as f:
            out[os.path.relpath(fn, mnt)] = hashlib.sha256(f.read()).hexdigest()
    return out


def held(files):
    return sum((os.path.getsize(f) + HUGE - 1) // HUGE * HUGE for f in files)


src = os.path.join(work, "llama")
config, full = fixtures.make("llama", src)

# 0. does this kernel serve passthrough to this process?
with tt.Mount(src, 2, "--passthrough", "on") as m:
    tt.wait_for(lambda: "passthrough:" in open(os.path.join(m.path, ".tpfs-stats")).read(), what="the stats")
    line = stats_line(m.path, "passthrough")
    if pass_counts(m.path) is None:
        print("SKIP: %s" % line)
        F.check("not used:" in line, "without passthrough the stats say why: %s" % line)
        F.done("passthrough")  # exits 1 when that check failed
        raise SystemExit(77)

# 1. copies before any read, then every open served from them, the right bytes, none through the daemon
for view in ([], ["--view", "vllm"]):
    name = "vllm view" if view else "hf view"
    for T in (2, 4):
        with tt.Mount(src, T, *view, "--push", "off") as m:
            off_bytes = raw(m.path)
        with tt.Mount(src, T, *view, "--passthrough", "on", "--passthrough-keep", "1") as m:
            files = tt.tensor_files(m.path)
            tt.wait_for(lambda: pass_counts(m.path)[0] == len(files), what="the copies of %s T=%d" % (name, T))
            made_of = source_used(m.path)
            F.check(pushed(m.path) == held(files),
                    "%s T=%d: the copies hold the files' whole 2 MiB pages (%d), nothing else is pushed (%d)"
                    % (name, T, held(files), pushed(m.path)))
            got = raw(m.path)
            F.check(got == off_bytes, "%s T=%d: every file read from its copy equals a --push off mount's (%s)"
                    % (name, T, sorted(k for k in off_bytes if got.get(k) != off_bytes[k])[:3]))
            # at once again (safetensors opens a file twice in a row): the copies are still there
            F.check(raw(m.path) == off_bytes, "%s T=%d: a second open at once reads the same" % (name, T))
            c = pass_counts(m.path)
            F.check(c[1] == 2 * len(files) and c[2] == 0 and tt.served_bytes(m.path) == 0,
                    "%s T=%d: %d opens, %d served from copies (%d dropped), %d bytes through the daemon"
                    % (name, T, 2 * len(files), c[1], c[2], tt.served_bytes(m.path)))
            # a second after use the copies move into the page cache, read from the copies, not the source
            total = sum(os.path.getsize(f) for f in files)
            tt.wait_for(lambda: pass_counts(m.path)[2] == len(files) and ", done;" in stats_line(m.path, "push"),
                        timeout=60, what="the move of the copies into the page cache (%s T=%d)" % (name, T))
            F.check(pushed(m.path) == total and sum(tt.resident(f) for f in files) >= 0.9 * total,
                    "%s T=%d: after the copies, the page cache holds the files (pushed %d of %d)"
                    % (name, T, pushed(m.path), total))
            F.check(source_used(m.path) == made_of and made_of > 0,
                    "%s T=%d: the move read no source byte (source bytes %d, %d when the copies were made)"
                    % (name, T, source_used(m.path), made_of))
            for r in range(T):
                loaded = {}
                for f in [f for f in files if ("rank%d/" % r) in f or ("rank-%d-" % r) in f]:
                    loaded.update(load_file(f))
                if not view:
                    want = {k: reference.expected("llama", config, k, x, T, r) for k, x in full.items()}
                    bad = [k for k in want if k not in loaded or not (loaded[k] == want[k]).all()]
                    F.check(not bad and len(loaded) == len(want), "%s T=%d rank %d: the rules' slices (%s)"
                            % (name, T, r, bad[:3]))
            F.check(raw(m.path) == off_bytes, "%s T=%d: a second read, from the page cache, is the same" % (name, T))

# 1b. the default keep: still served from the copies well after the grace the copies once had (10 s)
with tt.Mount(src, 2, "--passthrough", "on") as m:
    files = tt.tensor_files(m.path)
    tt.wait_for(lambda: pass_counts(m.path)[0] == len(files), what="the copies (default keep)")
    first = raw(m.path)
    time.sleep(12)
    F.check(raw(m.path) == first and pass_counts(m.path)[1] == 2 * len(files) and pass_counts(m.path)[2] == 0
            and tt.served_bytes(m.path) == 0 and "copies stay 600s after use" in stats_line(m.path, "passthrough"),
            "default keep: 12 s after use every open is still served from its copy: %s"
            % stats_line(m.path, "passthrough"))
bad = tt.tpfs("mount", src, work, "--tp", "2", "--passthrough-keep", "soon")
F.check(bad.returncode == 2 and "--passthrough-keep" in bad.stderr, "--passthrough-keep soon is refused: %s"
        % bad.stderr.strip()[:200])

# 2. a source rewritten after the copies are made: old bytes or end-of-file, never other bytes; new opens EIO
for view in ([], ["--view", "vllm"]):
    name = "vllm view" if view else "hf view"
    chg = os.path.join(work, "changed-" + ("vllm" if view else "hf"))
    fixtures.save(chg, config, full)
    with tt.Mount(chg, 2, *view, "--push", "off") as m:
        old = {os.path.relpath(f, m.path): open(f, "rb").read() for f in tt.tensor_files(m.path)}
    with tt.Mount(chg, 2, *view, "--passthrough", "on", allow_stderr=CHANGED) as m:
        files = tt.tensor_files(m.path)
        tt.wait_for(lambda: pass_counts(m.path)[0] == len(files), what="the copies (%s, before the change)" % name)
        fds = {fn: os.open(fn, os.O_RDONLY) for fn in files}  # opened from the copies before the change
        F.check(pass_counts(m.path)[1] == len(files), "%s: the opens before the change were served from copies" % name)
        victim = os.path.join(chg, "model-00001-of-00002.safetensors")
        with open(victim, "r+b") as f:  # same size, other bytes, in place
            f.seek(os.path.getsize(victim) - 4096)
            f.write(bytes(4096))
        hit = [fn for fn in files if "00001" in fn or "part-0" in fn]
        t0, reads, wrong = time.time(), {}, []
        while time.time() < t0 + 5:
            reads = {fn: os.pread(fds[fn], os.path.getsize(fn), 0) for fn in files}
            wrong += [fn for fn, b in reads.items() if b and b != old[os.path.relpath(fn, m.path)]]
            if all(reads[fn] == b"" for fn in hit):
                break
            time.sleep(0.05)
        took = time.time() - t0
        F.check(not wrong, "%s: reads of files open from their copies never gave other bytes (%s)" % (name, wrong[:2]))
        F.check(all(reads[fn] == b"" for fn in hit) and took < 2,
                "%s: files open from a copy of the rewritten source read end-of-file %.2f s after the write (%s)"
                % (name, took, {os.path.relpath(k, m.path): len(v) for k, v in reads.items()}))
        F.check(pass_counts(m.path)[3] >= len(hit), "%s: the stats count the copies dropped at the change: %s"
                % (name, stats_line(m.path, "passthrough")))
        for fd in fds.values():
            os.close(fd)
        errs = []
        for fn in hit:
            try:
                open(fn, "rb").read()
                errs.append(None)
            except OSError as e:
                errs.append(e.errno)
        F.check(errs == [5] * len(hit), "%s: a new open of a rewritten file's copy reads EIO (%s)" % (name, errs))

# 3. a budget below a file's whole pages: no copy of it, the page cache filled as without the option
with tt.Mount(src, 2, "--push", "off") as m:
    off_bytes = raw(m.path)
with tt.Mount(src, 2, "--passthrough", "on", "--push", "1M") as m:
    tt.wait_for(lambda: "stopped at the budget" in stats_line(m.path, "push") or ", done;" in stats_line(m.path, "push"),
                what="the push under a 1 MiB budget")
    F.check(pass_counts(m.path)[0] == 0 and 0 < pushed(m.path) <= 1 << 20,
            "--push 1M: no copy (a copy needs whole 2 MiB pages), the page cache pushed within the budget: %s / %s"
            % (stats_line(m.path, "passthrough"), stats_line(m.path, "push")))
    F.check(raw(m.path) == off_bytes, "--push 1M: every file equals a --push off mount's")
with tt.Mount(src, 2) as m:
    F.check(stats_line(m.path, "passthrough") == "passthrough: off", "no --passthrough: %s"
            % stats_line(m.path, "passthrough"))
bad = tt.tpfs("mount", src, work, "--tp", "2", "--passthrough", "maybe")
F.check(bad.returncode == 2 and "--passthrough" in bad.stderr, "--passthrough maybe is refused: %s"
        % bad.stderr.strip()[:200])

# 4. a lazy unmount while a file is open from its copy: the file still reads right, and once it is closed the
# daemon exits 0
with tt.Mount(src, 2, "--push", "off") as m:
    want0 = open(tt.tensor_files(m.path)[0], "rb").read()
m = tt.Mount(src, 2, "--passthrough", "on")
with m:
    files = tt.tensor_files(m.path)
    tt.wait_for(lambda: pass_counts(m.path)[0] == len(files), what="the copies (unmount)")
    held_open = open(files[0], "rb")
    first = held_open.read(4096)
    F.check(pass_counts(m.path)[1] == 1, "a file open from its copy (unmount)")
    subprocess.run(["fusermount3", "-u", "-z", m.path], check=True)
    rest = held_open.read()
    F.check(first + rest == want0, "after the lazy unmount the file open from its copy still reads right")
    held_open.close()
F.check(m.proc.returncode == 0 and not tt.is_mounted(m.path), "unmount with a file open from its copy: exit %s"
        % m.proc.returncode)


# 5. memory short: a memory cgroup whose room falls below an eighth of its limit while the copies are kept (the
# default keep, 600 s): the copies used move into the page cache after their grace (10 s), no new copy is made, and
# every file still reads the same. The cgroup is real (the kernel's own accounting, as in a container given
# less memory): the daemon runs in it, and a filler process in it takes all but about a tenth of the limit.
def mem_cgroup(limit):
    """A new memory cgroup below this process's (cgroup v1's memory hierarchy, or v2 where the memory controller
    is enabled for this process's cgroup's children) limited to LIMIT bytes: (its folder, the file whose bytes are
    its use), or (None, why) where none can be made here."""
    for line in open("/proc/self/cgroup").read().splitlines():
        _, ctl, path = line.split(":", 2)
        if "memory" in ctl.split(","):
            base, lim_f, use_f = "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        elif ctl == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            base, lim_f, use_f = "/sys/fs/cgroup", "memory.max", "memory.current"
            ctl_file = os.path.join(base + path, "cgroup.subtree_control")
            if "memory" not in open(ctl_file).read().split():
                continue
        else:
            continue
        d = os.path.join(base + path, "tpfs-test-%d" % os.getpid())
        try:
            os.mkdir(d)
            with open(os.path.join(d, lim_f), "w") as f:
                f.write(str(limit))
            return d, use_f
        except OSError as e:
            with contextlib.suppress(OSError):
                os.rmdir(d)
            return None, "%s: %s" % (d, e)
    return None, "no memory cgroup hierarchy in /proc/self/cgroup"


def cg_use(d, use_f):
    return int(open(os.path.join(d, use_f)).read())


IN_CG = 'echo $$ > "$0/cgroup.procs" && exec "$@"'  # sh -c IN_CG CGROUP CMD...: CMD runs in CGROUP
LIMIT = 512 << 20  # room for a sanitized daemon's own growth (ASan's quarantine) beside the filler
cg, use_f = mem_cgroup(LIMIT)
if cg is None:
    # without a memory cgroup to make (another container runtime's), this check cannot run; the rest has run
    print("memory-short check not run: %s" % use_f)
else:
    with tt.Mount(src, 2, "--push", "off") as m:
        off_bytes = raw(m.path)
    filler = None
    m = tt.Mount(src, 2, "--passthrough", "on")
    m.wrap = ["sh", "-c", IN_CG, cg]
    try:
        with m:
            files = tt.tensor_files(m.path)
            tt.wait_for(lambda: pass_counts(m.path)[0] == len(files), what="the copies (memory cgroup)")
            F.check(raw(m.path) == off_bytes and pass_counts(m.path)[1] == len(files) and pass_counts(m.path)[2] == 0,
                    "memory cgroup: every file read once from its copy, none moved: %s"
                    % stats_line(m.path, "passthrough"))
            # the filler takes what it is told, in steps, until the room is about a tenth of the limit: below the
            # eighth the daemon calls short, with 50 MB left for the daemon's own growth (with a sixteenth of
            # 128 MiB left, a sanitized daemon's memory grew into it and the cgroup's OOM killer took the filler)
            filler = subprocess.Popen(["sh", "-c", IN_CG, cg, sys.executable, "-c",
                                       "import sys\nkeep = []\nfor n in sys.stdin:\n    keep.append(b'\\1' * int(n))"
                                       "\n    print('ok', flush=True)"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(8):
                room = LIMIT - cg_use(cg, use_f)
                if room < LIMIT // 9:
                    break
                filler.stdin.write("%d\n" % (room - LIMIT // 10))
                filler.stdin.flush()
                F.check(filler.stdout.readline().strip() == "ok", "the filler took %d bytes" % (room - LIMIT // 10))
            room = LIMIT - cg_use(cg, use_f)
            F.check(room < LIMIT // 8, "the cgroup's room is below an eighth of its limit: %d of %d" % (room, LIMIT))
            t0 = time.time()
            try:
                tt.wait_for(lambda: pass_counts(m.path)[2] == len(files), timeout=40,
                            what="the copies moved with memory short")
            except AssertionError:
                print("cgroup %s: use %d of %d, filler %s, %s" % (cg, cg_use(cg, use_f), LIMIT, filler.poll(),
                      {f: open(os.path.join(cg, f)).read().split()[:8] for f in ("memory.failcnt", "memory.oom_control",
                       "memory.stat") if os.path.exists(os.path.join(cg, f))}))
                raise
            line = stats_line(m.path, "passthrough")
            F.check("(%d with memory short)" % len(files) in line and time.time() - t0 < 30,
                    "memory short: every copy moved into the page cache before its keep (600 s), within %.0f s: %s"
                    % (time.time() - t0, line))
            F.check(raw(m.path) == off_bytes, "memory short: every file still reads the same after the move")
            time.sleep(2)  # the push looks at the memory each second: with memory short it makes no copy again
            c = pass_counts(m.path)
            F.check(c[0] == len(files) and c[1] == len(files),
                    "memory short: no new copy is made and no open is served from one: %s"
                    % stats_line(m.path, "passthrough"))
    finally:
        if filler:
            filler.stdin.close()
            filler.wait()
        for _ in range(50):  # the daemon's and the filler's exits leave the cgroup empty
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.1)

shutil.rmtree(work, ignore_errors=True)
F.done("passthrough")
