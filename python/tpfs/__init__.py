"""tpfs from Python (the package `pip install .` installs from a checkout): the tpfs program installed with it
(binary()), a mount for the duration of a `with` block (mount()), and TpfsError, whose text is tpfs's own message.

    import tpfs
    with tpfs.mount("model/", tp=2, view="vllm") as mnt:
        ...  # mnt holds model-rank-{r}-part-{p}.safetensors

The engine plugins build on this: tpfs.node (one mount per node, shared by the engine's workers, removed when the
last of them exits), tpfs.vllm_plugin (vLLM's --load-format tpfs) and tpfs.sglang_plugin (SGLang's). This module
imports no engine.
"""
import contextlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

__all__ = ["TpfsError", "binary", "mount", "mount_args", "start", "unmount", "is_mounted", "mount_state"]

MOUNT_TIMEOUT_S = 900  # tpfs mount returns once the mount answers; planning a large checkpoint takes seconds


class TpfsError(RuntimeError):
    """tpfs refused or failed: str(e) is tpfs's own message (what it wrote on stderr)."""


def binary():
    """The path of the tpfs program: the one installed with this package (the scripts folder of this interpreter:
    the venv's bin/, or the user scheme's for pip install --user), else `tpfs` on PATH. Raises TpfsError where
    there is none."""
    dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    with contextlib.suppress(KeyError):
        dirs.append(sysconfig.get_path("scripts", "%s_user" % os.name))
    for d in dirs:
        p = os.path.join(d or "", "tpfs")
        if d and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    p = shutil.which("tpfs")
    if p:
        return p
    raise TpfsError("the tpfs program is not installed with this Python package (looked in %s and on PATH): "
                    "reinstall it (pip install . from a tpfs checkout)" % ", ".join(d for d in dirs if d))


def mount_args(src, mnt, tp, view=None, ranks=None, pp=None, extra=()):
    """The argument list of `tpfs mount SRC MNT --tp TP [--view VIEW] [--pp PP] [--ranks RANKS] EXTRA...`
    (ranks: a list such as "0-7" or "0,3", or a list of ints; None: every rank)."""
    args = [binary(), "mount", os.fspath(src), os.fspath(mnt), "--tp", str(int(tp))]
    if view:
        args += ["--view", str(view)]
    if pp and int(pp) > 1:
        args += ["--pp", str(int(pp))]
    if ranks is not None:
        args += ["--ranks", ranks if isinstance(ranks, str) else ",".join(str(int(r)) for r in ranks)]
    return args + [str(a) for a in extra]


def start(src, mnt, tp, view=None, ranks=None, pp=None, extra=()):
    """Mounts SRC at the existing folder MNT in the background (tpfs's daemon keeps serving after this returns)
    and returns once the mount answers. Raises TpfsError with tpfs's message where tpfs refuses (a checkpoint it
    cannot split, an unknown option, MNT already mounted) or fails."""
    cmd = mount_args(src, mnt, tp, view, ranks, pp, extra)
    # the daemon without the caller's LD_PRELOAD: an engine's workers preload their own allocator and OpenMP
    # runtime (vLLM's CPU backend: tcmalloc, libiomp5), which tpfs's daemon has no use for (and a sanitized
    # tpfs refuses to start under: ASan must come first)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=MOUNT_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as e:
        raise TpfsError("tpfs mount %s %s did not return within %d s" % (src, mnt, MOUNT_TIMEOUT_S)) from e
    if p.returncode != 0:  # tpfs's message, less its info lines (the view it chose, ...)
        lines = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith(("tpfs: info: ", "tpfs: debug: "))]
        raise TpfsError("\n".join(lines).strip() or p.stderr.strip() or "tpfs mount exited %d with no message"
                        % p.returncode)


def _mountinfo():
    """{mount point: filesystem type} of /proc/self/mountinfo (the last mount of a point wins)."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), left.split()[4])
            out[mp] = right.split()[0] if right else "?"
    return out


def is_mounted(mnt):
    """Whether MNT (its real path) is a mount point in this mount namespace."""
    return os.path.realpath(mnt) in _mountinfo()


def mount_state(mnt):
    """What is at MNT: "none" (no mount), "healthy" (a tpfs mount that answers), "dead" (a tpfs mount whose daemon
    is gone: ENOTCONN, or that does not answer otherwise) or "other" (another filesystem's mount)."""
    fstype = _mountinfo().get(os.path.realpath(mnt))
    if fstype is None:
        return "none"
    if fstype != "fuse.tpfs":
        return "other"
    try:
        # statfs goes to the daemon every time; a stat may be answered from the kernel's attribute cache, and is,
        # for a file looked up before the daemon died
        os.statvfs(mnt)
    except OSError:
        return "dead"
    return "healthy"


def unmount(mnt, lazy=True):
    """Unmounts MNT (lazily by default: detached at once, removed when the last open file closes; the daemon
    then exits). Raises TpfsError with the unmounter's message where it fails."""
    flags = ["-u", "-z"] if lazy else ["-u"]
    if shutil.which("fusermount3"):
        cmd = ["fusermount3"] + flags + [os.fspath(mnt)]
    else:
        cmd = ["umount"] + (["-l"] if lazy else []) + [os.fspath(mnt)]
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    if p.returncode != 0 and is_mounted(mnt):
        raise TpfsError("%s: %s" % (" ".join(cmd), p.stderr.strip()))


@contextlib.contextmanager
def mount(src, tp, view=None, ranks=None, pp=None, extra=(), mnt=None):
    """with tpfs.mount(src, tp=2, view="vllm", ranks="0-1") as mnt: SRC mounted at MNT (a new temporary folder
    unless mnt is given) for the block: mounted in the background, ready when the block starts, unmounted
    (lazily) and the temporary folder removed when it ends. view: hf (tpfs's default), vllm, sglang or a view
    file; pp: pipeline stages (--view vllm); extra: more `tpfs mount` arguments (e.g. ["--ep"]). A refusal raises
    TpfsError with tpfs's message, and nothing is left mounted."""
    own = mnt is None
    path = tempfile.mkdtemp(prefix="tpfs-") if own else os.fspath(mnt)
    try:
        start(src, path, tp, view, ranks, pp, extra)
        try:
            yield path
        finally:
            if is_mounted(path):
                unmount(path)
    finally:
        if own:
            with contextlib.suppress(OSError):
                os.rmdir(path)
