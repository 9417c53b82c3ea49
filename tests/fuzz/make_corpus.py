#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (committed under corpus/; rerun to refresh):
corpus/header: small valid and nearly valid safetensors files of every dtype family, scalars,
empty tensors, metadata, sub-byte dtypes; corpus/plan: each built-in plan file followed by
"\\n----\\n" and a config.json of the kind it serves."""
import json
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "py"))
from tpfs_test import DTYPE_BITS  # noqa: E402


def st(tensors, meta=None):
    hdr, off, data = {}, 0, b""
    if meta:
        hdr["__metadata__"] = meta
    for name, dt, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        nb = n * DTYPE_BITS[dt] // 8
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        data += bytes((off + i) % 251 for i in range(nb))
        off += nb
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


seeds = {
    "llama": st([("model.layers.0.self_attn.q_proj.weight", "BF16", [8, 4]),
                 ("model.layers.0.self_attn.o_proj.weight", "BF16", [4, 8]),
                 ("model.norm.weight", "F32", [4])], {"format": "pt"}),
    "dtypes": st([("a%d" % i, dt, [2, 4]) for i, dt in enumerate(sorted(DTYPE_BITS))]),
    "scalar_empty": st([("s", "F32", []), ("e", "F16", [0, 3]), ("f", "F16", [3, 0]), ("g", "I64", [1])]),
    "subbyte": st([("w", "F4", [4, 6]), ("x", "F6_E2M3", [2, 4]), ("y", "U8", [3, 3, 2])]),
    "fp8_block": st([("l.weight", "F8_E4M3", [6, 8]), ("l.weight_scale_inv", "F32", [1, 1])]),
    "nvfp4": st([("l.weight", "U8", [4, 8]), ("l.weight_scale", "F8_E4M3", [4, 1]), ("l.weight_scale_2", "F32", [])]),
    "bad_offsets": struct.pack("<Q", 56) + b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}  ',
    "escapes": st([('q"u\\ote\u00e9', "U8", [1])], {"k": "v\nw"}),
}
os.makedirs(os.path.join(here, "corpus", "header"), exist_ok=True)
for k, v in seeds.items():
    open(os.path.join(here, "corpus", "header", k + ".safetensors"), "wb").write(v)

configs = {
    "llama": {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 1,
              "head_dim": 16, "intermediate_size": 64, "vocab_size": 96},
    "deepseek": {"model_type": "deepseek_v3", "n_routed_experts": 8, "num_attention_heads": 2, "q_lora_rank": 128, "kv_lora_rank": 64,
                 "qk_nope_head_dim": 64, "qk_rope_head_dim": 128, "v_head_dim": 64, "vocab_size": 96,
                 "quantization_config": {"weight_block_size": [128, 128]}},
    "kda": {"model_type": "glm5_next", "text_config": {"layer_types": ["linear_attention"] * 3,
            "linear_attn_config": {"num_heads": 8, "head_dim": 8}, "vocab_size": 96}},
    "qwen3-next": {"model_type": "qwen3_next", "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                   "linear_key_head_dim": 4, "linear_value_head_dim": 6, "vocab_size": 96},
}
os.makedirs(os.path.join(here, "corpus", "plan"), exist_ok=True)
plans = os.path.join(here, "..", "..", "plans")
for fn in sorted(os.listdir(plans)):
    if fn.endswith(".json"):
        name = fn[:-5]
        cfg = configs.get(name, configs["llama"])
        text = open(os.path.join(plans, fn)).read() + "\n----\n" + json.dumps(cfg)
        open(os.path.join(here, "corpus", "plan", name + ".txt"), "w").write(text)
print("corpus written")
