"""One tpfs mount per node, shared by the engine processes that read it (the vLLM plugin's workers), and removed
once the last of them has exited, however it exits (SIGKILL included).

acquire(src, tp, ...) returns the mount point for (real path of SRC, tp, pp, ranks, view, extra arguments), in a
per-user runtime folder (runtime_dir()): RUN/<key>/ is the mount point, beside its three lock files (flock):
- <key>.lock, held exclusively while a process looks at the mount point and mounts it: the first worker of a
  node mounts, the others wait for it and find its mount healthy. A mount found dead (its daemon gone: ENOTCONN)
  is detached (fusermount3 -u -z) and made again; a healthy one is reused (two engines with the same source and
  split share it).
- <key>.users, held shared by every process that uses the mount, from acquire() until it exits (the kernel drops
  the lock when the process dies, however it dies).
- <key>.reaper, held exclusively by the mount's reaper for as long as it lives.
The process that mounts (or finds a mount whose reaper is gone) first starts the mount's reaper (`python -m
tpfs.node --reap`), which detaches itself: a session of its own (a signal to the engine's process group does not
reach it) and a second fork, so that it is no descendant of the engine (vLLM's shutdown SIGKILLs every descendant of its engine process: psutil's children,
recursively, in vllm/utils/system_utils.py kill_process_tree). It waits until no process holds <key>.users, then,
under <key>.lock (so that no new user comes in between), unmounts lazily, removes the mount point and exits. So the
mount lives exactly as long as some engine on the node uses it; an engine killed mid-load leaves none behind.
An engine killed while its first worker mounts leaves tpfs's daemon (a session of its own) mounting: the reaper,
started before the mount, removes it (unless the daemon mounts only after the reaper looked: between tpfs's fork
and its mount); the next acquire() waits for a mount still being made (tpfs's own lock on the mount point) and
takes it.
"""
import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time

from . import TpfsError, mount_state, start, unmount

_held = {}  # mount point -> (pid, the open <key>.users file whose shared lock process pid holds)


def _mine(mnt):
    """The <key>.users file of MNT whose lock this process took, or None. An entry a forked child inherits is its
    parent's: the child takes a lock of its own, so that /proc/locks names it (other_users, hand_over)."""
    h = _held.get(mnt)
    return h[1] if h and h[0] == os.getpid() else None


def runtime_dir():
    """The per-user folder of the node mounts: $TPFS_RUNTIME_DIR where set, else $XDG_RUNTIME_DIR/tpfs where
    XDG_RUNTIME_DIR is a writable folder, else /tmp/tpfs-<uid>. Made with mode 0700; refused (TpfsError) where it
    is not a folder owned by this user and closed to others (another user could otherwise plant a mount point)."""
    d = os.environ.get("TPFS_RUNTIME_DIR")
    if not d:
        x = os.environ.get("XDG_RUNTIME_DIR")
        d = os.path.join(x, "tpfs") if x and os.path.isdir(x) and os.access(x, os.W_OK) else "/tmp/tpfs-%d" % os.getuid()
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if not os.path.isdir(d) or os.path.islink(d) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise TpfsError("%s: the tpfs runtime folder must be a folder of user %d with mode 0700 (set "
                        "TPFS_RUNTIME_DIR to another)" % (d, os.getuid()))
    return d


def engine_args(args):
    """The `tpfs mount` arguments an engine plugin mounts with: args, and `--passthrough on` where they do not say
    --passthrough (the push's private copies read by the kernel directly: vLLM's load 0.96x its default loader's
    against 1.24x from the page cache, docs/PERFORMANCE.md "Passthrough copies"; where the daemon may not use
    passthrough, it serves as without it and its stats say why)."""
    args = list(args)
    if not any(a == "--passthrough" or a.startswith("--passthrough=") for a in args):
        args += ["--passthrough", "on"]
    return args


def ranks_text(ranks):
    """The --ranks text of a list of ranks: "lo-hi" for a run, else a comma list."""
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return "%d-%d" % (ranks[0], ranks[-1])
    return ",".join(map(str, ranks))


def mount_key(src, tp, pp=None, ranks=None, view=None, extra=()):
    """The name of a node mount: 16 hex digits of the SHA-256 of (real path of SRC, tp, pp, ranks, view, extra)."""
    ident = [os.path.realpath(src), int(tp), int(pp or 1), ranks, view, [str(a) for a in extra]]
    return "mnt-" + hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]


def mount_path(src, tp, pp=None, ranks=None, view=None, extra=()):
    """Where acquire() mounts SRC served as (tp, pp, ranks, view, extra) on this node."""
    return os.path.join(runtime_dir(), mount_key(src, tp, pp, ranks, view, extra))


def acquire(src, tp, pp=None, ranks=None, view=None, extra=()):
    """The mount point of SRC served as (tp, pp, ranks, view, extra) on this node, mounted by this call where no
    healthy mount exists (a dead one is detached first); this process is counted as its user until it exits.
    Blocks while another process of the node mounts it. Raises TpfsError with tpfs's message where tpfs refuses."""
    mnt = mount_path(src, tp, pp, ranks, view, extra)
    lock, users, reaper = (mnt + s for s in (".lock", ".users", ".reaper"))
    if _mine(mnt):
        return mnt
    with open(lock, "a") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        state = mount_state(mnt)
        if state in ("dead", "other"):
            if state == "other":
                raise TpfsError("%s: another filesystem is mounted there; unmount it" % mnt)
            unmount(mnt)
            state = mount_state(mnt)
        uf = open(users, "a")
        try:
            fcntl.flock(uf, fcntl.LOCK_SH)
            # the reaper first (none yet, or it was killed): this process killed while it mounts, the mount its
            # tpfs makes still has one (it looks once this process is gone and this lock is free)
            if not _reaper_alive(reaper):
                _start_reaper(lock, users, mnt, reaper)
            if state != "healthy":
                os.makedirs(mnt, exist_ok=True)
                try:
                    start(src, mnt, tp, view, ranks, pp, extra)
                except TpfsError:
                    # a process of the node killed while it mounted leaves tpfs's daemon (a session of its own)
                    # mounting still; tpfs waits for it, then refuses MNT as a mount point: that mount is ours
                    if mount_state(mnt) != "healthy":
                        raise
        except BaseException:
            uf.close()
            raise
        _held[mnt] = (os.getpid(), uf)
    return mnt


def release(mnt):
    """This process stops using MNT (it stops counting as a user; the reaper unmounts once none is left)."""
    h = _held.pop(mnt, None)
    if h:
        h[1].close()


def other_users(mnt):
    """The pids other than this process's that hold MNT's <key>.users lock (/proc/locks), or None where MNT is not
    a mount this process acquired."""
    uf = _mine(mnt)
    if not uf:
        return None
    st = os.fstat(uf.fileno())
    dev = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    pids = set()
    with open("/proc/locks") as f:
        for line in f:
            w = line.split()
            if len(w) >= 6 and w[1] == "FLOCK" and w[5] == dev and w[4].isdigit() and int(w[4]) != os.getpid():
                pids.add(int(w[4]))
    return pids


def hand_over(mnt, timeout):
    """Releases MNT once another process uses it too (the engine that this process mounted it for), or after
    TIMEOUT seconds; checks twice a second. For a process that mounts ahead of the engine it starts and lives on
    after it (vLLM's main process under LLM()): the mount then goes with the engine, not with this process."""
    end = time.time() + timeout
    while time.time() < end:
        others = other_users(mnt)
        if others is None or others:
            break
        time.sleep(0.5)
    release(mnt)


def _reaper_alive(reaper):
    """Whether a reaper holds REAPER (exclusively, for as long as it lives)."""
    with open(reaper, "a") as rf:
        try:
            fcntl.flock(rf, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def _start_reaper(lock, users, mnt, reaper):
    """Starts MNT's reaper; returns once it holds REAPER (the process started takes the lock, forks the reaper, which
    inherits it, and exits at once; where another reaper holds it already, it exits without one)."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pkg_parent] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    subprocess.run([sys.executable, "-m", "tpfs.node", "--reap", lock, users, mnt, reaper], env=env, timeout=60,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   start_new_session=True, close_fds=True)


def _reap(lock, users, mnt, rf):
    """The reaper: once no process holds USERS (shared), unmounts MNT lazily under LOCK, removes the folder and
    closes RF (the reaper lock), still under LOCK: a mount made after it is seen without a reaper, and gets one."""
    with open(lock, "a") as lf, open(users, "a") as uf:
        while True:
            fcntl.flock(uf, fcntl.LOCK_EX)  # every user gone (taken without LOCK: a user waits on LOCK first)
            fcntl.flock(uf, fcntl.LOCK_UN)
            fcntl.flock(lf, fcntl.LOCK_EX)
            try:
                try:
                    fcntl.flock(uf, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a new user came in between: wait again
                if mount_state(mnt) in ("healthy", "dead"):
                    with contextlib.suppress(TpfsError):  # nothing more to try; the next acquire() sees it
                        unmount(mnt)
                with contextlib.suppress(OSError):
                    os.rmdir(mnt)
                rf.close()
                return
            finally:
                fcntl.flock(lf, fcntl.LOCK_UN)


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--reap":
    _rf = open(sys.argv[5], "a")
    try:
        fcntl.flock(_rf, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os._exit(0)  # a reaper lives already
    if os.fork() == 0:  # the reaper, holding the lock: an orphan, adopted by init (or the nearest subreaper)
        _reap(*sys.argv[2:5], _rf)
    os._exit(0)
