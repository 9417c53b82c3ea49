"""The request threads' priority (`tpfs mount --nice N|keep`, default -10; fs_session.c set_request_priority).

A page fault on the mount that misses the page cache waits for a thread of the daemon's FUSE loop; while an
engine's workers keep every core busy, a thread at their priority waits a time slice first. So tpfs sets the
nice value of the threads that answer requests (libfuse's workers and the loop's own thread), and leaves the
push, the watcher and the invalidator (background work that yields to readers) at the inherited one.

Checked here, from /proc/PID/task/*/stat (the nice value of each thread of the foreground daemon), after reads
that make libfuse start workers:
- the default, where the daemon may raise its priority (CAP_SYS_NICE: root here): the loop's thread and every
  worker at -10, the background threads (at least one: the push runs) at the inherited 0, and the stats file
  says "nice: -10 (the request threads ...)";
- `-o nice=5` (the fstab form; lowering needs no capability): the request threads at 5, the others at 0;
- `--nice keep`: every thread at the inherited value, and the stats say so;
- the bytes read are the same under each (a --nice keep mount's);
- `--nice 20` and `--nice x` are refused by name.
Where raising is not allowed (no CAP_SYS_NICE), the default case checks the stats' "not set to -10" note
and that no thread changed instead.
"""
import os
import shutil
import subprocess
import tempfile

import fixtures
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-nice-")
src = os.path.join(work, "llama")
fixtures.make("llama", src)


def nices(pid):
    """{tid: nice} of every thread of pid (field 19 of /proc/PID/task/TID/stat, after the command's parens)."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that ended meanwhile
        out[int(tid)] = int(fields[16])  # fields from 3 (state) on: nice is field 19
    return out


def read_all(mnt):
    """Every file of every rank folder, read whole from 4 threads at once (so libfuse starts workers)."""
    import concurrent.futures as cf
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(mnt) for f in fs if not f.startswith(".tpfs"))
    with cf.ThreadPoolExecutor(4) as ex:
        return dict(zip([os.path.relpath(p, mnt) for p in files], ex.map(lambda p: open(p, "rb").read(), files)))


def stats_nice(mnt):
    for line in open(os.path.join(mnt, ".tpfs-stats")):
        if line.startswith("nice: "):
            return line[6:].strip()
    return None


may_raise = subprocess.run(["nice", "-n", "-1", "true"], capture_output=True).returncode == 0 and \
    b"cannot set niceness" not in subprocess.run(["nice", "-n", "-1", "true"], capture_output=True).stderr
inherited = os.getpriority(os.PRIO_PROCESS, 0)

with tt.Mount(src, 2, "--nice", "keep") as m:
    want = read_all(m.path)
    got = nices(m.proc.pid)
    F.check(len(want) >= 8, "--nice keep: the rank folders hold files: %s" % sorted(want))
    F.check(set(got.values()) == {inherited}, "--nice keep: every thread at the inherited %d: %s" % (inherited, got))
    F.check((stats_nice(m.path) or "").startswith("%d (the request threads keep the inherited value: --nice keep"
                                                  % inherited), "--nice keep: stats say so: %s" % stats_nice(m.path))

with tt.Mount(src, 2) as m:
    F.check(read_all(m.path) == want, "default: the bytes read equal the --nice keep mount's")
    got = nices(m.proc.pid)
    note = stats_nice(m.path) or ""
    if may_raise:
        F.check(got[m.proc.pid] == -10, "default: the loop's thread at -10: %s" % got)
        F.check(sorted(set(got.values())) == sorted({-10, inherited}) and
                sum(v == -10 for v in got.values()) >= 2 and sum(v == inherited for v in got.values()) >= 1,
                "default: request threads (the loop's and its workers) at -10, background threads at %d: %s"
                % (inherited, got))
        F.check(note.startswith("-10 (the request threads;"), "default: the stats say -10: %s" % note)
    else:
        F.check(set(got.values()) == {inherited}, "default without CAP_SYS_NICE: no thread changed: %s" % got)
        F.check("not set to -10" in note and "CAP_SYS_NICE" in note, "default without CAP_SYS_NICE: %s" % note)

with tt.Mount(src, 2, "-o", "nice=5") as m:
    F.check(read_all(m.path) == want, "-o nice=5: the bytes read equal the --nice keep mount's")
    got = nices(m.proc.pid)
    F.check(got[m.proc.pid] == 5 and sum(v == 5 for v in got.values()) >= 2 and
            sum(v == inherited for v in got.values()) >= 1 and set(got.values()) == {5, inherited},
            "-o nice=5: request threads at 5, background threads at %d: %s" % (inherited, got))
    F.check((stats_nice(m.path) or "").startswith("5 (the request threads;"), "-o nice=5: stats: %s"
            % stats_nice(m.path))

for bad in ("20", "x", "-21"):
    p = subprocess.run([tt.TPFS, "mount", src, os.path.join(work, "none"), "--tp", "2", "--nice", bad],
                       capture_output=True, text=True)
    F.check(p.returncode == 2 and "--nice: give -20..19, or keep" in p.stderr, "--nice %s refused: %s"
            % (bad, p.stderr.strip()[:200]))

shutil.rmtree(work, ignore_errors=True)
F.done("nice")
