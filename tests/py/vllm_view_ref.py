"""An independent reference for `tpfs mount --view vllm`: rank r's model-rank-{r}-part-{p}.safetensors.

From a source checkpoint (its config.json and *.safetensors) and a view file (views/vllm/*.json) it
builds, with torch and safetensors only, what vLLM's sharded_state loader must read for rank r of T:
1. every source tensor is cut for rank r the way vLLM 0.32's own weight loaders cut it (CUTS below,
   written from vllm/model_executor/layers/{linear,vocab_parallel_embedding}.py and
   fused_moe/layer.py, not from tpfs's plans or C code; views/vllm/README.md has the references):
   column-parallel weights (and their biases) a contiguous block of rows, row-parallel weights a
   block of columns, q heads split evenly, KV heads in replicated groups when fewer than T
   (QKVParallelLinear: shard tp_rank // (T / kv_heads)), the vocabulary padded with zero rows to a
   multiple of the view's pad_vocab and then divided (VocabParallelEmbedding), the rest whole;
2. the view's entries (drop first (a template, maybe ending in *), then cat, stack, from, const; if (tensor() and the
   entry's variables per match), dtype, reshape, shape (a const's), transpose, other_ranks, keep_rest, rename; include
   with a fragment's params; view-level drop and {"drop": {"entry": NAME}} in extends) are applied to those
   cuts, with the semantics written in views/vllm/README.md;
3. the served tensors are written, grouped into parts by the source file of each tensor's first
   piece (constants go with their `per` tensor), the parts numbered 0, 1, ... in source-file name
   order over the files that give a tensor.

Usage: python vllm_view_ref.py SRC VIEW.json TP OUT [RANKS] writes OUT/model-rank-*.safetensors and
copies SRC's other files (config.json, tokenizer, ...) beside them, as the mount would show them.
"""
import glob
import json
import os
import re
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file


class ViewError(Exception):
    pass


# ---- step 1: vLLM's per-rank cuts ----

def _chunk(x, axis, T, r):
    n = x.shape[axis]
    if n % T:
        raise ViewError("%s: axis %d of %d does not divide by %d" % (tuple(x.shape), axis, n, T))
    return x.narrow(axis, r * (n // T), n // T)


def cut_column(x, T, r):
    """ColumnParallelLinear.weight_loader / MergedColumnParallelLinear: rows [r*n/T, (r+1)*n/T)."""
    return _chunk(x, 0, T, r)


def cut_row(x, T, r):
    """RowParallelLinear.weight_loader: input_dim 1, columns [r*n/T, (r+1)*n/T); 1-D (a bias) whole."""
    return x if x.ndim == 1 else _chunk(x, 1, T, r)


def cut_kv(x, T, r, kv_heads):
    """QKVParallelLinear.weight_loader for "k"/"v": with kv_heads <= T (T % kv_heads == 0), one head,
    shard tp_rank // (T // kv_heads); otherwise kv_heads/T heads at tp_rank."""
    if T >= kv_heads:
        if T % kv_heads:
            raise ViewError("%d KV heads over %d ranks" % (kv_heads, T))
        size = x.shape[0] // kv_heads
        return x.narrow(0, (r // (T // kv_heads)) * size, size)
    return _chunk(x, 0, T, r)


def cut_vocab(x, T, r, pad):
    """VocabParallelEmbedding / ParallelLMHead: Vp = ceil(V / pad) * pad, Vp / T rows per rank, rows
    past V zero (weight_loader: param[n:].fill_(0))."""
    V = x.shape[0]
    Vp = -(-V // pad) * pad
    if Vp % T:
        raise ViewError("padded vocab %d over %d ranks" % (Vp, T))
    P = Vp // T
    lo, hi = min(r * P, V), min((r + 1) * P, V)
    out = torch.zeros((P,) + tuple(x.shape[1:]), dtype=x.dtype)
    out[:hi - lo] = x[lo:hi]
    return out


L = r"model\.layers\.\d+\."
# (regex on the source name, cut): the first match wins; no match is an error (a tensor this
# reference does not know). "whole" = replicated. Built from the pieces the families share.
EMBED = [(r"(lm_head|model\.embed_tokens)\.weight", "vocab")]  # VocabParallelEmbedding / ParallelLMHead
ATTN = [  # QKVParallelLinear (q heads split, KV heads in replicated groups), RowParallelLinear o_proj
    (L + r"self_attn\.q_proj\.(weight|bias)", "column"),  # qwen3_next: q and its output gate, whole heads
    (L + r"self_attn\.[kv]_proj\.(weight|bias)", "kv"),
    (L + r"self_attn\.o_proj\.weight", "row"),
    (L + r"self_attn\.o_proj\.bias", "whole"),
    (L + r"self_attn\.[qk]_norm\.weight", "whole"),
]
DENSE = [  # MergedColumnParallelLinear gate_up, RowParallelLinear down (dense layers of MoE models too)
    (L + r"mlp\.(gate|up)_proj\.weight", "column"),
    (L + r"mlp\.down_proj\.weight", "row"),
]
NORMS = [
    (L + r"(input|post_attention|pre_feedforward|post_feedforward)_layernorm\.weight", "whole"),  # gemma3: 4
    (r"model\.norm\.weight", "whole"),
    (L + r"self_attn\.rotary_emb\.inv_freq", "whole"),
]


def experts(names):
    """FusedMoE.weight_loader per expert (w1/w3 rows, w2 columns) and the shared experts, whose
    modules match `names` (a regex alternative), as MergedColumnParallelLinear / RowParallelLinear."""
    return [(L + r"mlp\.(%s)\.(gate|up)_proj\.weight" % names, "column"),
            (L + r"mlp\.(%s)\.down_proj\.weight" % names, "row")]


# GLM-5.3 (Glm5NextForConditionalGeneration: models/glm5next/common/{model,kda,attention,multimodal}.py),
# its text tower under model.language_model., its vision tower under model.visual.
LG = r"model\.language_model\.layers\.\d+\."
GLM5_NEXT = [
    (r"(lm_head|model\.language_model\.embed_tokens)\.weight", "vocab"),
    (r"model\.language_model\.norm\.weight", "whole"),
    (LG + r"(input|post_attention)_layernorm\.weight", "whole"),
    (LG + r"hc_(attn|ffn)_(fn|base|scale)", "whole"),  # plain nn.Parameters: default_weight_loader
    # KDA (kda.py): _Glm5NextMergedColumnParallelLinear in_proj_qkvbfg_a, shards q, k, v, b cut as
    # MergedColumnParallelLinear cuts them, f_a and g_a (replicated_shard_ids 4, 5) loaded at tp_rank 0
    # into a shard of their whole size: whole
    (LG + r"self_attn\.[qkvb]_proj\.weight", "column"),
    (LG + r"self_attn\.[fg]_a_proj\.weight", "whole"),
    (LG + r"self_attn\.[fg]_b_proj\.weight", "column"),  # ColumnParallelLinear
    (LG + r"self_attn\.[qkv]_conv1d\.weight", "column"),  # ColumnParallelLinear, output_dim 0
    (LG + r"self_attn\.dt_bias", "column"),  # sharded_weight_loader(0)
    (LG + r"self_attn\.A_log", "kda_a_log"),  # _a_log_weight_loader: view [1, 1, -1, 1], then axis 2
    (LG + r"self_attn\.o_norm\.weight", "whole"),
    (LG + r"self_attn\.o_proj\.weight", "row"),  # RowParallelLinear, in KDA and MLA layers alike
    # MLA (attention.py Glm5NextMLAAttention): the a-projections replicated (fused_qkv_a_proj), q_b_proj and
    # kv_b_proj ColumnParallelLinear; the indexer replicated (ReplicatedLinear wq_b, wk_weights_proj
    # disable_tp, LayerNorm k_norm, the kpool parameters)
    (LG + r"self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.weight", "whole"),
    (LG + r"self_attn\.(q_a|kv_a)_layernorm\.weight", "whole"),
    (LG + r"self_attn\.(q_b_proj|kv_b_proj)\.weight", "column"),
    (LG + r"self_attn\.indexer\..+", "whole"),
    # MLP (model.py Glm5NextMLP, Glm5NextMoE: GateLinear router, FusedMoE experts, shared experts an MLP)
    (LG + r"mlp\.((experts\.\d+|shared_experts)\.)?(gate|up)_proj\.weight", "column"),
    (LG + r"mlp\.((experts\.\d+|shared_experts)\.)?down_proj\.weight", "row"),
    (LG + r"mlp\.gate\.(weight|e_score_correction_bias)", "whole"),
    # the vision tower (multimodal.py) under --mm-encoder-tp-mode data: every linear is built with
    # disable_tp (is_vit_use_data_parallel), so every rank loads it whole
    (r"model\.visual\..+", "whole"),
]

MLA = [  # the a-projections replicated (fused_qkv_a_proj: ReplicatedLinear), b-projections whole heads
    (L + r"self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.weight", "whole"),
    (L + r"self_attn\.(q_a|kv_a)_layernorm\.weight", "whole"),
    (L + r"self_attn\.(q_b_proj|kv_b_proj)\.weight", "column"),  # ColumnParallelLinear
    (L + r"self_attn\.o_proj\.weight", "row"),
]
DS_MOE = [  # DeepseekV2MoE: the router and its bias replicated, routed and shared experts, dense first layers
    (L + r"mlp\.gate\.(weight|e_score_correction_bias)", "whole"),
] + experts(r"experts\.\d+|shared_experts") + DENSE + NORMS

CUTS = {
    "llama": EMBED + ATTN + DENSE + NORMS,
    # the families holding llama's names with more (models/exaone4.py, glm4.py, apertus.py, granite.py)
    "llama_more": EMBED + ATTN + DENSE + NORMS + [
        (L + r"mlp\.gate_up_proj\.weight", "halves"),  # glm4: fused in the checkpoint, loaded_shard_id None
        (L + r"(post_self_attn|post_mlp|attention|feedforward)_layernorm\.weight", "whole"),  # glm4, apertus
        (L + r"mlp\.act_fn\.(alpha_p|alpha_n|beta|eps)", "whole"),  # apertus: XIELU's parameters, replicated
        (L + r"self_attn\.sinks", "column"),  # granite_swa: one per head, sharded_weight_loader(0)
        (L + r"post_norm[12]\.weight", "whole"),  # hyperclovax: RMSNorm over the hidden size
    ],
    "mixtral": EMBED + ATTN + [  # models/mixtral.py: FusedMoE with ckpt_names (w1, w2, w3)
        (L + r"block_sparse_moe\.experts\.\d+\.w[13]\.weight", "column"),
        (L + r"block_sparse_moe\.experts\.\d+\.w2\.weight", "row"),
        (L + r"block_sparse_moe\.gate\.weight", "whole"),
    ] + NORMS,
    "moe": EMBED + ATTN + experts(r"experts\.\d+|shared_expert") + [  # qwen3_moe, qwen2_moe
        (L + r"mlp\.(gate|shared_expert_gate)\.weight", "whole"),  # ReplicatedLinear router, [1, H] gate
    ] + DENSE + NORMS,
    "glm4_moe": EMBED + ATTN + experts(r"experts\.\d+|shared_experts") + [  # models/glm4_moe.py
        (L + r"mlp\.gate\.(weight|e_score_correction_bias)", "whole"),  # GateLinear: replicated
    ] + DENSE + NORMS,
    # models/deepseek_v2.py DeepseekV2MLAAttention (deepseek_v3) and models/deepseek_v32/attention.py (the
    # CUDA class, deepseek_v32): the same MLA cuts; DSA adds the indexer, replicated
    "deepseek_v3": EMBED + MLA + DS_MOE,
    # models/deepseek_v2.py without q-LoRA (DeepSeek-V2-Lite): q_proj a ColumnParallelLinear over the heads
    "deepseek_v2": EMBED + MLA + [(L + r"self_attn\.q_proj\.weight", "column")] + DS_MOE,
    # models/granitemoe.py: llama's attention; the fused experts renamed by GraniteMoeModel's hf_to_vllm_mapper
    # (input_linear -> experts.gate_up_proj, output_linear -> experts.down_proj, router.layer -> gate) and loaded
    # by FusedMoE per expert: [E, 2I, D] chunked in two on dim -2, each half's rows cut (w13: [gate_r | up_r]),
    # [E, D, I] input columns cut (w2); GateLinear router replicated
    "granitemoe": EMBED + ATTN + [
        (L + r"block_sparse_moe\.(input_linear\.weight|experts\.gate_up_proj)", "experts_halves"),
        (L + r"block_sparse_moe\.(output_linear\.weight|experts\.down_proj)", "experts_row"),
        (L + r"block_sparse_moe\.router\.(layer\.)?weight", "whole"),
        # models/granitemoeshared.py (granitemoeshared, granitemoe_swa): the shared MLP's fused input_linear a
        # MergedColumnParallelLinear loaded whole (loaded_shard_id None: each half's rows cut), output_linear
        # RowParallelLinear; granitemoe_swa's sinks one per head (sharded_weight_loader(0))
        (L + r"shared_mlp\.input_linear\.weight", "halves"),
        (L + r"shared_mlp\.output_linear\.weight", "row"),
        (L + r"self_attn\.sinks", "column"),
    ] + NORMS,
    "deepseek_v32": EMBED + MLA + [
        (L + r"self_attn\.indexer\.wq_b\.weight", "whole"),  # ReplicatedLinear
        (L + r"self_attn\.indexer\.(wk|weights_proj)\.weight", "whole"),  # wk_weights_proj: disable_tp=True
        (L + r"self_attn\.indexer\.k_norm\.(weight|bias)", "whole"),  # LayerNorm, float32
    ] + DS_MOE,
    # HY V4 (vllm/models/hy_v4/nvidia/model.py load_weights, attention.py, hc.py, moe.py), the published names:
    # MLA as above, the indexer replicated, the output gate a ColumnParallelLinear, the sinks narrowed to the
    # rank's heads (load_weights: loaded_weight[head_rank_start:head_rank_end]), hyper-connections replicated
    # (ReplicatedLinear hc_fn / hc_head_fn, plain parameters); fused experts: gate_up_proj chunked in two on
    # dim -2 and each expert's half narrowed by FusedMoE.weight_loader (w13: [gate_r | up_r]), down_proj's
    # input dim narrowed (w2); per-expert and shared experts, the router and its bias as DeepSeek-V3's
    "hy_v4": EMBED + MLA + [
        (L + r"self_attn\.indexer\.(wq_b|wk|weights_proj)\.weight", "whole"),
        (L + r"self_attn\.indexer\.k_norm\.(weight|bias)", "whole"),
        (L + r"self_attn\.linear_gate\.weight", "column"),
        (L + r"self_attn\.learnable_sink_param", "column"),
        (L + r"hc_(attn|mlp)_layer\.hc_pre\.hc_(fn|base|scale)", "whole"),
        (r"model\.hc_head\.hc_head_(fn|base|scale)", "whole"),
        (L + r"mlp\.experts\.gate_up_proj", "experts_halves"),
        (L + r"mlp\.experts\.down_proj", "experts_row"),
    ] + DS_MOE,
    # GPT-J (models/gpt_j.py): QKVParallelLinear over n_head heads, each its own KV head (q, k, v each cut by rows),
    # out_proj and fc_out RowParallelLinear (fc_out's bias whole), fc_in ColumnParallelLinear with its bias,
    # ParallelLMHead with a bias (padded and cut as the vocabulary), LayerNorms whole
    "gptj": [
        (r"(lm_head|transformer\.wte)\.weight", "vocab"),
        (r"lm_head\.bias", "vocab"),
        (r"transformer\.h\.\d+\.attn\.[qkv]_proj\.weight", "column"),
        (r"transformer\.h\.\d+\.attn\.out_proj\.weight", "row"),
        (r"transformer\.h\.\d+\.mlp\.fc_in\.(weight|bias)", "column"),
        (r"transformer\.h\.\d+\.mlp\.fc_out\.weight", "row"),
        (r"transformer\.h\.\d+\.mlp\.fc_out\.bias", "whole"),
        (r"transformer\.(h\.\d+\.ln_1|ln_f)\.(weight|bias)", "whole"),
    ],
    "qwen3_next": EMBED + ATTN + [  # models/qwen3_next.py, layers/mamba/gdn/qwen_gdn_linear_attn.py
        (L + r"linear_attn\.in_proj_(qkvz|ba)\.weight", "column"),  # one output shard: contiguous rows
        (L + r"linear_attn\.conv1d\.weight", "gdn_conv"),  # mamba_v2_sharded_weight_loader: [q | k | v]
        (L + r"linear_attn\.(dt_bias|A_log)", "column"),  # sharded_weight_loader(0)
        (L + r"linear_attn\.norm\.weight", "whole"),
        (L + r"linear_attn\.out_proj\.weight", "row"),
        (L + r"mlp\.(gate|shared_expert_gate)\.weight", "whole"),
    ] + experts(r"experts\.\d+|shared_expert") + NORMS,
    # Qwen3.5 (models/qwen3_5.py, qwen_gdn_linear_attn.py with gqa_interleaved_layout=False): in_proj_qkv loaded as
    # shards 0-2 of in_proj_qkvz ([key, key, value, value]: q, k, v each cut), in_proj_z shard 3, in_proj_b / in_proj_a
    # shards 0 / 1 of in_proj_ba (each cut); the dense MLP (qwen3_5_text) as llama's
    "qwen3_5": EMBED + ATTN + [
        (L + r"linear_attn\.in_proj_qkv\.weight", "gdn_conv"),
        (L + r"linear_attn\.in_proj_[zba]\.weight", "column"),
        (L + r"linear_attn\.conv1d\.weight", "gdn_conv"),
        (L + r"linear_attn\.(dt_bias|A_log)", "column"),
        (L + r"linear_attn\.norm\.weight", "whole"),
        (L + r"linear_attn\.out_proj\.weight", "row"),
        (L + r"mlp\.(gate|shared_expert_gate)\.weight", "whole"),
    ] + experts(r"experts\.\d+|shared_expert") + DENSE + NORMS,
    "glm5_next": GLM5_NEXT,
    "lfm2": EMBED + [  # models/lfm2.py (its mapper: .conv. -> .short_conv.), layers/mamba/short_conv.py ShortConv
        (L + r"conv\.in_proj\.weight", "thirds"),  # MergedColumnParallelLinear([dim] * 3), loaded whole: B | C | x
        (L + r"conv\.conv\.weight", "column"),  # ColumnParallelLinear(L_cache -> dim), weight [dim, 1, L]
        (L + r"conv\.out_proj\.weight", "row"),  # RowParallelLinear
        (L + r"self_attn\.q_proj\.weight", "column"),
        (L + r"self_attn\.[kv]_proj\.weight", "kv"),
        (L + r"self_attn\.out_proj\.weight", "row"),
        (L + r"self_attn\.[qk]_layernorm\.weight", "whole"),  # RMSNorm(head_dim)
        (L + r"feed_forward\.w[13]\.weight", "column"),  # w13: MergedColumnParallelLinear
        (L + r"feed_forward\.w2\.weight", "row"),
        (L + r"(operator|ffn)_norm\.weight", "whole"),
        (r"model\.embedding_norm\.weight", "whole"),
        # LFM2-MoE (models/lfm2_moe.py): FusedMoE per expert (w1 / w3 rows, w2 columns), GateLinear and the
        # expert_bias it loads as e_score_correction_bias replicated
        (L + r"feed_forward\.experts\.\d+\.w[13]\.weight", "column"),
        (L + r"feed_forward\.experts\.\d+\.w2\.weight", "row"),
        (L + r"feed_forward\.(gate\.weight|expert_bias)", "whole"),
    ],
    # OLMo hybrid (models/olmo_hybrid.py, layers/mamba/gdn/olmo_gdn_linear_attn.py): attention as llama's but
    # q_norm / k_norm whole (normalized over the gathered heads); GDN: q, k, v, g shards of in_proj_qkvg
    # (MergedColumnParallelLinear rows), the convs rows of conv1d (_make_fused_conv1d_weight_loader),
    # a_proj / b_proj ColumnParallelLinear, dt_bias / A_log sharded_weight_loader(0), o_norm whole, o_proj row
    "olmo_hybrid": EMBED + [
        (L + r"self_attn\.q_proj\.weight", "column"),
        (L + r"self_attn\.[kv]_proj\.weight", "kv"),
        (L + r"self_attn\.o_proj\.weight", "row"),
        (L + r"self_attn\.[qk]_norm\.weight", "whole"),
        (L + r"linear_attn\.[qkvgab]_proj\.weight", "column"),
        (L + r"linear_attn\.[qkv]_conv1d\.weight", "column"),
        (L + r"linear_attn\.(dt_bias|A_log)", "column"),
        (L + r"linear_attn\.o_norm\.weight", "whole"),
        (L + r"linear_attn\.o_proj\.weight", "row"),
        (L + r"(attention|feedforward)_layer_norm\.weight", "whole"),
    ] + DENSE + NORMS,
    # Kimi Linear (models/kimi_k3/nvidia/model.py KimiLinearModel.load_weights, its KimiMoE and KimiMLP;
    # layers/mamba/gdn/kimi_gdn_linear_attn.py for the KDA layers; models/kimi_k3/nvidia/mla.py for MLA)
    "kimi_linear": EMBED + [
        # KDA: q, k, v, b are shards 0-3 of _KimiGDNMergedColumnParallelLinear in_proj_qkvgfab
        # (MergedColumnParallelLinear rows); the MLA layers' q_proj is a ColumnParallelLinear
        (L + r"self_attn\.[qkvb]_proj\.weight", "column"),
        # shard 4 (f_a) is loaded as tp_rank 0 of a size x T shard: the whole weight on every rank
        (L + r"self_attn\.f_a_proj\.weight", "whole"),
        (L + r"self_attn\.[fg]_b_proj\.weight", "column"),  # ColumnParallelLinear
        (L + r"self_attn\.g_a_proj\.weight", "whole"),  # ReplicatedLinear
        (L + r"self_attn\.[qkv]_conv1d\.weight", "column"),  # _make_fused_conv1d_weight_loader: rows r*P/T
        (L + r"self_attn\.dt_bias", "column"),  # sharded_weight_loader(0)
        (L + r"self_attn\.A_log", "a_log"),  # a_log_weight_loader: [1, 1, H, 1] viewed as [H], then narrowed
        (L + r"self_attn\.o_norm\.weight", "whole"),  # FusedRMSNormGated: default loader
        # MLA without q_lora_rank: kv_a_proj_with_mqa ReplicatedLinear, kv_b_proj / g_proj ColumnParallelLinear
        (L + r"self_attn\.kv_a_proj_with_mqa\.weight", "whole"),
        (L + r"self_attn\.kv_a_layernorm\.weight", "whole"),
        (L + r"self_attn\.(kv_b_proj|g_proj)\.weight", "column"),
        (L + r"self_attn\.o_proj\.weight", "row"),  # both layer kinds: RowParallelLinear
        # KimiMoE: FusedMoE per expert (w1 / w3 rows, w2 columns), KimiMLP shared experts, GateLinear and
        # its e_score_correction_bias replicated
        (L + r"block_sparse_moe\.experts\.\d+\.w[13]\.weight", "column"),
        (L + r"block_sparse_moe\.experts\.\d+\.w2\.weight", "row"),
        (L + r"block_sparse_moe\.gate\.(weight|e_score_correction_bias)", "whole"),
        (L + r"block_sparse_moe\.(shared_experts\.)?(gate|up)_proj\.weight", "column"),  # also a dense layer
        (L + r"block_sparse_moe\.(shared_experts\.)?down_proj\.weight", "row"),  # saved under block_sparse_moe
    ] + DENSE + NORMS,
    # vLLM's Transformers backend (models/transformers: base.py, utils.py replace_linear_class): each nn.Linear made
    # vLLM's ColumnParallelLinear ("colwise"), RowParallelLinear ("rowwise") or ReplicatedLinear by the model's
    # base_model_tp_plan; q/k/v as QKVParallelLinear (fuser.py), norms, biases of row-parallel linears whole
    "transformers": EMBED + ATTN + DENSE + NORMS + [
        (L + r"mlp\.c_fc\.(weight|bias)", "column"),  # starcoder2: colwise
        (L + r"mlp\.c_proj\.weight", "row"),  # rowwise
        (L + r"mlp\.c_proj\.bias", "whole"),
        (L + r"(input|post_attention)_layernorm\.bias", "whole"),  # LayerNorms (starcoder2, jais2)
        (r"model\.norm\.bias", "whole"),
        (L + r"self_attn\.(query|key)_layernorm\.weight", "whole"),  # hunyuan_v1_dense
        (L + r"mlp\.(gate|up)_proj\.bias", "column"),  # jais2's MLP biases
        (L + r"mlp\.down_proj\.bias", "whole"),
        # glm: the checkpoint's fused gate_up_proj is one ColumnParallelLinear ("colwise_gather_output" in GlmConfig's
        # base_model_tp_plan): a contiguous block of rows, not [gate_r | up_r]
        (L + r"mlp\.gate_up_proj\.weight", "column"),
    ],
    # models/gpt_oss.py (GptOssModel.load_weights, _load_weights_other for BF16 experts, _load_weights_mxfp4): q / k /
    # v heads cut evenly (OAIAttention: num_key_value_heads // T, no replication), sinks narrowed by heads, o_proj
    # row-parallel (its bias whole), the router whole (GateLinear); BF16 experts: gate_up_proj [E, H, 2I] columns
    # [2rI/T, 2(r+1)I/T) (weight[:, :, 2 * tp_rank_start : 2 * tp_rank_end]), down_proj [E, I, H] rows, the
    # gate_up bias the same columns, down_proj_bias whole on rank 0 and zeros elsewhere (weight.zero_() where
    # tp_rank != 0); MXFP4 experts: blocks [E, 2I, H/32, 16] rows [2rI/T, ...) and scales alike, down's blocks and
    # scales by block columns (axis 2: tp_rank_start // 32 ... of the [E, H, I/32(, 16)] tensors)
    "gpt_oss": [
        (r"(lm_head|model\.embed_tokens)\.weight", "vocab"),
        (r"model\.norm\.weight", "whole"),
        (L + r"(input|post_attention)_layernorm\.weight", "whole"),
        (L + r"self_attn\.q_proj\.(weight|bias)", "column"),
        (L + r"self_attn\.[kv]_proj\.(weight|bias)", "column"),
        (L + r"self_attn\.o_proj\.(weight|bias)", "row"),
        (L + r"self_attn\.sinks", "column"),
        (L + r"mlp\.router\.(weight|bias)", "whole"),
        (L + r"mlp\.experts\.gate_up_proj", "axis2"),
        (L + r"mlp\.experts\.(gate_up_proj_bias|down_proj|gate_up_proj_blocks|gate_up_proj_scales)", "axis1"),
        (L + r"mlp\.experts\.down_proj_(blocks|scales)", "axis2"),
        (L + r"mlp\.experts\.down_proj_bias", "rank0"),
    ],
    # Gemma 4 (models/gemma4.py): llama's cuts (q heads of either width, KV heads replicated), the per-layer
    # embeddings a VocabParallelEmbedding (padded, cut by rows), their projection a ColumnParallelLinear, the
    # per-layer gate and projection ReplicatedLinear, the norms and layer_scalar whole
    "gemma4": EMBED + ATTN + DENSE + NORMS + [
        (r"model\.embed_tokens_per_layer\.weight", "vocab"),
        (r"model\.per_layer_model_projection\.weight", "column"),
        (r"model\.per_layer_projection_norm\.weight", "whole"),
        (L + r"(per_layer_input_gate|per_layer_projection|post_per_layer_input_norm)\.weight", "whole"),
        (L + r"layer_scalar", "whole"),
        # the MoE block (num_experts): the router whole (GateLinear, its scale and per_expert_scale plain
        # parameters), FusedMoE's fused experts: gate_up_proj [E, 2I, H] each half's rows cut, down_proj [E, H, I]
        # its input columns cut
        (L + r"router\.(proj\.weight|scale|per_expert_scale)", "whole"),
        (L + r"experts\.gate_up_proj", "experts_halves"),
        (L + r"experts\.down_proj", "experts_row"),
        (L + r"(pre_feedforward_layernorm_2|post_feedforward_layernorm_[12])\.weight", "whole"),
    ],
    # Phi through vLLM's Transformers backend: q, k, v (weights and biases) as QKVParallelLinear, dense and fc2
    # RowParallelLinear (their biases whole), fc1 ColumnParallelLinear with its bias, LayerNorms whole, lm_head's
    # bias with its rows
    "phi": EMBED + ATTN + [
        (r"lm_head\.bias", "vocab"),
        (L + r"self_attn\.dense\.weight", "row"),
        (L + r"self_attn\.dense\.bias", "whole"),
        (L + r"mlp\.fc1\.(weight|bias)", "column"),
        (L + r"mlp\.fc2\.weight", "row"),
        (L + r"mlp\.fc2\.bias", "whole"),
        (L + r"input_layernorm\.(weight|bias)", "whole"),
        (r"model\.final_layernorm\.(weight|bias)", "whole"),
    ],
    # HunYuan MoE through vLLM's Transformers MoE backend: llama's attention with query_layernorm / key_layernorm
    # (RMSNorm(head_dim)) whole, FusedMoE experts, the router (gate.wg) replicated, the shared MLP column / row
    "hunyuan_moe": EMBED + ATTN + experts(r"experts\.\d+|shared_mlp") + [
        (L + r"mlp\.gate\.wg\.weight", "whole"),
        (L + r"self_attn\.(query|key)_layernorm\.weight", "whole"),
    ] + NORMS,
    # EXAONE 3 (models/exaone.py): llama's cuts under EXAONE's names (QKVParallelLinear q, k, v; out_proj and c_proj
    # RowParallelLinear; c_fc_0 / c_fc_1 into the MergedColumnParallelLinear gate_up_proj; wte vocab-parallel)
    "exaone": [
        (r"(lm_head|transformer\.wte)\.weight", "vocab"),
        (r"transformer\.h\.\d+\.attn\.attention\.q_proj\.weight", "column"),
        (r"transformer\.h\.\d+\.attn\.attention\.[kv]_proj\.weight", "kv"),
        (r"transformer\.h\.\d+\.attn\.attention\.out_proj\.weight", "row"),
        (r"transformer\.h\.\d+\.mlp\.c_fc_[01]\.weight", "column"),
        (r"transformer\.h\.\d+\.mlp\.c_proj\.weight", "row"),
        (r"transformer\.(h\.\d+\.ln_[12]|ln_f)\.weight", "whole"),
    ],
    "phi3": EMBED + [  # models/phi3.py (llama.py): fused checkpoint tensors loaded with loaded_shard_id None
        (L + r"self_attn\.qkv_proj\.weight", "qkv_fused"),
        (L + r"self_attn\.o_proj\.weight", "row"),
        (L + r"mlp\.gate_up_proj\.weight", "halves"),
        (L + r"mlp\.down_proj\.weight", "row"),
    ] + NORMS,
}
# MiniMax-M2 (models/minimax_m2.py): llama's attention with q_norm / k_norm cut with their heads
# (MiniMaxText01RMSNormTP.weight_loader: q_norm's H*hd/T channels at tp_rank, k_norm's by KV head at
# tp_rank // replicas, as k_proj), mixtral's experts (ckpt_names w1, w2, w3), GateLinear and the routing bias
# replicated
CUTS["minimax_m2"] = EMBED + [
    (L + r"self_attn\.q_norm\.weight", "column"),
    (L + r"self_attn\.k_norm\.weight", "kv"),
    (L + r"block_sparse_moe\.e_score_correction_bias", "whole"),
] + CUTS["mixtral"][1:]


# ERNIE-4.5-MoE (models/ernie45_moe.py): llama's attention, GateLinear and the moe_statics bias replicated, experts and
# shared experts as DeepSeek's
CUTS["ernie4_5_moe"] = CUTS["glm4_moe"] + [(L + r"mlp\.moe_statics\.e_score_correction_bias", "whole")]


# MiniCPM3 (models/minicpm3.py MiniCPM3Attention): DeepSeek-V2's MLA cuts (q_a_proj / kv_a_proj_with_mqa
# ReplicatedLinear, q_b_proj / kv_b_proj ColumnParallelLinear, o_proj row), MiniCPMMLP gate_up / down as llama's
CUTS["minicpm3"] = EMBED + MLA + DENSE + NORMS


# AFMoE (models/afmoe.py): llama's attention plus the output gate (ColumnParallelLinear: rows cut), the sandwich norms,
# GateLinear and expert_bias replicated, experts and shared experts as DeepSeek's
CUTS["afmoe"] = EMBED + ATTN + [
    (L + r"self_attn\.gate_proj\.weight", "column"),
    (L + r"mlp\.router\.gate\.weight", "whole"),
    (L + r"mlp\.expert_bias", "whole"),
    (L + r"(pre|post)_mlp_layernorm\.weight", "whole"),
] + experts(r"experts\.\d+|shared_experts") + DENSE + NORMS


# HY V3 (models/hy_v3.py): llama's attention, GateLinear and expert_bias replicated, experts and the shared_mlp as
# DeepSeek's
CUTS["hy_v3"] = EMBED + ATTN + [
    (L + r"mlp\.router\.gate\.weight", "whole"),
    (L + r"mlp\.expert_bias", "whole"),
] + experts(r"experts\.\d+|shared_mlp") + DENSE + NORMS


# Llama 4's language model (models/llama4.py Llama4ForCausalLM): llama's attention (q / k rows permuted inside each
# head while loading: the view's "deinterleave"), the dense layers' feed_forward and the shared expert as
# MergedColumnParallelLinear / RowParallelLinear, the GateLinear router whole, the fused experts as
# load_moe_expert_weights cuts them: gate_up_proj [E, H, 2I] transposed, chunked into gate and up, each cut by rows
# (here: the columns of each half), down_proj [E, I, H] transposed and cut by its input columns (here: axis 1)
LF = L + r"feed_forward\."
CUTS["llama4"] = EMBED + ATTN + [
    (LF + r"(shared_expert\.)?(gate|up)_proj\.weight", "column"),
    (LF + r"(shared_expert\.)?down_proj\.weight", "row"),
    (LF + r"router\.weight", "whole"),
    (LF + r"experts\.gate_up_proj", "axis2_halves"),
    (LF + r"experts\.down_proj", "axis1"),
] + NORMS
# Llama 4 as published (models/mllama4.py): the language model's cuts under language_model., the vision tower whole
# (--mm-encoder-tp-mode data: ReplicatedLinear, disable_tp), multi_modal_projector.linear_1 a ColumnParallelLinear
CUTS["llama4_vl"] = [(r"language_model\." + p, how) for p, how in CUTS["llama4"]] + [
    (r"vision_model\..+", "whole"),
    (r"multi_modal_projector\.linear_1\.weight", "column"),
]


# Muse Glimmer (models/muse_glimmer.py): llama's cuts under model.language_model., the attention's output gate a
# ColumnParallelLinear (by heads), the vision attention cut by its heads, the rest of the tower, adapter and
# projection whole (nn.Linear)
CUTS["muse_glimmer"] = [(p.replace(r"model\.", r"model\.language_model\.", 1), how)
                        for p, how in EMBED + ATTN + DENSE + NORMS] + [
    (L.replace(r"model\.", r"model\.language_model\.", 1) + r"self_attn\.gate_proj\.weight", "column"),
    # MuseGlimmerVisionAttention: QKVParallelLinear (q, k, v and biases by the vision heads), RowParallelLinear proj
    (r"model\.vision_tower\.layers\.\d+\.attn\.[qkv]_proj\.(weight|bias)", "column"),
    (r"model\.vision_tower\.layers\.\d+\.attn\.proj\.weight", "row"),
    (r"model\.vision_(tower|adapter|projection)\..+", "whole"),
]


# EXAONE MoE (models/exaone_moe.py): Qwen3-MoE's cuts with shared_experts (plural) and the bias replicated
CUTS["exaone_moe"] = EMBED + ATTN + [
    (L + r"mlp\.(gate\.weight|e_score_correction_bias)", "whole"),
] + experts(r"experts\.\d+|shared_experts") + DENSE + NORMS


# Cohere 2 MoE (models/cohere2_moe.py): llama's attention, the dense MLP, FusedMoE experts and shared experts, the
# GateLinear router replicated, LayerNorms whole
CUTS["cohere2_moe"] = EMBED + ATTN + [
    (L + r"mlp\.gate\.weight", "whole"),
] + experts(r"experts\.\d+|shared_experts") + DENSE + NORMS


# A.X K1 (models/AXK1.py): DeepSeek-V3's cuts and its post_mlp_layernorm, whole
CUTS["axk1"] = CUTS["deepseek_v3"] + [(L + r"post_mlp_layernorm\.weight", "whole")]


# MiMo-V2-Flash (models/mimo_v2.py): q, k, v by heads (no KV replication here), the sinks narrowed to the rank's
# heads, GLM-4.5's MoE cuts
CUTS["mimo_v2_flash"] = EMBED + ATTN + [(L + r"self_attn\.attention_sink_bias", "column")] + CUTS["glm4_moe"][1 + len(ATTN):]


FAMILY = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama", "gemma3_text": "llama",
          "granite": "llama_more", "exaone4": "llama_more", "glm4": "llama_more", "apertus": "llama_more",
          "ernie4_5": "llama", "cohere": "llama", "ministral3": "llama", "gemma": "llama", "gemma2": "llama",
          "cohere2": "llama", "granite_swa": "llama_more", "hyperclovax": "llama_more",
          "qwen3_moe": "moe", "qwen2_moe": "moe", "mellum": "moe", "mixtral": "mixtral", "phi3": "phi3",
          "glm4_moe": "glm4_moe", "deepseek_v3": "deepseek_v3", "kimi_k2": "deepseek_v3",
          # GLM-4.7-Flash (models/glm4_moe_lite.py): DeepseekV2MLAAttention and glm4_moe.py's Glm4MoE, whose
          # GateLinear router and correction bias are replicated, experts and shared experts cut as DeepSeek's
          "glm4_moe_lite": "deepseek_v3", "deepseek_v2": "deepseek_v2",
          # OLMoE (models/olmoe.py): QKVParallelLinear, q_norm / k_norm RMSNorms over all heads (default loader:
          # whole), FusedMoE experts, GateLinear router replicated: the Qwen-MoE cuts without a shared expert
          "olmoe": "moe", "granitemoe": "granitemoe", "minimax_m2": "minimax_m2", "ernie4_5_moe": "ernie4_5_moe",
          "minicpm3": "minicpm3", "afmoe": "afmoe", "hy_v3": "hy_v3", "llama4_text": "llama4", "llama4": "llama4_vl", "muse_glimmer": "muse_glimmer",
          "exaone_moe": "exaone_moe", "cohere2_moe": "cohere2_moe", "axk1": "axk1",
          "mimo_v2_flash": "mimo_v2_flash",
          "deepseek_v32": "deepseek_v32", "glm_moe_dsa": "deepseek_v32", "qwen3_next": "qwen3_next",
          "qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5",
          "glm5_next": "glm5_next", "kimi_linear": "kimi_linear", "lfm2": "lfm2",
          "lfm2_moe": "lfm2", "olmo_hybrid": "olmo_hybrid", "gpt_oss": "gpt_oss", "hy_v4": "hy_v4", "gptj": "gptj",
          **{mt: "transformers" for mt in ("arcee", "seed_oss", "smollm3", "starcoder2", "cwm", "hunyuan_v1_dense",
                                           "jais2", "olmo", "vaultgemma", "olmo2", "olmo3", "glm")},
          # Nemotron (models/nemotron.py): llama's attention, up_proj alone, LayerNorm1P weights and biases whole
          "nemotron": "transformers", "gemma4_text": "gemma4", "phi": "phi", "flex_olmo": "moe",
          "hunyuan_v1_moe": "hunyuan_moe", "exaone": "exaone", "internlm3": "llama",
          "iquestcoder": "llama", "granitemoeshared": "granitemoe", "granitemoe_swa": "granitemoe"}


def cut(family, cfg, name, x, T, r, pad):
    if name.endswith(".weight_scale_inv"):
        # FP8 block scales (BlockQuantScaleParameter, layers/quantization/fp8.py): the weight loader narrows
        # the scale as it narrows the weight, in units of one 128x128 block (adjust_block_scale_shard), so
        # the weight's rule applies to the scale's rows and columns (the view serves only cuts on blocks)
        name = name[:-len("_scale_inv")]
    scale = re.search(r"\.(weight_scale|weight_scale_2|input_scale)$", name)
    if scale and x.numel() == 1:
        # a per-tensor scale (PerTensorScaleParameter: one slot per loaded shard; ModelOpt's 0-d
        # weight_scale_2 and input_scale, compressed-tensors' [1]): whole
        return x
    if scale:
        # compressed-tensors W8A8 scales (ChannelQuantScaleParameter [out, 1]: output_dim 0 only, so cut as
        # the weight's rows where the weight's rows are cut, whole where its columns are (row-parallel));
        # NVFP4 group scales [out, in/16] (ModelWeightParameter: input_dim 1, output_dim 0): cut as the weight
        name = name[:scale.start()] + ".weight"
    for pat, how in CUTS[family]:
        if re.fullmatch(pat, name):
            break
    else:
        raise ViewError("%s: no vLLM cut known for this tensor" % name)
    if scale and how == "row" and x.shape[-1] == 1:
        return x
    if how == "vocab":
        return cut_vocab(x, T, r, pad)
    if how == "column":
        return cut_column(x, T, r)
    if how == "row":
        return cut_row(x, T, r)
    if how == "kda_a_log":  # [H] viewed as [1, 1, H, 1], sharded_weight_loader(2): heads [r*H/T, ...)
        return _chunk(x.reshape(1, 1, -1, 1) if x.ndim == 1 else x, 2, T, r)
    if how in ("kv", "qkv_fused"):
        kv = (cfg.get("num_key_value_heads") or config_value(cfg, "num_key_value_heads")  # llama4: text_config's
              or config_value(cfg, "num_attention_heads"))
    if how == "kv":
        return cut_kv(x, T, r, kv)
    if how == "qkv_fused":  # QKVParallelLinear.weight_loader(loaded_shard_id=None): q | k | v, each cut
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        q, k, v = x.split([cfg["num_attention_heads"] * hd, kv * hd, kv * hd], dim=0)
        return torch.cat([cut_column(q, T, r), cut_kv(k, T, r, kv), cut_kv(v, T, r, kv)], dim=0)
    if how == "gdn_conv":  # conv1d [key_dim | key_dim | value_dim, 1, K]: each section cut contiguously
        kd = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
        vd = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
        return torch.cat([cut_column(y, T, r) for y in x.split([kd, kd, vd], dim=0)], dim=0)
    if how == "a_log":  # old [1, 1, H, 1] or current [H]: as [H], then H / T heads at tp_rank
        return cut_column(x.reshape(x.shape[2]) if x.ndim == 4 else x, T, r)
    if how == "thirds":  # MergedColumnParallelLinear.weight_loader(loaded_shard_id=None), three equal outputs
        return torch.cat([cut_column(y, T, r) for y in x.chunk(3, dim=0)], dim=0)
    if how == "experts_halves":  # [E, 2I, D]: chunk(2, dim=-2), each expert's gate and up rows cut (w13)
        g, u = x.chunk(2, dim=-2)
        return torch.cat([_chunk(g, 1, T, r), _chunk(u, 1, T, r)], dim=1)
    if how == "experts_row":  # [E, D, I]: each expert's input columns cut (w2)
        return _chunk(x, 2, T, r)
    if how == "axis2_halves":  # [E, H, 2I]: chunk(2, dim=-1), each half's columns cut (Llama 4's gate | up)
        g, u = x.chunk(2, dim=-1)
        return torch.cat([_chunk(g, 2, T, r), _chunk(u, 2, T, r)], dim=2)
    if how in ("axis1", "axis2"):  # a contiguous block of axis 1 or 2, [r*n/T, (r+1)*n/T)
        return _chunk(x, int(how[-1]), T, r)
    if how == "rank0":  # loaded whole on rank 0, zeros on the others
        return x if r == 0 else torch.zeros_like(x)
    if how == "halves":  # MergedColumnParallelLinear.weight_loader(loaded_shard_id=None): gate | up, each cut
        g, u = x.chunk(2, dim=0)
        return torch.cat([cut_column(g, T, r), cut_column(u, T, r)], dim=0)
    return x


# ---- step 2: the view ----

def template(t):
    """A template "a.{i}.b" as (regex, variables in order); a drop template's ending "*": any rest."""
    names, out, rest = [], "", t.endswith("*")
    for part in re.split(r"(\{[a-z_]+\})", t[:-1] if rest else t):
        if part.startswith("{") and part.endswith("}"):
            v = part[1:-1]
            out += "(?P=%s)" % v if v in names else "(?P<%s>\\d+)" % v
            if v not in names:
                names.append(v)
        else:
            out += re.escape(part)
    return re.compile(out + (".*" if rest else "")), names


def fill(t, b):
    return re.sub(r"\{([a-z_]+)\}", lambda m: b[m.group(1)], t)


def config_value(cfg, k, default=None, defaults=None):
    """config.json's key k in the one lookup order of plans and views: under text_config first (where
    transformers keeps a composite config's text-model keys), then at the top, then the view's
    `defaults` (the config class's values)."""
    for where in ((cfg.get("text_config") or {}), cfg, defaults or {}):
        if where.get(k) is not None:
            return where[k]
    return default


class _Missing(Exception):
    pass


def condition(expr, cfg, defaults, T, tensor=None, b=None):
    """A view condition (an entry's `if`, `refuse.if`: a plan expression) evaluated here by Python: the
    operators rewritten (&& || ! to and or not), every name looked up by config_value, T bound (P 1, EP and
    EP_RR 0: the reference makes TP files only), has(k) testing a key, tensor('NAME') asking `tensor` (an
    entry's match: whether the source holds NAME filled in; None: an error), the match's variables (b) bound
    to their values as integers. A key neither config.json nor the
    view's defaults has, outside has(), raises: tpfs refuses such a condition by name."""
    py = re.sub(r"has\(\s*([A-Za-z_][A-Za-z0-9_.]*)\s*\)", r'_has("\1")', expr)
    py = re.sub(r"\btensor\(", "_tensor(", py)
    py = py.replace("&&", " and ").replace("||", " or ")
    py = re.sub(r"!(?!=)", " not ", py)
    py = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", py))

    class Names(dict):
        def __missing__(self, name):
            if b and name in b:
                return int(b[name])
            if name == "T":
                return T
            if name in ("P", "EP", "EP_RR"):  # the reference writes TP files only: one stage, no --ep
                return 1 if name == "P" else 0
            if name == "_has":
                return lambda k: config_value(cfg, k, defaults=defaults) is not None
            if name == "_tensor":
                if tensor is None:
                    raise ViewError("tensor() is only for a view entry's if: %r" % expr)
                return tensor
            v = config_value(cfg, name, defaults=defaults)
            if v is None:
                raise _Missing("condition %r reads %r, which neither config.json nor the view's defaults has"
                               % (expr, name))
            return v
    return bool(eval(py, {"__builtins__": {}}, Names()))


GONE = {"when": 'write "if": EXPR', "unless": 'write "if": "!(EXPR)"', "if_missing": 'write "if": "!tensor(\'NAME\')"',
        "optional": 'write "if": "tensor(\'PIECE\') && ...", naming the pieces a match may lack',
        "remove": 'write {"drop": {"entry": NAME}} (an inherited entry taken away)'}


def entry_vars(entry):
    """The variables an entry's first piece (or per, or drop template) binds."""
    first = entry.get("drop") or (entry.get("cat") or [entry.get("from") or entry.get("per")])[0]
    return template(first)[1] if isinstance(first, str) else []


def per_match(entry):
    """Whether an entry's `if` is decided for each match: it reads tensor() or one of the entry's variables (an
    identifier outside quotes)."""
    c = entry.get("if", "")
    bare = re.sub(r"'[^']*'|\"[^\"]*\"", "", c)
    return "tensor(" in c or any(re.search(r"(?<![\w.])%s(?![\w.])" % v, bare) for v in entry_vars(entry))


def applies(entry, cfg, defaults=None, T=1, names=None, b=None):
    """Whether a view entry applies under config.json cfg at T: its `if` true. An `if` that reads tensor() is
    decided for each match (b: its binding, names: the source's tensors); before the matches (b None) it
    applies. An `if` reading the entry's variables is decided for each match too, with them bound. The keywords
    `if` and `drop` replaced are refused, naming the replacement."""
    for k, how in GONE.items():
        if k in entry:
            raise ViewError("%r is no longer a view keyword: %s" % (k, how))
    if "if" not in entry:
        return True
    pm = per_match(entry)
    if pm != (b is not None):
        return True
    return condition(entry["if"], cfg, defaults, T, tensor=(lambda t: fill(t, b) in names) if pm else None,
                     b=b if pm else None)


DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def plan_view(view, cfg, names, T=1):
    """The served tensors: a list of (served name, recipe, first source name) where recipe is
    ("cat", [names], dtype, shape, transpose, zeros) / ("stack", [[names] per e], dtype, shape, transpose, zeros)
    (dtype None: the pieces', or "F32": widened; shape None: as made, or the served shape; transpose: the last two
    axes swapped; zeros: ranks other than 0 serve zeros) / ("const", dtype, value, shape: [] a
    scalar); and the
    source names used."""
    used, served = set(), []
    if "drop_layers" in view:
        raise ViewError("'drop_layers' is no longer a view keyword: write the tensors entry "
                        '{"drop": "PREFIX{n}.*", "if": "n >= KEY"}')
    dropped = set()  # the drop entries first, each over every source tensor: no other entry sees what they take
    for entry in view["tensors"]:
        if "drop" in entry and applies(entry, cfg, view.get("defaults"), T):
            if not isinstance(entry["drop"], str):
                raise ViewError("%r takes away an inherited entry, and this view inherits none" % entry)
            rx, _ = template(entry["drop"])
            dropped |= {n for n in names if rx.fullmatch(n) and
                        applies(entry, cfg, view.get("defaults"), T, names, rx.fullmatch(n).groupdict())}
    names = set(names) - dropped
    for entry in view["tensors"]:
        if "drop" in entry or not applies(entry, cfg, view.get("defaults"), T):
            continue
        pieces = entry.get("cat") or ([entry["from"]] if "from" in entry else None)
        first = pieces[0] if pieces else entry["per"]
        rx, var = template(first)
        stack = entry.get("stack")
        bindings, seen = [], set()
        for n in sorted(names):
            m = rx.fullmatch(n)
            if not m:
                continue
            b = m.groupdict()
            key = tuple(sorted((k, v) for k, v in b.items() if k != stack))
            if key in seen:
                continue
            seen.add(key)
            bindings.append(b)
        for b in bindings:
            if not applies(entry, cfg, view.get("defaults"), T, names, b):
                continue  # a per-match "if" (tensor()) false for this match
            sname = fill(entry["name"], b)
            if "const" in entry:
                served.append((sname, ("const", entry["const"]["dtype"], entry["const"]["value"],
                                       entry.get("shape", [])), fill(first, b)))
                continue
            if stack:
                es = sorted(int(m.group(stack)) for m in (rx.fullmatch(n) for n in names)
                            if m and all(m.group(k) == v for k, v in b.items() if k != stack))
                if es != list(range(len(es))):
                    raise ViewError("%s: experts %s are not 0..E-1" % (sname, es))
                groups = [[fill(p, dict(b, **{stack: str(e)})) for p in pieces] for e in es]
            else:
                groups = [[fill(p, b) for p in pieces]]
            missing = [p for g in groups for p in g if p not in names]
            if missing:
                raise ViewError("%s: piece %s is missing" % (sname, missing[0]))
            twice = used & {p for g in groups for p in g}
            if twice:
                raise ViewError("%s: source tensor %s is used by two entries" % (sname, sorted(twice)[0]))
            used |= {p for g in groups for p in g}
            dt = entry.get("dtype")  # "F32": the pieces' values widened, as torch converts them
            if "shape" in entry:
                raise ViewError("%s: \"shape\" on a cat / from entry is now \"reshape\"" % sname)
            shape = entry.get("reshape")  # the served shape (one -1, a 0 the tensor's own), as torch reshapes
            dil = entry.get("deinterleave")  # per piece: None, or a config key N (rows of a block)
            if dil is not None:
                if len(dil) != len(pieces) or stack or dt or entry.get("transpose"):
                    raise ViewError("%s: \"deinterleave\" is one item per piece, on an entry neither stacked, "
                                    "widened nor transposed" % sname)
                dil = [None if d is None else config_value(cfg, d, defaults=view.get("defaults")) for d in dil]
            tail = (entry.get("transpose", False), entry.get("other_ranks") == "zeros", dil)
            served.append((sname, (("stack", groups, dt, shape) if stack else ("cat", groups[0], dt, shape)) + tail,
                           groups[0][0]))
    rest = [n for n in sorted(names) if n not in used]

    def renamed(n):  # "rename": [{from, to, names}], the first pair that takes n; None: none does
        for rn in view.get("rename", []):
            a, b = rn["from"], rn["to"]
            if n.startswith(a) and ("names" not in rn or any(template(t)[0].fullmatch(n[len(a):]) for t in rn["names"])):
                return b + n[len(a):]
        return None
    served += [(renamed(n), ("cat", [n], None, None, False, False, None), n) for n in rest if renamed(n) is not None]
    rest = [n for n in rest if renamed(n) is None]
    if view.get("keep_rest", True):
        served += [(n, ("cat", [n], None, None, False, False, None), n) for n in rest]
    elif rest:
        raise ViewError("%s: no entry of view %s uses it" % (rest[0], view["name"]))
    dup = {s for s, _, _ in served if [x for x, _, _ in served].count(s) > 1}
    if dup:
        raise ViewError("served twice: %s" % sorted(dup))
    return served


def config_of(src):
    with open(os.path.join(src, "config.json")) as f:
        return json.load(f)


def cat(pieces):
    """The pieces concatenated along the first axis: one piece as it is (a 0-d tensor too); several 0-d
    pieces as a vector of them (vLLM's per-shard scale slots: [3] from q's, k's and v's scalar)."""
    if len(pieces) == 1:
        return pieces[0]
    return torch.cat([x.reshape(1) if x.ndim == 0 else x for x in pieces], 0)


def build(src, view, T, r, family=None):
    """{part index: {served name: tensor}} for rank r."""
    cfg = config_of(src)
    family = family or FAMILY.get(cfg["model_type"])
    if family is None:
        raise ViewError("model_type %s: no reference cut rules" % cfg["model_type"])
    files = sorted(glob.glob(os.path.join(src, "*.safetensors")))
    where, handles = {}, [safe_open(f, framework="pt") for f in files]
    for p, h in enumerate(handles):
        for n in h.keys():
            where[n] = p
    pad = view.get("pad_vocab", 1)
    local = {}

    def piece(n):
        if n not in local:
            local[n] = cut(family, cfg, n, handles[where[n]].get_tensor(n), T, r, pad).contiguous()
        return local[n]

    parts = {}
    for sname, recipe, first in plan_view(view, cfg, set(where), T):
        if recipe[0] == "const":
            t = torch.full(recipe[3], recipe[2], dtype=DTYPES[recipe[1]])
        elif recipe[0] == "cat":
            # "deinterleave": a piece's rows in blocks of N, each as its even rows, then its odd rows (as vLLM's
            # Llama 4 permute_qk_weight_for_rotary: view(-1, N / 2, 2, ...).transpose(1, 2))
            t = cat([piece(n) if not recipe[6] or not recipe[6][j] else
                     piece(n).reshape(-1, recipe[6][j] // 2, 2, *piece(n).shape[1:]).transpose(1, 2)
                     .reshape(piece(n).shape) for j, n in enumerate(recipe[1])])
        else:
            t = torch.stack([cat([piece(n) for n in g]) for g in recipe[1]], 0)
        if recipe[0] != "const" and recipe[2] and t.dtype != DTYPES[recipe[2]]:
            if t.dtype not in (torch.bfloat16, torch.float16):
                raise ViewError("%s: %s pieces cannot be widened to %s" % (sname, t.dtype, recipe[2]))
            t = t.to(DTYPES[recipe[2]])
        if recipe[0] != "const" and recipe[3]:  # a 0: the tensor's own size at that axis
            t = t.reshape([t.shape[a] if d == 0 else d for a, d in enumerate(recipe[3])])
        if recipe[0] != "const" and recipe[4]:  # "transpose": the last two axes swapped
            t = t.transpose(-1, -2)
        if recipe[0] != "const" and recipe[5] and r != 0:  # "other_ranks": "zeros"
            t = torch.zeros_like(t)
        parts.setdefault(where[first], {})[sname] = t.contiguous()
    return parts


def write(src, view, T, out, ranks=None, family=None):
    """Writes OUT as the mount would show it: SRC's files other than weights, and each rank's parts."""
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(src):
        p = os.path.join(src, f)
        if os.path.isfile(p) and not f.endswith(".safetensors") and f != "model.safetensors.index.json":
            shutil.copy(p, os.path.join(out, f))
    for r in (range(T) if ranks is None else ranks):
        built = build(src, view, T, r, family)  # {source file index: tensors}; parts numbered densely
        for p, f in enumerate(sorted(built)):
            save_file(built[f], os.path.join(out, "model-rank-%d-part-%d.safetensors" % (r, p)))


def merge_over(base, over, path, what, fragment=False):
    """Puts view (or fragment) OVER over BASE in place, as views/vllm/README.md says: each top-level
    field of a view but extends / include / tensors / refuse / defaults replacing base's (a fragment
    adds only its tensors, refuse and defaults), each "tensors" entry replacing base's of the same
    name (a drop entry: of the same drop template) where it stands, {"drop": {"entry": NAME}} taking base's
    entry making (or dropping) NAME away, any other appended; refuse entries appended; defaults merged by key; a
    view-level "drop": [FIELD, ...] taking base's fields away ({"remove": NAME} and a top-level null, which
    "drop" replaced, refused)."""
    tensors = base.setdefault("tensors", [])

    def key(e):
        return ("name", e["name"]) if "name" in e else ("drop", e.get("drop"))
    nbase = len(tensors)  # over's entries replace base's only, never each other
    for e in over.get("tensors", []):
        if "remove" in e:
            raise ViewError("%s: 'remove' is no longer a view keyword: write {\"drop\": {\"entry\": NAME}}" % path)
        if isinstance(e.get("drop"), dict):
            rm = e["drop"].get("entry")
            hit = [x for x in tensors[:nbase] if (x.get("name") or x.get("drop")) == rm]
            if len(e) != 1 or list(e["drop"]) != ["entry"] or not hit:
                raise ViewError("%s: drop entry %r: no entry of %s makes or drops it" % (path, rm, what))
            tensors.remove(hit[0])
            nbase -= 1
            continue
        at = [i for i, x in enumerate(tensors[:nbase]) if key(x) == key(e)]
        if at:
            tensors[at[0]] = e
        else:
            tensors.append(e)
    for k in ([] if fragment else over.get("drop", [])):  # "drop": [FIELD, ...]: base's fields not inherited
        if k in ("tpfs_view", "engine", "name", "extends", "include", "tensors", "refuse", "defaults", "drop",
                 "fragment") or k not in base or k in over:
            raise ViewError("%s: \"drop\": %r: not a field of %s this view may take away" % (path, k, what))
        del base[k]
    for k, x in over.items():
        if k in ("extends", "include", "tensors", "drop"):
            continue
        if k in ("refuse", "defaults") and x is None:
            raise ViewError("%s: %r: null: a view adds to what it extends, it cannot take it away" % (path, k))
        if x is None and not fragment:
            raise ViewError('%s: "%s": null no longer takes an inherited field away: write "drop": ["%s"]' % (path, k, k))
        if k == "refuse":
            base["refuse"] = base.get("refuse", []) + x
        elif k == "defaults":
            base["defaults"] = dict(base.get("defaults", {}), **x)
        elif not fragment:
            base[k] = x


def with_params(frag, given, path, name):
    """The fragment with its parameters put in: "params" {NAME: default, or None: required}; every ${NAME} in
    the strings of its tensors and refuse replaced by the include's "with" value, else the default. A value
    for no parameter, a required one not given and a ${X} that names no parameter are errors."""
    params = frag.get("params", {})
    for k in given:
        if k not in params:
            raise ViewError("%s: include %r: %r is not one of its params" % (path, name, k))
    vals = {}
    for k, d in params.items():
        if k not in given and d is None:
            raise ViewError("%s: include %r: parameter %r is required" % (path, name, k))
        vals[k] = given.get(k, d)

    def put(x):
        if isinstance(x, str):
            def one(m):
                if m.group(1) not in vals:
                    raise ViewError("%s: fragment %r: ${%s} is not one of its params" % (path, name, m.group(1)))
                return vals[m.group(1)]
            return re.sub(r"\$\{([^}]*)\}", one, x)
        if isinstance(x, list):
            return [put(y) for y in x]
        if isinstance(x, dict):
            return {k: put(y) for k, y in x.items()}
        return x
    return {k: put(x) if k in ("tensors", "refuse") else x for k, x in frag.items() if k != "params"}


def load_view(path):
    """A view file, with "extends" and "include" applied as views/vllm/README.md says: the named
    view of the same folder, or ENGINE/NAME: of the engine's folder beside it (none: an empty view), then each named fragment of its fragments/
    folder in order (ENGINE/NAME: another engine's fragment), then this file, each put over what came before (merge_over)."""
    with open(path) as f:
        view = json.load(f)
    base, inc = view.get("extends"), view.get("include", [])
    if base is None and not inc:
        return view
    folder = os.path.dirname(path) or "."
    if os.path.basename(folder) == "fragments":
        raise ViewError("%s: a fragment neither extends nor includes" % path)
    out = {"tensors": []}
    if base is not None:
        out = None
        if "/" in base:  # another engine's view: views/ENGINE/
            engine, base = base.split("/", 1)
            folder = os.path.join(os.path.dirname(folder), engine)
        for f in sorted(glob.glob(os.path.join(folder, "*.json"))):
            with open(f) as fh:
                if json.load(fh).get("name") == base:
                    out = load_view(f)
        if out is None:
            raise ViewError("%s: extends %r, which no view beside it is" % (path, base))
    folder = os.path.dirname(path) or "."  # the view's own fragments
    for item in inc:  # NAME: the view's engine's fragment; ENGINE/NAME: another engine's; or {"fragment": NAME,
        # "with": {PARAM: VALUE}}: a fragment that takes parameters
        name, given = (item, {}) if isinstance(item, str) else (item["fragment"], item.get("with", {}))
        fdir = os.path.join(os.path.dirname(folder), name.split("/")[0]) if "/" in name else folder
        frag = os.path.join(fdir, "fragments", name.split("/")[-1] + ".json")
        if not os.path.isfile(frag):
            raise ViewError("%s: includes %r, which no fragment in fragments/ is" % (path, name))
        with open(frag) as fh:
            merge_over(out, with_params(json.load(fh), given, path, name), path, name, fragment=True)
    merge_over(out, view, path, base or "(included)")
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    ranks = [int(x) for x in sys.argv[5].split(",")] if len(sys.argv) == 6 else None
    write(sys.argv[1], load_view(sys.argv[2]), int(sys.argv[3]), sys.argv[4], ranks)
