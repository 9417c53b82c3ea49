"""SGLang's sharded_state loader on the files `tpfs mount SRC MNT --tp 2 --view sglang` serves (issue 29).

Tiny random checkpoints (vllm_models.py: random norm weights, and the published extras such as MTP layers and F32
norms: issue 51) of every SGLang view family (FAMILIES), mounted at T=2 with
--view sglang, proven by SGLang 0.5.23 (the venv of `scripts/setup.sh --sglang`) as a user runs it:
sglang.Engine(model_path=..., tp_size=2, load_format=...) on SRC with SGLang's default loader and on the
mount with load_format="sharded_state" (sglang_check.py), on the CPU engine with the torch_native
attention. Checked per rank, through a hook in SGLang's worker processes (sglang_site/sitecustomize.py):
  - the key set, shapes and dtypes sharded_state fills (ShardedStateLoader._filter_subtensors of the
    model's state dict) equal the served part files' headers;
  - every parameter, buffer and tensor attribute of the model each loader leaves, after SGLang's own
    post-load steps (SGLang processes the weights inside load_model, and for sharded_state before it
    copies the files in), is bitwise equal between the two loaders;
and per family but LOAD_ONLY: greedy tokens and the top-5 logprobs of every step equal between the two loaders. Every
part file also equals, byte for byte, the independent reference (vllm_view_ref.py, which SGLang's weight
loaders agree with for these families: the engine comparison above is what proves it for SGLang).

Wrong files must fail: the vLLM view's files (four attention scale entries SGLang does not hold: a
KeyError in its sharded_state loader) and the SGLang view's files with the two ranks swapped (same
names and shapes: the weights and tokens differ). Refusals by name: KV heads fewer than the ranks and
an intermediate size SGLang's CPU path pads, FP8 checkpoints (DeepSeek-V3, Kimi K2, Qwen3, Qwen3-MoE with block
scales, per-tensor FP8: views/sglang/fp8.json, whose reason SGLang's default loader confirms, FP8_ENGINE) and another
quant method, pipeline stages, an untied Gemma 3 (whose
head SGLang's loader never fills), a tied or partly dense Qwen3-Next, a tied Arcee, HunYuan dense without
use_qk_norm, Command R with it, Qwen3-Next (its norms' gemma_weight, which SGLang's sharded_state leaves at 1.0: DERIVED
runs it with that refusal lifted and requires exactly those tensors to differ), a family with no SGLang view (gemma2, gemma: views/sglang/README.md says why).
TPFS_SGLANG_FAMILIES=a,b starts the Engines of those families only (and llama's): to iterate on a family.

STAND-IN: SGLang's CPU kernels (sgl_kernel) are not on PyPI; sglang_site/sgl_kernel is a module whose
every function raises, which only lets SGLang import (its native torch paths then run), and it registers two
torch operators Qwen3-Next's Gated DeltaNet backend looks up on import, which raise too: see its docstring. torch.compile is off (TORCHDYNAMO_DISABLE=1) for both loaders alike: it halves each engine
start on two cores and touches no weight. SGLang's processes are forked from sglang_check.py's, which has
imported SGLang once, not spawned (each spawned process imports it again: 25 of a start's 30-38 s); the
model code, loaders and post-load steps are SGLang's own either way (sglang_check.py, FORKED, NOT SPAWNED).
TPFS_SGLANG_ENGINE=none starts no engine (the sanitized build: what it adds is the daemon under ASan/UBSan).
Exits 77 only where the SGLang venv cannot be made (setup.sh --sglang wrote BUILD/venv-sglang.unavailable).
"""
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VIEWS = os.path.join(HERE, "..", "..", "views", "sglang")
# family -> (view, config fields for vllm_models.make): KV heads as many as the ranks (SGLang's CPU path pads
# fewer; the view refuses them); qwen3_moe's intermediate_size one SGLang pads, which no layer of an all-MoE
# checkpoint uses (served: the engines prove that the padding leaves its parameters alone)
# DeepSeek-V3's config fields as the published config.json has them, which SGLang reads (srt/models/deepseek_v2.py)
# and transformers' DeepseekV3Config omits; its CPU rotary embedding takes YaRN only (deepseek_yarn)
DEEPSEEK = {"moe_layer_freq": 1, "scoring_func": "sigmoid", "ep_size": 1,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                                "mscale": 1.0, "mscale_all_dim": 1.0}}
FAMILIES = {"llama": ("llama", {"num_key_value_heads": 2}), "qwen2": ("llama", {"num_key_value_heads": 2}),
            "qwen3": ("llama", {"num_key_value_heads": 2}),
            # Qwen3 with its norm weights stored F32 beside BF16 matrices (issue 51): served as stored (CASTS)
            "qwen3_f32norm": ("llama", {"num_key_value_heads": 2}), "qwen3_moe": ("qwen3_moe", {"num_key_value_heads": 2, "intermediate_size": 96}),
            "mixtral": ("mixtral", {"num_key_value_heads": 2}), "mistral": ("llama", {"num_key_value_heads": 2}),
            "phi3": ("phi3", {"num_key_value_heads": 2}), "glm4_moe": ("glm4_moe", {"num_key_value_heads": 2}),
            "qwen2_moe": ("qwen2_moe", {"num_key_value_heads": 2}),
            "granite": ("llama", {"num_key_value_heads": 2}), "glm4": ("llama", {"num_key_value_heads": 2}),
            "deepseek_v3": ("deepseek_v3", DEEPSEEK),
            # Kimi K2: DeepSeek-V3's model under model_type kimi_k2 (vllm_models retypes config.json), which SGLang
            # reads as DeepseekV3Config (srt/utils/hf_transformers/common.py _KimiK2ConfigAlias)
            "kimi_k2": ("deepseek_v3", DEEPSEEK),
            # Gemma 3's text model, tied (Gemma3TextConfig's default; the view refuses an untied one)
            "gemma3": ("gemma3", {"num_key_value_heads": 2}),
            # full_attention_interval as the published config.json has it: SGLang's Qwen3NextConfig builds its
            # layer pattern from it (configs/qwen3_next.py layers_block_type), not from layer_types
            "qwen3_next": ("qwen3_next", {"num_key_value_heads": 2, "full_attention_interval": 2}),
            # llama's view: Apertus (no gate_proj, xIELU's parameters and 0-d buffers), Arcee (no gate_proj, never
            # tied), OLMo (LayerNorms without weights), HunYuan dense (query_layernorm / key_layernorm, which SGLang
            # builds only with use_qk_norm, as the published config.json says)
            "apertus": ("llama", {"num_key_value_heads": 2}), "arcee": ("llama", {"num_key_value_heads": 2}),
            "olmo": ("llama", {"num_key_value_heads": 2}),
            "hunyuan_v1_dense": ("llama", {"num_key_value_heads": 2, "use_qk_norm": True}),
            # Command R: no lm_head (SGLang's logits come from the embedding), tied (CohereConfig's default)
            "cohere": ("cohere", {"num_key_value_heads": 2}),
            # issue 49, loaders only (LOAD_ONLY: no tokens, two Engine starts each). llama's view: Ministral 3,
            # Granite SWA (its sinks cut with the heads), InternLM3 and IQuestCoder (SGLang's LlamaForCausalLM; their
            # configuration class from the checkpoint: REMOTE_CODE); Cohere 2 (SGLang's CohereForCausalLM)
            "ministral3": ("llama", {"num_key_value_heads": 2}), "granite_swa": ("llama", {"num_key_value_heads": 2}),
            "internlm3": ("llama", {"num_key_value_heads": 2}), "iquestcoder": ("llama", {"num_key_value_heads": 2}),
            "cohere2": ("cohere", {"num_key_value_heads": 2}),
            "olmo2": ("olmo2", {"num_key_value_heads": 2}), "exaone": ("exaone", {"num_key_value_heads": 2}),
            # OLMoE: KV heads as many as heads (SGLang's k_norm is hidden_size wide)
            "olmoe": ("olmoe", {"num_key_value_heads": 2}),
            "granitemoe": ("granitemoe", {"num_key_value_heads": 2}),
            "granitemoeshared": ("granitemoe", {"num_key_value_heads": 2}),
            "granitemoe_swa": ("granitemoe_swa", {"num_key_value_heads": 2}),
            # DeepSeek-V2-Lite: no q-LoRA (q_proj, kv_a_proj_with_mqa unfused), greedy softmax routing, no bias
            "deepseek_v2": ("deepseek_v2", dict(DEEPSEEK, scoring_func="softmax")),
            "glm4_moe_lite": ("glm4_moe_lite", DEEPSEEK),
            "minimax_m2": ("minimax_m2", {"num_key_value_heads": 2}),
            "ernie4_5_moe": ("ernie4_5_moe", {"num_key_value_heads": 2}),
            "gpt_oss": ("gpt_oss", {"num_key_value_heads": 2}), "afmoe": ("afmoe", {"num_key_value_heads": 2}),
            "hy_v3": ("hy_v3", {"num_key_value_heads": 2}),
            # EXAONE 4: sliding_window_pattern as published (a string, "LLLG" for 4 layers: SGLang's Exaone4Attention
            # takes len() of it; transformers' Exaone4Config writes an int)
            "exaone4": ("llama", {"num_key_value_heads": 2, "sliding_window_pattern": "LG"}), "starcoder2": ("starcoder2", {"num_key_value_heads": 2}),
            "mellum": ("mellum", {"num_key_value_heads": 2}),
            # Hunyuan-A13B: the config.json keys SGLang reads, as published (the experts and shared MLP as wide as
            # intermediate_size, as transformers builds them)
            "hunyuan_v1_moe": ("hunyuan_v1_moe", {"num_key_value_heads": 2, "use_qk_norm": True, "use_mixed_mlp_moe": 1,
                                                  "num_shared_expert": 1, "moe_intermediate_size": 64}),
            # Cohere 2 MoE: its dense first layer said by first_k_dense_replace too (SGLang reads that key)
            "cohere2_moe": ("cohere2_moe", {"num_key_value_heads": 2, "first_k_dense_replace": 1})}
# families whose configuration class comes from the checkpoint (vllm_models.REMOTE): SGLang reads them with
# trust_remote_code, as a user of the published checkpoints does
REMOTE_CODE = {"internlm3", "iquestcoder", "exaone"}
# TPFS_SGLANG_FAMILIES=a,b: only those families' Engine starts (and llama's, which the wrong-file cases use), to
# iterate on one family; unset: every family
ONLY = [f for f in (os.environ.get("TPFS_SGLANG_FAMILIES") or "").split(",") if f]
RUN = [f for f in FAMILIES if not ONLY or f in ONLY or f == "llama"]
# the reference's cuts (vllm_view_ref.CUTS, vLLM's) where SGLang's model cuts otherwise: Gemma 3's embedding is
# Gemma3TextScaledWordEmbedding, a plain nn.Embedding (srt/models/gemma3_causal.py): whole on every rank, and with
# tied embeddings its lm_head is that module
REF_FAMILY = {"gemma3": "sglang_gemma3"}
# more sglang.Engine arguments, none touching weights: SGLang resolves Qwen3-Next's Mamba radix cache to its
# extra_buffer strategy where the overlap scheduler is on, which asserts on a CPU ("extra_buffer requires platform
# support for Mamba cache state snapshots", srt/arg_groups/mamba_hook.py); without it, no_buffer. Its Mamba state
# pool is sized to 8 requests: SGLang sizes it from the free memory otherwise (22 s against 7 s an Engine start
# here, and the next start's check that the ranks see the same free memory, "The memory capacity is unbalanced",
# failed on a busy machine)
ENGINE_ARGS = {"qwen3_next": {"disable_overlap_schedule": True, "max_mamba_cache_size": 8},
               # SGLang asserts one of triton, trtllm_mha, fa3, fa4, ascend, intel_amx, intel_xpu, aiter for gpt-oss
               # (srt/arg_groups/model_hook.py: torch_native has neither sliding windows nor sinks); load-only, so
               # triton's backend is built and never run (the attention backend holds no weight)
               "gpt_oss": {"attention_backend": "triton"},
               # the same for EXAONE 4 wherever sliding_window_pattern is set (fa3, triton or trtllm_mha), which
               # transformers' Exaone4Config always sets
               "exaone4": {"attention_backend": "triton"}}
# loaders only, no tokens: SGLang's Qwen2-MoE forward calls a Triton kernel (fused_gate_sigmoid_mul_add) that the
# CPU build of Triton cannot run ("0 active drivers"), for either loader alike; DeepSeek-V3's (and Kimi K2's)
# torch_native attention cannot run a v head dim other than the qk one; Qwen3-Next's Gated DeltaNet on a CPU calls
# sgl_kernel's CPU kernels (chunk_gated_delta_rule_cpu, causal_conv1d_fn_cpu, ...: srt/layers/attention/linear/),
# with no native torch path, and sgl_kernel here is a stand-in
LOAD_ONLY = {"qwen2_moe", "deepseek_v3", "kimi_k2", "qwen3_next"}
# issue 49's families: proven by the loaders only (key sets and every tensor after post-load), no tokens, to keep
# CI's time (each family's two Engine starts, without generation)
LOAD_ONLY |= {"ministral3", "granite_swa", "internlm3", "iquestcoder", "cohere2", "olmo2", "exaone", "olmoe",
              "granitemoe", "granitemoeshared", "granitemoe_swa", "deepseek_v2", "glm4_moe_lite", "minimax_m2",
              "ernie4_5_moe", "gpt_oss", "afmoe", "hy_v3", "exaone4", "starcoder2", "mellum", "hunyuan_v1_moe", "cohere2_moe"}
# keys served in the checkpoint's dtype where SGLang's parameter has the model's (issue 51): SGLang's sharded_state
# copy casts them as its default loader's weight_loader does, so the loaded bits are equal (checked below with every
# tensor); narrowing them in the view would be right for one --dtype only. family -> regex; at least one must be cast
CASTS = {"qwen3_f32norm": r"norm\.weight$",
         # ERNIE-4.5-MoE's router and correction bias, F32 in the checkpoint (transformers keeps them so), which
         # SGLang's MoEGate holds in the model's dtype
         "ernie4_5_moe": r"mlp\.gate\.(weight|e_score_correction_bias)$",
         # HunYuan MoE's router likewise (mlp.gate.wg, F32 in the checkpoint)
         "hunyuan_v1_moe": r"mlp\.gate\.weight$"}
# families the SGLang view refuses for a tensor SGLang derives at load time outside the state dict, which its
# sharded_state loader never refreshes (issue 51): family -> the derived tensors. Such a family is mounted with its
# view less that last refusal (a view FILE) and run like the others, and the loaders must leave exactly those
# tensors different (and no other): the refusal's reason, proven by SGLang itself. Were SGLang to refresh them,
# this check fails, and the family can be served again. Qwen3-Next: GemmaRMSNorm.gemma_weight (weight + 1), left at
# 1.0 by sharded_state; seen only with norm weights other than zeros (vllm_models.random_norms)
DERIVED = {"qwen3_next": r"\.gemma_weight$"}


PROMPTS = [[1, 5, 9, 600, 999], [3, 700, 20, 511, 512, 513]]
ENGINE = os.environ.get("TPFS_SGLANG_ENGINE") or "run"  # none: no Engine start (the sanitized build)


def refusals(fails, work):
    """What --view sglang refuses by name, each with its reason."""
    import tpfs_test
    import vllm_models
    cases = [("one KV head at T=2", "llama", {"num_key_value_heads": 1}, [],
              "SGLang on CPU pads the attention and KV heads"),
             ("intermediate_size 96 at T=2", "llama", {"num_key_value_heads": 2, "intermediate_size": 96}, [],
              "pads intermediate_size to a multiple of 32 x ranks"),
             ("moe_intermediate_size 32 at T=2", "qwen3_moe", {"num_key_value_heads": 2, "moe_intermediate_size": 32},
              [], "pads moe_intermediate_size"),
             ("qwen3_moe with a dense layer", "qwen3_moe", {"num_key_value_heads": 2, "mlp_only_layers": [0]}, [],
              "builds every Qwen3-MoE layer sparse"),
             ("mixtral intermediate_size 96 at T=2", "mixtral", {"num_key_value_heads": 2, "intermediate_size": 96}, [],
              "pads intermediate_size to a multiple of 32 x ranks"),
             ("mixtral head_dim 32 of hidden 128 / 2 heads", "mixtral", {"num_key_value_heads": 2, "head_dim": 32}, [],
              "Mixtral attention takes head_dim as hidden_size / num_attention_heads"),
             ("qwen2 head_dim 32 of hidden 128 / 2 heads", "qwen2", {"num_key_value_heads": 2, "head_dim": 32}, [],
              "Qwen2 attention on CPU takes head_dim"),
             ("pipeline stages", "llama", {"num_key_value_heads": 2}, ["--pp", "2"], "has no pipeline stages"),
             ("expert parallelism", "qwen3_moe", {"num_key_value_heads": 2}, ["--ep"],
              "expert parallelism is proven for no model type"),
             ("tied qwen3_moe", "qwen3_moe", {"num_key_value_heads": 2, "tie_word_embeddings": True}, [],
              "never ties lm_head to the embedding"),
             ("tied mixtral", "mixtral", {"num_key_value_heads": 2, "tie_word_embeddings": True}, [],
              "never ties lm_head to the embedding"),
             ("qwen2_moe moe_intermediate_size 32 at T=2", "qwen2_moe", {"num_key_value_heads": 2, "moe_intermediate_size": 32},
              [], "pads moe_intermediate_size and shared_expert_intermediate_size"),
             ("qwen2_moe shared_expert_intermediate_size 96 at T=2", "qwen2_moe",
              {"num_key_value_heads": 2, "shared_expert_intermediate_size": 96}, [], "shared_expert_intermediate_size"),
             ("tied qwen2_moe", "qwen2_moe", {"num_key_value_heads": 2, "tie_word_embeddings": True}, [],
              "never ties lm_head to the embedding"),
             ("qwen2_moe with a dense layer", "qwen2_moe", {"num_key_value_heads": 2, "mlp_only_layers": [0]}, [],
              "builds every Qwen2-MoE layer sparse"),
             ("glm4_moe intermediate_size 96 at T=2", "glm4_moe", {"num_key_value_heads": 2, "intermediate_size": 96}, [],
              "pads intermediate_size to a multiple of 32 x ranks"),
             ("phi3 intermediate_size 96 at T=2", "phi3", {"num_key_value_heads": 2, "intermediate_size": 96}, [],
              "pads intermediate_size to a multiple of 32 x ranks"),
             ("tied deepseek_v3", "deepseek_v3", dict(DEEPSEEK, tie_word_embeddings=True), [], "a tied DeepSeek-V3"),
             ("tied kimi_k2", "kimi_k2", dict(DEEPSEEK, tie_word_embeddings=True), [], "a tied DeepSeek-V3"),
             ("deepseek_v3 with 3 heads at T=2", "deepseek_v3", dict(DEEPSEEK, num_attention_heads=3), [],
              "splits the heads evenly only"),
             ("untied gemma3", "gemma3", {"num_key_value_heads": 2, "tie_word_embeddings": False}, [],
              "its loader never fills"),
             ("gemma3 intermediate_size 96 at T=2", "gemma3", {"num_key_value_heads": 2, "intermediate_size": 96}, [],
              "pads intermediate_size to a multiple of 32 x ranks"),
             ("gemma3 one KV head at T=2", "gemma3", {"num_key_value_heads": 1}, [], "pads the attention and KV heads"),
             ("tied qwen3_next", "qwen3_next", dict(FAMILIES["qwen3_next"][1], tie_word_embeddings=True), [],
              "never ties lm_head to the embedding"),
             ("qwen3_next with a dense layer", "qwen3_next", dict(FAMILIES["qwen3_next"][1], mlp_only_layers=[0]), [],
              "builds every Qwen3-Next layer sparse"),
             ("qwen3_next moe_intermediate_size 32 at T=2", "qwen3_next",
              dict(FAMILIES["qwen3_next"][1], moe_intermediate_size=32), [], "pads moe_intermediate_size"),
             ("qwen3_next pipeline stages", "qwen3_next", FAMILIES["qwen3_next"][1], ["--pp", "2"], "has no pipeline stages"),
             # issue 51: the norms' gemma_weight, which sharded_state leaves at 1.0 (DERIVED proves it)
             ("qwen3_next (gemma_weight)", "qwen3_next", FAMILIES["qwen3_next"][1], [], "gemma_weight stays 1.0"),
             ("deepseek_v3 pipeline stages", "deepseek_v3", DEEPSEEK, ["--pp", "2"], "has no pipeline stages"),
             ("tied arcee", "arcee", {"num_key_value_heads": 2, "tie_word_embeddings": True}, [],
              "never ties its head"),
             ("hunyuan_v1_dense without use_qk_norm", "hunyuan_v1_dense", {"num_key_value_heads": 2}, [],
              "only where config.json says use_qk_norm"),
             ("cohere with use_qk_norm", "cohere", {"num_key_value_heads": 2, "use_qk_norm": True}, [],
              "cut by heads"),
             ("apertus intermediate_size 96 at T=2", "apertus", {"num_key_value_heads": 2, "intermediate_size": 96}, [],
              "pads intermediate_size to a multiple of 32 x ranks"),
             ("no SGLang view for gemma2", "gemma2", {"num_key_value_heads": 2}, [], "no sglang view for plan"),
             # SGLang's Gemma adds 1 to every norm weight as it loads (srt/models/gemma.py), which no view makes
             ("no SGLang view for gemma", "gemma", {"num_key_value_heads": 2}, [], "no sglang view for plan"),
             # issue 49: families examined and refused, each with the reason from SGLang's code
             ("qwen3_5 (gemma_weight)", "qwen3_5", {}, [], "every gemma_weight stays 1.0"),
             ("qwen3_5_moe (gemma_weight)", "qwen3_5_moe", {}, [], "every gemma_weight stays 1.0"),
             ("minicpm3 (w_kc / w_vc)", "minicpm3", {}, [], "leaves w_kc / w_vc None"),
             ("gemma4_text (SGLang cannot read its config here)", "gemma4_text", {"num_key_value_heads": 2}, [],
              "AmbiguousGlobalPerLayerAttributeError"),
             ("olmoe with fewer KV heads than heads", "olmoe",
              {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}, [],
              "builds k_norm as RMSNorm(hidden_size)"),
             ("tied olmoe", "olmoe", {"tie_word_embeddings": True}, [], "never ties lm_head"),
             ("tied gpt_oss", "gpt_oss", {"tie_word_embeddings": True}, [], "never ties lm_head"),
             ("tied afmoe", "afmoe", {"num_key_value_heads": 2, "tie_word_embeddings": True}, [], "never ties lm_head"),
             ("ernie4_5_moe moe_intermediate_size 32 at T=2", "ernie4_5_moe",
              {"num_key_value_heads": 2, "moe_intermediate_size": 32}, [], "pads moe_intermediate_size"),
             ("cohere2_moe without first_k_dense_replace", "cohere2_moe", {"num_key_value_heads": 2}, [],
              "names its first dense layers by mlp_layer_types only"),
             ("hunyuan_v1_moe as transformers writes it", "hunyuan_v1_moe", {"num_key_value_heads": 2}, [],
              "which the published config.json holds and this one lacks"),
             ("granitemoe intermediate_size 96 at T=2", "granitemoe", {"num_key_value_heads": 2, "intermediate_size": 96},
              [], "pads intermediate_size to a multiple of 32 x ranks")]
    for what, fam, cfg, extra, want in cases:
        src = vllm_models.make(fam, os.path.join(work, "refused", what.replace(" ", "_")), tp=2, config=cfg)
        p = tpfs_test.tpfs("plan", src, "--tp", 2, "--view", "sglang", *extra)
        fails.check(p.returncode != 0 and want in p.stderr, "--view sglang, %s: refused with %r, got %d %r"
                    % (what, want, p.returncode, p.stderr[-400:]))
    # the SGLang views over vLLM's parts (minimax_m2 over vllm/mixtral, granitemoe over vllm/llama; their shared
    # tensors in vllm/ fragments) refuse by SGLang's reason, naming SGLang's code, not vLLM's
    engine_own = [("minimax_m2 without rotary_dim", "minimax_m2", {}, "rotary_dim", "SGLang's MiniMaxM2 reads"),
                  ("granitemoe head_dim 32", "granitemoe", {"num_key_value_heads": 2, "head_dim": 32}, None,
                   "SGLang's GraniteMoeAttention takes head_dim"),
                  ("granitemoe_swa head_dim 32", "granitemoe_swa", {"num_key_value_heads": 2, "head_dim": 32}, None,
                   "SGLang's GraniteMoeAttention takes head_dim")]
    for what, fam, cfg, pop, want in engine_own:
        src = vllm_models.make(fam, os.path.join(work, "refused", what.replace(" ", "_")), tp=2, config=cfg)
        if pop:
            with open(os.path.join(src, "config.json")) as f:
                c = json.load(f)
            c.pop(pop)
            with open(os.path.join(src, "config.json"), "w") as f:
                json.dump(c, f)
        p = tpfs_test.tpfs("plan", src, "--tp", 2, "--view", "sglang")
        fails.check(p.returncode != 0 and want in p.stderr and "vLLM" not in p.stderr,
                    "--view sglang, %s: refused with %r and no vLLM reason, got %d %r"
                    % (what, want, p.returncode, p.stderr[-400:]))
    # FP8 (views/sglang/fp8.json): each published form refused with the reason from SGLang's code; fp8_sources
    # made them (FP8_ENGINE's Engine start shows SGLang's own loader failing on the first of them)
    for what, src in fp8_sources(work).items():
        p = tpfs_test.tpfs("plan", src, "--tp", 2, "--view", "sglang")
        fails.check(p.returncode != 0 and FP8_REASON in p.stderr and "view 'fp8'" in p.stderr,
                    "--view sglang on %s: refused by views/sglang/fp8.json (%r), got %d %r"
                    % (what, FP8_REASON, p.returncode, p.stderr[-400:]))
    # another quantization SGLang's views do not list: refused by the choice of view, naming the method
    src = os.path.join(work, "refused", "ct")
    shutil.copytree(os.path.join(work, "src", "llama"), src)
    vllm_models.edit_config(src, lambda c: c.update(quantization_config={"quant_method": "compressed-tensors"}))
    p = tpfs_test.tpfs("plan", src, "--tp", 2, "--view", "sglang")
    fails.check(p.returncode != 0 and "quant_method 'compressed-tensors'" in p.stderr,
                "--view sglang on a compressed-tensors checkpoint: refused by quant_method, got %d %r"
                % (p.returncode, p.stderr[-400:]))


# FP8 checkpoints (quant_method fp8) under --view sglang: refused by views/sglang/fp8.json, for this reason (a part
# of its text). SGLang's sharded_state loader runs process_weights_after_loading on the empty model before it copies
# the files in (srt/model_loader/loader.py), so the files would have to hold FP8's processed layout, and on a CPU that
# layout is none: Fp8LinearMethod / Fp8MoEMethod assert AMX (srt/layers/quantization/fp8.py), and with AMX repack
# through sgl_kernel (amx_utils.py convert_weight_packed). FP8_ENGINE: SGLang's default loader on the DeepSeek-V3
# FP8 checkpoint must fail with FP8_ASSERT (one Engine start, a few seconds): were SGLang to load FP8 on a CPU
# without AMX, this check fails, and fp8.json's reason is to be read again (a form may then be served and proven).
FP8_REASON = ("Fp8LinearMethod and Fp8MoEMethod (srt/layers/quantization/fp8.py process_weights_after_loading) "
              "assert AMX")
FP8_ASSERT = "Fp8LinearMethod on CPU requires that CPU has AMX support"
FP8_ENGINE = "deepseek_v3_fp8"


def fp8_sources(work):
    """{what: checkpoint folder} of the FP8 forms refused: DeepSeek-V3 and Kimi K2 as published (128x128 block
    scales, weight_scale_inv, the router unquantized: vllm_models' deepseek_v3_fp8 with SGLang's DeepSeek config
    keys), Qwen3 FP8 (Qwen3 quantized as Qwen's FP8 checkpoints are: fp8_block), Qwen3-MoE FP8, and per-tensor
    FP8 (no weight_block_size, static activations: Llama's FP8 form). Made once under WORK/fp8."""
    import vllm_models
    out = {}
    for what, fam, cfg in (("deepseek_v3_fp8", "deepseek_v3_fp8", DEEPSEEK),
                           ("kimi_k2_fp8", "deepseek_v3_fp8", DEEPSEEK),
                           ("qwen3_fp8", "qwen3", {"num_key_value_heads": 2}),
                           ("qwen3_moe_fp8", "qwen3_moe_fp8", {}),
                           ("llama_fp8_per_tensor", "llama", {"num_key_value_heads": 2})):
        src = out[what] = os.path.join(work, "fp8", what)
        if os.path.exists(src):
            continue
        vllm_models.make(fam, src, tp=2, config=cfg)
        if what == "kimi_k2_fp8":
            vllm_models.edit_config(src, lambda c: c.update(vllm_models.RETYPE["kimi_k2"]))
        elif what == "qwen3_fp8":
            vllm_models.fp8_block(src)
        elif what == "llama_fp8_per_tensor":
            vllm_models.edit_config(src, lambda c: c.update(quantization_config={"quant_method": "fp8",
                                                                                 "activation_scheme": "static"}))
    return out


def swapped_ranks(mnt, out):
    """The served files with rank 0's and rank 1's swapped (same names, shapes and dtypes)."""
    os.makedirs(out)
    for f in os.listdir(mnt):
        if f.startswith("model-rank-"):
            r = int(f.split("-")[2])
            shutil.copyfile(os.path.join(mnt, f), os.path.join(out, f.replace("rank-%d-" % r, "rank-%d-" % (1 - r))))
        elif f.endswith(".json"):
            shutil.copyfile(os.path.join(mnt, f), os.path.join(out, f))


def loaded(keys, how, r):
    p = os.path.join(keys, "%s-rank%d.json" % (how, r))
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def main():
    import tpfs_test
    import vllm_models
    import vllm_view_ref
    from test_vllm import header, part_files, same_files

    # SGLang's Gemma 3 cut (REF_FAMILY): vLLM's llama cuts with the embedding and the tied head whole
    vllm_view_ref.CUTS["sglang_gemma3"] = [(r"(lm_head|model\.embed_tokens)\.weight", "whole")] + vllm_view_ref.CUTS["llama"]
    fails = tpfs_test.Failures()
    # about 45 mounts stay up through every Engine start; under a load average of 12-18 one daemon of them twice took
    # more than the default 30 s to exit after its lazy unmount (killed, failing the test), the cause not found
    tpfs_test.Mount.exit_wait = 180
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="tpfs-sglang-")
    tpfs_test.require_fuse()
    times = {}
    with contextlib.ExitStack() as stack:
        jobs, served, served_hdr = [], {}, {}
        for fam in RUN:
            view, cfg = FAMILIES[fam]
            src = vllm_models.make(fam, os.path.join(work, "src", fam), tp=2, config=cfg)
            ref = os.path.join(work, "ref", fam)
            vllm_view_ref.write(src, vllm_view_ref.load_view(os.path.join(VIEWS, view + ".json")), 2, ref,
                                family=REF_FAMILY.get(fam))
            how = "sglang"
            if fam in DERIVED:  # the view less its refusal of the derived tensors, as a view file
                with open(os.path.join(VIEWS, view + ".json")) as f:
                    v = json.load(f)
                assert "gemma_weight" in v["refuse"][-1]["reason"], v["refuse"][-1]
                v["refuse"].pop()
                how = os.path.join(work, "%s-served.json" % fam)
                with open(how, "w") as f:
                    json.dump(v, f)
            mnt = served[fam] = stack.enter_context(tpfs_test.Mount(src, 2, "--view", how)).path
            same_files(fails, "%s T=2" % fam, mnt, ref, 2)
            for r in range(2):  # the served headers, read from the mount
                served_hdr[fam, r] = {k: list(v) for pth in part_files(mnt, r) for k, v in header(pth).items()}
            for how, model in (("auto", src), ("sharded_state", mnt)):
                jobs.append({"name": "%s/%s" % (fam, how), "family": fam, "model": model, "load_format": how,
                             "tp": 2, "keys": os.path.join(work, "keys", fam, how),
                             "prompts": [] if fam in LOAD_ONLY else PROMPTS,
                             "engine_args": dict(ENGINE_ARGS.get(fam, {}),
                                                 **({"trust_remote_code": True} if fam in REMOTE_CODE else {}))})
        # wrong files: the vLLM view's (extra keys), the SGLang view's with the ranks swapped (other weights)
        wrong_vllm = stack.enter_context(tpfs_test.Mount(os.path.join(work, "src", "llama"), 2, "--view", "vllm")).path
        swapped = os.path.join(work, "swapped")
        swapped_ranks(served["llama"], swapped)
        for name, model, fail in (("llama/vllm-view", wrong_vllm, True), ("llama/ranks-swapped", swapped, False)):
            jobs.append({"name": name, "family": "llama", "model": model, "load_format": "sharded_state", "tp": 2,
                         "keys": os.path.join(work, "keys", name.replace("/", "-")), "prompts": PROMPTS[:1],
                         "fails": fail})
        if not ONLY or FP8_ENGINE in ONLY:  # SGLang's default loader on an FP8 checkpoint: fails (FP8_ASSERT)
            jobs.append({"name": FP8_ENGINE + "/auto", "family": FP8_ENGINE, "model": fp8_sources(work)[FP8_ENGINE],
                         "load_format": "auto", "tp": 2, "keys": os.path.join(work, "keys", FP8_ENGINE),
                         "prompts": [], "fails": True})
        refusals(fails, work)
        times["mount + reference + refusals"] = time.time() - t0
        if ENGINE == "none":
            jobs = []
        t1 = time.time()
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "sglang_site"), TORCHDYNAMO_DISABLE="1")
        res = {}
        # the jobs that must load in one process, each that must fail in one of its own: where an Engine fails,
        # SGLang kills the process that started it
        batches = [b for b in [[j for j in jobs if not j.get("fails")]] + [[j] for j in jobs if j.get("fails")] if b]
        for k, batch in enumerate(batches):
            jp, rp, log = (os.path.join(work, "batch%d.%s" % (k, x)) for x in ("json", "result.json", "log"))
            with open(jp, "w") as f:
                json.dump(batch, f)
            with open(log, "w") as lf:
                subprocess.run([sys.executable, os.path.join(HERE, "sglang_check.py"), jp, rp], stdout=lf,
                               stderr=subprocess.STDOUT, env=env, timeout=900)
            if os.path.exists(rp):
                with open(rp) as f:
                    res.update(json.load(f))
            for job in batch:
                if job["name"] not in res:  # the errors its log shows (a worker's traceback, then the kill)
                    with open(log, errors="replace") as f:
                        text = f.read()
                    errs = [ln.strip() for ln in text.splitlines() if "Error" in ln]
                    res[job["name"]] = {"error": "sglang_check.py ended without a result (%s): %s" % (log, errs[-20:]),
                                        "log": text}
        times["Engine starts (%d)" % len(jobs)] = time.time() - t1

    if ENGINE == "none":
        print("TPFS_SGLANG_ENGINE=none: SGLang not started (the reference bytes and the refusals only)")
        print("time: %.0f s" % (time.time() - t0))
        shutil.rmtree(work, ignore_errors=True)
        fails.done("sglang")
        return
    print("%-24s %-8s %-9s %-9s %s" % ("family", "rank", "keys", "weights", "tensors"))
    for fam in RUN:
        a, b = res.get(fam + "/auto", {}), res.get(fam + "/sharded_state", {})
        for n_, x in ((fam + " (default loader)", a), (fam + " (sharded_state)", b)):
            fails.check(x and not x.get("error"), "%s: SGLang failed: %s" % (n_, (x.get("error") or "no result")[-800:]))
        for r in range(2):
            la = loaded(os.path.join(work, "keys", fam, "auto"), "auto", r)
            lb = loaded(os.path.join(work, "keys", fam, "sharded_state"), "sharded_state", r)
            fails.check(la and lb, "%s rank %d: a loader left no record (hook)" % (fam, r))
            if not (la and lb):
                continue
            have = served_hdr[fam, r]
            want = {k: [v[0], TORCH_TO_ST.get(v[1], v[1])] for k, v in lb["expected"].items()}
            if fam in CASTS:  # served F32 where the model holds BF16: the shape agrees, only the dtype differs
                cast = sorted(k for k in have if k in want and re.search(CASTS[fam], k) and have[k][0] == want[k][0]
                              and have[k][1] == "F32" and want[k][1] == "BF16")
                fails.check(cast, "%s rank %d: no key served F32 where SGLang holds BF16 (%s): the case proves "
                            "nothing" % (fam, r, CASTS[fam]))
                want = dict(want, **{k: have[k] for k in cast})
            keys_ok = have == want
            fails.check(keys_ok, "%s rank %d: served keys/shapes/dtypes differ from what sharded_state fills: %s"
                        % (fam, r, sorted((k, have.get(k), want.get(k)) for k in set(have) | set(want)
                                          if have.get(k) != want.get(k))[:4]))
            # what sharded_state asks for is the default loader's model's state dict too (the hook makes the same
            # _filter_subtensors call on it): the files a user dumps from a running SGLang would hold these keys
            fails.check(la["expected"] == lb["expected"], "%s rank %d: the two loaders' models hold different "
                        "state dicts: %s" % (fam, r, sorted(set(la["expected"]) ^ set(lb["expected"]))[:4]))
            differ = sorted(k for k in set(la["final"]) | set(lb["final"]) if la["final"].get(k) != lb["final"].get(k))
            if fam in DERIVED:  # exactly the derived tensors differ: why the view refuses the family
                derived = [k for k in differ if re.search(DERIVED[fam], k)]
                fails.check(derived and len(derived) == len(differ) and la["final"],
                            "%s rank %d: the loaders should leave exactly the derived tensors %s different "
                            "(why the view refuses it): derived %s, others %s"
                            % (fam, r, DERIVED[fam], derived[:3], [k for k in differ if k not in derived][:5]))
                differ = [k for k in differ if k not in derived]
            fails.check(not differ and la["final"], "%s rank %d: the loaders leave different tensors: %s"
                        % (fam, r, differ[:5]))
            print("%-24s %-8s %-9s %-9s %d" % (fam, r, "equal" if keys_ok else "DIFFER", "equal" if not differ
                                               else "DIFFER", len(la["final"])))
        if fam in LOAD_ONLY:
            print("%-24s tokens not run (loaders only: LOAD_ONLY)" % fam)
            continue
        same = bool(a.get("tokens")) and a.get("tokens") == b.get("tokens") and a.get("logprobs") == b.get("logprobs")
        fails.check(same, "%s: tokens or logprobs missing or different: %s vs %s" % (fam, a.get("tokens"), b.get("tokens")))
        print("%-24s tokens %s" % (fam, "equal" if same else "DIFFER"))
    # the wrong files must fail, each in its own way
    x = res.get("llama/vllm-view", {})
    key_error = re.search(r"KeyError: '[\w.]*self_attn\.attn\._(k|v|q|prob)_scale'", x.get("log") or "")
    fails.check(key_error, "llama through the vLLM view: SGLang should fail with a KeyError on vLLM's scale "
                "entries, got %s" % str(x.get("error") or x)[-400:])
    print("%-24s %s" % ("llama/vllm-view", "caught (KeyError)" if key_error else "MISSED"))
    auto = [loaded(os.path.join(work, "keys", "llama", "auto"), "auto", r) for r in range(2)]
    sw = [loaded(os.path.join(work, "keys", "llama-ranks-swapped"), "sharded_state", r) for r in range(2)]
    caught = all(a_ and s_ and a_["final"] != s_["final"] for a_, s_ in zip(auto, sw))
    y, a = res.get("llama/ranks-swapped", {}), res.get("llama/auto", {})
    fails.check(caught, "llama with the ranks swapped: the loaded weights should differ from the default loader's")
    fails.check(y.get("tokens") and a.get("tokens") and y["tokens"][0] != a["tokens"][0],
                "llama with the ranks swapped: the tokens should differ: %s" % (y.get("tokens") or y.get("error")))
    print("%-24s %s" % ("llama/ranks-swapped", "caught (weights, tokens)" if caught else "MISSED"))
    if FP8_ENGINE + "/auto" in res:  # why fp8.json refuses FP8, in SGLang's own words
        x = res[FP8_ENGINE + "/auto"]
        amx = FP8_ASSERT in (x.get("log") or "") + (x.get("error") or "")
        fails.check(amx, "%s: SGLang's default loader should fail with %r on this CPU (without AMX; views/sglang/"
                    "fp8.json's reason), got %s" % (FP8_ENGINE, FP8_ASSERT, str(x.get("error") or x)[-400:]))
        print("%-24s %s" % (FP8_ENGINE + "/auto", "fails (AMX assert: fp8.json's refusal)" if amx else "MISSED"))
    tpfs_test.finish(fails, "sglang", work, times, t0)


TORCH_TO_ST = {"bfloat16": "BF16", "float32": "F32", "float16": "F16", "int8": "I8", "uint8": "U8",
               "int32": "I32", "int64": "I64", "float8_e4m3fn": "F8_E4M3"}

if __name__ == "__main__":
    import tpfs_test
    tpfs_test.reexec(tpfs_test.sglang_python, "TPFS_SGLANG_INNER", __file__)
    sys.path.insert(0, HERE)
    main()
