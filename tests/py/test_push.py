"""Push-ahead (`--push auto|SIZE`): after mounting, a thread of the daemon fills the page cache of the
served files (fuse_lowlevel_notify_store), so that a loader's reads are page-cache hits.

Checked here, on the hf view (rank folders) and on --view vllm, at T=2 and 4:
- the push happened before any read: `.tpfs-stats` counts the pushed bytes (every served tensor or part
  file, whole), the pages of every served file are in the FUSE file's page cache (mincore over a mapping
  of the mounted file) while no read has reached the daemon; at least 90% of them, not all: a host's
  proactive reclaim (DAMON pageout on the VMs this was written on) may drop pushed pages that nothing
  has touched yet within seconds (docs/PERFORMANCE.md), and those are then read through the daemon;
- the bytes then read equal the rules' slices (reference.py; for the view, vLLM's names and fusions as
  test_view.py states them) and, byte for byte, what a `--push off` mount serves; those reads were served
  from the page cache (at most a tenth of the bytes by the daemon, for the reason above);
- a source rewritten after a push gives EIO, never the pushed bytes;
- the budget holds: with `--push 64K`, pushed <= 64 KiB, and the files still read whole and right;
- `--push off` pushes nothing (no page cached before a read, the stats say "push: off"); no --push (the
  default, auto since issue 46's second round) pushes every served byte and the stats say "done";
  `--push lots` is refused;
- reads racing the push over the same ranges (a larger checkpoint: 128 MiB of embedding) give the same
  bytes as a `--push off` mount, and what the push did not store was read first: pushed + skipped (the
  stats) is every served byte;
- a file read whole before the push comes to it (the last one it pushes, read at once after the mount) is
  skipped, not stored again: the stats count at least its bytes skipped (a loader that overtakes the push
  on slow storage costs no second copy), and it reads the same again;
- an unmount while the push runs is clean: the daemon exits 0, with nothing unexpected on stderr; so is a
  SIGTERM while the push runs beside readers of the same files;
- from a cold source (its pages dropped with POSIX_FADV_DONTNEED), the push reads with O_DIRECT
  (`--push-io direct`, and the default auto where one rank is served; the stats count those bytes, and the
  source's pages stay out of the page cache) and the files equal a `--push off` mount's; `--push-io map`
  reads none so; a source
  rewritten during or after such a push gives EIO, never bytes (neither the old pushed ones nor new ones).
"""
import contextlib
import glob
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np
from safetensors.numpy import load_file

import fixtures
import reference
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-push-")
CHANGED = [r"^tpfs: error: .*: the source changed since it was mounted"]


def push_line(mnt):
    """The stats file's push line."""
    for line in open(os.path.join(mnt, ".tpfs-stats")).read().splitlines():
        if line.startswith("push:"):
            return line
    raise AssertionError("no push line in the stats")


def stats(mnt):
    """(pushed, budget) from the stats file; (None, None) with the push off."""
    w = push_line(mnt).split()
    return (None, None) if w[1] == "off" else (int(w[2]), int(w[4]))


def digest(fn, step=1 << 20):
    """sha256 of a file read with reads of step bytes."""
    h = hashlib.sha256()
    with open(fn, "rb") as f:
        while True:
            c = f.read(step)
            if not c:
                return h.hexdigest()
            h.update(c)


def raw(mnt):
    """{path under mnt: sha256} of every served safetensors file."""
    return {os.path.relpath(f, mnt): digest(f) for f in tt.tensor_files(mnt)}


def skipped(mnt):
    """The bytes the push skipped: reads had replied them before it came to them."""
    return int(push_line(mnt).split("; skipped ")[1].split()[0])


def wait_pushed(mnt, want, what):
    """Waits until the stats count want bytes pushed or skipped (read first); returns the last (pushed,
    budget)."""
    got = [None]

    def done():
        got[0] = stats(mnt)
        return got[0][0] is not None and got[0][0] + skipped(mnt) >= want
    try:
        tt.wait_for(done, timeout=60, what=what)
    except AssertionError:
        pass
    return got[0]


def vllm_expected(config, full, T, r):
    """{name: array} that vLLM's model on rank r holds (as test_view.py states it): q, k, v fused as qkv_proj,
    gate and up as gate_up_proj, four scale scalars a layer, the vocabulary padded to 64."""
    ex = lambda n: reference.expected("llama", config, n, full[n], T, r, pad=64)
    out, used = {}, set()
    for i in sorted({int(n.split(".")[2]) for n in full if n.startswith("model.layers.")}):
        p = "model.layers.%d." % i
        for kind in ("weight", "bias"):
            q, k, v = (p + "self_attn.%s_proj.%s" % (x, kind) for x in "qkv")
            if q in full:
                out[p + "self_attn.qkv_proj." + kind] = np.concatenate([ex(n) for n in (q, k, v)])
                used |= {q, k, v}
        g, u = p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"
        out[p + "mlp.gate_up_proj.weight"] = np.concatenate([ex(g), ex(u)])
        used |= {g, u}
        for s in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
            out[p + "self_attn.attn." + s] = np.array(1.0, np.float32)
    for n in full:
        if n not in used:
            out[n] = ex(n)
    return out


def compare(what, got, want):
    F.check(sorted(got) == sorted(want), "%s: key set (extra %s, missing %s)" % (
        what, sorted(set(got) - set(want))[:3], sorted(set(want) - set(got))[:3]))
    bad = [k for k in want if k in got and (got[k].shape != want[k].shape or got[k].dtype != want[k].dtype or
                                            not np.array_equal(got[k], want[k]))]
    F.check(not bad, "%s: %d tensors differ from the rules' slices: %s" % (what, len(bad), bad[:4]))


src = os.path.join(work, "llama")
config, full = fixtures.make("llama", src)

# 1. the hf view and --view vllm at T=2 and 4: pushed before any read, then read from the page cache
for view in ([], ["--view", "vllm"]):
    name = "vllm view" if view else "hf view"
    for T in (2, 4):
        with tt.Mount(src, T, *view, "--push", "off") as m:
            off_bytes = raw(m.path)
        with tt.Mount(src, T, *view, "--push", "auto") as m:
            files = tt.tensor_files(m.path)
            total = sum(os.path.getsize(f) for f in files)
            pushed, budget = wait_pushed(m.path, total, "the push of %s T=%d" % (name, T))
            F.check(pushed == total and budget >= total,
                    "%s T=%d: stats count every served byte pushed: %s of %s, %d served" % (name, T, pushed, budget, total))
            pages = [tt.resident_pages(f) for f in files]
            cached = sum(map(sum, pages)) / max(1, sum(map(len, pages)))
            F.check(len(files) == 2 * T and all(sum(p) for p in pages) and cached >= 0.9,
                    "%s T=%d: the pages of every file are cached before any read (%d files, %.1f%% of their pages)"
                    % (name, T, len(files), 100 * cached))
            F.check(tt.served_bytes(m.path) == 0, "%s T=%d: no read reached the daemon yet" % (name, T))
            got_raw = raw(m.path)
            F.check(got_raw == off_bytes, "%s T=%d: every file equals a --push off mount's, byte for byte (%s)"
                    % (name, T, sorted(k for k in off_bytes if got_raw.get(k) != off_bytes[k])[:3]))
            for r in range(T):
                if view:
                    got = {}
                    for f in sorted(glob.glob(os.path.join(m.path, "model-rank-%d-part-*.safetensors" % r))):
                        got.update(load_file(f))
                    compare("%s T=%d rank %d" % (name, T, r), got, vllm_expected(config, full, T, r))
                else:
                    got = {}
                    for f in sorted(glob.glob(os.path.join(m.rank(r), "*.safetensors"))):
                        got.update(load_file(f))
                    compare("%s T=%d rank %d" % (name, T, r), got,
                            {k: reference.expected("llama", config, k, x, T, r) for k, x in full.items()})
            F.check(tt.served_bytes(m.path) <= total // 10,
                    "%s T=%d: the reads were page-cache hits (bytes served by the daemon: %d of %d)"
                    % (name, T, tt.served_bytes(m.path), total))

# 2. a source rewritten after a push: EIO, never the pushed bytes (both views)
for view in ([], ["--view", "vllm"]):
    name = "vllm view" if view else "hf view"
    chg = os.path.join(work, "changed-" + ("vllm" if view else "hf"))
    fixtures.save(chg, config, full)
    with tt.Mount(chg, 2, *view, "--push", "auto", allow_stderr=CHANGED) as m:
        files = tt.tensor_files(m.path)
        wait_pushed(m.path, sum(os.path.getsize(f) for f in files), "the push (%s, before the change)" % name)
        F.check(all(tt.resident(f) > 0 for f in files), "%s: pushed before the change" % name)
        fds = {fn: os.open(fn, os.O_RDONLY) for fn in files}  # opened before the change: reads meet the cache
        victim = os.path.join(chg, "model-00001-of-00002.safetensors")
        with open(victim, "r+b") as f:  # same size, other bytes, in place
            f.seek(os.path.getsize(victim) - 4096)
            f.write(bytes(4096))
        rank_files = [fn for fn in files if "00001" in fn or "part-0" in fn]
        reads = {}
        t0 = time.time()
        # the watcher notices within 100 ms and the invalidation follows (a cached read in between may
        # still see the old bytes, as docs/SAFETY.md says of any cached page): wait until every such file fails
        while time.time() < t0 + 5:
            reads = {}
            for fn in files:
                try:
                    reads[fn] = os.pread(fds[fn], os.path.getsize(fn), 0)
                except OSError as e:
                    reads[fn] = e.errno
            if all(reads[fn] == 5 for fn in rank_files):
                break
            time.sleep(0.05)
        took = time.time() - t0
        for fd in fds.values():
            os.close(fd)
        F.check(all(reads.get(fn) == 5 for fn in rank_files) and took < 2,
                "%s: every file read from the rewritten source fails with EIO, %.2f s after the write (got %s)"
                % (name, took, {os.path.relpath(k, m.path): (v if isinstance(v, int) else "%d bytes" % len(v))
                                for k, v in reads.items()}))

# 3. the budget holds, and the files still read whole and right
with tt.Mount(src, 2, "--push", "off") as m:
    off_bytes = raw(m.path)
with tt.Mount(src, 2, "--push", "64K") as m:
    files = tt.tensor_files(m.path)
    pushed, budget = wait_pushed(m.path, 64 * 1024, "the push up to its budget")
    time.sleep(0.3)  # anything past the budget would show by now
    pushed, budget = stats(m.path)
    F.check(budget == 64 * 1024 and 0 < pushed <= budget, "--push 64K: pushed %s of %s bytes" % (pushed, budget))
    cached = sum(tt.resident(f) for f in files)
    F.check(0 < cached <= budget, "--push 64K: %d bytes cached before any read, at most the budget" % cached)
    F.check(raw(m.path) == off_bytes, "--push 64K: every file equals a --push off mount's")
    tt.wait_for(lambda: "stopped at the budget" in push_line(m.path), timeout=30, what="the push's end at the budget")

# 4. --push off: nothing pushed; no --push (the default, auto): every served byte, then "done"
with tt.Mount(src, 2, "--push", "off") as m:
    time.sleep(0.3)
    files = tt.tensor_files(m.path)
    F.check(stats(m.path) == (None, None), "--push off: the stats say push: off")
    F.check(all(tt.resident(f) == 0 for f in files), "--push off: no page cached before a read: %s"
            % [tt.resident(f) for f in files])
with tt.Mount(src, 2) as m:
    files = tt.tensor_files(m.path)
    total = sum(os.path.getsize(f) for f in files)
    wait_pushed(m.path, total, "the default push")
    tt.wait_for(lambda: ", done;" in push_line(m.path), timeout=30, what="the default push's end")
    line = push_line(m.path)
    F.check(stats(m.path)[0] == total and "the served files hold %d; skipped 0 " % total in line,
            "no --push: the default pushes every served byte (%d) and says done: %s" % (total, line))
    F.check(sum(tt.resident(f) for f in files) >= 0.9 * total, "no --push: the served files are cached before a read")
bad = tt.tpfs("mount", src, work, "--tp", "2", "--push", "lots")
F.check(bad.returncode == 2 and "--push" in bad.stderr, "--push lots is refused: %s" % bad.stderr.strip()[:200])

# 5. a larger checkpoint (128 MiB of tied embedding): reads racing the push give the same bytes, and an
# unmount while the push runs is clean
big = os.path.join(work, "big")
bcfg = dict(config, vocab_size=32768, hidden_size=1024, head_dim=128, intermediate_size=256, num_hidden_layers=1,
            tie_word_embeddings=True)
b = fixtures.Builder(7)
b.add("model.embed_tokens.weight", bcfg["vocab_size"], bcfg["hidden_size"])
fixtures._gqa(b, "model.layers.0.", bcfg, bias=True, o_bias=True)
fixtures._mlp(b, "model.layers.0.", bcfg["hidden_size"], bcfg["intermediate_size"])
fixtures._norms(b, "model.layers.0.", bcfg["hidden_size"])
b.add("model.norm.weight", bcfg["hidden_size"])
fixtures.save(big, bcfg, b.t)
del b
for view in ([], ["--view", "vllm"]):
    name = "vllm view" if view else "hf view"
    with tt.Mount(big, 2, *view, "--push", "off") as m:
        off_bytes = raw(m.path)
    with tt.Mount(big, 2, *view, "--push", "auto") as m:
        files = tt.tensor_files(m.path)
        got, errs = {}, []

        def read(fn, step):
            try:
                got[(os.path.relpath(fn, m.path), step)] = digest(fn, step)
            except OSError as e:
                errs.append("%s: %s" % (fn, e))
        th = [threading.Thread(target=read, args=(fn, step)) for fn in files for step in (1 << 20, 300001)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        F.check(not errs, "%s: racing reads fail: %s" % (name, errs[:2]))
        wrong = [(k, step) for (k, step), v in got.items() if v != off_bytes[k]]
        F.check(not wrong and len(got) == 2 * len(files),
                "%s: reads racing the push equal a --push off mount's bytes (wrong: %s)" % (name, wrong[:3]))
        total = sum(os.path.getsize(f) for f in files)
        pushed, _ = wait_pushed(m.path, total, "the push after the racing reads")
        F.check(pushed and pushed > 0, "%s: the push ran beside the reads (pushed %s of %d)" % (name, pushed, total))
        F.check(", done;" in push_line(m.path) and pushed + skipped(m.path) == total,
                "%s: pushed and skipped (read first) are every served byte: %s of %d" % (name, push_line(m.path), total))
    # the last file the push stores (the last rank's copy of the last file; the view: the last rank's last part),
    # read whole at once after the mount: the push finds it replied and skips it
    with tt.Mount(big, 2, *view, "--push", "auto") as m:
        files = tt.tensor_files(m.path)
        last = sorted(files, key=lambda f: (os.path.basename(f), f))[-1]
        got_last = digest(last)
        total = sum(os.path.getsize(f) for f in files)
        pushed, _ = wait_pushed(m.path, total, "the push after the last file was read")
        print("%s, the last file (%d bytes) read first: %s" % (name, os.path.getsize(last), push_line(m.path)))
        F.check(", done;" in push_line(m.path) and skipped(m.path) >= os.path.getsize(last)
                and pushed + skipped(m.path) == total,
                "%s: the file read before the push came to it (%s, %d bytes) was skipped: %s"
                % (name, os.path.relpath(last, m.path), os.path.getsize(last), push_line(m.path)))
        F.check(got_last == off_bytes[os.path.relpath(last, m.path)] and digest(last) == got_last,
                "%s: the file read first equals a --push off mount's, and again from the page cache" % name)

mid = 0
for attempt in range(5):
    with tt.Mount(big, 2, "--push", "auto") as m:
        total = sum(os.path.getsize(f) for f in tt.tensor_files(m.path))
        end = time.time() + 10
        pushed = 0
        while time.time() < end:
            pushed = stats(m.path)[0]
            if pushed:
                break
            time.sleep(0.002)
        # the Mount's exit unmounts (fusermount3 -u -z) now, and checks the exit status and stderr
    F.check(m.proc.returncode == 0 and not tt.is_mounted(m.path), "unmount during the push: daemon exited %s"
            % m.proc.returncode)
    if 0 < pushed < total:
        mid += 1
        break
F.check(mid > 0, "an unmount met the push under way in one of 5 tries (the last saw %s of %d pushed)" % (pushed, total))

# SIGTERM to the daemon while the push runs beside readers of the same files: the loop ends, the push
# thread is joined, the mount goes, exit 0 (no store may keep the daemon waiting on a READ nobody answers)
for attempt in range(6):
    m = tt.Mount(big, 2, "--push", "auto", *(["--view", "vllm"] if attempt % 2 else []))
    m.__enter__()
    try:
        files = tt.tensor_files(m.path)
        halt = [False]

        def drain(fn, step):
            with contextlib.suppress(OSError), open(fn, "rb") as f:
                while not halt[0] and f.read(step):
                    pass
        th = [threading.Thread(target=drain, args=(fn, step)) for fn in files for step in (1 << 20,)]
        for t in th:
            t.start()
        time.sleep(0.03 * (attempt + 1))
        stats(m.path)
        dev = os.stat(m.path).st_dev
        conn = os.major(dev) << 20 | os.minor(dev)  # the connection's number (the kernel's dev_t)
        t0 = time.time()
        m.proc.send_signal(signal.SIGTERM)
        try:
            rc = m.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = "still running after 30 s"
            with contextlib.suppress(OSError):  # end the hung connection, so that the test fails instead of hanging
                open("/sys/fs/fuse/connections/%d/abort" % conn, "w").write("1")
        halt[0] = True
        for t in th:
            t.join()
        F.check(rc == 0 and not tt.is_mounted(m.path), "SIGTERM during the push (try %d): exit %s in %.1f s, mounted: %s"
                % (attempt, rc, time.time() - t0, tt.is_mounted(m.path)))
    finally:
        m.cleanup()
    bad = [l for l in m.stderr().splitlines() if l and not any(a.search(l) for a in tt.ALLOWED_STDERR)]
    F.check(not bad, "SIGTERM during the push: nothing unexpected on stderr: %s" % bad[:3])



# 6. --push-io direct (the default) from a cold source: the push reads the source pages that are not cached
# with O_DIRECT into its own buffer; the bytes are the same, and a rewrite during or after it gives EIO
def direct_bytes(mnt):
    """The source bytes the push read with O_DIRECT (the stats' push line)."""
    w = push_line(mnt).split("; ")
    return int([x for x in w if x.startswith("source bytes read with O_DIRECT ")][0].split()[-1])


def drop_cached(d):
    """Drops the page cache of every file of folder d (clean pages: written and synced first)."""
    os.sync()
    for fn in os.listdir(d):
        fd = os.open(os.path.join(d, fn), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def src_cached(d):
    return sum(tt.resident(os.path.join(d, fn)) for fn in os.listdir(d) if fn.endswith(".safetensors"))


src_bytes = sum(os.path.getsize(os.path.join(big, fn)) for fn in os.listdir(big) if fn.endswith(".safetensors"))
for view in ([], ["--view", "vllm"]):
    name = "vllm view" if view else "hf view"
    with tt.Mount(big, 2, *view, "--push", "off") as m:
        off_bytes = raw(m.path)
    for mode in ("auto", "direct", "map"):  # auto: direct where one rank is served (here rank 1), else map
        drop_cached(big)
        extra = ["--ranks", "1"] if mode == "auto" else ["--push-io", mode]
        with tt.Mount(big, 2, *view, "--push", "auto", *extra) as m:
            files = tt.tensor_files(m.path)
            total = sum(os.path.getsize(f) for f in files)
            tt.wait_for(lambda: ", running;" not in push_line(m.path), timeout=60, what="the push's end")
            pushed, direct, cached = stats(m.path)[0], direct_bytes(m.path), src_cached(big)
            if mode != "map":
                # every page the push needs is read with O_DIRECT, at least its share of the served bytes
                F.check(pushed == total and direct >= total * 0.9 and cached < src_bytes // 4,
                        "%s, cold source, %s: pushed %s of %d bytes, %d read with O_DIRECT, the source's "
                        "pages cached after it %d of %d" % (name, " ".join(extra), pushed, total, direct, cached,
                                                            src_bytes))
            else:
                F.check(pushed == total and direct == 0,
                        "%s, cold source, --push-io map: pushed %s of %d bytes, none with O_DIRECT (%d)"
                        % (name, pushed, total, direct))
            got_raw = raw(m.path)
            want = {k: v for k, v in off_bytes.items() if k in got_raw} if mode == "auto" else off_bytes  # rank 1's
            F.check(got_raw and got_raw == want, "%s, cold source, %s: every file equals a --push off mount's (%s)"
                    % (name, " ".join(extra), sorted(k for k in want if got_raw.get(k) != want[k])[:3]))

    # a source rewritten during (as soon as the push has stored something) or after the direct push: every file
    # read from it fails with EIO within 2 s; a read that returns bytes before that returns the old ones
    for when in ("during", "after"):
        chg = os.path.join(work, "big-changed")
        shutil.rmtree(chg, ignore_errors=True)
        shutil.copytree(big, chg)
        drop_cached(chg)
        with tt.Mount(chg, 2, *view, "--push", "auto", "--push-io", "direct", allow_stderr=CHANGED) as m:
            files = tt.tensor_files(m.path)
            fds = {fn: os.open(fn, os.O_RDONLY) for fn in files}
            if when == "during":
                tt.wait_for(lambda: (stats(m.path)[0] or 0) > 0, timeout=60, what="the push's first store")
            else:
                tt.wait_for(lambda: ", running;" not in push_line(m.path), timeout=60, what="the push's end")
            seen = push_line(m.path)
            for fn in sorted(os.listdir(chg)):  # every byte of every source file, in place
                if fn.endswith(".safetensors"):
                    p = os.path.join(chg, fn)
                    with open(p, "r+b") as f:
                        f.seek(4096)
                        f.write(b"\x5a" * (os.path.getsize(p) - 4096))
            t0, reads, mixed = time.time(), {}, []
            while time.time() < t0 + 5:
                for fn in files:
                    try:
                        data = os.pread(fds[fn], os.path.getsize(fn), 0)
                        reads[fn] = len(data)
                        if hashlib.sha256(data).hexdigest() != off_bytes[os.path.relpath(fn, m.path)]:
                            mixed.append(os.path.relpath(fn, m.path))
                    except OSError as e:
                        reads[fn] = e.errno
                if all(v == 5 for v in reads.values()):
                    break
                time.sleep(0.05)
            took = time.time() - t0
            for fd in fds.values():
                os.close(fd)
            F.check(all(v == 5 for v in reads.values()) and took < 2 and not mixed,
                    "%s, source rewritten %s a direct push (%s): every file fails with EIO, %.2f s after the write; "
                    "bytes other than the old ones: %s; last reads %s" % (
                        name, when, seen, took, mixed[:3],
                        {os.path.relpath(k, m.path): v for k, v in reads.items()}))
        shutil.rmtree(chg, ignore_errors=True)

shutil.rmtree(work, ignore_errors=True)
F.done("push")
