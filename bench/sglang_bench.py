"""SGLang start benchmark: `python -m sglang.launch_server ... --tp 2` on the CPU, the same Llama-shaped bf16
checkpoint of about 1.16 GB as bench/vllm_bench.py (build/vllm-bench/llama-1g, made there if missing), measured
side by side in one run, each repetition of every row in turn (the order rotated by one row each repetition):

  default            SGLang's default loader (--load-format auto) on SRC, the source in the page cache;
  one flag           --load-format tpfs on SRC: the plugin of this checkout (pip install --no-deps into a venv
                     layered on the SGLang venv) mounts SRC from SGLang's main process before it launches the
                     schedulers, so the push-ahead runs while they start;
  one flag, late     the same with TPFS_SGLANG_EARLY=0: the first scheduler mounts as it begins to load (the
                     plugin before the early mount).

For each start: "Load weight end. elapsed=X s" (SGLang's model_runner; the largest of the two schedulers), the
whole start (process start to a /health that answers 200), and the greedy tokens of one /generate request (every
row must give the same). Each start is a server process of its own, SIGTERMed after its request: nothing carries
over but the page cache (and no mount: the plugin's goes with the engine).

STAND-INS, said as the tests say them: SGLang's server imports `sgl_kernel` and `soundfile`, which its CPU wheel
set lacks here; tests/py/sglang_site/sgl_kernel and tests/py/sglang_server_site/soundfile.py stand in so that it
imports (nothing of a CPU start with attention_backend torch_native calls them). The same stand-ins serve every row.

python bench/sglang_bench.py [--reps N] [--work DIR] [--out FILE]
"""
import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
TESTS = os.path.join(ROOT, "tests", "py")
sys.path.insert(0, HERE)
sys.path.insert(0, TESTS)

import tpfs_test  # noqa: E402
from vllm_bench import MAKE  # noqa: E402 -- the same checkpoint as the vLLM benchmark


def sglang_python():
    v = os.path.join(ROOT, "build", "venv-sglang", "bin", "python")
    if not os.path.exists(v):
        sys.exit("no SGLang venv: run bash scripts/setup.sh --sglang build")
    return v


def plugin_python(work):
    """A venv at WORK/sglang-plugin-venv layered on the SGLang venv (as tests/py/test_sglang_plugin.py makes it),
    with this checkout installed (pip install --no-deps); its python."""
    base = sglang_python()
    venv_work = os.path.join(work, "sglang-plugin")
    shutil.rmtree(venv_work, ignore_errors=True)
    os.makedirs(venv_work)
    # plugin_venv layers on the interpreter that runs it: run it under the SGLang venv's python
    code = "import sys; sys.path[:0] = %r; from test_sglang_plugin import plugin_venv; print(plugin_venv(%r, {}))" % (
        [TESTS], venv_work)
    p = subprocess.run([base, "-c", code], capture_output=True, text=True, timeout=1500)
    if p.returncode != 0:
        sys.exit("the plugin venv failed:\n%s" % (p.stdout + p.stderr)[-3000:])
    return p.stdout.strip().splitlines()[-1]


def start(py, src, load_format, env_more, log):
    """One server start: (largest "Load weight end" elapsed, seconds to /health 200, greedy tokens)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [py, "-m", "sglang.launch_server", "--model-path", src, "--load-format", load_format, "--tp", "2",
           "--device", "cpu", "--attention-backend", "torch_native", "--skip-tokenizer-init", "--disable-cuda-graph",
           "--max-total-tokens", "256", "--random-seed", "0", "--host", "127.0.0.1", "--port", str(port)]
    env = dict({k: v for k, v in os.environ.items() if k not in ("TPFS_BIN",)}, SGLANG_USE_CPU_ENGINE="1",
               SGLANG_NCCL_SO_PATH=os.devnull, SGLANG_CPU_OMP_THREADS_BIND="0|1", TORCHDYNAMO_DISABLE="1",
               PYTHONPATH=os.pathsep.join([os.path.join(TESTS, "sglang_server_site"), os.path.join(TESTS, "sglang_site")]),
               **env_more)
    url = "http://127.0.0.1:%d" % port
    tokens = None
    t0 = time.time()
    with open(log, "w") as lf:
        p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        ready = None
        deadline = t0 + 900
        while p.poll() is None and time.time() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        ready = time.time() - t0
                        break
            time.sleep(0.25)
        if ready is not None:
            body = json.dumps({"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                                                              "ignore_eos": True}}).encode()
            req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                tokens = json.load(r)["output_ids"]
    finally:
        tpfs_test.stop_group(p)
    with open(log, errors="replace") as f:
        text = f.read()
    loads = [float(x) for x in re.findall(r"Load weight end\. elapsed=([0-9.]+) s", text)]
    if ready is None or not loads or tokens is None:
        sys.exit("SGLang failed (%s, %s; log %s):\n%s" % (src, load_format, log, text[-3000:]))
    return max(loads), ready, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "vllm-bench"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    py = sglang_python()
    src = os.path.join(a.work, "llama-1g")
    os.makedirs(a.work, exist_ok=True)
    if not os.path.exists(os.path.join(src, "config.json")):
        print("generating the Llama-shaped checkpoint in %s ..." % src, flush=True)
        subprocess.run([py, "-c", MAKE, src], check=True)
    ppy = plugin_python(a.work)
    run = tempfile.mkdtemp(prefix="tpfs-sglang-bench-run-")  # the plugin's node mounts: a runtime folder of its own
    logs = tempfile.mkdtemp(prefix="tpfs-sglang-bench-logs-")
    for f in os.listdir(src):  # the source in the page cache, as for every row
        with open(os.path.join(src, f), "rb") as fh:
            while fh.read(1 << 24):
                pass
    rows = [("default", py, "auto", {}),
            ("one flag", ppy, "tpfs", {"TPFS_RUNTIME_DIR": run}),
            ("one flag, late", ppy, "tpfs", {"TPFS_RUNTIME_DIR": run, "TPFS_SGLANG_EARLY": "0"})]
    res = {r[0]: [] for r in rows}
    tokens = {}
    for rep in range(a.reps):
        order = rows[rep % len(rows):] + rows[:rep % len(rows)]
        for name, p, fmt, env in order:
            log = os.path.join(logs, "%s-%d.log" % (name.replace(" ", "_").replace(",", ""), rep))
            load, whole, tok = start(p, src, fmt, env, log)
            res[name].append((load, whole))
            tokens.setdefault(name, tok)
            print("rep %d %-15s load %.2f s, whole start %.1f s, tokens %s" % (rep, name, load, whole, tok),
                  flush=True)
            mounted = lambda: [d for d in os.listdir(run) if os.path.ismount(os.path.join(run, d))]  # noqa: E731
            if not tpfs_test.wait_until(lambda: not mounted(), 30):  # its reaper unmounts once the engine is gone
                sys.exit("a mount outlived its server by 30 s: %s" % mounted())
    base_l = statistics.median(x[0] for x in res["default"])
    base_w = statistics.median(x[1] for x in res["default"])
    out = ["SGLang (CPU, launch_server --tp 2), %.2f GB bf16 Llama-shaped, source cached, medians of %d" % (
        sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src) if f.endswith(".safetensors")) / 1e9,
        a.reps), "",
        "| row | Load weight end elapsed, each repetition | median | x default | whole start (to /health), median "
        "| x default |", "| --- | --- | --- | --- | --- | --- |"]
    for name, _, _, _ in rows:
        ls_, ws = [x[0] for x in res[name]], [x[1] for x in res[name]]
        ml, mw = statistics.median(ls_), statistics.median(ws)
        out.append("| %s | %s | %.2f s | %.2fx | %.1f s | %.2fx |" % (
            name, " / ".join("%.2f" % x for x in ls_), ml, ml / base_l, mw, mw / base_w))
    same = len({json.dumps(t) for t in tokens.values()}) == 1
    out += ["", "greedy tokens %s: %s" % ("of every row equal" if same else "DIFFER", tokens)]
    text = "\n".join(out)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    shutil.rmtree(logs, ignore_errors=True)
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
