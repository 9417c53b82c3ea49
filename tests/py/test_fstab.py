"""The mount conventions: tpfs mounted by mount(8), from an fstab line and by a systemd mount unit.

mount(8) mounts a fuse.tpfs file system with Debian's mount.fuse3 (util-linux falls back to /sbin/mount.fuse for
a fuse.TYPE without a /sbin/mount.fuse.TYPE helper), which runs `tpfs SRC MNT -o OPTIONS` through /bin/sh with
mount(8)'s environment: no PATH, so the shell's default one (/usr/local/sbin first). The test runs in a mount
namespace of its own (unshare -m), where a folder holding a link to the tpfs under test is bind-mounted over
/usr/local/sbin: nothing outside the namespace changes. There, with a llama checkpoint (fixtures.py):
1. `mount -t fuse.tpfs SRC MNT -o tp=2,ranks=1,noatime`: MNT holds rank1 alone, every file of it byte-equal to
   `tpfs mount SRC REF --tp 2`'s rank1; the mount is fuse.tpfs, ro, nosuid, nodev (mount.fuse3 adds dev,suid:
   dropped), noatime; `umount MNT` unmounts it and its daemon exits.
2. An fstab line `SRC MNT fuse.tpfs tp=2,view=vllm,ranks=0:1,defaults,noauto,nofail,_netdev,x-systemd.automount,
   comment=tpfs 0 0` mounted by `mount -T FSTAB MNT`: vLLM's part files of both ranks, byte-equal to
   `tpfs mount --view vllm`'s.
3. `mount.fuse3 tpfs#SRC MNT -o ...` run directly, with the options mount(8) would have dropped (defaults,
   x-systemd.*, comment=): tpfs drops them too.
4. An unknown key (`tpp=2`) and a key without its value (`tp`): mount exits non-zero, the message names the key,
   nothing is mounted.
5. The systemd unit contrib/srv-tpfs-llama.mount: `systemd-analyze verify` accepts it (where systemd-analyze is
   installed; the test says so otherwise), and its What/Where/Type/Options, with What and Where pointed at this
   test's folders, mounted as systemd mounts them (`mount What Where -t Type -o Options`) serve vLLM's ranks 0-7
   of TP=8 (llama's fixture has 8 heads), byte-equal to `tpfs mount`'s.
Needs root, mount.fuse3 and a mount namespace (unshare -m); exits 77 naming what is missing.
"""
import configparser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
UNIT = os.path.join(HERE, "..", "..", "contrib", "srv-tpfs-llama.mount")
HELPER_DIR = "/usr/local/sbin"  # the first folder of /bin/sh's default PATH
# the commands run with the system's PATH, which mount(8) gives its helpers (a tpfs elsewhere on the test's own
# PATH, a pip-installed one, must not be the one mount.fuse3 finds)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def digests(folder):
    """{relative path: sha256} of every file under FOLDER, read whole."""
    out = {}
    for d, _, fs in os.walk(folder):
        for f in fs:
            p = os.path.join(d, f)
            if os.path.basename(p) == ".tpfs-stats":
                continue
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def mount_opts(mnt):
    """(fstype, mount options) of MNT in mountinfo, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if left.split()[4] == os.path.realpath(mnt):
                return right.split()[0], left.split()[5].split(",")
    return None


def daemons(mnt):
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if os.path.realpath(mnt).encode() in args and os.path.basename(args[0]) == b"tpfs":
            out.append(int(d))
    return out


def wait_until(pred, timeout):
    end = time.time() + timeout
    while not pred() and time.time() < end:
        time.sleep(0.1)
    return pred()


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, PATH=SYSTEM_PATH), **kw)
    return p.returncode, (p.stdout + p.stderr).strip()


def main():
    import fixtures
    import tpfs_test as tt
    F = tt.Failures()
    work = tempfile.mkdtemp(prefix="tpfs-fstab-")
    helper = os.path.join(work, "sbin")
    os.mkdir(helper)
    os.symlink(os.path.realpath(tt.TPFS), os.path.join(helper, "tpfs"))
    subprocess.run(["mount", "--bind", helper, HELPER_DIR], check=True)  # in this namespace only
    src = os.path.join(work, "llama")
    fixtures.make("llama", src)
    mnt = os.path.join(work, "mnt")
    os.mkdir(mnt)

    def served_as(args, what):
        """The files of `tpfs mount SRC REF --tp ...ARGS` (the reference mount)."""
        with tt.Mount(src, *args) as m:
            d = digests(m.path)
        F.check(d, "%s: the reference mount served nothing" % what)
        return d

    def check_mount(what, cmd, want, opts_want=("ro", "nosuid", "nodev"), at=mnt):
        rc, out = run(cmd)
        F.check(rc == 0, "%s: %s exited %d: %s" % (what, " ".join(cmd), rc, out[-1500:]))
        if rc:
            return
        fo = mount_opts(at)
        F.check(fo and fo[0] == "fuse.tpfs" and set(opts_want) <= set(fo[1]),
                "%s: mounted as %s, not fuse.tpfs with %s" % (what, fo, opts_want))
        have = digests(at)
        F.check(have == want, "%s: the files differ from tpfs mount's: %s" % (
            what, sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))[:5]))
        pids = daemons(at)
        rc, out = run(["umount", at])
        F.check(rc == 0 and not tt.is_mounted(at), "%s: umount: %d %s" % (what, rc, out))
        gone = wait_until(lambda: not any(os.path.exists("/proc/%d" % p) for p in pids), 10)
        F.check(pids and gone, "%s: the daemon %s still runs after umount" % (what, pids))
        print("%-44s %d files byte-equal, %s, daemon gone after umount" % (what, len(have), ",".join(fo[1])))

    try:
        rank1 = served_as([2, "--ranks", "1"], "ranks=1")
        check_mount("mount -t fuse.tpfs -o tp=2,ranks=1,noatime",
                    ["mount", "-t", "fuse.tpfs", src, mnt, "-o", "tp=2,ranks=1,noatime"], rank1,
                    ("ro", "nosuid", "nodev", "noatime"))
        F.check(not any(k.startswith("rank0/") for k in rank1), "ranks=1 served rank0 too")

        vllm = served_as([2, "--view", "vllm", "--ranks", "0,1"], "view=vllm")
        fstab = os.path.join(work, "fstab")
        with open(fstab, "w") as f:
            f.write("# tpfs test\n%s %s fuse.tpfs tp=2,view=vllm,ranks=0:1,defaults,noauto,nofail,_netdev,"
                    "x-systemd.automount,comment=tpfs 0 0\n" % (src, mnt))
        check_mount("fstab line, mount -T FSTAB MNT", ["mount", "-T", fstab, mnt], vllm)
        check_mount("mount.fuse3 tpfs#SRC MNT -o ...", ["mount.fuse3", "tpfs#" + src, mnt, "-o",
                    "tp=2,view=vllm,ranks=0-1,defaults,x-systemd.requires=x.service,comment=y,rw"], vllm)

        for opts, name in (("tp=2,tpp=2", "tpp=2"), ("view=vllm,tp", "-o tp: give tp=VALUE")):
            rc, out = run(["mount", "-t", "fuse.tpfs", src, mnt, "-o", opts])
            F.check(rc != 0 and name in out and not tt.is_mounted(mnt),
                    "-o %s: refused naming %r wanted, got %d %r (mounted: %s)" % (opts, name, rc, out, tt.is_mounted(mnt)))
            print("-o %-41s refused: %s" % (opts, out.splitlines()[0] if out else ""))

        # the systemd unit: verified by systemd-analyze, and mounted as systemd mounts it
        if shutil.which("systemd-analyze"):
            rc, out = run(["systemd-analyze", "verify", os.path.realpath(UNIT)])
            F.check(rc == 0 and not out, "systemd-analyze verify %s: %d %s" % (UNIT, rc, out))
            print("systemd-analyze verify contrib/srv-tpfs-llama.mount: %s" % (out or "no complaint"))
        else:
            print("systemd-analyze is not installed: the unit is not verified by systemd here")
        unit = configparser.ConfigParser(interpolation=None, strict=False)
        unit.optionxform = str
        unit.read(UNIT)
        m = unit["Mount"]
        F.check(m["Type"] == "fuse.tpfs" and re.search(r"(^|,)tp=8(,|$)", m["Options"]),
                "the unit's Type/Options: %s %s" % (m["Type"], m["Options"]))
        want = served_as(["8", "--view", "vllm", "--ranks", "0-7", "-o", "allow_other"], "the unit at TP=8")
        check_mount("the unit's What/Where/Type/Options", ["mount", src, mnt, "-t", m["Type"], "-o", m["Options"]],
                    want)
        print("the unit: What=%s Where=%s Type=%s Options=%s (What and Where pointed at the test's folders)"
              % (m["What"], m["Where"], m["Type"], m["Options"]))
    finally:
        for _ in range(3):
            if not tt.is_mounted(mnt):
                break
            subprocess.run(["umount", "-l", mnt])
        subprocess.run(["umount", "-l", HELPER_DIR])
    if not F.items:
        shutil.rmtree(work, ignore_errors=True)
    F.done("fstab")


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    import tpfs_test as tt
    tt.require_fuse()
    missing = [x for x in ("mount.fuse3", "unshare", "mount") if not shutil.which(x)]
    if os.geteuid() != 0 or missing:
        print("SKIP: %s" % ("needs root" if os.geteuid() else "missing: " + ", ".join(missing)))
        sys.exit(tt.SKIP)
    if os.environ.get("TPFS_FSTAB_INNER") != "1":  # into a mount namespace of its own
        p = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True)
        if p.returncode != 0:
            print("SKIP: no mount namespace of its own (unshare -m: %s)" % p.stderr.strip())
            sys.exit(tt.SKIP)
        env = dict(os.environ, TPFS_FSTAB_INNER="1")
        os.execvpe("unshare", ["unshare", "-m", "--propagation", "private", sys.executable, __file__], env)
    main()
