"""A generated Llama-like FP16 checkpoint for the storage benchmarks and tests (issue 16's geometry
by default: 8 layers, hidden 2048, 16 heads of 128, 4 KV heads, intermediate 5632, vocab 32000,
4 files, about 1 GiB). Random bytes tiled from one block, so writing it is fast.

    python llama_gen.py OUT_DIR [--small]
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import save_file

MiB = 1 << 20


def config(layers=8, hidden=2048, heads=16, head_dim=128, kv_heads=4, inter=5632, vocab=32000):
    return dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=hidden,
                num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                intermediate_size=inter, vocab_size=vocab, num_hidden_layers=layers,
                tie_word_embeddings=False, rms_norm_eps=1e-6, torch_dtype="float16")


def shapes(c):
    D, H, KV, hd, I, V = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                          c["intermediate_size"], c["vocab_size"])
    out = [("model.embed_tokens.weight", (V, D))]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out += [(p + "self_attn.q_proj.weight", (H * hd, D)), (p + "self_attn.k_proj.weight", (KV * hd, D)),
                (p + "self_attn.v_proj.weight", (KV * hd, D)), (p + "self_attn.o_proj.weight", (D, H * hd)),
                (p + "mlp.gate_proj.weight", (I, D)), (p + "mlp.up_proj.weight", (I, D)),
                (p + "mlp.down_proj.weight", (D, I)),
                (p + "input_layernorm.weight", (D,)), (p + "post_attention_layernorm.weight", (D,))]
    out += [("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]
    return out


def write_checkpoint(path, c, shapes, nfiles, seed=0):
    """Writes config c and tensors shapes [(name, shape, dtype "f2" or "f4")] in that order over nfiles
    safetensors files with an index (random bytes tiled from one 16 MiB block, NaNs made finite, so
    writing stays fast); returns the data bytes. bench.py writes its GLM-5.3 geometry with it."""
    block = np.random.default_rng(seed).integers(0, 256, 16 * MiB + 4096, dtype=np.uint8)
    total = sum(int(np.prod(s)) * int(dt[1]) for _, s, dt in shapes)
    per = total / nfiles
    os.makedirs(path, exist_ok=True)
    files, cur, acc, wm, off = [], {}, 0, {}, 0

    def flush():
        fn = "model-%05d-of-%05d.safetensors" % (len(files) + 1, nfiles)
        save_file(cur, os.path.join(path, fn), metadata={"format": "pt"})
        for k in cur:
            wm[k] = fn
        files.append(fn)
        cur.clear()

    for name, shape, dt in shapes:
        n = int(np.prod(shape)) * int(dt[1])
        raw = np.resize(block[off % 4096:], n)
        off += 7
        cur[name] = np.nan_to_num(raw.view(np.float16 if dt == "f2" else np.float32)).reshape(shape)
        acc += n
        if acc >= per * (len(files) + 1) and len(files) < nfiles - 1:
            flush()
    flush()
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    return total


def write(path, c, nfiles=4, seed=0):
    """Writes the Llama checkpoint of config c in layer order over nfiles files with an index; returns
    the data bytes."""
    return write_checkpoint(path, c, [(n, s, "f2") for n, s in shapes(c)], nfiles, seed)


def ensure(work, smoke=False, log=None):
    """The folder of the benchmarks' generated checkpoint under work (llama-io, or with smoke the small
    llama-io-smoke), written once: a finished one holds a .complete stamp, a partial one is rewritten. Returns
    (its path, its config)."""
    c = config(layers=2, hidden=1024, heads=8, kv_heads=4, inter=4096, vocab=8192) if smoke else config()
    gen = os.path.join(work, "llama-io-smoke" if smoke else "llama-io")
    if not os.path.exists(os.path.join(gen, ".complete")):
        shutil.rmtree(gen, ignore_errors=True)
        if log:
            log("generating the Llama-like checkpoint in %s ..." % gen)
        write(gen, c)
        open(os.path.join(gen, ".complete"), "w").close()
    return gen, c


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: llama_gen.py OUT_DIR [--small]")
    c = config(layers=2, hidden=1024, heads=8, kv_heads=4, inter=4096, vocab=8192) if sys.argv[2:] == ["--small"] else config()
    print("wrote %d bytes of tensors to %s" % (write(sys.argv[1], c), sys.argv[1]))
