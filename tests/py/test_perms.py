"""Permissions and the mount itself: no wider access than the source gives.

Run as root (the case the issue found): another user (setpriv to 65534) is denied a 0600 source
file, a link to a 0600 file outside SRC, a 0600 safetensors file and anything under a 0700
folder, and is allowed a 0644 file only with -o allow_other (without it a FUSE mount refuses
every other user). Served files keep the source's owner, group and read/execute bits. "-o rw"
leaves the mount read-only at the VFS. A link into the mount point is refused before mounting
(the mount would read itself), with nothing mounted and no daemon left behind.
"""
import os
import shutil
import stat
import subprocess
import tempfile
import time

import fixtures
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-perms-")
os.chmod(work, 0o755)  # other users may walk to SRC and to the outside file (their modes decide)
src = os.path.join(work, "src")
fixtures.make("llama", src)
TENSORS = "model-00001-of-00002.safetensors"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

with open(os.path.join(src, "secret.txt"), "w") as f:
    f.write("root only\n")
os.chmod(os.path.join(src, "secret.txt"), 0o600)
with open(os.path.join(src, "public.txt"), "w") as f:
    f.write("anyone\n")
os.chmod(os.path.join(src, "public.txt"), 0o644)
os.chmod(os.path.join(src, TENSORS), 0o600)
os.makedirs(os.path.join(src, "private"))
with open(os.path.join(src, "private", "inside.txt"), "w") as f:
    f.write("inside a 0700 folder\n")
os.chmod(os.path.join(src, "private", "inside.txt"), 0o644)
os.chmod(os.path.join(src, "private"), 0o700)
outside = os.path.join(work, "outside")
os.makedirs(outside)
os.chmod(outside, 0o755)
with open(os.path.join(outside, "shadow"), "w") as f:
    f.write("not for you\n")
os.chmod(os.path.join(outside, "shadow"), 0o600)
os.symlink(os.path.join(outside, "shadow"), os.path.join(src, "linked-secret"))
os.chown(os.path.join(src, "public.txt"), 1234, 5678)


def as_nobody(*cmd):
    return subprocess.run(NOBODY + list(cmd), capture_output=True, text=True, errors="replace", timeout=60)


def denied(path, what):
    p = as_nobody("cat", path)
    F.check(p.returncode != 0 and "Permission denied" in p.stderr and not p.stdout,
            "%s: another user is denied (exit %d, out %r, err %r)" % (what, p.returncode, p.stdout[:60], p.stderr.strip()))


def allowed(path, want, what):
    p = as_nobody("cat", path)
    F.check(p.returncode == 0 and p.stdout == want, "%s: another user reads it (exit %d, err %r)" % (what, p.returncode, p.stderr.strip()))


with tt.Mount(src, 2, "-o", "allow_other") as m:
    r0 = m.rank(0)
    denied(os.path.join(r0, "secret.txt"), "0600 file")
    denied(os.path.join(r0, "linked-secret"), "link to a 0600 file outside SRC")
    denied(os.path.join(r0, TENSORS), "0600 safetensors file")
    denied(os.path.join(r0, "private", "inside.txt"), "0644 file in a 0700 folder")
    p = as_nobody("ls", os.path.join(r0, "private"))
    F.check(p.returncode != 0, "0700 folder: another user cannot list it (exit %d)" % p.returncode)
    allowed(os.path.join(r0, "public.txt"), "anyone\n", "0644 file with -o allow_other")
    # root still reads everything, and the attributes are the source's (write bits cleared)
    F.check(open(os.path.join(r0, "secret.txt")).read() == "root only\n", "root reads the 0600 file")
    for name, want_mode, uid, gid in [("secret.txt", 0o400, 0, 0), ("public.txt", 0o444, 1234, 5678),
                                      ("linked-secret", 0o400, 0, 0), (TENSORS, 0o400, 0, 0)]:
        st = os.stat(os.path.join(r0, name))
        F.check(stat.S_IMODE(st.st_mode) == want_mode and st.st_uid == uid and st.st_gid == gid,
                "%s: mode %o owner %d:%d, want %o %d:%d" % (name, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                                                            want_mode, uid, gid))
    st = os.stat(os.path.join(r0, "private"))
    F.check(stat.S_IMODE(st.st_mode) == 0o500, "0700 folder served as 0500 (got %o)" % stat.S_IMODE(st.st_mode))

# without -o allow_other no other user gets in at all, even to a 0644 file
with tt.Mount(src, 2) as m:
    p = as_nobody("cat", os.path.join(m.rank(0), "public.txt"))
    F.check(p.returncode != 0 and not p.stdout, "no allow_other: another user is refused (exit %d)" % p.returncode)
    F.check(open(os.path.join(m.rank(0), "public.txt")).read() == "anyone\n", "no allow_other: root reads")

# SRC's mode tightened after mounting: the top folder follows at once, as the rank folders do
src4 = os.path.join(work, "src4")
shutil.copytree(src, src4, symlinks=True)
os.chmod(src4, 0o755)
with tt.Mount(src4, 2, "--ranks", "0", "-o", "allow_other") as m:
    F.check(stat.S_IMODE(os.stat(m.path).st_mode) == 0o555, "top folder 0555 before the chmod")
    os.chmod(src4, 0o700)
    time.sleep(0.3)
    modes = [stat.S_IMODE(os.stat(p).st_mode) for p in (m.path, m.rank(0), os.path.join(m.path, ".tpfs-stats"))]
    F.check(modes == [0o500, 0o500, 0o400], "chmod 700 SRC: top folder, rank folder, stats file %s" % [oct(x) for x in modes])
    p = as_nobody("ls", m.path)
    F.check(p.returncode != 0 and not p.stdout, "chmod 700 SRC: another user cannot list the mount (%r)" % p.stdout)

# -o rw cannot make the mount writable
with tt.Mount(src, 2, "-o", "rw") as m:
    opts = [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == os.path.realpath(m.path)]
    F.check(opts and "ro" in opts[0].split(","), "-o rw: mounted read-only (mount options %s)" % opts)
    try:
        os.open(os.path.join(m.rank(0), "public.txt"), os.O_WRONLY)
        F.check(False, "-o rw: opening for write fails")
    except OSError as e:
        F.check(e.errno == 30, "-o rw: opening for write fails with EROFS (got %s)" % e)

# -o options long enough to cut ours (ro, default_permissions) short are refused, not mounted
# wide open (as root with allow_other, another user read a 0600 file)
longo = "allow_other,fsname=" + "a" * (4067 - len("allow_other,fsname="))
mnt = tempfile.mkdtemp(prefix="tpfs-perms-mnt-")
for mode in (["-f"], []):
    try:
        p = subprocess.run([tt.TPFS, "mount", src, mnt, "--tp", "2", "-o", longo] + mode, capture_output=True,
                           text=True, timeout=3 if mode else 30)
        out = (p.returncode, p.stderr.strip()[-200:])
    except subprocess.TimeoutExpired:
        out = ("still running", "")
    F.check(out[0] == 1 and "too long" in out[1], "-o of 4067 characters %s: refused (%s, %r)" % (mode, *out))
    if tt.is_mounted(mnt):
        p = as_nobody("cat", os.path.join(mnt, "rank0", "secret.txt"))
        F.check(not p.stdout, "-o of 4067 characters: another user read a 0600 file: %r" % p.stdout)
        subprocess.run(["fusermount3", "-u", "-z", mnt])
os.rmdir(mnt)

# a link into the mount point is refused before mounting (the issue's own example)
mnt = tempfile.mkdtemp(prefix="tpfs-perms-mnt-")
with open(os.path.join(mnt, "leftover.txt"), "w") as f:
    f.write("x\n")
src2 = os.path.join(work, "src2")
shutil.copytree(src, src2, symlinks=True)
os.symlink(os.path.join(mnt, "leftover.txt"), os.path.join(src2, "extra.txt"))
for mode in (["-f"], []):
    p = subprocess.run([tt.TPFS, "mount", src2, mnt, "--tp", "2"] + mode, capture_output=True, text=True, timeout=30)
    F.check(p.returncode == 1 and "extra.txt: leads into the mount point" in p.stderr,
            "link into MNT %s: refused (exit %d, %r)" % (mode, p.returncode, p.stderr.strip()))
    F.check(not tt.is_mounted(mnt), "link into MNT %s: nothing mounted" % mode)
    if tt.is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", mnt])
# a folder link into MNT too
os.remove(os.path.join(src2, "extra.txt"))
os.symlink(mnt, os.path.join(src2, "sub"))
p = subprocess.run([tt.TPFS, "mount", src2, mnt, "--tp", "2"], capture_output=True, text=True, timeout=30)
F.check(p.returncode == 1 and "sub: leads into the mount point" in p.stderr,
        "folder link into MNT: refused (exit %d, %r)" % (p.returncode, p.stderr.strip()))
shutil.rmtree(mnt)

# SRC replaced, after mounting, by a link into the mount itself (or a folder on a source's path
# by one): the daemon never follows it (a handler would wait on its own mount; with every worker
# waiting, even SIGTERM could not end it); reads fail with EIO and the daemon unmounts
src3 = os.path.join(work, "src3")
shutil.copytree(src, src3, symlinks=True)
with tt.Mount(src3, 2, allow_stderr=[r"the source changed since it was mounted"]) as m:
    F.check(open(os.path.join(m.rank(0), "public.txt")).read() == "anyone\n", "link swap: served before")
    dev = os.stat(m.path).st_dev
    os.rename(src3, src3 + ".old")
    os.symlink(m.rank(0), src3)
    time.sleep(0.3)
    for name in ("rank0/public.txt", "rank1/config.json", "rank1/model.safetensors.index.json"):
        # not subprocess.run(timeout=): a reader waiting on a hung FUSE request survives SIGKILL
        p = subprocess.Popen(["cat", os.path.join(m.path, name)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        end = time.time() + 10
        while p.poll() is None and time.time() < end:
            time.sleep(0.05)
        if p.poll() is None:
            F.check(False, "SRC replaced by a link into MNT: reading %s hangs (the daemon reads its own mount)" % name)
            with open("/sys/fs/fuse/connections/%d/abort" % os.minor(dev), "w") as f:
                f.write("1\n")
            p.wait()
            break
        err = p.stderr.read()
        F.check(p.returncode != 0 and "Input/output error" in err,
                "SRC replaced by a link into MNT: %s fails with EIO (exit %d, %r)" % (name, p.returncode, err.strip()))
    os.remove(src3)
    os.rename(src3 + ".old", src3)

# a folder swapped for a link into MNT after planning, before the watches are added (the mount
# exists by then and its loop has not started): adding the watch must not follow the link (it
# would wait on the mount for ever). A preloaded inotify_add_watch makes the swap at the first
# watch, so the window is hit every time.
shim_c = os.path.join(work, "swap.c")
with open(shim_c, "w") as f:
    f.write(r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int inotify_add_watch(int fd, const char *path, uint32_t mask)
{
	static int done;
	const char *from = getenv("SWAP_FROM"), *to = getenv("SWAP_TO");
	if (!done && from && to) {
		char old[4096];
		snprintf(old, sizeof old, "%s.old", from);
		done = rename(from, old) == 0 && symlink(to, from) == 0 ? 1 : -1;
	}
	int (*real)(int, const char *, uint32_t) = (int (*)(int, const char *, uint32_t))dlsym(RTLD_NEXT, "inotify_add_watch");
	return real(fd, path, mask);
}
""")
shim = os.path.join(work, "swap.so")
subprocess.run(["cc", "-shared", "-fPIC", "-o", shim, shim_c, "-ldl"], check=True)
src5 = os.path.join(work, "src5")
shutil.copytree(src, src5, symlinks=True)
mnt = os.path.realpath(tempfile.mkdtemp(prefix="tpfs-perms-mnt-"))


def mnt_dev():
    """MNT's device from mountinfo, or None: no stat of MNT, which would wait on a stuck daemon."""
    return next((l.split()[2] for l in open("/proc/self/mountinfo") if l.split()[4] == mnt), None)


env = dict(os.environ, LD_PRELOAD=shim, SWAP_FROM=os.path.join(src5, "private"), SWAP_TO=os.path.join(mnt, "rank0"),
           ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0")
errf = tempfile.TemporaryFile(mode="w+")
d = subprocess.Popen([tt.TPFS, "mount", src5, mnt, "--tp", "2", "-f"], stderr=errf, stdout=subprocess.DEVNULL, env=env)
tt.wait_for(lambda: mnt_dev() or d.poll() is not None, what="the mount")
results = {}
for name in ("rank0/public.txt", "rank0/private/inside.txt"):
    p = subprocess.Popen(["cat", os.path.join(mnt, name)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.time() + 10
    while p.poll() is None and time.time() < end:
        time.sleep(0.05)
    if p.poll() is None:
        F.check(False, "watch swap: reading %s hangs (adding a watch followed the link into the mount)" % name)
        with open("/sys/fs/fuse/connections/%s/abort" % mnt_dev().split(":")[1], "w") as f:
            f.write("1\n")
        p.wait()
        break
    results[name] = (p.returncode, p.stdout.read(), p.stderr.read())
F.check(os.path.islink(os.path.join(src5, "private")), "watch swap: the shim swapped the folder for a link")
if "rank0/public.txt" in results:
    F.check(results["rank0/public.txt"][:2] == (0, "anyone\n"), "watch swap: other files still served (%r)" % (results["rank0/public.txt"],))
if "rank0/private/inside.txt" in results:
    r = results["rank0/private/inside.txt"]
    F.check(r[0] != 0 and "Input/output error" in r[2], "watch swap: a file under the swapped folder fails with EIO (%r)" % (r,))
subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
try:
    d.wait(timeout=30)
except subprocess.TimeoutExpired:
    d.kill()
    d.wait()
errf.seek(0)
log = errf.read()
F.check("cannot watch" in log, "watch swap: the unwatched folder is logged (%r)" % log[-300:])
os.remove(os.path.join(src5, "private"))
os.rename(os.path.join(src5, "private.old"), os.path.join(src5, "private"))
os.rmdir(mnt)
# what docs/SAFETY.md says: only SRC's own mode and what is under it are copied; a
# 0700 folder above SRC does not protect a 0644 file in it from other users under -o allow_other,
# and a restrictive mode on SRC itself does
above = os.path.join(work, "above")
src6 = os.path.join(above, "src6")
shutil.copytree(src, src6, symlinks=True)
os.chmod(above, 0o700)
os.chmod(src6, 0o755)
F.check(as_nobody("cat", os.path.join(src6, "public.txt")).returncode != 0, "0700 folder above SRC keeps others out of SRC")
with tt.Mount(src6, 2, "-o", "allow_other") as m:
    allowed(os.path.join(m.rank(0), "public.txt"), "anyone\n", "0644 file in SRC under a 0700 folder above SRC (docs/SAFETY.md)")
os.chmod(src6, 0o700)
with tt.Mount(src6, 2, "-o", "allow_other") as m:
    p = as_nobody("cat", os.path.join(m.rank(0), "public.txt"))
    F.check(p.returncode != 0 and not p.stdout, "SRC itself 0700: another user is denied (%r)" % p.stdout)
shutil.rmtree(work)
F.done("perms")
