"""Hardening: each case as a careless or hostile user met it.

1. Racing mounts: two `tpfs mount SRC MNT` started at once, 20 times, with a SRC that is slow to
   plan (3,000 small files): exactly one wins, the other exits 1 with "already a mount point" and
   leaves nothing behind; one tpfs mount on MNT each time.
2. Descriptor exhaustion: under `prlimit --nofile=300:300`, a reader holds 400 plain files of a
   rank open at once: every open succeeds (plain files hold no descriptor while open), every read
   gives the source's bytes, and config.json and the index stay served: nothing is marked changed.
3. JSON that Python's json refuses (or reads otherwise than cJSON) in config.json, an index or a
   plan file is refused with Python's words and the line and column; Python's json is asked, in
   the test, that it refuses (or reads otherwise) each case.
4. A folder tree deeper than the path limit: the part beyond it is left out with a message that
   says what and why, in `tpfs plan` and the mount's log; everything within the limit is served.
5. Reads that overlap an in-place write() of the source, 20 runs: 16 threads drop the rank file's
   cached pages and pread 4 KiB or 1 MiB at random offsets of both ranks' copy of a 64 MiB shard
   while a quarter of the shard is rewritten at its middle: every byte returned is the old byte
   (a read may end short, with the old bytes before a page that fails: counted and printed), or
   the read fails with EIO.
6. Smaller: .tpfs-stats has the size a read gives; O_RDONLY|O_APPEND opens; `tpfs stats` on a
   mount whose daemon was killed says so and names `tpfs umount`; a 100 MB config.json is refused.
"""
import errno
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import fixtures
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-hard3-")
base = os.path.join(work, "base")
fixtures.make("llama", base)
ALLOW_CHANGED = [r"^tpfs: error: .*: the source changed since it was mounted"]


def fresh(name):
    d = os.path.join(work, name)
    shutil.copytree(base, d, symlinks=True)
    return d


def count_mounts(mnt):
    real = os.path.realpath(mnt)
    return sum(1 for m in tt.mountpoints_list() if m == real)


# ---- 1. racing mounts ----
slow = fresh("slow")
for k in range(3000):
    with open(os.path.join(slow, "p%04d.txt" % k), "w") as f:
        f.write("x%d\n" % k)
mnt = os.path.join(work, "mnt")
os.mkdir(mnt)
outcomes = []
for attempt in range(20):
    procs = [subprocess.Popen([tt.TPFS, "mount", slow, mnt, "--tp", "2"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    res = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    n = count_mounts(mnt)
    codes = sorted(r[0] for r in res)
    loser = [r[1] for r in res if r[0] != 0]
    ok = codes == [0, 1] and n == 1 and loser and "already a mount point" in loser[0]
    outcomes.append(ok)
    F.check(ok, "racing mounts, try %d: exit codes %s, %d tpfs mounts on MNT, loser said %r" % (attempt, codes, n, loser))
    for _ in range(n):
        tt.tpfs("umount", mnt)
    F.check(count_mounts(mnt) == 0, "racing mounts, try %d: nothing left mounted" % attempt)
print("racing mounts: %d of 20 tries with exactly one mount" % sum(outcomes))

# ---- 2. descriptor exhaustion ----
many = fresh("many")
for k in range(400):
    with open(os.path.join(many, "p%03d.txt" % k), "w") as f:
        f.write("plain file %d\n" % k * 50)
cfg_src = open(os.path.join(many, "config.json"), "rb").read()
m = tt.Mount(many, 2)
m.wrap = ["prlimit", "--nofile=300:300"]
with m:
    r0 = m.rank(0)
    want_cfg = open(os.path.join(r0, "config.json"), "rb").read()
    want_idx = open(os.path.join(r0, "model.safetensors.index.json"), "rb").read()
    fds, failed = [], []
    for k in range(400):
        try:
            fds.append((k, os.open(os.path.join(r0, "p%03d.txt" % k), os.O_RDONLY)))
        except OSError as e:
            failed.append((k, e.errno))
    F.check(not failed, "fd exhaustion: %d of 400 opens failed (%s)" % (len(failed), failed[:3]))
    wrong = [k for k, fd in fds if os.pread(fd, 1 << 16, 0) != ("plain file %d\n" % k * 50).encode()]
    F.check(not wrong, "fd exhaustion: %d held files read other bytes" % len(wrong))
    for _, fd in fds:
        os.close(fd)
    for name, want in (("config.json", want_cfg), ("model.safetensors.index.json", want_idx)):
        F.check(tt.read_state(os.path.join(r0, name), want) == "same", "fd exhaustion: %s still served" % name)
    F.check(json.loads(want_cfg)["num_attention_heads"] * 2 == json.loads(cfg_src)["num_attention_heads"],
            "fd exhaustion: rank 0's config.json has its own head count")
    F.check("changed since it was mounted" not in m.stderr(), "fd exhaustion: nothing marked changed: %s" % m.stderr()[-300:])

# ---- 3. JSON that Python's json refuses or reads otherwise ----
good = json.loads(open(os.path.join(base, "config.json")).read())
txt = json.dumps(good)
# (name, config.json bytes, what Python does with it: "refuses" or "reads otherwise", part of tpfs's message)
cases = [
    ("trailing data", (txt + " }{").encode(), "refuses", "Extra data"),
    ("a second object", (txt + txt).encode(), "refuses", "Extra data"),
    ("raw TAB in a string", txt.replace('"llama"', '"lla\tma"').encode(), "refuses", "Invalid control character"),
    ("raw NUL in a string", txt.replace('"llama"', '"lla\x00ma"').encode(), "refuses", "Invalid control character"),
    ("form feed as whitespace", ("\f" + txt).encode(), "refuses", "Expecting value"),
    ("leading zero", txt.replace('"rms_norm_eps"', '"x": 007, "rms_norm_eps"').encode(), "refuses", "leading zero"),
    ("leading plus", txt.replace('"rms_norm_eps"', '"x": +7, "rms_norm_eps"').encode(), "refuses", "Expecting value"),
    ("number ending in a dot", txt.replace('"rms_norm_eps"', '"x": 7., "rms_norm_eps"').encode(), "refuses", "ending in '.'"),
    ("invalid UTF-8", txt.replace('"llama"', '"llama"').encode().replace(b'"torch_dtype"', b'"\xff\xfe": 1, "torch_dtype"')
     if '"torch_dtype"' in txt else (txt[:-1] + ', "\xff": 1}').encode("latin-1"), "refuses", "not UTF-8"),
    ("byte-order mark", b"\xef\xbb\xbf" + txt.encode(), "refuses", "byte-order mark"),
    ("NaN", txt.replace('"rms_norm_eps"', '"x": NaN, "rms_norm_eps"').encode(), "reads otherwise", "NaN"),
    ("\\u0000 in a string", txt.replace('"llama"', '"lla\\u0000ma"').encode(), "reads otherwise", "\\u0000"),
    ("unpaired surrogate", txt.replace('"llama"', '"lla\\ud800ma"').encode(), "reads otherwise", "surrogate"),
]
for name, data, python, part in cases:
    try:
        json.loads(data.decode("utf-8"))
        py = "reads"
    except (ValueError, UnicodeDecodeError):
        py = "refuses"
    F.check(py == ("refuses" if python == "refuses" else "reads"), "JSON %s: Python's json %s it" % (name, py))
    d = fresh("json-" + "".join(c for c in name if c.isalnum()))
    with open(os.path.join(d, "config.json"), "wb") as f:
        f.write(data)
    p = tt.tpfs("plan", d, "--tp", "2")
    F.check(p.returncode == 1 and "config.json: " in p.stderr and part in p.stderr,
            "JSON %s: tpfs plan refuses it with %r (%d: %s)" % (name, part, p.returncode, p.stderr.strip()[:300]))
    p = tt.tpfs("mount", d, os.path.join(work, "mnt"), "--tp", "2")
    F.check(p.returncode == 1 and part in p.stderr and count_mounts(mnt) == 0,
            "JSON %s: tpfs mount refuses it (%d)" % (name, p.returncode))
# the same rule for an index and a plan file
d = fresh("json-index")
ip = os.path.join(d, "model.safetensors.index.json")
with open(ip, "ab") as f:
    f.write(b"\n{}")
p = tt.tpfs("plan", d, "--tp", "2")
F.check(p.returncode == 1 and "model.safetensors.index.json: not valid JSON" in p.stderr and "Extra data" in p.stderr,
        "JSON index with trailing data refused (%d: %s)" % (p.returncode, p.stderr.strip()[:300]))
plan_path = os.path.join(work, "plan.json")
pj = tt.tpfs("plan", base, "--tp", "2", "--json", check=True).stdout
with open(plan_path, "w") as f:
    f.write(pj.rstrip() + "\n]")
p = tt.tpfs("plan", base, "--tp", "2", "--plan", plan_path)
F.check(p.returncode == 1 and "not valid JSON" in p.stderr and "Extra data" in p.stderr,
        "JSON plan file with trailing data refused (%d: %s)" % (p.returncode, p.stderr.strip()[:300]))
with open(plan_path, "w") as f:
    f.write(pj)
F.check(tt.tpfs("plan", base, "--tp", "2", "--plan", plan_path).returncode == 0, "the same plan file without it is accepted")

# ---- 4. a folder tree deeper than the path limit ----
deep = fresh("deep")
path = deep
for k in range(25):
    path = os.path.join(path, ("d%02d" % k) * 67)[:len(path) + 1 + 200]
    try:
        os.mkdir(path)
    except OSError:  # the path limit: go on relative to the folder
        break
# os.mkdir of a path over PATH_MAX fails; build the rest relative to an open folder
fd = os.open(os.path.dirname(path) if not os.path.isdir(path) else path, os.O_RDONLY)
levels = path.count(os.sep) - deep.count(os.sep)
for k in range(levels, 25):
    name = ("d%02d" % k) * 67
    name = name[:200]
    os.mkdir(name, dir_fd=fd)
    nfd = os.open(name, os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = nfd
leaf = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
os.write(leaf, b"at the bottom\n")
os.close(leaf)
os.close(fd)
p = tt.tpfs("plan", deep, "--tp", "2")
F.check(p.returncode == 0 and "left out of every rank" in p.stderr and "PATH_MAX" in p.stderr,
        "deep tree: tpfs plan says what is left out and why (%d: %s)" % (p.returncode, p.stderr.strip()[:400]))
with tt.Mount(deep, 2, allow_stderr=[r"left out of every rank"]) as m:
    F.check("left out of every rank" in m.stderr(), "deep tree: the mount's log says what is left out")
    served = sum(len(dirs) for _, dirs, _ in os.walk(m.rank(0)))
    # every folder whose source path fits is served: count them in SRC the same way
    fits = 0
    for root, dirs, _ in os.walk(deep):
        fits += sum(1 for x in dirs if len(os.path.join(root, x)) < 4096)
    F.check(served == fits and fits >= 15, "deep tree: %d folders served, %d fit in the path limit" % (served, fits))

# ---- 5. reads that overlap an in-place write ----
tear = os.path.join(work, "tear")
os.mkdir(tear)
rows, cols = 4096, 4096
tname = "model.layers.0.mlp.down_proj.weight"
hdr = json.dumps({tname: {"dtype": "F32", "shape": [rows, cols], "data_offsets": [0, rows * cols * 4]}}).encode()
hdr += b" " * ((8 - len(hdr) % 8) % 8)
shard = os.path.join(tear, "model.safetensors")
json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "intermediate_size": cols,
           "hidden_size": rows, "vocab_size": 64, "num_attention_heads": 8, "num_key_value_heads": 8,
           "num_hidden_layers": 1}, open(os.path.join(tear, "config.json"), "w"))
rng = np.random.default_rng(5)
old = rng.integers(0, 2**32, size=rows * cols, dtype=np.uint32)
new = rng.integers(0, 2**32, size=rows * cols, dtype=np.uint32).tobytes()
q = rows * cols * 4 // 4
mid = rows * cols * 4 // 2 - q // 2
# the rank files expected before the write, from the rule (row-parallel: columns split)
data_start = 8 + len(hdr)
totals = {"reads": 0, "same": 0, "eio": 0, "short": 0, "wrong": 0}
RUNS = 20
for run in range(RUNS):
    with open(shard, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + old.tobytes())
    with tt.Mount(tear, 2, allow_stderr=ALLOW_CHANGED) as m:
        paths = [os.path.join(m.rank(r), "model.safetensors") for r in range(2)]
        hl = [os.path.getsize(p) - rows * cols * 2 for p in paths]
        want = [open(paths[r], "rb").read(hl[r]) + old.reshape(rows, cols)[:, r * cols // 2:(r + 1) * cols // 2].tobytes()
                for r in range(2)]
        F.check(all(open(paths[r], "rb").read() == want[r] for r in range(2)), "overlap run %d: rank files as the rule says" % run)
        log, stop = [], threading.Event()

        def reader(seed):
            rnd = random.Random(seed)
            fds = [os.open(p, os.O_RDONLY) for p in paths]
            try:
                while not stop.is_set():
                    r = rnd.randrange(2)
                    ln = rnd.choice([4096, 1 << 20])
                    off = rnd.randrange(0, len(want[r]) - ln)
                    os.posix_fadvise(fds[r], 0, 0, os.POSIX_FADV_DONTNEED)
                    try:
                        got = os.pread(fds[r], ln, off)
                        w = want[r][off:off + ln]
                        log.append("same" if got == w else "short" if w.startswith(got) else "wrong")
                    except OSError as e:
                        log.append("eio" if e.errno == errno.EIO else "errno %d" % e.errno)
            finally:
                for fd in fds:
                    os.close(fd)

        threads = [threading.Thread(target=reader, args=(1000 * run + k,)) for k in range(16)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        fd = os.open(shard, os.O_WRONLY)
        os.pwrite(fd, new[mid:mid + q], data_start + mid)  # one write() of a quarter, at the middle
        os.close(fd)
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join()
        totals["reads"] += len(log)
        for k in ("same", "eio", "short", "wrong"):
            totals[k] += log.count(k)
        other = [x for x in log if x not in ("same", "eio", "short", "wrong")]
        F.check(not other and "wrong" not in log, "overlap run %d: %d reads returned a byte other than the old one, "
                "other results %s" % (run, log.count("wrong"), other[:3]))
        F.check(log.count("eio") > 0 and log.count("same") > 10, "overlap run %d: reads before (%d) and EIO after (%d)"
                % (run, log.count("same"), log.count("eio")))
print("overlapping writes: %d runs, %d reads: %d old bytes, %d EIO, %d short reads of old bytes, %d with another byte"
      % (RUNS, totals["reads"], totals["same"], totals["eio"], totals["short"], totals["wrong"]))

# ---- 6. smaller items ----
with tt.Mount(base, 2) as m:
    st_path = os.path.join(m.path, ".tpfs-stats")
    for _ in range(2):
        size = os.stat(st_path).st_size
        body = open(st_path, "rb").read()
        F.check(size == len(body) and size > 0, "stats: st_size %d, a read gives %d bytes" % (size, len(body)))
        open(os.path.join(m.rank(0), "config.json"), "rb").read()
    out = tt.tpfs("stats", m.path).stdout
    F.check(out.startswith("tpfs ") and out.endswith("\n") and not out.endswith(" \n"), "tpfs stats prints the text without padding")
    f = os.path.join(m.rank(1), "model-00001-of-00002.safetensors")
    fd = os.open(f, os.O_RDONLY | os.O_APPEND)
    F.check(os.pread(fd, 8, 0) == open(f, "rb").read(8), "O_RDONLY|O_APPEND opens and reads")
    os.close(fd)
    for flags in (os.O_WRONLY | os.O_APPEND, os.O_RDWR):
        try:
            os.close(os.open(f, flags))
            F.check(False, "open with write access %o succeeded" % flags)
        except OSError as e:
            F.check(e.errno == errno.EROFS, "open with write access gives EROFS (%s)" % e)
killed = os.path.join(work, "killed")
os.mkdir(killed)
p = subprocess.Popen([tt.TPFS, "mount", base, killed, "--tp", "2", "-f"], stderr=subprocess.DEVNULL)
tt.wait_for(lambda: tt.is_mounted(killed), what="the mount")
p.send_signal(signal.SIGKILL)
p.wait()
s = tt.tpfs("stats", killed)
F.check(s.returncode == 1 and "daemon" in s.stderr and "tpfs umount" in s.stderr,
        "tpfs stats on a dead mount names the cause and the cure (%r)" % s.stderr.strip())
F.check(tt.tpfs("umount", killed).returncode == 0 and not tt.is_mounted(killed), "tpfs umount removes the dead mount")
big = fresh("bigcfg")
cfg = dict(good)
cfg["padding"] = "x" * (100 << 20)
with open(os.path.join(big, "config.json"), "w") as f:
    json.dump(cfg, f)
p = tt.tpfs("plan", big, "--tp", "2")
F.check(p.returncode == 1 and "MiB tpfs reads of a config.json" in p.stderr, "a 100 MB config.json is refused (%s)" % p.stderr.strip()[:200])

shutil.rmtree(work, ignore_errors=True)
F.done("hardening")
