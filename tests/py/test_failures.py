"""The failed-files list: a failed file is named, with its reason and time, where a user looks.

A loader that maps a rank file (vLLM, SGLang, safetensors, transformers) gets a failed read as a bus
error (SIGBUS); the reason is in tpfs's log. So:
1. A source rewritten in place after mounting: a read of its rank file fails with EIO, an mmap
   reader of it dies of SIGBUS, and `tpfs stats MNT` (and MNT/.tpfs-stats) lists the file with the
   reason ("the source changed since it was mounted") and a UTC time of the failure; files that did
   not fail are not listed, and a file that fails again is listed once.
2. The list is bounded: 20 changed files list the latest 16, the total and "and 4 earlier files".
3. `tpfs mount` in background mode says where the daemon logs (--log FILE, made absolute; syslog
   without it), and the stats file says it too.
"""
import calendar
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import fixtures
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-failures-")
ALLOW = [r"^tpfs: error: .*: the source changed since it was mounted \(.*\); its rank files now fail with EIO"]
A, B = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
LINE = re.compile(r"^  (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) (\S+): (.*)$")


def failed(text):
    """(the "failed:" line, [(time, file, reason)] of the listed files, the "and N earlier" line or None)."""
    head = next((l for l in text.splitlines() if l.startswith("failed: ")), None)
    listed = [LINE.match(l).groups() for l in text.splitlines() if LINE.match(l)]
    more = next((l.strip() for l in text.splitlines() if l.startswith("  and ")), None)
    return head, listed, more


def rewrite(path):
    """Same size, other bytes, at the end of the data."""
    with open(path, "r+b") as f:
        f.seek(-16, 2)
        f.write(os.urandom(16))


def recent(stamp, t0):
    t = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    return t0 - 2 <= t <= time.time() + 2


# ---- 1. one file rewritten: EIO, SIGBUS, and the stats name it ----
src = os.path.join(work, "m1")
fixtures.make("llama", src)
with tt.Mount(src, 2, allow_stderr=ALLOW) as m:
    p = tt.tpfs("stats", m.path)
    F.check(p.returncode == 0 and "failed: none" in p.stdout, "before any failure the stats say 'failed: none':\n%s"
            % p.stdout)
    F.check("log: stderr" in p.stdout, "a foreground mount's stats say it logs to stderr")
    t0 = time.time()
    reader = subprocess.Popen([sys.executable, "-c", """
import mmap, sys
f = open(sys.argv[1], 'rb'); mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()
import posix; posix.posix_fadvise(f.fileno(), 0, 0, posix.POSIX_FADV_DONTNEED)
data = mm[:]
print('READ %d' % len(data))
""", os.path.join(m.rank(1), A)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    reader.stdout.readline()
    rewrite(os.path.join(src, A))
    state = "same"
    end = time.time() + 5
    while state != "eio" and time.time() < end:
        try:
            open(os.path.join(m.rank(0), A), "rb").read()
        except OSError as e:
            state = "eio" if e.errno == 5 else "errno %d" % e.errno
        time.sleep(0.01)
    F.check(state == "eio", "a read of the rewritten file's rank copy fails with EIO (%s)" % state)
    reader.stdin.write("go\n")
    reader.stdin.flush()
    out, _ = reader.communicate(timeout=30)
    F.check(reader.returncode == -signal.SIGBUS, "an mmap reader of it dies of SIGBUS (exit %s, %r)"
            % (reader.returncode, out))
    for _ in range(3):  # failing again lists it once
        try:
            open(os.path.join(m.rank(1), A), "rb").read()
        except OSError:
            pass
    F.check(open(os.path.join(m.rank(0), B), "rb").read() != b"", "the other file is still served")
    p = tt.tpfs("stats", m.path)
    head, listed, more = failed(p.stdout)
    F.check(p.returncode == 0 and head is not None and head.startswith("failed: 1 file ") and "SIGBUS" in head,
            "tpfs stats counts one failed file and says what a loader sees: %r" % head)
    F.check(len(listed) == 1 and listed[0][1] == A and more is None, "tpfs stats lists the file once: %s" % listed)
    if listed:
        F.check("the source changed since it was mounted" in listed[0][2] and "EIO" in listed[0][2],
                "tpfs stats gives the reason: %r" % listed[0][2])
        F.check(recent(listed[0][0], t0), "tpfs stats gives the failure's time: %s" % listed[0][0])
    F.check(failed(open(os.path.join(m.path, ".tpfs-stats")).read())[1] == listed,
            "MNT/.tpfs-stats lists the same")

# ---- 2. bounded: the latest 16 files, and a count of the rest ----
src = os.path.join(work, "m2")
c, t = fixtures.llama()
fixtures.save(src, c, t, nfiles=len(t))  # one tensor a file
files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
with tt.Mount(src, 2, allow_stderr=ALLOW) as m:
    changed = files[:20]
    for fn in changed:
        rewrite(os.path.join(src, fn))
        try:
            open(os.path.join(m.rank(0), fn), "rb").read()
        except OSError:
            pass
        time.sleep(0.02)  # one second's stamps still order them: the list is in the order they failed
    text = tt.tpfs("stats", m.path).stdout
    head, listed, more = failed(text)
    F.check(head is not None and head.startswith("failed: 20 files "), "20 failed files counted: %r" % head)
    names = [x[1] for x in listed]
    F.check(names == changed[4:], "the latest 16 listed, oldest first: %s" % names)
    F.check(more == "and 4 earlier files not listed (the log names every one)", "the rest counted: %r" % more)
    F.check(len(text) <= os.path.getsize(os.path.join(m.path, ".tpfs-stats")) + 1,
            "the stats file's size bounds its text (%d)" % len(text))

# ---- 3. background mode says where the daemon logs ----
src = os.path.join(work, "m1")
mnt = os.path.join(work, "mnt")
os.mkdir(mnt)
p = tt.tpfs("mount", src, mnt, "--tp", "2", "--log", "daemon.log", cwd=work)
log = os.path.join(work, "daemon.log")
F.check(p.returncode == 0 and ("logs to %s" % log) in p.stderr and ("tpfs stats %s" % mnt) in p.stderr,
        "a background mount names its log file, made absolute, and tpfs stats: %r" % p.stderr)
if p.returncode == 0:
    F.check(("log: %s\n" % log) in open(os.path.join(mnt, ".tpfs-stats")).read(), "the stats file names the log file")
    tt.tpfs("umount", mnt)
    F.check(os.path.exists(log) and "tpfs: info: gather: " in open(log).read(), "the daemon logged there")
p = tt.tpfs("mount", src, mnt, "--tp", "2")
F.check(p.returncode == 0 and "logs to syslog" in p.stderr, "without --log, it says syslog: %r" % p.stderr)
if p.returncode == 0:
    tt.tpfs("umount", mnt)

shutil.rmtree(work)
F.done("test_failures")
