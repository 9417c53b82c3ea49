"""vLLM load benchmark (issues 21 and 31): vLLM's "Loading weights took", TP=2, for a Llama-shaped
bf16 model of about 1 GB, measured side by side in one run, each repetition of every row in turn (the
order rotated by one row, or one first-and-second pair, each repetition):

  default          vLLM's default loader on SRC (every rank reads the HF checkpoint and slices it
                   in each weight_loader), the source in the page cache;
  dump             --load-format sharded_state on a pre-sharded dump on this disk (what
                   save_sharded_state writes: the view's part files copied out), cached: the
                   contender tpfs replaces;
  identity first   sharded_state on `tpfs mount DUMP MNT --tp 1` (every byte through a FUSE
                   daemon, nothing sliced): the ceiling any FUSE gives on this machine;
  identity second  the same mount again (its pages cached);
  after first      sharded_state on a fresh `tpfs mount SRC MNT --tp 2 --view vllm` with its defaults
                   (the source cached; push-ahead, on by default, fills the rank files' page cache
                   while vLLM starts: issue 46);
  after second     the same mount again (the rank files now in the page cache);
  before ...       with --before OLD_TPFS, the same two rows for another binary (a change's base);
  after --reply iov  with --iov, the same two rows with iovec replies and no push (the read path with
                   one copy fewer);
  after --push off  with --push-off, the same two rows without push-ahead (every byte of the first
                   start comes through the daemon: the read path alone).
  after TAG       with --variant TAG=ARGS (repeatable), the same two rows with more `tpfs mount`
                   arguments (e.g. --variant 'nice keep=--nice keep'): a default weighed against an
                   alternative in the same run.
  one flag        with --plugin, `--load-format tpfs` on SRC: the plugin of this checkout (pip install
                   --no-deps into a venv layered on the vLLM venv) mounts SRC itself, from the engine-core
                   process as the start begins; every start is a first start (the mount goes with the
                   engine).
--no-ceiling leaves out the dump and identity rows (a shorter run).

Each start runs in its own process of the vLLM venv (scripts/setup.sh --vllm): no state carries
over but the page cache. Prints a table with every repetition, the medians and the ratios, and the
FUSE requests of each first start (the stats file); --out writes it (docs/PERFORMANCE.md's vLLM
section is made from it).

python bench/vllm_bench.py [--reps N] [--work DIR] [--out FILE] [--tpfs PATH] [--before PATH] [--iov] [--push-off]
                           [--no-ceiling] [--variant TAG=ARGS ...] [--plugin]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

MAKE = r'''
import sys, torch, transformers as tf
torch.manual_seed(0)
cfg = tf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=10, num_attention_heads=16,
                     num_key_value_heads=4, head_dim=128, vocab_size=32000, max_position_embeddings=512,
                     tie_word_embeddings=False, initializer_range=0.02)
m = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
m.save_pretrained(sys.argv[1], max_shard_size="300MB")
'''

START = r'''
import sys, time
t0 = time.time()
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], load_format=sys.argv[2], tensor_parallel_size=2, dtype="bfloat16",
              enforce_eager=True, skip_tokenizer_init=True, max_model_len=256, max_num_seqs=2, seed=0,
              distributed_executor_backend="mp")
    out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], SamplingParams(max_tokens=4, temperature=0.0,
                       detokenize=False, ignore_eos=True), use_tqdm=False)
    print("TOKENS", list(out[0].outputs[0].token_ids), flush=True)
    print("STARTUP %.2f" % (time.time() - t0), flush=True)
    llm.llm_engine.engine_core.shutdown()
'''


def vllm_python():
    v = os.path.join(ROOT, "build", "venv-vllm", "bin", "python")
    if not os.path.exists(v):
        sys.exit("no vLLM venv: run bash scripts/setup.sh --vllm build")
    return v


def plugin_python(work):
    """A venv at WORK/plugin-venv layered on the vLLM venv (a .pth to its site-packages), with this checkout
    installed into it (pip install --no-deps: the wheel builds tpfs with the Meson build); its python."""
    base, venv = vllm_python(), os.path.join(work, "plugin-venv")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([base, "-m", "venv", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    purelib = lambda p: subprocess.run([p, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],  # noqa: E731
                                       capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib(py), "zz-tpfs-vllm-base.pth"), "w") as f:
        f.write(purelib(base) + "\n")
    p = subprocess.run([py, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", ROOT],
                       capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        sys.exit("pip install --no-deps %s failed:\n%s" % (ROOT, (p.stdout + p.stderr)[-3000:]))
    return py


def start(py, model, fmt, script):
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0|1", VLLM_CPU_KVCACHE_SPACE="1")
    t0 = time.time()
    p = subprocess.run([py, script, model, fmt], capture_output=True, text=True, env=env, timeout=900)
    wall = time.time() - t0
    text = p.stdout + p.stderr
    loads = [float(x) for x in re.findall(r"Loading weights took ([0-9.]+) s", text)]
    tok = re.search(r"TOKENS (\[.*\])", text)
    if p.returncode != 0 or not loads or not tok:
        sys.exit("vLLM failed (%s, %s):\n%s" % (model, fmt, text[-3000:]))
    return max(loads), wall, tok.group(1)


def cpu_s(pid):
    """User + system CPU seconds of process pid so far (/proc/PID/stat)."""
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def stats_line(m, cpu0):
    """Reads and bytes of every rank from the mount's stats file, and the daemon's CPU seconds since
    cpu0, and the bytes pushed ahead (--push): (requests, bytes, copied, cpu, pushed)."""
    reads = served = copied = pushed = 0
    for l in open(os.path.join(m.path, ".tpfs-stats")).read().splitlines():
        f = l.split()
        if len(f) >= 5 and f[0].isdigit():
            served, reads, copied = served + int(f[1]), reads + int(f[3]), copied + int(f[4])
        elif f[:2] == ["push:", "pushed"]:
            pushed = int(f[2])
    return reads, served, copied, cpu_s(m.proc.pid) - cpu0, pushed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "vllm-bench"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--tpfs", default=os.path.join(ROOT, "build", "src", "tpfs"))
    ap.add_argument("--before", default=None, help="another tpfs binary (the one before a change): its view rows too")
    ap.add_argument("--iov", action="store_true", help="also the view with --reply iov (the kernel copies from the "
                    "daemon's source mappings: one copy fewer)")
    ap.add_argument("--push-off", action="store_true", help="also the view with --push off (every byte of the "
                    "first start through the daemon)")
    ap.add_argument("--no-ceiling", action="store_true", help="leave out the dump and identity rows")
    ap.add_argument("--plugin", action="store_true", help="also --load-format tpfs (the plugin of this checkout, "
                    "installed into a venv layered on the vLLM venv)")
    ap.add_argument("--variant", action="append", default=[], metavar="TAG=ARGS",
                    help="also the view with more tpfs mount arguments, e.g. 'nice keep=--nice keep' (repeatable)")
    a = ap.parse_args()
    os.environ["TPFS_BIN"] = a.tpfs
    import tpfs_test as tt
    py = vllm_python()
    src = os.path.join(a.work, "llama-1g")
    os.makedirs(a.work, exist_ok=True)
    if not os.path.exists(os.path.join(src, "config.json")):
        print("generating the Llama-shaped checkpoint in %s ..." % src, flush=True)
        subprocess.run([py, "-c", MAKE, src], check=True)
    size = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src) if f.endswith(".safetensors"))
    script = os.path.join(a.work, "start.py")
    with open(script, "w") as f:
        f.write(START)
    # the pre-sharded dump: what save_sharded_state writes (the view's part files, which the probe
    # proves equal to it), copied to this disk: the contender tpfs replaces, and under an identity
    # FUSE mount (tpfs --tp 1 over it: every byte through a FUSE daemon, nothing sliced) the ceiling
    # any FUSE gives here
    dump = os.path.join(a.work, "dump")
    if not os.path.exists(os.path.join(dump, "config.json")):
        with tt.Mount(src, 2, "--view", "vllm") as m:
            shutil.copytree(m.path, dump + ".tmp", ignore=shutil.ignore_patterns(".tpfs-stats"))
        os.rename(dump + ".tmp", dump)
    ident = os.path.join(a.work, "identity-plan.json")  # every tensor whole: T=1 slices nothing
    with open(ident, "w") as f:
        json.dump({"tpfs_plan": 1, "name": "identity", "description": "every tensor whole (the benchmark's identity "
                   "mount)", "rules": [{"name": "whole", "match": "**", "split": "replicate"}]}, f)
    for d in (src, dump):  # the sources in the page cache, as for every contender
        for f in os.listdir(d):
            with open(os.path.join(d, f), "rb") as fh:
                while fh.read(1 << 24):
                    pass
    binaries = [("after", a.tpfs, [])] + ([("before", a.before, [])] if a.before else [])
    binaries += [("after --reply iov", a.tpfs, ["--reply", "iov", "--push", "off"])] if a.iov else []
    binaries += [("after --push off", a.tpfs, ["--push", "off"])] if a.push_off else []
    for v in a.variant:
        tag, sep, args = v.partition("=")
        if not sep or not tag.strip():
            ap.error("--variant: give TAG=ARGS, e.g. 'nice keep=--nice keep'")
        binaries.append(("after %s" % tag.strip(), a.tpfs, args.split()))
    keys = ["default"] + ([] if a.no_ceiling else ["dump", "identity first", "identity second"])
    keys += ["one flag"] if a.plugin else []
    ppy = plugin_python(a.work) if a.plugin else None
    if a.plugin:  # the plugin's node mounts live in a runtime folder of this run's own
        os.environ["TPFS_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="tpfs-bench-run-")
    for tag, _, _ in binaries:
        keys += ["%s first" % tag, "%s second" % tag]
    res = {k: [] for k in keys}
    notes = {}
    tokens = set()

    def run(key, model, fmt, python=None):
        lw, wall, tok = start(python or py, model, fmt, script)
        res[key].append((lw, wall))
        tokens.add(tok)

    def ceiling():
        run("dump", dump, "sharded_state")
        with tt.Mount(dump, 1, "--plan", ident, "--push", "off", allow_stderr=[r"^tpfs: warning: "]) as m:
            c0 = cpu_s(m.proc.pid)
            run("identity first", m.rank(0), "sharded_state")
            notes.setdefault("identity", []).append(stats_line(m, c0))
            run("identity second", m.rank(0), "sharded_state")

    def view(tag, binary, extra):
        tt.TPFS = binary
        with tt.Mount(src, 2, "--view", "vllm", *extra) as m:
            c0 = cpu_s(m.proc.pid)
            run("%s first" % tag, m.path, "sharded_state")
            notes.setdefault(tag, []).append(stats_line(m, c0))
            run("%s second" % tag, m.path, "sharded_state")
        tt.TPFS = a.tpfs

    # the groups of rows (a first start and its second stay together), in an order rotated by one group each
    # repetition: on a VM that hands freed memory back to its host, a start's load time depends on what ran just
    # before it (bench/first_touch.py), so no row may always follow the same one
    groups = [lambda: run("default", src, "auto")]
    groups += [lambda: run("one flag", src, "tpfs", ppy)] if a.plugin else []
    groups += [ceiling] if not a.no_ceiling else []
    groups += [lambda b=b: view(*b) for b in binaries]
    for rep in range(a.reps):
        k = rep % len(groups)
        for g in groups[k:] + groups[:k]:
            g()
        print("rep %d: %s" % (rep + 1, ", ".join("%s %.2f s" % (k, v[-1][0]) for k, v in res.items())), flush=True)
    d = statistics.median(x[0] for x in res["default"])
    idf = statistics.median(x[0] for x in res["identity first"]) if res.get("identity first") else None
    dw = statistics.median(x[1] for x in res["default"])
    names = {"default": "vLLM default loader on SRC (source cached)",
             "one flag": "--load-format tpfs on SRC (the plugin mounts it as the engine starts; source cached)",
             "dump": "sharded_state on a pre-sharded dump on this disk (no FUSE; dump cached)",
             "identity first": "identity FUSE (tpfs --tp 1 over the dump), first start: the FUSE ceiling",
             "identity second": "identity FUSE, second start (its pages cached)"}
    for tag, _, _ in binaries:
        names["%s first" % tag] = "tpfs --view vllm (%s), first start (rank files not cached)" % tag
        names["%s second" % tag] = "tpfs --view vllm (%s), second start (rank files cached)" % tag
    lines = ["| vLLM 0.32 (CPU), TP=2, %.2f GB bf16 Llama-shaped | Loading weights took, each repetition | median | x default | x identity FUSE first | whole start (process start to done), median | x default |"
             % (size / 1e9), "| --- | --- | --- | --- | --- | --- | --- |"]
    for k in keys:
        v = [x[0] for x in res[k]]
        med, wmed = statistics.median(v), statistics.median(x[1] for x in res[k])
        lines.append("| %s | %s | %.2f s | %.2fx | %s | %.1f s | %.2fx |" % (
            names[k], " / ".join("%.2f" % x for x in v), med, med / d, "%.2fx" % (med / idf) if idf else "-", wmed, wmed / dw))
    lines.append("")
    for tag, st in sorted(notes.items()):
        r, b, c, cpu, pushed = st[-1]
        lines.append("FUSE requests of the %s first start (the stats file, both ranks): %d reads, %.1f MB, %.0f KiB "
                     "a request, %d copied%s; reads in each repetition %s; the daemon's CPU time %s s." % (
                         tag, r, b / 1e6, b / max(r, 1) / 1024, c, ", %.1f MB pushed ahead" % (pushed / 1e6) if pushed else "",
                         " / ".join("%d" % x[0] for x in st), " / ".join("%.2f" % x[3] for x in st)))
    lines.append("Greedy tokens of every start: %s (%s)." % (sorted(tokens),
                 "identical" if len(tokens) == 1 else "DIFFERENT"))
    lines.append("Command: `python bench/vllm_bench.py --reps %d%s%s%s%s%s` (each start its own process; the machine: "
                 "2 cores, no GPU)." % (a.reps, " --before OLD_TPFS" if a.before else "", " --iov" if a.iov else "",
                                        " --push-off" if a.push_off else "", " --no-ceiling" if a.no_ceiling else "",
                                        "".join(" --variant '%s'" % v for v in a.variant) + (" --plugin" if a.plugin else "")))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if len(tokens) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
