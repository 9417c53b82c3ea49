"""The transposed read path (TP_RUN_TRANSPOSE, issue 28) side by side with the plain one.

python bench/transpose_bench.py [--tp T] [--reps N] [--experts E] [--hidden H] [--inter I] [--work DIR]

Writes a gpt-oss-shaped BF16 checkpoint of one decoder layer (experts gate_up_proj [E, H, 2I] and down_proj
[E, I, H], random bytes; by default E=8, H=I=2880 as gpt-oss's: 398 MB of experts), then per repetition, with
the source in the page cache:
  - hf view    rank 0's rank folder through tpfs (`tpfs mount SRC MNT --tp T`): the experts cut by columns and
               rows, served as cut (TP_RUN_SRC runs);
  - vllm view  rank 0's sharded_state file (`--view vllm`): the same cuts served transposed, as vLLM's
               w13_weight [E, 2I/T, H] and w2_weight [E, H, I/T] (TP_RUN_TRANSPOSE runs, the CPU gather);
  - numpy      what a pre-sharding script does for the same bytes: mmap the source (safetensors' safe_open),
               slice, transpose and copy into contiguous arrays (np.ascontiguousarray), no file written.
Each read is the daemon's first (a fresh mount per repetition); throughputs are rank bytes over wall time;
the ratios are taken within a repetition, then the median. Prints a Markdown table for docs/PERFORMANCE.md.
"""
import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
import tpfs_test as tt  # noqa: E402
from io_bench import read_files as read_all  # noqa: E402  (bench/ is this script's folder: on sys.path)


def write_checkpoint(out, E, H, I, heads=64, kv=8, hd=64, vocab=2048):
    """One gpt-oss decoder layer (config.json as transformers writes it, model.safetensors in BF16)."""
    os.makedirs(out, exist_ok=True)
    L = "model.layers.0."
    shapes = {"model.embed_tokens.weight": [vocab, H], "lm_head.weight": [vocab, H], "model.norm.weight": [H],
              L + "input_layernorm.weight": [H], L + "post_attention_layernorm.weight": [H],
              L + "self_attn.q_proj.weight": [heads * hd, H], L + "self_attn.q_proj.bias": [heads * hd],
              L + "self_attn.k_proj.weight": [kv * hd, H], L + "self_attn.k_proj.bias": [kv * hd],
              L + "self_attn.v_proj.weight": [kv * hd, H], L + "self_attn.v_proj.bias": [kv * hd],
              L + "self_attn.o_proj.weight": [H, heads * hd], L + "self_attn.o_proj.bias": [H],
              L + "self_attn.sinks": [heads], L + "mlp.router.weight": [E, H], L + "mlp.router.bias": [E],
              L + "mlp.experts.gate_up_proj": [E, H, 2 * I], L + "mlp.experts.gate_up_proj_bias": [E, 2 * I],
              L + "mlp.experts.down_proj": [E, I, H], L + "mlp.experts.down_proj_bias": [E, H]}
    hdr, off = {}, 0
    for k in sorted(shapes):
        n = int(np.prod(shapes[k])) * 2
        hdr[k] = {"dtype": "BF16", "shape": shapes[k], "data_offsets": [off, off + n]}
        off += n
    js = json.dumps(hdr).encode()
    js += b" " * (-len(js) % 8)
    rng = np.random.default_rng(0)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js)
        left = off
        while left:
            n = min(left, 64 << 20)
            f.write(rng.integers(0, 1 << 16, n // 2, dtype=np.uint16).tobytes())
            left -= n
    cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": H, "intermediate_size": I,
           "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
           "num_local_experts": E, "num_experts_per_tok": 4, "vocab_size": vocab, "tie_word_embeddings": False,
           "layer_types": ["sliding_attention"], "sliding_window": 128, "max_position_embeddings": 4096,
           "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                               "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0},
           "torch_dtype": "bfloat16"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    return off


def timed(fn):
    t = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - t


def numpy_cut(src, T, E, H, I):
    """Rank 0's transposed experts as a script makes them: mmap, slice, transpose, copy."""
    path = os.path.join(src, "model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    base = (8 + n) // 2

    def tensor(k):
        a, b = hdr[k]["data_offsets"]
        return mm[base + a // 2: base + b // 2].reshape(hdr[k]["shape"])
    gu = tensor("model.layers.0.mlp.experts.gate_up_proj")[:, :, : 2 * I // T]
    dn = tensor("model.layers.0.mlp.experts.down_proj")[:, : I // T, :]
    w13 = np.ascontiguousarray(gu.transpose(0, 2, 1))
    w2 = np.ascontiguousarray(dn.transpose(0, 2, 1))
    return w13.nbytes + w2.nbytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2880)
    ap.add_argument("--inter", type=int, default=2880)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="tpfs-tbench-")
    src = os.path.join(work, "src")
    total = write_checkpoint(src, a.experts, a.hidden, a.inter)
    read_all([os.path.join(src, "model.safetensors")])  # into the page cache
    experts = a.experts * a.hidden * a.inter * 3 * 2  # gate_up + down, BF16
    rows = {"hf view (cut, served as cut)": [], "vllm view (cut, served transposed)": [],
            "numpy (slice, transpose, copy; no file)": []}
    ratios = []
    for rep in range(a.reps):
        got = {}
        for name, extra in (("hf view (cut, served as cut)", ()), ("vllm view (cut, served transposed)", ("--view", "vllm"))):
            with tt.Mount(src, a.tp, *extra) as m:
                if extra:
                    files = [os.path.join(m.path, f) for f in sorted(os.listdir(m.path)) if f.startswith("model-rank-0-")]
                else:
                    files = [os.path.join(m.path, "rank0", "model.safetensors")]
                n, s = timed(lambda: read_all(files))
            got[name] = (n, s)
            rows[name].append(n / s / 1e9)
        n, s = timed(lambda: numpy_cut(src, a.tp, a.experts, a.hidden, a.inter))
        rows["numpy (slice, transpose, copy; no file)"].append(n / s / 1e9)
        ratios.append(rows["vllm view (cut, served transposed)"][-1] / rows["hf view (cut, served as cut)"][-1])
        print("rep %d: %s" % (rep, ", ".join("%s %.2f GB/s" % (k, v[-1]) for k, v in rows.items())), file=sys.stderr)
    print("Checkpoint: one gpt-oss layer, BF16, experts E=%d, H=%d, I=%d (%.0f MB of experts, %.0f MB in all); T=%d, "
          "rank 0; source in the page cache; medians of %d repetitions.\n"
          % (a.experts, a.hidden, a.inter, experts / 1e6, total / 1e6, a.tp, a.reps))
    print("| reader of rank 0 | median | ratio |")
    print("| --- | --- | --- |")
    hf = statistics.median(rows["hf view (cut, served as cut)"])
    for k, v in rows.items():
        m = statistics.median(v)
        print("| %s | %.2f GB/s | %.2fx hf view |" % (k, m, m / hf))
    print("\nvllm view / hf view, per repetition: %s (median %.2f)" % (", ".join("%.2f" % r for r in ratios),
                                                                       statistics.median(ratios)))


if __name__ == "__main__":
    main()
