"""Sources that change while mounted.

Truncated, rewritten in place, replaced by a rename, or changed behind a Hugging Face cache link:
reads of the affected rank files fail with EIO (the daemon notices through inotify, drops the
kernel's cached pages of them, and checks size and mtime on every read); no read ever returns bytes
that differ from the original; other files keep working; an mmap reader gets an error, not wrong
bytes; the daemon does not die and exits 0 at unmount, having logged one line per changed file.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import fixtures
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-changing-")
A, B = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
ALLOW = [r"^tpfs: error: .*: the source changed since it was mounted \(.*\); its rank files now fail with EIO"]


def snapshot(m, T):
    return {(r, fn): open(os.path.join(m.rank(r), fn), "rb").read() for r in range(T) for fn in os.listdir(m.rank(r))
            if os.path.isfile(os.path.join(m.rank(r), fn))}


read_state = tt.read_state


def expect_eio(name, m, fn, snap, T):
    """Every rank's copy of fn fails with EIO within a few seconds, never reading wrong bytes."""
    for r in range(T):
        path = os.path.join(m.rank(r), fn)
        end, states = time.time() + 5, []
        while time.time() < end:
            states.append(read_state(path, snap[(r, fn)]))
            if states[-1] != "same":
                break
            time.sleep(0.01)
        F.check(states[-1] == "eio", "%s: rank %d %s fails with EIO (saw %s)" % (name, r, fn, states[-3:]))
        F.check("WRONG" not in states, "%s: rank %d %s never read wrong bytes" % (name, r, fn))
        for _ in range(3):
            F.check(read_state(path, snap[(r, fn)]) == "eio", "%s: rank %d %s keeps failing" % (name, r, fn))


def expect_ok(name, m, fn, snap, T):
    for r in range(T):
        F.check(read_state(os.path.join(m.rank(r), fn), snap[(r, fn)]) == "same", "%s: rank %d %s still served" % (name, r, fn))


# truncation, in-place rewrite, a changed plain file, an mmap reader
src = os.path.join(work, "m1")
fixtures.make("llama", src)
with tt.Mount(src, 2, allow_stderr=ALLOW) as m:
    snap = snapshot(m, 2)
    # an mmap reader of the file that is about to shrink, in a child process
    reader = subprocess.Popen([sys.executable, "-c", """
import mmap, sys, time
f = open(sys.argv[1], 'rb'); mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
orig = open(sys.argv[2], 'rb').read()
sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()
import posix; posix.posix_fadvise(f.fileno(), 0, 0, posix.POSIX_FADV_DONTNEED)
data = mm[:]
print('SAME' if data == orig else 'WRONG')
""", os.path.join(m.rank(1), A), "/dev/null"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    reader.stdout.readline()
    os.truncate(os.path.join(src, A), os.path.getsize(os.path.join(src, A)) // 2)
    expect_eio("truncated", m, A, snap, 2)
    expect_ok("truncated (other file)", m, B, snap, 2)
    expect_ok("truncated (config)", m, "config.json", snap, 2)
    reader.stdin.write("go\n")
    reader.stdin.flush()
    out, _ = reader.communicate(timeout=30)
    F.check(reader.returncode != 0 and "WRONG" not in out and "SAME" not in out,
            "an mmap reader of the truncated file fails (exit %s, %r)" % (reader.returncode, out))
    with open(os.path.join(src, B), "r+b") as f:   # same size, other bytes
        f.seek(os.path.getsize(os.path.join(src, B)) - 64)
        f.write(os.urandom(64))
    expect_eio("rewritten in place", m, B, snap, 2)
    # MNT/config.json (the source's, served from memory) read through a descriptor opened before the change:
    # its cached pages must be dropped like every rank file's, so the next read reaches the daemon and fails
    top_cfg = os.open(os.path.join(m.path, "config.json"), os.O_RDONLY)
    before = os.pread(top_cfg, 1 << 20, 0)
    F.check(before == open(os.path.join(src, "config.json"), "rb").read(), "MNT/config.json is the source's")
    with open(os.path.join(src, "config.json"), "a") as f:
        f.write(" ")
    expect_eio("plain file changed", m, "config.json", snap, 2)
    end, seen = time.time() + 5, "same"
    while time.time() < end and seen == "same":
        try:
            seen = "same" if os.pread(top_cfg, 1 << 20, 0) == before else "WRONG"
        except OSError as e:
            seen = "eio" if e.errno == 5 else "error %d" % e.errno
        time.sleep(0.01)
    os.close(top_cfg)
    F.check(seen == "eio", "MNT/config.json through a descriptor opened before the change fails with EIO (saw %s)"
            % seen)
    expect_ok("others", m, "tokenizer_config.json", snap, 2)
    expect_ok("the rewritten index is not affected", m, "model.safetensors.index.json", snap, 2)

# replaced by a rename
src = os.path.join(work, "m2")
fixtures.make("llama", src)
with tt.Mount(src, 2, allow_stderr=ALLOW) as m:
    snap = snapshot(m, 2)
    tmp = os.path.join(src, ".new")
    shutil.copyfile(os.path.join(src, A), tmp)
    with open(tmp, "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\x7f" * 8)
    os.replace(tmp, os.path.join(src, A))
    expect_eio("replaced by rename", m, A, snap, 2)
    expect_ok("replaced (other file)", m, B, snap, 2)

# a Hugging Face cache snapshot: files are links into ../../blobs/
hf = os.path.join(work, "hub", "models--x--y")
blobs, snapdir = os.path.join(hf, "blobs"), os.path.join(hf, "snapshots", "abc123")
os.makedirs(blobs)
os.makedirs(snapdir)
fixtures.make("llama", os.path.join(work, "plain"))
for fn in os.listdir(os.path.join(work, "plain")):
    shutil.copyfile(os.path.join(work, "plain", fn), os.path.join(blobs, "sha-" + fn))
    os.symlink(os.path.join("..", "..", "blobs", "sha-" + fn), os.path.join(snapdir, fn))
with tt.Mount(snapdir, 2, allow_stderr=ALLOW) as m:
    snap = snapshot(m, 2)
    F.check(len(snap[(1, A)]) > 0 and sorted(os.listdir(m.rank(0))) == sorted(os.listdir(snapdir)),
            "a Hugging Face snapshot folder mounts through its links")
    with open(os.path.join(blobs, "sha-" + A), "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\x01" * 8)
    expect_eio("blob behind a link changed", m, A, snap, 2)
    expect_ok("blob (other file)", m, B, snap, 2)

shutil.rmtree(work)
F.done("test_changing")
