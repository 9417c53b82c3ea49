"""SGLang's --load-format tpfs: the package's sglang.srt.plugins entry point, as a user installs and runs it.

1. `pip install --no-deps .` of this checkout into a fresh venv layered on the SGLang venv (scripts/setup.sh
   --sglang; .pth lines append its site-packages and the vLLM venv's under it, as setup_sglang layers SGLang),
   timed; the sglang.srt.plugins entry point is installed.
2. The command line: after SGLang's load_plugins(), prepare_server_args (what `python -m sglang.launch_server`
   parses its arguments with) takes `--model-path SRC --load-format tpfs --tp 2`; the SGLang venv without the
   package refuses it ("invalid choice": the check can fail). The node's ranks (node_ranks) as SGLang's engine
   places them: one node; node 1 of 2 at TP=16; under data parallelism or pipeline stages the scheduler's own.
3. The engines, as test_sglang.py runs them (sglang_check.py: sglang.Engine on the CPU, its processes forked, the
   loader hook of sglang_site/sitecustomize.py): llama (vllm_models.py, 2 KV heads) with
   Engine(model_path=SRC, load_format="auto", tp_size=2) and Engine(model_path=SRC, load_format="tpfs", tp_size=2)
   in one process: per rank, the key set sharded_state fills and every parameter, buffer and tensor attribute
   after SGLang's post-load steps equal, bitwise; greedy tokens and top-5 logprobs equal. The tpfs engine's
   schedulers loaded through ShardedStateLoader (their record says so), from exactly one mount that existed
   while the engine ran (in a runtime folder of the test's own, TPFS_RUNTIME_DIR) and is gone once it is shut
   down, the process that made it still running (its main process mounted and handed the mount over).
4. A checkpoint tpfs refuses (an extra tensor no rule of llama's plan matches): the Engine with load_format="tpfs"
   fails at start, its process exits non-zero, tpfs's message (TpfsError) in its output, no mount left.
5. SGLang's HTTP server as a user types it (README's quick start; TPFS_SGLANG_SERVER=0 leaves it out), `python -m sglang.launch_server --model-path SRC --load-format tpfs --tp 2` (and the
   CPU flags of sglang_check.py), answers /generate with the greedy tokens and top-5 logprobs of the default
   loader's Engine (3.); its log says that SGLang's main process mounted ranks 0-1 before it launched the
   schedulers (so that the push runs while they start), and that ranks 0 and 1 read that one mount, made before
   them; after SIGTERM, no mount is left. The server does not import in the test venv as installed (--no-deps: `soundfile`, which
   srt/entrypoints/openai/audio_chunking.py imports, is missing): sglang_server_site/soundfile.py stands in.
Exits 77 only where the SGLang venv cannot be made (setup.sh --sglang wrote BUILD/venv-sglang.unavailable).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PROMPTS = [[1, 5, 9, 600, 999], [3, 700, 20, 511, 512, 513]]
SERVER = os.environ.get("TPFS_SGLANG_SERVER") != "0"  # 5.: SGLang's HTTP server, as README's quick start types it
REFUSAL = "no rule of plan 'llama' matches it"  # tpfs's message for the extra tensor (src/planner_*.c)


def purelib(py):
    return subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()


def plugin_venv(work, times):
    """A venv at WORK/venv layered on the SGLang venv (this interpreter's), with `pip install --no-deps REPO`."""
    venv = os.path.join(work, "venv")
    t = time.time()
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    base = purelib(sys.executable)
    lines = [base]
    for f in sorted(os.listdir(base)):  # the SGLang venv's own layering (the vLLM venv's site-packages)
        if f.startswith("zz-tpfs-") and f.endswith(".pth"):
            with open(os.path.join(base, f)) as fh:
                lines += [ln.strip() for ln in fh if ln.strip() and not ln.startswith(("#", "import"))]
    with open(os.path.join(purelib(py), "zz-tpfs-sglang-base.pth"), "w") as f:
        f.write("\n".join(lines) + "\n")
    times["venv"] = time.time() - t
    t = time.time()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPFS_")}
    p = subprocess.run([py, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", REPO], env=env,
                       capture_output=True, text=True, timeout=1200)
    times["pip install"] = time.time() - t
    if p.returncode != 0:
        print(p.stdout[-3000:] + p.stderr[-3000:])
        raise AssertionError("pip install --no-deps %s exited %d" % (REPO, p.returncode))
    return py


PARSE = """
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
a = prepare_server_args(["--model-path", sys.argv[1], "--load-format", "tpfs", "--tp", "2", "--device", "cpu"])
print("LOAD_FORMAT", a.load_format)
"""

RANKS = """
import json, tpfs.sglang_plugin as sp
print(json.dumps([sp.node_ranks(2, 1), sp.node_ranks(16, 9, 1, 2, 1), sp.node_ranks(16, 3, 1, 2, 0),
                  sp.node_ranks(8, 3, 1, 1, 0, 2), sp.node_ranks(4, 1, 2, 1, 0)]))
"""


def batch(py, jobs, work, name, env):
    """Runs sglang_check.py on JOBS under PY; (exit status, {job name: result}, log text)."""
    jp, rp, log = (os.path.join(work, "%s.%s" % (name, x)) for x in ("json", "result.json", "log"))
    with open(jp, "w") as f:
        json.dump(jobs, f)
    with open(log, "w") as lf:
        p = subprocess.run([py, os.path.join(HERE, "sglang_check.py"), jp, rp], stdout=lf, stderr=subprocess.STDOUT,
                           env=env, timeout=900)
    res = {}
    if os.path.exists(rp):
        with open(rp) as f:
            res = json.load(f)
    with open(log, errors="replace") as f:
        return p.returncode, res, f.read()


def server(py, src, env, log, run):
    """5. `python -m sglang.launch_server --model-path SRC --load-format tpfs --tp 2` on the CPU: (greedy tokens,
    top-5 logprobs per step as sglang_check.py gives them) per prompt, or None where it did not serve; the mounts
    under RUN while it served."""
    import contextlib
    import socket
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [py, "-m", "sglang.launch_server", "--model-path", src, "--load-format", "tpfs", "--tp", "2",
           "--device", "cpu", "--attention-backend", "torch_native", "--skip-tokenizer-init", "--disable-cuda-graph",
           "--max-total-tokens", "256", "--random-seed", "0", "--host", "127.0.0.1", "--port", str(port)]
    env = dict(env, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "sglang_server_site"), env["PYTHONPATH"]]),
               SGLANG_USE_CPU_ENGINE="1", SGLANG_NCCL_SO_PATH=os.devnull, SGLANG_CPU_OMP_THREADS_BIND="0|1")
    url = "http://127.0.0.1:%d" % port
    outs, seen = None, None
    with open(log, "w") as lf:
        p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 600
        while p.poll() is None and time.time() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            time.sleep(2)
        if p.poll() is None and time.time() < deadline:
            from test_plugin import tpfs_mounts
            seen = tpfs_mounts(run)
            outs = []
            for pr in PROMPTS:
                body = json.dumps({"input_ids": pr, "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                                                        "ignore_eos": True},
                                   "return_logprob": True, "top_logprobs_num": 5}).encode()
                req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=300) as r:
                    res = json.load(r)
                outs.append((res["output_ids"], [[[t[1], t[0]] for t in step]
                                                 for step in res["meta_info"]["output_top_logprobs"]]))
    finally:
        tpfs_test.stop_group(p)
    return outs, seen


def main():
    import tpfs_test
    import vllm_models
    from test_plugin import tpfs_mounts, wait_until
    from test_sglang import loaded
    tpfs_test.require_fuse()
    fails = tpfs_test.Failures()
    times = {}
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="tpfs-sglang-plugin-")
    run = os.path.join(work, "run")
    os.mkdir(run, 0o700)

    # 1. pip install .
    py = plugin_venv(work, times)
    env = dict({k: v for k, v in os.environ.items() if k not in ("TPFS_BIN", "TPFS_SGLANG_INNER")},
               TPFS_RUNTIME_DIR=run, PYTHONPATH=os.path.join(HERE, "sglang_site"), TORCHDYNAMO_DISABLE="1")
    p = subprocess.run([py, "-c", "from importlib.metadata import entry_points; print([e.value for e in "
                        "entry_points(group='sglang.srt.plugins') if e.name == 'tpfs'])"], capture_output=True,
                       text=True, env=env)
    fails.check("tpfs.sglang_plugin:register" in p.stdout, "the sglang.srt.plugins entry point: %r"
                % (p.stdout + p.stderr))
    print("pip install --no-deps .: %.0f s (venv %.0f s)" % (times["pip install"], times["venv"]))

    src = vllm_models.make("llama", os.path.join(work, "src"), tp=2, config={"num_key_value_heads": 2})
    bad = os.path.join(work, "bad")
    shutil.copytree(src, bad)
    from safetensors.torch import load_file, save_file
    import torch
    t = load_file(os.path.join(bad, "model.safetensors"))
    t["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    save_file(t, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})

    # 2. the command line's --load-format tpfs, with and without the package; the node's ranks
    t = time.time()
    with_pkg = subprocess.run([py, "-c", PARSE, src], capture_output=True, text=True, env=env, timeout=600)
    without = subprocess.run([sys.executable, "-c", PARSE, src], capture_output=True, text=True, env=env, timeout=600)
    times["argument parsing"] = time.time() - t
    fails.check(with_pkg.returncode == 0 and "LOAD_FORMAT tpfs" in with_pkg.stdout,
                "--load-format tpfs with the package: %d %s" % (with_pkg.returncode, with_pkg.stderr[-1500:]))
    fails.check(without.returncode != 0 and "invalid choice: 'tpfs'" in without.stderr,
                "--load-format tpfs without the package should be refused: %d %s" % (without.returncode,
                                                                                       without.stderr[-500:]))
    print("--load-format tpfs --tp 2: parsed with the package (%s), refused without it (%s)"
          % (with_pkg.stdout.split()[-1] if with_pkg.stdout.split() else "?",
             "invalid choice" if "invalid choice" in without.stderr else without.returncode))
    p = subprocess.run([py, "-c", RANKS], capture_output=True, text=True, env=env, timeout=300)
    want = [[0, 1], list(range(8, 16)), list(range(8)), [3], [1]]
    got = json.loads(p.stdout.splitlines()[-1]) if p.returncode == 0 else p.stderr[-500:]
    fails.check(got == want, "node_ranks: %s, not %s" % (got, want))

    # 3. the engine pair; 4. the refusal (in a process of its own: SGLang kills the process whose Engine fails)
    keys = {h: os.path.join(work, "keys", h) for h in ("auto", "tpfs", "refused")}
    jobs = [{"name": "llama/auto", "model": src, "load_format": "auto", "tp": 2, "keys": keys["auto"],
             "prompts": PROMPTS},
            {"name": "llama/tpfs", "model": src, "load_format": "tpfs", "tp": 2, "keys": keys["tpfs"],
             "prompts": PROMPTS, "mounts_under": run}]
    t = time.time()
    rc, res, log = batch(py, jobs, work, "engines", env)
    times["two Engine starts"] = time.time() - t
    gone = wait_until(lambda: not tpfs_mounts(run), 30)
    a, b = res.get("llama/auto", {}), res.get("llama/tpfs", {})
    for name, x in (("default loader", a), ("tpfs", b)):
        fails.check(x and not x.get("error"), "llama (%s): SGLang failed: %s" % (
            name, (x.get("error") or "no result: %s" % log[-1500:])[-1500:]))
    for r in range(2):
        la, lb = loaded(keys["auto"], "auto", r), loaded(keys["tpfs"], "sharded_state", r)
        fails.check(la and lb, "rank %d: a loader left no record (the tpfs engine's must be sharded_state's)" % r)
        if la and lb:
            fails.check(la["expected"] == lb["expected"], "rank %d: the two models hold different state dicts" % r)
            differ = sorted(k for k in set(la["final"]) | set(lb["final"]) if la["final"].get(k) != lb["final"].get(k))
            fails.check(la["final"] and not differ, "rank %d: the loaders leave different tensors: %s" % (r, differ[:5]))
            print("rank %d: %d tensors after post-load, %s" % (r, len(la["final"]), "equal" if not differ else
                                                               "%d DIFFER" % len(differ)))
    same = bool(a.get("tokens")) and a.get("tokens") == b.get("tokens") and a.get("logprobs") == b.get("logprobs")
    fails.check(same, "tokens or logprobs missing or different: default %s, tpfs %s" % (a.get("tokens"),
                                                                                        b.get("tokens")))
    print("tokens: default %s, tpfs %s: %s" % (a.get("tokens"), b.get("tokens"), "equal (and top-5 logprobs)"
                                               if same else "DIFFER"))
    seen = b.get("mounts")
    fails.check(seen is not None and len(seen) == 1, "while the tpfs engine ran, mounts under the runtime folder: %s"
                % seen)
    # the main process made the mount and handed it over to the schedulers (tpfs.node.hand_over): it goes with
    # the engine, not with this process, which lives on (a notebook's sglang.Engine)
    fails.check(b.get("mounts_after_shutdown") == [], "after the tpfs engine's shutdown, its process still running, "
                "mounts %s were left 30 s on" % b.get("mounts_after_shutdown"))
    fails.check(gone, "mounts left after the engines exited: %s" % tpfs_mounts(run))
    print("mounts while the tpfs engine ran: %s; after its shutdown (its process running): %s, %s s after; after "
          "the process exited: %s" % (seen, b.get("mounts_after_shutdown"), b.get("gone_after_s"), tpfs_mounts(run)))

    t = time.time()
    rc, res, log = batch(py, [{"name": "bad/tpfs", "model": bad, "load_format": "tpfs", "tp": 2,
                               "keys": keys["refused"], "prompts": PROMPTS[:1]}], work, "refused", env)
    times["refused start"] = time.time() - t
    served = bool(res.get("bad/tpfs", {}).get("tokens"))
    fails.check(rc != 0 and not served, "the refused checkpoint: exit %s, served %s" % (rc, served))
    fails.check(REFUSAL in log and "TpfsError" in log, "the refused checkpoint's output lacks tpfs's message %r"
                % REFUSAL)
    fails.check(wait_until(lambda: not tpfs_mounts(run), 30), "the refused start left mounts %s" % tpfs_mounts(run))
    line = next((ln.strip() for ln in log.splitlines() if "TpfsError: " in ln), "")
    fails.check(REFUSAL in line, "the refused checkpoint: the TpfsError line is not tpfs's message: %r" % line)
    print("refused checkpoint: exit %s; %s" % (rc, line[:300]))

    if SERVER:
        t = time.time()
        log = os.path.join(work, "server.log")
        outs, seen = server(py, src, env, log, run)
        times["server"] = time.time() - t
        with open(log, errors="replace") as f:
            text = f.read()
        fails.check(outs is not None, "the server did not serve (log %s): %s" % (log, text[-1500:]))
        if outs:
            fails.check([o[0] for o in outs] == a.get("tokens") and [o[1] for o in outs] == a.get("logprobs"),
                        "the server's tokens or logprobs differ from the default loader's Engine: %s vs %s"
                        % ([o[0] for o in outs], a.get("tokens")))
        fails.check(seen is not None and len(seen) == 1, "while the server served, mounts %s (one wanted)" % seen)
        fails.check(re.search(r"tpfs: mounted \S+ for ranks 0-1 of TP=2 at \S+ from SGLang's main process", text),
                    "the server's log does not say that SGLang's main process mounted ranks 0-1 before the schedulers")
        for r in range(2):
            fails.check(re.search(r"tpfs: rank %d reads \S+, the mount of \S+ for ranks 0-1 of TP=2, made before it"
                                  % r, text), "the server's log does not say that rank %d read the node's mount of "
                        "ranks 0-1, made before it (by the main process)" % r)
        fails.check(wait_until(lambda: not tpfs_mounts(run), 30), "mounts left after the server: %s"
                    % tpfs_mounts(run))
        print("launch_server --load-format tpfs --tp 2: tokens %s (%s the default loader's, top-5 logprobs too); "
              "mounts while serving %s; after SIGTERM %s" % ([o[0] for o in outs] if outs else None,
                                                            "equal to" if outs and [o[0] for o in outs] ==
                                                            a.get("tokens") else "NOT", seen, tpfs_mounts(run)))
    tpfs_test.finish(fails, "sglang_plugin", work, times, t0)


if __name__ == "__main__":
    import tpfs_test
    tpfs_test.reexec(tpfs_test.sglang_python, "TPFS_SGLANG_INNER", __file__)
    sys.path.insert(0, HERE)
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    main()
