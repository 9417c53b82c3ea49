"""Issue 11, permissions and the mount itself: no wider access than the source gives.

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

# -o rw cannot make the mount writable
with tt.Mount(src, 2, "-o", "rw") as m:
    opts = [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == os.path.realpath(m.path)]
    F.check(opts and "ro" in opts[0].split(","), "-o rw: mounted read-only (mount options %s)" % opts)
    try:
        os.open(os.path.join(m.rank(0), "public.txt"), os.O_WRONLY)
        F.check(False, "-o rw: opening for write fails")
    except OSError as e:
        F.check(e.errno == 30, "-o rw: opening for write fails with EROFS (got %s)" % e)

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
shutil.rmtree(work)
F.done("perms")
