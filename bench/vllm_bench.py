"""vLLM load benchmark (issue 21): vLLM's "Loading weights took" and its whole start, TP=2, for a
Llama-shaped bf16 model of about 1 GB, measured side by side in one run:

  default        vLLM's default loader on SRC (every rank reads the HF checkpoint and slices it
                 in each weight_loader), the source in the page cache;
  tpfs, first    --load-format sharded_state on a fresh `tpfs mount SRC MNT --tp 2 --view vllm`
                 (the source cached, the rank files not yet: every byte comes through the daemon);
  tpfs, second   the same mount again (the rank files now in the page cache).

Each start runs in its own process of the vLLM venv (scripts/setup.sh --vllm): no state carries
over but the page cache. Prints a table; --out writes it (docs/PERFORMANCE.md's vLLM section is
made from it).

python bench/vllm_bench.py [--reps N] [--work DIR] [--out FILE] [--tpfs PATH]
"""
import argparse
import os
import re
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "vllm-bench"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--tpfs", default=os.path.join(ROOT, "build", "src", "tpfs"))
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
    for f in os.listdir(src):  # the source in the page cache, as for every contender
        with open(os.path.join(src, f), "rb") as fh:
            while fh.read(1 << 24):
                pass
    res = {"default": [], "first": [], "second": []}
    tokens = set()
    for rep in range(a.reps):
        lw, wall, tok = start(py, src, "auto", script)
        res["default"].append((lw, wall))
        tokens.add(tok)
        with tt.Mount(src, 2, "--view", "vllm") as m:
            for key in ("first", "second"):
                lw, wall, tok = start(py, m.path, "sharded_state", script)
                res[key].append((lw, wall))
                tokens.add(tok)
        print("rep %d: %s" % (rep + 1, ", ".join("%s %.2f s (start %.1f s)" % (k, v[-1][0], v[-1][1])
                                                   for k, v in res.items())), flush=True)
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
    d = med["default"]
    rows = [("vLLM default loader on SRC (source cached)", med["default"], "1.00x"),
            ("sharded_state through tpfs --view vllm, first start (rank files not cached)", med["first"],
             "%.2fx default" % (med["first"][0] / d[0])),
            ("sharded_state through tpfs, second start (rank files cached)", med["second"],
             "%.2fx default" % (med["second"][0] / d[0]))]
    lines = ["| vLLM 0.32 (CPU), TP=2, %.2f GB bf16 Llama-shaped | Loading weights took | whole start | load time against the default |"
             % (size / 1e9), "| --- | --- | --- | --- |"]
    lines += ["| %s | %.2f s | %.1f s | %s |" % (n, v[0], v[1], r) for n, v, r in rows]
    lines.append("")
    lines.append("Greedy tokens of every start: %s (%s)." % (sorted(tokens),
                 "identical" if len(tokens) == 1 else "DIFFERENT"))
    lines.append("Command: `python bench/vllm_bench.py --reps %d` (medians of %d repetitions, each start its own "
                 "process; the machine: 2 cores, no GPU)." % (a.reps, a.reps))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if len(tokens) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
