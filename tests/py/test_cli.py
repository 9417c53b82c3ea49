"""The command line and the mount's life cycle:

- --help for every command, --version; usage errors exit 2;
- refusals before anything is mounted, each with a clear message and no leftover mount: SRC
  missing or not a folder, MNT missing / not a folder / already a mount / inside SRC, SRC inside
  MNT, bad --tp, a corrupt header, a truncated file, a tensor that cannot be split N ways;
- background mode returns only once the mount answers, and fails with the reason when it cannot;
- `tpfs umount`, `fusermount3 -u`, SIGTERM and SIGINT all unmount cleanly;
- `tpfs check` passes a good checkpoint and names the file and the rule of a bad one.
"""
import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time

import fixtures
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-cli-")
src = os.path.join(work, "model")
fixtures.make("llama", src)
mnt = os.path.join(work, "mnt")
os.mkdir(mnt)

# help and version
p = tt.tpfs("--version")
F.check(p.returncode == 0 and p.stdout.startswith("tpfs "), "--version")
for cmd in ("mount", "umount", "plan", "check", "stats"):
    p = tt.tpfs(cmd, "--help")
    F.check(p.returncode == 0 and ("usage: tpfs " + cmd) in p.stdout, "%s --help" % cmd)
p = tt.tpfs("mount", "--help")
for word in ("--tp", "--plan", "--strict", "--pad-vocab", "--readahead", "-o", "umount"):
    F.check(word in p.stdout, "mount --help mentions %s" % word)
# the help says what the review found missing (joined: phrases may wrap)
mh = " ".join(p.stdout.split())
for phrase in ("model_type no built-in plan knows is refused", "--plan generic opts in", "user_allow_other in /etc/fuse.conf",
               "keep their global numbers (8-15 gives rank8 .. rank15)", "Pick readahead on stores limited by request count"):
    F.check(phrase in mh, "mount --help says %r" % phrase)
ph = " ".join(tt.tpfs("plan", "--help").stdout.split())
for phrase in ("model_type no built-in plan knows is refused", "--plan generic opts in"):
    F.check(phrase in ph, "plan --help says %r" % phrase)
F.check(tt.tpfs().returncode == 2, "no command: usage, exit 2")
F.check(tt.tpfs("frobnicate").returncode == 2, "unknown command: exit 2")


def refused(args, want, code=1):
    p = tt.tpfs(*args)
    F.check(p.returncode == code and want in p.stderr, "%s: exit %d (want %d), stderr %r (want %r)"
            % (" ".join(map(str, args)), p.returncode, code, p.stderr.strip(), want))
    F.check(not tt.is_mounted(mnt), "%s: nothing left mounted" % " ".join(map(str, args)))


refused(["mount", os.path.join(work, "nope"), mnt, "--tp", 2], "No such file or directory")
refused(["mount", os.path.join(src, "config.json"), mnt, "--tp", 2], "not a folder")
refused(["mount", src, os.path.join(work, "nomnt"), "--tp", 2], "create the mount point first")
refused(["mount", src, os.path.join(src, "config.json"), "--tp", 2], "not a folder")
os.mkdir(os.path.join(src, "inner"))
refused(["mount", src, os.path.join(src, "inner"), "--tp", 2], "would contain itself")
os.rmdir(os.path.join(src, "inner"))
refused(["mount", src, work, "--tp", 2], "would hide its own source")
refused(["mount", src, mnt, "--tp", 0], "--tp", code=2)
refused(["mount", src, mnt, "--tp", 1025], "--tp", code=2)
refused(["mount", src, mnt, "--tp", "two"], "--tp", code=2)
refused(["mount", src, mnt], "--tp N is required", code=2)
refused(["mount", src, mnt, "--tp", 3], "tensor 'lm_head.weight'")
refused(["mount", src, mnt, "--tp", 2, "--gather", "cuda"], "--gather cuda")

# bad input at mount time: corrupt header, truncated file, unsplittable tensor
bad = os.path.join(work, "bad")
shutil.copytree(src, bad)
f1 = os.path.join(bad, "model-00001-of-00002.safetensors")
data = open(f1, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
with open(f1, "wb") as f:
    f.write(data[:8] + b"[" + data[9:])
refused(["mount", bad, mnt, "--tp", 2], "model-00001-of-00002.safetensors: header does not start with '{'")
with open(f1, "wb") as f:
    f.write(data[:len(data) - 100])
refused(["mount", bad, mnt, "--tp", 2], "model-00001-of-00002.safetensors: file is %d bytes but the header describes %d" % (len(data) - 100, len(data)))
with open(f1, "wb") as f:
    f.write(data)
h = json.loads(data[8:8 + n])
first = sorted(k for k in h if k != "__metadata__")[0]
h[first]["shape"][0] += 1  # the byte count no longer matches the shape
hb = json.dumps(h, separators=(",", ":")).encode()
hb += b" " * ((8 - len(hb) % 8) % 8)
with open(f1, "wb") as f:
    f.write(struct.pack("<Q", len(hb)) + hb + data[8 + n:])
p = tt.tpfs("check", bad)
F.check(p.returncode == 1 and ("BAD  model-00001-of-00002.safetensors: tensor '%s'" % first) in p.stdout
        and "but shape and dtype F32 need" in p.stdout and "ok   model-00002" in p.stdout,
        "check names the bad file and passes the good one: %s" % p.stdout)
with open(f1, "wb") as f:
    f.write(data)
p = tt.tpfs("check", src)
F.check(p.returncode == 0 and "2 safetensors files, 0 invalid" in p.stdout, "check passes a good checkpoint: %s" % p.stdout)

# already a mount
with tt.Mount(src, 2, mnt=mnt):
    p = tt.tpfs("mount", src, mnt, "--tp", 2)
    F.check(p.returncode == 1 and "already a mount point" in p.stderr, "MNT already a mount: %s" % p.stderr)
F.check(not tt.is_mounted(mnt), "the mount is gone after the test mount")

# background mode: returns once the mount answers; umount
t0 = time.time()
p = tt.tpfs("mount", src, mnt, "--tp", 2)
F.check(p.returncode == 0, "background mount: %s" % p.stderr)
F.check(tt.is_mounted(mnt) and sorted(os.listdir(mnt)) == [".tpfs-stats", "config.json", "rank0", "rank1"],
        "the mount answers as soon as tpfs returns")
F.check(os.path.getsize(os.path.join(mnt, "rank1", "model-00001-of-00002.safetensors")) > 0, "files readable at once")
stats = open(os.path.join(mnt, ".tpfs-stats")).read()
F.check("gather: cpu (auto:" in stats, "--gather auto serves with the CPU where no crossover is measured: %s" % stats)
# a file held open: umount refuses, after a short grace for lookups in flight (EBUSY retried for 2 s); closed: it
# unmounts
held = open(os.path.join(mnt, "rank1", "model-00001-of-00002.safetensors"), "rb")
t1 = time.time()
p = tt.tpfs("umount", mnt)
F.check(p.returncode == 1 and "files are open" in p.stderr and tt.is_mounted(mnt) and time.time() - t1 >= 1.5,
        "tpfs umount with a file open refuses, after its grace: %d %r in %.1f s" % (p.returncode, p.stderr, time.time() - t1))
held.close()
p = tt.tpfs("umount", mnt)
F.check(p.returncode == 0 and not tt.is_mounted(mnt), "tpfs umount: %s" % p.stderr)
p = tt.tpfs("umount", mnt)
F.check(p.returncode == 1 and "not a mount point" in p.stderr, "umount of a non-mount refuses")
p = tt.tpfs("mount", src, mnt, "--tp", 2, "-o", "no_such_option_xyz")
F.check(p.returncode == 2 and not tt.is_mounted(mnt), "background mount with a bad -o fails: %s" % p.stderr)

def holders(path):
    """The processes with their working directory or an open file under PATH (what keeps a mount busy)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink("/proc/%s/cwd" % pid)] + [os.readlink("/proc/%s/fd/%s" % (pid, fd))
                                                         for fd in os.listdir("/proc/%s/fd" % pid)]
            if any(l == path or l.startswith(path + "/") for l in links):
                out.append("%s (%s)" % (pid, open("/proc/%s/comm" % pid).read().strip()))
        except OSError:
            continue
    return out


def unmount(mnt):
    """fusermount3 -u MNT, retried for up to 5 s while the kernel says the mount is busy (a process of the
    machine's, another test's, can hold it for a moment): (returncode, stderr, who held it)."""
    seen = []
    for _ in range(25):
        p = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
        if p.returncode == 0 or "busy" not in p.stderr:
            return p.returncode, p.stderr, seen
        seen = seen or holders(mnt)
        time.sleep(0.2)
    return p.returncode, p.stderr, seen


# foreground daemon: fusermount3 -u, SIGTERM, SIGINT
for how in ("fusermount3", "SIGTERM", "SIGINT", "umount"):
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([tt.TPFS, "mount", src, mnt, "--tp", "2", "-f"], stderr=err)
    try:
        tt.wait_for(lambda: tt.is_mounted(mnt) or proc.poll() is not None, what="mount")
        os.listdir(os.path.join(mnt, "rank0"))
        if how == "fusermount3":
            urc, uerr, held = unmount(mnt)
            F.check(urc == 0, "fusermount3 -u: %s (held by %s)" % (uerr.strip(), held or "no process found"))
        elif how == "umount":
            tt.tpfs("umount", mnt, check=True)
        else:
            proc.send_signal(getattr(signal, how))
        rc = proc.wait(timeout=20)
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError, OSError) as ex:
        rc = "hung or failed: %s" % ex
    finally:
        if proc.poll() is None:  # never left behind: it holds the test's output open
            proc.kill()
            proc.wait()
    err.seek(0)
    e = err.read()
    F.check(rc == 0, "%s: daemon exits 0 (got %s): %s" % (how, rc, e))
    F.check(not tt.is_mounted(mnt), "%s: nothing left mounted" % how)
    F.check(all(l.startswith("tpfs: info: ") for l in e.splitlines() if l), "%s: clean stderr: %s" % (how, e))
    if tt.is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", mnt])

# SIGTERM as soon as the mount exists, before it has answered anything: the daemon must not wait
# for the ready helper, whose stat of the mount it will never answer (10 times: it is a race)
for k in range(10):
    proc = subprocess.Popen([tt.TPFS, "mount", src, mnt, "--tp", "2", "-f"], stderr=subprocess.DEVNULL)
    tt.wait_for(lambda: tt.is_mounted(mnt) or proc.poll() is not None, what="mount")
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        rc = "hung"
        for t in sorted(os.listdir("/proc/%d/task" % proc.pid)):  # where it waits, for the log
            with contextlib.suppress(OSError):
                print("thread", t, open("/proc/%d/task/%s/comm" % (proc.pid, t)).read().strip(),
                      open("/proc/%d/task/%s/wchan" % (proc.pid, t)).read().strip(),
                      open("/proc/%d/task/%s/stat" % (proc.pid, t)).read().split()[2])
        print(subprocess.run(["ps", "-o", "pid,ppid,stat,wchan:30,args", "--ppid", str(proc.pid)],
                             capture_output=True, text=True).stdout)
    F.check(rc == 0, "SIGTERM at once (%d): the daemon exits 0 (got %s)" % (k, rc))
    F.check(rc == "hung" or not tt.is_mounted(mnt), "SIGTERM at once (%d): nothing left mounted" % k)
    if tt.is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", mnt])
    if rc == "hung":
        proc.kill()
        break

# --tp parsed strictly; background mode reports the daemon's own reason
for bad in ("+2", " 2", "2 ", "0x2", "-2", ""):
    p = tt.tpfs("plan", src, "--tp", bad)
    F.check(p.returncode == 2 and "--tp" in p.stderr, "--tp %r refused with usage (exit %d)" % (bad, p.returncode))
F.check(tt.tpfs("plan", src, "--tp", "2").returncode == 0, "--tp 2 accepted")
p = tt.tpfs("mount", src, mnt, "--tp", "2", "-o", "max_read=1")
F.check(p.returncode == 1 and "maximum read size" in p.stderr and "Connection refused" not in p.stderr,
        "background mount with -o max_read=1: the daemon's reason (exit %d, %r)" % (p.returncode, p.stderr.strip()))
F.check(not tt.is_mounted(mnt), "max_read=1: nothing left mounted")
p = tt.tpfs("mount", src, mnt, "--tp", "2", "-o", "no_such_option")
F.check(p.returncode == 2 and "no_such_option" in p.stderr and p.stderr.count("\n") == 1,
        "background mount with an unknown option: one line naming it, a usage error, before any planning (%r)"
        % p.stderr)
if tt.is_mounted(mnt):
    subprocess.run(["fusermount3", "-u", "-z", mnt])

# tpfs check refuses numbers with leading zeros, as the safetensors package does
lz = os.path.join(work, "lz")
os.makedirs(lz)
for what, hdr in (("shape", '{"w":{"dtype":"F32","shape":[001],"data_offsets":[0,4]}}'),
                  ("offset", '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,04]}}')):
    h = hdr.encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(lz, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"\0" * 4)
    p = tt.tpfs("check", lz)
    F.check(p.returncode == 1 and "leading zero" in p.stdout + p.stderr,
            "check: a %s with a leading zero is refused (exit %d, %r)" % (what, p.returncode, (p.stdout + p.stderr)[-300:]))

# JSON nested deeper than cJSON's limit says so (it said only "not valid JSON (near byte 1025)")
deep = os.path.join(work, "deep")
shutil.copytree(src, deep)
with open(os.path.join(deep, "config.json"), "w") as f:
    f.write('{"x": ' + "[" * 1100 + "]" * 1100 + "}")
p = tt.tpfs("plan", deep, "--tp", "2")
F.check(p.returncode == 1 and "config.json: not valid JSON" in p.stderr and "JSON nested deeper than 512 levels" in p.stderr,
        "deep config.json: nesting named (exit %d, %r)" % (p.returncode, p.stderr.strip()))
deep_plan = os.path.join(work, "deep-plan.json")
with open(deep_plan, "w") as f:
    f.write("[" * 1001 + "]" * 1001)
p = tt.tpfs("plan", src, "--tp", "2", "--plan", deep_plan)
F.check(p.returncode == 1 and "nested deeper than 512 levels" in p.stderr,
        "deep plan file: nesting named (exit %d, %r)" % (p.returncode, p.stderr.strip()))
with open(deep_plan, "w") as f:
    f.write("[" * 499 + "]" * 498 + "x")
p = tt.tpfs("plan", src, "--tp", "2", "--plan", deep_plan)
F.check(p.returncode == 1 and "not valid JSON (near byte 997, line 1 column 998): Expecting ',' delimiter" in p.stderr,
        "shallow broken plan file: position named (exit %d, %r)" % (p.returncode, p.stderr.strip()))

# a rule "split": "axis" with "axis": -1 is shown as "axis 1" (it read "axis axis 1")
plan = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plans", "llama.json")))
for r in plan["rules"]:
    if r.get("name") == "mlp_out":
        r["split"], r["axis"] = "axis", -1
ax_plan = os.path.join(work, "axis-plan.json")
with open(ax_plan, "w") as f:
    json.dump(plan, f)
p = tt.tpfs("plan", src, "--tp", "2", "--plan", ax_plan)
line = [l for l in p.stdout.splitlines() if "mlp.down_proj.weight" in l]
F.check(p.returncode == 0 and line and "axis 1" in line[0] and "axis axis" not in p.stdout,
        "axis -1 shown as 'axis 1' (exit %d, %r, %r)" % (p.returncode, line[:1], p.stderr.strip()[-200:]))

# a per_rank key whose value cannot hold a rank's count (a per-layer list, as Gemma 3n's
# intermediate_size) refuses `tpfs plan` with the mount's message (it printed the other counts and
# exited 0, issue 30's first finding)
lw = os.path.join(work, "listed")
shutil.copytree(src, lw)
cfg = json.load(open(os.path.join(lw, "config.json")))
cfg["layer_widths"] = [96, 96]
json.dump(cfg, open(os.path.join(lw, "config.json"), "w"))
lw_plan = os.path.join(work, "listed-plan.json")
json.dump({"tpfs_plan": 1, "name": "listed", "extends": "llama", "description": "llama, one more per-rank key",
           "per_rank": [{"key": "num_attention_heads"}, {"key": "layer_widths"}], "rules": []}, open(lw_plan, "w"))
p = tt.tpfs("plan", lw, "--tp", "2", "--plan", lw_plan)
F.check(p.returncode == 1 and '"layer_widths" is not a whole number' in p.stderr and "rank's count" in p.stderr,
        "tpfs plan refuses a per_rank key holding a list, as the mount does (exit %d, %r)"
        % (p.returncode, p.stderr.strip()[-200:]))
mnt_lw = os.path.join(work, "mnt-listed")
os.mkdir(mnt_lw)
q = tt.tpfs("mount", lw, mnt_lw, "--tp", "2", "--plan", lw_plan)
F.check(q.returncode == 1 and q.stderr.strip().splitlines()[-1:] == p.stderr.strip().splitlines()[-1:],
        "the mount gives the same refusal (%r)" % q.stderr.strip()[-200:])

# a file named on the command line that is not a regular file (issue 50): a FIFO with no writer given as
# --view or --plan held tpfs in open() (it checked the kind only once it had opened the file); now every such
# file is opened without blocking and refused by what it is, within a second. Also a folder, a device, and
# a FIFO as --log (which the daemon opens once it serves: the mount was made and every access waited).
fifo = os.path.join(work, "view-fifo.json")
os.mkfifo(fifo)
mnt_f = os.path.join(work, "mnt-fifo")
os.mkdir(mnt_f)


def refused_at_once(args, want):
    t0 = time.time()
    try:
        p = subprocess.run([tt.TPFS] + [str(a) for a in args], capture_output=True, text=True, timeout=1)
        rc, err = p.returncode, p.stderr.strip()
    except subprocess.TimeoutExpired:
        rc, err = None, "still running after 1 s"
    F.check(rc == 1 and want in err, "%s: refused within a second (%.2f s): exit %s, %r (want %r)"
            % (" ".join(map(str, args)), time.time() - t0, rc, err[-300:], want))
    if tt.is_mounted(mnt_f):
        subprocess.run(["fusermount3", "-u", "-z", mnt_f])
        F.check(False, "%s: left a mount" % " ".join(map(str, args)))


for opt in ("--view", "--plan"):
    hint = " (give a plan file)" if opt == "--plan" else ""
    refused_at_once(["plan", src, "--tp", 2, opt, fifo], fifo + ": not a regular file (a FIFO)" + hint)
    refused_at_once(["mount", src, mnt_f, "--tp", 2, opt, fifo], fifo + ": not a regular file (a FIFO)" + hint)
    refused_at_once(["mount", src, mnt_f, "--tp", 2, "-f", opt, fifo], fifo + ": not a regular file (a FIFO)" + hint)
refused_at_once(["plan", src, "--tp", 2, "--view", "/dev/null"], "/dev/null: not a regular file (a character device)")
refused_at_once(["plan", src, "--tp", 2, "--plan", work + "/"], work + "/: not a regular file (a folder) (give a plan file)")
refused_at_once(["mount", src, mnt_f, "--tp", 2, "--log", fifo], "--log %s: a FIFO" % fifo)
os.mkfifo(os.path.join(mnt_f, ".tpfs-stats"))
refused_at_once(["stats", mnt_f], ".tpfs-stats: not a regular file (a FIFO) (is %s a tpfs mount?)" % mnt_f)

shutil.rmtree(work)
F.done("test_cli")
