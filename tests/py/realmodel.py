"""Tiny random checkpoints written by the real transformers model code, one per architecture family,
and what a tensor-parallel rank of each looks like to that code.

Owned here: the family table (config of a tiny model with every layer kind of the family, the
model class, the config keys that are per-rank counts), building and saving a checkpoint
(`save_pretrained` with a small max_shard_size, so the index is used; fixed seeds), each rank's
local config (computed from the rules of the family, independently of tpfs), and the hooks that
turn a local-size model into one rank of a tensor-parallel forward over torch.distributed
(vocab-parallel embedding and lm_head, row-parallel outputs summed, norms over all heads
all-reduced). test_real_models.py drives it.

Sizes divide by 2 and 4 (and by 3 where the family allows uneven heads): hidden 64, 8 heads of 16,
intermediate 96, experts of 48, vocabulary 384.
"""
import copy
import json
import os

V, D, I, IM = 384, 64, 96, 48


def _common(**kw):
    base = dict(vocab_size=V, hidden_size=D, intermediate_size=I, num_attention_heads=8, max_position_embeddings=256,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    base.update(kw)
    return base


def _mla(**kw):
    base = _common(num_key_value_heads=8, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16,
                   v_head_dim=16, moe_intermediate_size=IM, n_routed_experts=8, num_experts_per_tok=2,
                   n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1, num_hidden_layers=3)
    base.update(kw)
    return base


# Each family: the config class and its arguments, the model class, the per-rank keys
# ("key" or "sub.key", kind: even / uneven / groups / same_as:<key>), the Ts it runs at, the
# tensor whose halves the wrong-split check swaps on rank 0 (a regex over the local state dict),
# and hooks (extra TP patching). `config_json` post-edits the saved config.json (other forms).
FAMILIES = {}


def family(name, cfg_cls, cfg, model_cls, per_rank, ts=(2, 4), wrong=r"layers\.0\.self_attn\.q_proj\.weight$",
           wrong_dim=0, config_json=None, global_norms=(), rank0_bias=(), mxfp4=False, mtp=False, forward_via=None,
           patch=None, output=None):
    """patch: a family's own TP hook, patch(model, T, r, allsum), run after tp_patch's generic ones
    (for module kinds the generic hooks do not know: a mixer's gated norm over all heads, fused experts
    of another class, ...). output: output(model, ids) -> the tensor compared instead of the logits, for
    a model without a head (a composite's text tower: its last hidden state, which every rank holds
    whole after the row-parallel sums; a vision encoder fed embeddings made from ids). model_cls: a
    class transformers exports, or "module:Class" under transformers.models for one it does not."""
    FAMILIES[name] = dict(name=name, cfg_cls=cfg_cls, cfg=cfg, model_cls=model_cls, per_rank=per_rank, ts=ts,
                          wrong=wrong, wrong_dim=wrong_dim, config_json=config_json, global_norms=global_norms,
                          rank0_bias=rank0_bias, mxfp4=mxfp4, mtp=mtp, forward_via=forward_via, patch=patch,
                          output=output)


def model_class(fam):
    """The model class fam["model_cls"] names (see family)."""
    import importlib
    import transformers
    mod, _, cls = fam["model_cls"].rpartition(":")
    return getattr(importlib.import_module("transformers.models." + mod) if mod else transformers, cls)


def logits(fam, model, ids):
    """The logits of token ids: the model's forward, or that of the submodule forward_via names (a
    wrapper whose text-only forward transformers cannot run: Llama4ForConditionalGeneration's returns
    through image outputs its language model does not have; the wrapper calls the same submodule)."""
    m = getattr(model, fam["forward_via"]) if fam["forward_via"] else model
    if fam["output"]:
        return fam["output"](m, ids)
    return m(input_ids=ids).logits


GQA = [("num_attention_heads", "even"), ("num_key_value_heads", "groups"), ("intermediate_size", "even")]

family("llama", "LlamaConfig", _common(num_key_value_heads=2, num_hidden_layers=2, head_dim=16, attention_bias=True),
       "LlamaForCausalLM", GQA)
family("mistral", "MistralConfig", _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16), "MistralForCausalLM", GQA)
family("qwen2", "Qwen2Config", _common(num_key_value_heads=2, num_hidden_layers=2), "Qwen2ForCausalLM", GQA)
family("qwen3", "Qwen3Config", _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, tie_word_embeddings=True),
       "Qwen3ForCausalLM", GQA)
family("qwen2_moe", "Qwen2MoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, moe_intermediate_size=IM, shared_expert_intermediate_size=IM,
               num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[0]),
       "Qwen2MoeForCausalLM", GQA + [("moe_intermediate_size", "even"), ("shared_expert_intermediate_size", "even")])
family("qwen3_moe", "Qwen3MoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, moe_intermediate_size=IM, num_experts=8,
               num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[0]),
       "Qwen3MoeForCausalLM", GQA + [("moe_intermediate_size", "even")])

MLA = [("num_attention_heads", "uneven"), ("num_key_value_heads", "same_as:num_attention_heads"),
       ("intermediate_size", "even"), ("moe_intermediate_size", "even")]
family("deepseek_v3", "DeepseekV3Config", _mla(), "DeepseekV3ForCausalLM", MLA, ts=(2, 3, 4), mtp=True,
       wrong=r"layers\.0\.self_attn\.q_b_proj\.weight$")
family("kimi_k2", "DeepseekV3Config", _mla(), "DeepseekV3ForCausalLM", MLA, ts=(2, 3, 4), mtp=True,
       wrong=r"layers\.0\.self_attn\.kv_b_proj\.weight$",
       config_json=lambda c: c.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"]))
# DeepseekV2Config refuses a hidden size that is not a multiple of the head count (3 heads of 8 at T=3):
# the model code's check, not the split's, so T=3 is proven on the other MLA families.
family("deepseek_v2", "DeepseekV2Config", _mla(q_lora_rank=None, n_group=1, topk_group=1), "DeepseekV2ForCausalLM",
       MLA)
family("deepseek_v32", "DeepseekV32Config",
       _mla(index_topk=8, index_head_dim=16, index_n_heads=4, mlp_layer_types=["dense", "sparse", "sparse"]),
       "DeepseekV32ForCausalLM", MLA, ts=(2, 3, 4), mtp=True, wrong=r"layers\.0\.self_attn\.o_proj\.weight$", wrong_dim=1)
family("glm_moe_dsa", "GlmMoeDsaConfig",
       _mla(index_topk=8, index_head_dim=16, index_n_heads=4, mlp_layer_types=["dense", "sparse", "sparse"]),
       "GlmMoeDsaForCausalLM", MLA, ts=(2, 3, 4), mtp=True, wrong=r"layers\.0\.self_attn\.q_b_proj\.weight$")
family("glm4_moe", "Glm4MoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, moe_intermediate_size=IM, n_routed_experts=8,
               num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
               use_qk_norm=True, attention_bias=True),
       "Glm4MoeForCausalLM", GQA + [("moe_intermediate_size", "even")])

KDA = [("linear_num_heads", "even"), ("num_attention_heads", "even"),
       ("num_key_value_heads", "same_as:num_attention_heads"), ("intermediate_size", "even"),
       ("moe_intermediate_size", "even")]
_kimi = _mla(num_hidden_layers=4, linear_num_heads=8, linear_head_dim=16, linear_conv_kernel_dim=4,
             layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
             mlp_layer_types=["dense", "sparse", "sparse", "sparse"], q_lora_rank=None, num_experts=8,
             num_local_experts=8, qk_rope_head_dim=0)
del _kimi["n_routed_experts"], _kimi["first_k_dense_replace"]
family("kimi_linear", "KimiLinearConfig", _kimi, "KimiLinearForCausalLM", KDA,
       wrong=r"layers\.0\.self_attn\.k_proj\.weight$")


def _kimi_remote_form(c):
    """The form of checkpoints published with the original remote code: linear_attn_config, 1-based layer lists."""
    c["linear_attn_config"] = {"num_heads": c.pop("linear_num_heads"), "head_dim": c.pop("linear_head_dim"),
                               "short_conv_kernel_size": c.pop("linear_conv_kernel_dim"),
                               "kda_layers": [i + 1 for i, t in enumerate(c["layer_types"]) if t == "linear_attention"],
                               "full_attn_layers": [i + 1 for i, t in enumerate(c["layer_types"]) if t != "linear_attention"]}
    del c["layer_types"]


family("kimi_linear_remote", "KimiLinearConfig", _kimi, "KimiLinearForCausalLM", KDA,
       wrong=r"layers\.1\.self_attn\.forget_gate\.dt_bias$", config_json=_kimi_remote_form)

_g5 = _mla(num_hidden_layers=4, qk_rope_head_dim=0, linear_num_heads=8, linear_head_dim=16, linear_conv_kernel_dim=4,
           hc_mult=2, index_topk=8, index_head_dim=16, index_n_heads=4, index_kpool=4,
           layer_types=["linear_attention", "linear_attention", "linear_attention", "indexed_attention"],
           mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
del _g5["first_k_dense_replace"]
family("glm5_next", "Glm5NextConfig", dict(text_config=_g5, vision_config=dict(
    depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=D, projection_intermediate_size=64)),
       "Glm5NextForConditionalGeneration", [("text_config." + k, v) for k, v in KDA],
       wrong=r"layers\.0\.self_attn\.g_b_proj\.weight$", mtp=True)



def _glm5_remote_form(c):
    """GLM-5.3 as the original remote code writes it (tp-rules.md section 7): linear_attn_config in text_config,
    DSA layers named deepseek_sparse_attention."""
    t = c["text_config"]
    t["linear_attn_config"] = {"num_heads": t.pop("linear_num_heads"), "head_dim": t.pop("linear_head_dim"),
                               "short_conv_kernel_size": t.pop("linear_conv_kernel_dim"),
                               "kda_layers": [i + 1 for i, x in enumerate(t["layer_types"]) if x == "linear_attention"],
                               "full_attn_layers": [i + 1 for i, x in enumerate(t["layer_types"]) if x != "linear_attention"]}
    t["layer_types"] = [x if x == "linear_attention" else "deepseek_sparse_attention" for x in t["layer_types"]]


family("glm5_next_remote", "Glm5NextConfig", FAMILIES["glm5_next"]["cfg"], "Glm5NextForConditionalGeneration",
       FAMILIES["glm5_next"]["per_rank"], wrong=r"layers\.2\.self_attn\.forget_gate\.A_log$", config_json=_glm5_remote_form)

GDN = [("linear_num_key_heads", "even"), ("linear_num_value_heads", "even")]
_gdn = _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
               linear_value_head_dim=16, linear_num_key_heads=4, linear_num_value_heads=8,
               layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
family("qwen3_next", "Qwen3NextConfig",
       dict(_gdn, moe_intermediate_size=IM, shared_expert_intermediate_size=IM, num_experts=8, num_experts_per_tok=2,
            decoder_sparse_step=1, mlp_only_layers=[0]),
       "Qwen3NextForCausalLM",
       GQA + GDN + [("moe_intermediate_size", "even"), ("shared_expert_intermediate_size", "even")],
       wrong=r"layers\.0\.linear_attn\.in_proj_qkvz\.weight$")
family("qwen3_5", "Qwen3_5TextConfig", _gdn, "Qwen3_5ForCausalLM", GQA + GDN,
       wrong=r"layers\.0\.linear_attn\.in_proj_qkv\.weight$")
family("qwen3_5_moe", "Qwen3_5MoeTextConfig",
       dict(_gdn, moe_intermediate_size=IM, shared_expert_intermediate_size=IM, num_experts=8, num_experts_per_tok=2),
       "Qwen3_5MoeForCausalLM",
       GQA + GDN + [("moe_intermediate_size", "even"), ("shared_expert_intermediate_size", "even")],
       wrong=r"layers\.3\.self_attn\.q_proj\.weight$")

family("gemma3", "Gemma3TextConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True),
       "Gemma3ForCausalLM", GQA)
family("gemma3_mm", "Gemma3Config", dict(
    text_config=_common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, query_pre_attn_scalar=16,
                        sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                       patch_size=14), mm_tokens_per_image=4, image_token_index=V - 1, boi_token_index=V - 3,
    eoi_token_index=V - 2), "Gemma3ForConditionalGeneration", [("text_config." + k, v) for k, v in GQA],
       wrong=r"layers\.1\.self_attn\.k_proj\.weight$")
family("phi3", "Phi3Config", _common(num_key_value_heads=4, num_hidden_layers=2), "Phi3ForCausalLM", GQA,
       wrong=r"layers\.0\.self_attn\.qkv_proj\.weight$")
family("mixtral", "MixtralConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, intermediate_size=IM, num_local_experts=8,
               num_experts_per_tok=2),
       "MixtralForCausalLM", GQA)
family("ernie4_5_moe", "Ernie4_5_MoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, moe_intermediate_size=IM, moe_num_experts=8, moe_k=2,
               moe_num_shared_experts=1, moe_layer_start_index=1, use_bias=False),
       "Ernie4_5_MoeForCausalLM", GQA + [("moe_intermediate_size", "even")])
family("gpt_oss", "GptOssConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, intermediate_size=IM, num_local_experts=8,
               num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
       "GptOssForCausalLM", GQA, wrong=r"layers\.0\.self_attn\.sinks$", rank0_bias=("down_proj_bias",))
# gpt-oss as published: experts in MXFP4 (blocks of 32 FP4 values, 16 bytes, and one E8M0 scale per block).
# intermediate 128 so that a rank's down_proj keeps whole blocks at T=4 (128 / 4 = 32).
family("gpt_oss_mxfp4", "GptOssConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, intermediate_size=128, num_local_experts=8,
               num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
       "GptOssForCausalLM", GQA, wrong=r"layers\.1\.mlp\.experts\.down_proj$", wrong_dim=1,
       rank0_bias=("down_proj_bias",), mxfp4=True)
family("minimax_m2", "MiniMaxM2Config",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, intermediate_size=IM, num_local_experts=8,
               num_experts_per_tok=2),
       "MiniMaxM2ForCausalLM", GQA, wrong=r"layers\.0\.self_attn\.q_norm\.weight$", global_norms=("q_norm", "k_norm"))
family("llama4", "Llama4TextConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, intermediate_size=IM, intermediate_size_mlp=I,
               num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=8),
       "Llama4ForCausalLM", GQA + [("intermediate_size_mlp", "even")],
       wrong=r"layers\.1\.feed_forward\.experts\.gate_up_proj$", wrong_dim=2)

# Llama 4 as published (Llama4ForConditionalGeneration): language_model.lm_head, the vision model whole
family("llama4_mm", "Llama4Config", dict(
    text_config=FAMILIES["llama4"]["cfg"],
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                       patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32,
                       intermediate_layers_indices=[0]), image_token_index=V - 1, boi_token_index=V - 3,
    eoi_token_index=V - 2), "Llama4ForConditionalGeneration",
       [("text_config." + k, v) for k, v in FAMILIES["llama4"]["per_rank"]],
       wrong=r"layers\.1\.feed_forward\.experts\.gate_up_proj$", wrong_dim=2, forward_via="language_model")


# dense variants of the llama shape under the llama plan, each with its own model code
_dense = dict(num_key_value_heads=4, num_hidden_layers=2, head_dim=16)
family("gemma", "GemmaConfig", _common(**_dense), "GemmaForCausalLM", GQA)
family("gemma2", "Gemma2Config", _common(**_dense, query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=5.0,
                                         final_logit_softcapping=3.0), "Gemma2ForCausalLM", GQA)
family("vaultgemma", "VaultGemmaConfig", _common(**_dense, query_pre_attn_scalar=16, sliding_window=8),
       "VaultGemmaForCausalLM", GQA)
family("granite", "GraniteConfig", _common(**dict(_dense, num_key_value_heads=2), embedding_multiplier=2.0,
                                           residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=4.0,
                                           attention_bias=True), "GraniteForCausalLM", GQA)
family("smollm3", "SmolLM3Config", _common(**dict(_dense, num_hidden_layers=4), no_rope_layer_interval=2),
       "SmolLM3ForCausalLM", GQA)
family("seed_oss", "SeedOssConfig", _common(**_dense, attention_bias=True, attention_out_bias=True),
       "SeedOssForCausalLM", GQA)
family("ministral", "MinistralConfig", _common(**_dense, sliding_window=8), "MinistralForCausalLM", GQA)
family("exaone4", "Exaone4Config", _common(**dict(_dense, num_hidden_layers=4), sliding_window=8,
                                           sliding_window_pattern=2), "Exaone4ForCausalLM", GQA)
family("cohere", "CohereConfig", _common(**_dense, logit_scale=0.5, tie_word_embeddings=True), "CohereForCausalLM", GQA)
family("cohere2", "Cohere2Config", _common(**_dense, sliding_window=8, logit_scale=0.5, tie_word_embeddings=True,
                                           layer_types=["sliding_attention", "full_attention"]), "Cohere2ForCausalLM", GQA)
family("cwm", "CwmConfig", _common(**_dense, sliding_window=8), "CwmForCausalLM", GQA)
family("ernie4_5", "Ernie4_5Config", _common(**_dense), "Ernie4_5ForCausalLM", GQA)
family("internlm3", "InternLM3Config", _common(**_dense), "LlamaForCausalLM", GQA)
family("iquestcoder", "IQuestCoderConfig", _common(**_dense), "LlamaForCausalLM", GQA)
family("sarvam_mla", "SarvamMLAConfig", _mla(), "DeepseekV3ForCausalLM", MLA, wrong=r"layers\.0\.self_attn\.q_b_proj\.weight$")


# --- dense families, more (issue 22) ---


def _rows(*leaves):
    """A patch= hook: the Linear modules whose last name is one of leaves are row-parallel (their
    input is the rank's slice; the output is summed over ranks and the bias added once), for the
    families that name their output projections otherwise (StarCoder2's c_proj, Phi's dense and fc2)."""
    def patch(model, T, r, allsum):
        import torch.nn.functional as F
        from torch import nn
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in leaves:
                def row(x, mod=mod):
                    y = allsum(F.linear(x, mod.weight))
                    return y + mod.bias if mod.bias is not None else y
                mod.forward = row
    return patch


family("olmo", "OlmoConfig", _common(**_dense, clip_qkv=0.5), "OlmoForCausalLM", GQA)
# OLMo 2/3: q_norm [H*hd] and k_norm [KV*hd] over all heads, split with the heads; olmo3 with KV heads in
# replicated groups at T=4 (2 KV heads), whose variance over all ranks counts each group T/KV times: the same mean
family("olmo2", "Olmo2Config", _common(**_dense), "Olmo2ForCausalLM", GQA,
       wrong=r"layers\.0\.self_attn\.q_norm\.weight$", global_norms=("q_norm", "k_norm"))
family("olmo3", "Olmo3Config", _common(**dict(_dense, num_key_value_heads=2), sliding_window=8,
                                       layer_types=["sliding_attention", "full_attention"]), "Olmo3ForCausalLM", GQA,
       wrong=r"layers\.1\.self_attn\.k_norm\.weight$", global_norms=("q_norm", "k_norm"))
family("starcoder2", "Starcoder2Config", _common(**_dense, use_bias=True, sliding_window=8), "Starcoder2ForCausalLM",
       GQA, wrong=r"layers\.0\.mlp\.c_fc\.weight$", patch=_rows("c_proj"))
family("glm", "GlmConfig", _common(**dict(_dense, num_key_value_heads=2), attention_bias=True), "GlmForCausalLM", GQA,
       wrong=r"layers\.0\.mlp\.gate_up_proj\.weight$")
family("glm4", "Glm4Config", _common(**dict(_dense, num_key_value_heads=2), attention_bias=True), "Glm4ForCausalLM",
       GQA, wrong=r"layers\.1\.mlp\.gate_up_proj\.weight$")
family("phi", "PhiConfig", _common(**dict(_dense, head_dim=8), partial_rotary_factor=0.5), "PhiForCausalLM", GQA,
       wrong=r"layers\.0\.mlp\.fc1\.weight$", patch=_rows("dense", "fc2"))
# helium: refused by the llama plan (its o_proj is built [D, D] whatever the rank's head count)
family("arcee", "ArceeConfig", _common(**_dense), "ArceeForCausalLM", GQA, wrong=r"layers\.0\.mlp\.up_proj\.weight$")
family("apertus", "ApertusConfig", _common(**_dense), "ApertusForCausalLM", GQA)
family("apertus1p5_text", "Apertus1p5TextConfig", _common(**_dense), "Apertus1p5TextForCausalLM", GQA)
family("hunyuan_v1_dense", "HunYuanDenseV1Config", _common(**_dense), "HunYuanDenseV1ForCausalLM", GQA)
family("nemotron", "NemotronConfig", _common(**_dense, partial_rotary_factor=0.5), "NemotronForCausalLM", GQA)
family("jais2", "Jais2Config", _common(**_dense, attention_bias=True, mlp_bias=True), "Jais2ForCausalLM", GQA,
       wrong=r"layers\.0\.mlp\.up_proj\.bias$")
family("hyperclovax", "HyperCLOVAXConfig", _common(**_dense, use_post_norm=True, embedding_multiplier=2.0,
                                                   residual_multiplier=0.5, attention_multiplier=0.1,
                                                   logits_scaling=4.0), "HyperCLOVAXForCausalLM", GQA)
family("ministral3", "Ministral3Config", _common(**_dense, sliding_window=8), "Ministral3ForCausalLM", GQA)
family("nanochat", "NanoChatConfig", _common(**_dense), "NanoChatForCausalLM", GQA, patch=_rows("fc2"))
# DiffLlama pairs head h with h + H/2 and V's first KV half with its second: 8 KV heads, so each half divides at T=4
family("diffllama", "DiffLlamaConfig", _common(**dict(_dense, num_key_value_heads=8)), "DiffLlamaForCausalLM", GQA)


# EXAONE 3: Llama's model code (LlamaForCausalLM) over EXAONE's own tensor names (transformer.h.N.attn.attention.*,
# mlp.c_fc_0/1, c_proj, ln_1/2, wte, ln_f), which save_pretrained writes and from_pretrained renames
family("exaone", "ExaoneConfig", _common(**_dense), "LlamaForCausalLM", GQA,
       wrong=r"layers\.0\.mlp\.gate_proj\.weight$")
family("granite_swa", "GraniteSWAConfig", _common(**dict(_dense, num_key_value_heads=2), sliding_window=8,
                                                 layer_types=["full_attention", "sliding_attention"],
                                                 embedding_multiplier=2.0, residual_multiplier=0.5,
                                                 attention_multiplier=0.1, logits_scaling=4.0),
       "GraniteSWAForCausalLM", GQA, wrong=r"layers\.0\.self_attn\.sinks$")

# dense MLA models under the deepseek plan (MLA attention, llama's MLP): uneven heads too
_dense_mla = _common(hidden_size=48, num_key_value_heads=6, num_attention_heads=6, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
                     qk_nope_head_dim=16, v_head_dim=16, head_dim=8, num_hidden_layers=2)
family("minicpm3", "MiniCPM3Config", dict(_dense_mla, scale_emb=2.0, scale_depth=1.4, dim_model_base=32),
       "MiniCPM3ForCausalLM", MLA[:3], ts=(2, 3, 4), wrong=r"layers\.0\.self_attn\.kv_b_proj\.weight$")
# Youtu zeroes its embedding's padding_idx row on load: pad_token_id None (its default), since local_config here keeps
# the source's pad_token_id on every rank (tpfs states the local index on the rank that holds it, null elsewhere)
family("youtu", "YoutuConfig", dict(_dense_mla, tie_word_embeddings=True, pad_token_id=None), "YoutuForCausalLM",
       MLA[:3], ts=(2, 3, 4),
       wrong=r"layers\.0\.self_attn\.q_b_proj\.weight$")

# Gemma 4 (dense): full-attention layers with their own head width (global_head_dim), per-layer embeddings whole
family("gemma4_text", "Gemma4TextConfig", _common(**_dense, global_head_dim=32, sliding_window=8,
                                                  layer_types=["sliding_attention", "full_attention"],
                                                  vocab_size_per_layer_input=V, hidden_size_per_layer_input=16,
                                                  tie_word_embeddings=True),
       "Gemma4ForCausalLM", GQA, wrong=r"layers\.1\.self_attn\.q_proj\.weight$")
# Gemma 4 unified's text model: Gemma 4's attention and MLP classes (modular_gemma4_unified.py), its full-attention
# layers' head width from global_head_dim, no per-layer embeddings
family("gemma4_unified_text", "Gemma4UnifiedTextConfig", _common(**_dense, global_head_dim=32, sliding_window=8,
                                                                  layer_types=["sliding_attention", "full_attention"],
                                                                  tie_word_embeddings=True),
       "Gemma4UnifiedForCausalLM", GQA, wrong=r"layers\.1\.self_attn\.q_proj\.weight$")


# --- mixture-of-experts families, more (issue 22) ---
# dots1: GLM-4.5's names (per-expert experts, shared_experts, gate.e_score_correction_bias, q/k norms per head)
family("dots1", "Dots1Config",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, moe_intermediate_size=IM, n_routed_experts=8,
               num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1),
       "Dots1ForCausalLM", GQA + [("moe_intermediate_size", "even")])
_g4lite = _mla(mlp_layer_types=["dense", "sparse", "sparse"])
del _g4lite["first_k_dense_replace"]
family("glm4_moe_lite", "Glm4MoeLiteConfig", _g4lite, "Glm4MoeLiteForCausalLM", MLA, ts=(2, 3, 4),
       wrong=r"layers\.0\.self_attn\.kv_b_proj\.weight$")
# Mistral 4: MLA, experts saved fused (experts.gate_up_proj [E, 2I, D], experts.down_proj [E, D, I])
family("mistral4", "Mistral4Config", _mla(), "Mistral4ForCausalLM", MLA, ts=(2, 3, 4),
       wrong=r"layers\.1\.mlp\.experts\.gate_up_proj$", wrong_dim=1)
# Phi-3.5-MoE: Mixtral's names, LayerNorms with biases, attention and lm_head biases
family("phimoe", "PhimoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, intermediate_size=IM, num_local_experts=8,
               num_experts_per_tok=2, attention_bias=True, lm_head_bias=True),
       "PhimoeForCausalLM", GQA)


def _gathered_qk_norms(model, T, r, allsum):
    """OLMoE: q_norm [hidden_size] and k_norm [(hidden_size / H) * KV] are whole on every rank (the model
    code sizes them so): gather q (k) from every rank, normalize the whole, keep this rank's slice."""
    import torch
    import torch.distributed as dist
    for name, mod in model.named_modules():
        if name.rsplit(".", 1)[-1] in ("q_norm", "k_norm"):
            orig = mod.forward

            def gathered(x, orig=orig):
                x = x.contiguous()
                parts = [torch.empty_like(x) for _ in range(T)]
                dist.all_gather(parts, x)
                w = x.shape[-1]
                return orig(torch.cat(parts, dim=-1))[..., r * w:(r + 1) * w]
            mod.forward = gathered


family("olmoe", "OlmoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, intermediate_size=IM, num_experts=8, num_experts_per_tok=2),
       "OlmoeForCausalLM", GQA, wrong=r"layers\.0\.self_attn\.k_proj\.weight$", patch=_gathered_qk_norms)
# FlexOlmo: OLMo-2's post-norms, q_norm [H*hd] / k_norm [KV*hd] split with their heads (variance all-reduced)
family("flex_olmo", "FlexOlmoConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, intermediate_size=IM, num_experts=8, num_experts_per_tok=2),
       "FlexOlmoForCausalLM", GQA, wrong=r"layers\.0\.self_attn\.q_norm\.weight$", global_norms=("q_norm", "k_norm"))
# Sarvam MoE: GLM-4.5's model code (Glm4MoeForCausalLM) on its own names: a fused attention.query_key_value, 2 KV
# heads (replicated groups at T=4), attention.dense, query/key_layernorm, word_embeddings, gate.expert_bias
family("sarvam_moe", "SarvamMoEConfig",
       _common(num_key_value_heads=2, num_hidden_layers=2, head_dim=16, moe_intermediate_size=IM, n_routed_experts=8,
               num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1),
       "Glm4MoeForCausalLM", GQA + [("moe_intermediate_size", "even")],
       wrong=r"layers\.0\.self_attn\.k_proj\.weight$")


def _longcat_identity_once(model, T, r, allsum):
    """LongCat-Flash: the zero-computation experts return their (replicated) input times the routing weight
    inside the experts module, whose output is all-reduced: only rank 0 adds that share."""
    import torch
    for name, mod in model.named_modules():
        if name.endswith("experts.identity_expert") and r != 0:
            mod.forward = lambda x: torch.zeros_like(x)


_longcat = _mla(num_layers=2, ffn_hidden_size=I, expert_ffn_hidden_size=IM, n_routed_experts=8, zero_expert_num=2,
                moe_topk=2, routed_scaling_factor=1.0, head_dim=8)
for _k in ("num_hidden_layers", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "intermediate_size",
           "num_experts_per_tok"):
    _longcat.pop(_k, None)
family("longcat_flash", "LongcatFlashConfig", _longcat, "LongcatFlashForCausalLM",
       [("num_attention_heads", "uneven"), ("num_key_value_heads", "same_as:num_attention_heads"),
        ("ffn_hidden_size", "even"), ("expert_ffn_hidden_size", "even")],
       wrong=r"layers\.0\.self_attn\.1\.kv_b_proj\.weight$", patch=_longcat_identity_once)


def _dsv4_rows(model, T, r, allsum):
    """DeepSeek-V4: the grouped output projection's o_b_proj is row-parallel over the rank's groups; the
    embedding and head are whole, so the generic vocab-parallel hooks are undone."""
    import torch.nn.functional as F
    for name, mod in model.named_modules():
        if name.endswith("self_attn.o_b_proj"):
            mod.forward = lambda x, mod=mod: allsum(F.linear(x, mod.weight))
        elif name.endswith(("embed_tokens", "lm_head")) and "forward" in mod.__dict__:
            del mod.forward  # whole vocabulary on every rank (the hash router's tid2eid needs it): the plain forward


# DeepSeek-V4: one shared KV head, query heads split with their sinks, the grouped output projection by groups,
# hyper-connections, compressor and indexer whole; sliding, compressed-sparse and heavily-compressed layers, hash and
# top-k routing
family("deepseek_v4", "DeepseekV4Config",
       _common(num_key_value_heads=1, num_hidden_layers=4, head_dim=16, q_lora_rank=32, moe_intermediate_size=IM,
               n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, o_groups=4, o_lora_rank=16,
               index_n_heads=4, index_head_dim=16, index_topk=4, hc_mult=2, sliding_window=8,
               compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
               layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                            "compressed_sparse_attention"],
               mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"]),
       "DeepseekV4ForCausalLM", [("num_attention_heads", "even"), ("o_groups", "even"),
                                 ("moe_intermediate_size", "even"), ("vocab_size", "same_as:vocab_size")],
       wrong=r"layers\.0\.self_attn\.o_a_proj\.weight$", patch=_dsv4_rows)
# A.X-K1: DeepSeek-V3 with a post_mlp_layernorm on the MoE output (after the experts' all-reduce)
family("axk1", "AXK1Config", _mla(mlp_layer_types=["dense", "sparse", "sparse"]), "AXK1ForCausalLM", MLA,
       ts=(2, 3, 4), wrong=r"layers\.0\.self_attn\.q_b_proj\.weight$")
# Cohere 2 MoE: a dense prefix layer on its own intermediate size, shared experts averaged with the routed ones
family("cohere2_moe", "Cohere2MoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, intermediate_size=IM, num_experts=8,
               num_experts_per_tok=2, num_shared_experts=1, prefix_dense_intermediate_size=I, sliding_window=8,
               logit_scale=0.5, tie_word_embeddings=True, layer_types=["sliding_attention", "full_attention"] * 2,
               mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
       "Cohere2MoeForCausalLM", GQA + [("prefix_dense_intermediate_size", "even")],
       wrong=r"layers\.0\.mlp\.gate_proj\.weight$")
family("hy_v3", "HYV3Config",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, moe_intermediate_size=IM, num_experts=8,
               num_experts_per_tok=2, num_shared_experts=1, mlp_layer_types=["dense", "sparse"]),
       "HYV3ForCausalLM", GQA + [("moe_intermediate_size", "even")])
# MiMo-V2-Flash: v_head_dim < head_dim, sliding layers with 2x the KV heads and sinks (saved as attention_sink_bias)
family("mimo_v2_flash", "MiMoV2FlashConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=24, v_head_dim=16, moe_intermediate_size=IM,
               n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, sliding_window=8,
               layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
               mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
       "MiMoV2FlashForCausalLM", [("num_attention_heads", "even"), ("num_key_value_heads", "even"),
                                  ("intermediate_size", "even"), ("moe_intermediate_size", "even")],
       wrong=r"layers\.1\.self_attn\.sinks$")
# K-EXAONE: EXAONE 4's attention (no head_dim in its config: the width comes from hidden / heads), DeepSeek-style experts
family("exaone_moe", "ExaoneMoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, moe_intermediate_size=IM, num_experts=8, num_experts_per_tok=2,
               num_shared_experts=1, sliding_window=8, sliding_window_pattern=2,
               mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
       "ExaoneMoeForCausalLM", GQA + [("moe_intermediate_size", "even")])
family("solar_open", "SolarOpenConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, moe_intermediate_size=IM, n_routed_experts=8,
               num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1),
       "SolarOpenForCausalLM", GQA + [("moe_intermediate_size", "even")])
family("afmoe", "AfmoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, moe_intermediate_size=IM, num_experts=8,
               num_experts_per_tok=2, num_shared_experts=2, num_dense_layers=1, global_attn_every_n_layers=2,
               sliding_window=8),
       "AfmoeForCausalLM", GQA + [("moe_intermediate_size", "even")], wrong=r"layers\.0\.self_attn\.gate_proj\.weight$")


def _lightning_norm(model, T, r, allsum):
    """MiniMax-Text-01's lightning attention: self_attn.norm normalizes over all heads; each rank holds its
    heads' channels, so the sum of squares and the count are all-reduced (the final model.norm is whole)."""
    import torch
    for name, mod in model.named_modules():
        if name.endswith("self_attn.norm"):
            w, eps = mod.weight.shape[0], mod.variance_epsilon

            def gnorm(x, mod=mod, w=w, eps=eps):  # in float32, as MiniMaxRMSNorm
                x32 = x.to(torch.float32)
                ss = allsum(x32.pow(2).sum(-1, keepdim=True))
                n = allsum(torch.tensor([float(w)]))
                return mod.weight * (x32 * torch.rsqrt(ss / n + eps)).to(x.dtype)
            mod.forward = gnorm


family("minimax", "MiniMaxConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, intermediate_size=IM, num_local_experts=8,
               num_experts_per_tok=2, block_size=8,
               layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
       "MiniMaxForCausalLM", GQA, wrong=r"layers\.0\.self_attn\.qkv_proj\.weight$", patch=_lightning_norm)
# Phi-3 with fewer KV heads than T at T=4 (4 heads, 2 KV heads): the fused qkv_proj's K and V blocks in replicated groups
family("phi3_gqa", "Phi3Config", _common(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2),
       "Phi3ForCausalLM", GQA, wrong=r"layers\.0\.self_attn\.qkv_proj\.weight$")


def _granite_shared_rows(model, T, r, allsum):
    """Granite MoE's shared MLP: output_linear is row-parallel (the generic hooks know it as down_proj only)."""
    import torch.nn.functional as F
    for name, mod in model.named_modules():
        if name.endswith("shared_mlp.output_linear"):
            mod.forward = lambda x, mod=mod: allsum(F.linear(x, mod.weight))


_granite_moe = dict(num_key_value_heads=4, num_hidden_layers=2, intermediate_size=IM, num_local_experts=8,
                    num_experts_per_tok=2, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1,
                    logits_scaling=4.0)
family("granitemoe", "GraniteMoeConfig", _common(**_granite_moe), "GraniteMoeForCausalLM", GQA,
       wrong=r"layers\.1\.block_sparse_moe\.experts\.gate_up_proj$", wrong_dim=1)
family("granitemoeshared", "GraniteMoeSharedConfig", _common(**_granite_moe, shared_intermediate_size=IM),
       "GraniteMoeSharedForCausalLM", GQA + [("shared_intermediate_size", "even")],
       wrong=r"layers\.0\.shared_mlp\.input_linear\.weight$", patch=_granite_shared_rows)
family("granitemoe_swa", "GraniteMoeSWAConfig",
       _common(**_granite_moe, shared_intermediate_size=IM, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"]),
       "GraniteMoeSWAForCausalLM", GQA + [("shared_intermediate_size", "even")],
       wrong=r"layers\.0\.self_attn\.sinks$", patch=_granite_shared_rows)
family("hunyuan_v1_moe", "HunYuanMoEV1Config",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, intermediate_size=IM, num_experts=8, moe_topk=2),
       "HunYuanMoEV1ForCausalLM", GQA)



# --- SSM hybrids and vision-language families (issue 22) ---

# Vision-language composites as served: the language model split by its text plan, the vision tower and its merger
# (projector) whole. Text-only forwards (the tower is loaded strictly, not run). Qwen2-VL / Qwen2.5-VL save the
# published layout (model.layers..., visual.*); Qwen3-VL nests model.language_model / model.visual.
_VL = [("text_config." + k, v) for k, v in GQA]
_qvl_text = _common(num_key_value_heads=2, num_hidden_layers=2, rope_parameters=dict(
    rope_type="default", rope_theta=10000.0, mrope_section=[1, 1, 2]))
def _attention_head_dim_from_config(module_name, cls_name):
    """Qwen2-VL's, Qwen2.5-VL's and GLM-4.1V's text attention derive head_dim as hidden_size / num_attention_heads, which at a
    rank's head count (4 of 8) is twice the width of the rank's heads; their rotary embedding already honours
    config.head_dim. A tensor-parallel engine keeps the global width (vLLM: hidden_size / total heads), and a rank's
    config.json states it (head_dim, tpfs's per-rank value). So that the local-size model is built from the
    rank's config.json as it is, the attention takes config.head_dim where the config has one and it differs (the
    unsplit model's config has none: unchanged); the projections are rebuilt at that width, the rest is the
    model code."""
    import importlib
    from torch import nn
    cls = getattr(importlib.import_module(module_name), cls_name)
    if getattr(cls, "_tpfs_head_dim", False):
        return
    orig = cls.__init__

    def init(self, config, layer_idx=None):
        orig(self, config, layer_idx)
        hd = getattr(config, "head_dim", None)
        if hd and hd != self.head_dim:
            self.head_dim, self.scaling = hd, hd ** -0.5
            H, KV, Dm = self.num_heads, self.num_key_value_heads, self.hidden_size
            self.q_proj = nn.Linear(Dm, H * hd, bias=True)
            self.k_proj = nn.Linear(Dm, KV * hd, bias=True)
            self.v_proj = nn.Linear(Dm, KV * hd, bias=True)
            self.o_proj = nn.Linear(H * hd, Dm, bias=False)
    cls.__init__ = init
    cls._tpfs_head_dim = True


def _qwen2_vl_patches():
    _attention_head_dim_from_config("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLAttention")
    _attention_head_dim_from_config("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLAttention")
    _attention_head_dim_from_config("transformers.models.glm4v.modeling_glm4v", "Glm4vTextAttention")


_qwen2_vl_patches()


family("qwen2_vl", "Qwen2VLConfig", dict(text_config=_qvl_text, vision_config=dict(
    depth=1, embed_dim=32, hidden_size=D, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2)),
       "Qwen2VLForConditionalGeneration", _VL, wrong=r"layers\.1\.self_attn\.k_proj\.weight$")
family("qwen2_5_vl", "Qwen2_5_VLConfig", dict(text_config=_qvl_text, vision_config=dict(
    depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=D, fullatt_block_indexes=[1])),
       "Qwen2_5_VLForConditionalGeneration", _VL, wrong=r"layers\.0\.self_attn\.v_proj\.weight$")
_q3vl_text = _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, rope_parameters=dict(
    rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3], mrope_interleaved=True))
_q3vl_vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=D,
                    deepstack_visual_indexes=[0], num_position_embeddings=16)
family("qwen3_vl", "Qwen3VLConfig", dict(text_config=_q3vl_text, vision_config=_q3vl_vision),
       "Qwen3VLForConditionalGeneration", _VL, wrong=r"layers\.0\.self_attn\.q_proj\.weight$")
family("qwen3_vl_moe", "Qwen3VLMoeConfig", dict(text_config=dict(
    _q3vl_text, moe_intermediate_size=IM, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
    mlp_only_layers=[0]), vision_config=_q3vl_vision), "Qwen3VLMoeForConditionalGeneration",
       _VL + [("text_config.moe_intermediate_size", "even")],
       wrong=r"layers\.1\.mlp\.experts\.gate_up_proj$", wrong_dim=1)
# GLM-4.1V (Glm4v) and GLM-OCR: the GLM-4 text model (fused gate_up_proj, sandwich norms, partial multimodal rotary)
_glm_text = _common(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, rope_parameters=dict(
    rope_type="default", rope_theta=10000.0, mrope_section=[1, 1, 2], partial_rotary_factor=0.5))
_glm_vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=D)
family("glm4v", "Glm4vConfig", dict(text_config=_glm_text, vision_config=_glm_vision),
       "Glm4vForConditionalGeneration", _VL, wrong=r"layers\.0\.mlp\.gate_up_proj\.weight$")
family("glm_ocr", "GlmOcrConfig", dict(text_config=dict(_glm_text, head_dim=16), vision_config=_glm_vision),
       "GlmOcrForConditionalGeneration", _VL, wrong=r"layers\.1\.self_attn\.q_proj\.weight$")
family("glm4v_moe", "Glm4vMoeConfig", dict(text_config=dict(
    _glm_text, head_dim=16, moe_intermediate_size=IM, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
    first_k_dense_replace=1, n_group=1, topk_group=1, num_hidden_layers=3), vision_config=_glm_vision),
       "Glm4vMoeForConditionalGeneration", _VL + [("text_config.moe_intermediate_size", "even")],
       wrong=r"layers\.2\.mlp\.experts\.gate_up_proj$", wrong_dim=1)


# Granite-Docling: Granite's text model (multipliers, tied embeddings) under model.text_model, the vision model and
# its connector (model.vision_model.*) whole
family("granite_docling", "GraniteDoclingConfig", dict(
    text_config=_common(num_key_value_heads=2, num_hidden_layers=2, tie_word_embeddings=True, embedding_multiplier=2.0,
                        residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=4.0),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                       patch_size=8, out_hidden_size=D, scale_factor=2, deepstack_visual_indexes=[0]),
    image_token_id=V - 1, pad_token_id=0), "GraniteDoclingForConditionalGeneration", _VL,
       wrong=r"text_model\.layers\.0\.self_attn\.v_proj\.weight$")
family("hunyuan_vl", "HunYuanVLConfig", dict(
    text_config=_common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, tie_word_embeddings=True,
                        rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 2, 2, 2])),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       out_hidden_size=D, text_hidden_size=D, patch_size=8),
    image_token_id=V - 1, im_start_id=V - 2, im_end_id=V - 3, im_newline_id=V - 4, pad_token_id=0),
       "HunYuanVLForConditionalGeneration", _VL, wrong=r"layers\.1\.self_attn\.q_proj\.weight$")


# Mamba2 hybrids (plan mamba2). The rank's Mamba2 mixer is the model code's at the rank's head and group counts;
# the hooks a TP engine adds: the vocab-parallel embedding under Nemotron-H's name (backbone.embeddings), the
# gated norm's mean square reduced over the ranks that share a group when the checkpoint has fewer groups than
# ranks (the local model holds one group, a 1/(T/G) slice of it), the row-parallel outputs (out_proj, o_proj,
# down_proj) summed by tp_patch.
def _vocab_parallel(mod, r, allsum):
    n = mod.weight.shape[0]
    orig = mod.forward

    def emb(ids, orig=orig, n=n):
        loc = ids - r * n
        miss = (loc < 0) | (loc >= n)
        return allsum(orig(loc.masked_fill(miss, 0)).masked_fill(miss[..., None], 0.0))
    mod.forward = emb


def _gated_norm_over_ranks(mod, G, T, r, allsum):
    """A Mamba2 gated RMSNorm (norm(x * silu(gate)) in groups) whose G global groups are fewer than T ranks: rank r
    holds a slice of group floor(r / (T / G)); the group's mean square is the sum over its ranks' slices."""
    import torch
    import torch.nn.functional as F
    n_loc = mod.weight.shape[0]
    g = r // (T // G)

    before = getattr(mod, "norm_before_gate", False)  # Falcon-H1: norm(x) * silu(gate)

    def fwd(x, gate=None, mod=mod):
        dt = x.dtype
        x = x.to(torch.float32)
        if gate is not None and not before:
            x = x * F.silu(gate.to(torch.float32))
        part = torch.zeros(*x.shape[:-1], G, dtype=x.dtype)
        part[..., g] = x.pow(2).sum(-1)
        ms = allsum(part)[..., g:g + 1] / (n_loc * (T // G))
        if before:
            y = mod.weight * (x * torch.rsqrt(ms + mod.variance_epsilon))
            return (y * F.silu(gate.to(torch.float32)) if gate is not None else y).to(dt)
        return mod.weight * (x * torch.rsqrt(ms + mod.variance_epsilon)).to(dt)
    mod.forward = fwd


def _mamba2_patch(G):
    """The family's TP hook; G: the checkpoint's (global) number of SSM groups."""
    def patch(model, T, r, allsum):
        from torch import nn
        for name, mod in model.named_modules():
            if name.endswith("embeddings") and isinstance(mod, nn.Embedding):
                _vocab_parallel(mod, r, allsum)
            elif type(mod).__name__.endswith("RMSNormGated") and G < T:
                _gated_norm_over_ranks(mod, G, T, r, allsum)
    return patch


_nemo = _common(num_key_value_heads=4, head_dim=16, num_hidden_layers=4, layers_block_type=["mamba", "moe", "attention", "mlp"],
                mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, conv_kernel=4, chunk_size=8, use_mamba_kernels=False,
                time_step_limit=[0.0, 1000.0],
                moe_intermediate_size=IM, moe_shared_expert_intermediate_size=IM, n_routed_experts=8, num_experts_per_tok=2,
                n_group=1, topk_group=1)
family("nemotron_h", "NemotronHConfig", dict(_nemo, n_groups=4), "NemotronHForCausalLM",
       GQA + [("mamba_num_heads", "even"), ("n_groups", "groups"), ("moe_intermediate_size", "even"),
              ("moe_shared_expert_intermediate_size", "even")],
       wrong=r"layers\.0\.mixer\.in_proj\.weight$", patch=_mamba2_patch(4))
# one SSM group (Nemotron-H 4B's, Bamba's and Granite 4.0's layout): B and C whole on every rank, the gated norm
# spans every rank; the wrong split: the norm's weight
family("nemotron_h_1group", "NemotronHConfig", dict(_nemo, n_groups=1), "NemotronHForCausalLM",
       FAMILIES["nemotron_h"]["per_rank"], wrong=r"layers\.0\.mixer\.norm\.weight$", patch=_mamba2_patch(1))


def _granite_hybrid_patch(G):
    """Granite 4.0: the Mamba2 hooks, and its experts' and shared MLP's row-parallel output_linear summed over ranks."""
    base = _mamba2_patch(G)

    def patch(model, T, r, allsum):
        base(model, T, r, allsum)
        for name, mod in model.named_modules():
            if name.endswith(("block_sparse_moe.output_linear", "shared_mlp.output_linear")):
                mod.register_forward_hook(lambda m, a, out: allsum(out))
    return patch


# Bamba and Granite 4.0: mamba_expand 4 (I = 4 * 64) so that a rank's mamba_expand (4 / T) is whole at T=2 and 4
# (the published expand 2 is served at T=2 and refused at T=4 by name)
_bamba_ssm = dict(mamba_expand=4, mamba_n_heads=8, mamba_d_head=32, mamba_d_state=16, mamba_d_conv=4,
                  mamba_chunk_size=8, time_step_limit=[0.0, 1000.0])
_SSM = [("mamba_n_heads", "even"), ("mamba_n_groups", "groups"), ("mamba_expand", "even")]
family("bamba", "BambaConfig", _common(num_key_value_heads=4, num_hidden_layers=2, attn_layer_indices=[1],
                                       mamba_n_groups=1, **_bamba_ssm),
       "BambaForCausalLM", GQA + _SSM, wrong=r"layers\.0\.mamba\.conv1d\.weight$", patch=_mamba2_patch(1))
family("granitemoehybrid", "GraniteMoeHybridConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, layer_types=["mamba", "attention"], mamba_n_groups=2,
               intermediate_size=IM, shared_intermediate_size=I, num_local_experts=4, num_experts_per_tok=2,
               embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=4.0,
               **_bamba_ssm),
       "GraniteMoeHybridForCausalLM", GQA + _SSM + [("shared_intermediate_size", "even")],
       wrong=r"layers\.0\.mamba\.in_proj\.weight$", patch=_granite_hybrid_patch(2))
# Falcon-H1: mamba_d_ssm states the mixer's width; the gated norm on (normalised before the gate, one group spanning
# every rank) and muP multipliers that differ per segment of in_proj (the rank's mup_vector comes from its config)
family("falcon_h1", "FalconH1Config",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, mamba_d_ssm=128, mamba_n_heads=8,
               mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=8,
               mamba_rms_norm=True, mamba_norm_before_gate=True, time_step_limit=[0.0, 1000.0],
               ssm_multipliers=[0.5, 1.5, 0.7, 1.3, 2.0], mlp_multipliers=[1.5, 0.5], key_multiplier=0.8,
               embedding_multiplier=2.0, lm_head_multiplier=0.5, attention_out_multiplier=0.7,
               attention_in_multiplier=1.2, ssm_out_multiplier=0.9, ssm_in_multiplier=1.1),
       "FalconH1ForCausalLM", GQA + [("mamba_n_heads", "even"), ("mamba_n_groups", "groups"), ("mamba_d_ssm", "even")],
       wrong=r"layers\.1\.mamba\.in_proj\.weight$", patch=_mamba2_patch(1))


# Jamba: Mamba v1 mixers split by channel; x_proj's partial sums reduced before dt/B/C (the hook), out_proj by tp_patch
def _jamba_patch(model, T, r, allsum):
    for name, mod in model.named_modules():
        if name.endswith("mamba.x_proj"):
            mod.register_forward_hook(lambda m, a, out: allsum(out))


family("jamba", "JambaConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, mamba_expand=4, mamba_d_state=16, mamba_d_conv=4,
               mamba_dt_rank=8, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
               num_experts=4, num_experts_per_tok=2, use_mamba_kernels=False),
       "JambaForCausalLM", GQA + [("mamba_expand", "even")], wrong=r"layers\.0\.mamba\.x_proj\.weight$", wrong_dim=1,
       patch=_jamba_patch)


# --- issue 30: the newest families ---

# Cosmos3 Edge: llama GQA with a relu2 MLP (fc1 / fc2, saved as mlp.up_proj / down_proj), saved by the composite as
# to_q / to_k / to_v / to_out at the root; the vision tower and projector whole. Proves cosmos3_edge_text too.
family("cosmos3_edge", "Cosmos3EdgeConfig", dict(
    text_config=_common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, rope_parameters=dict(
        rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
    projector_hidden_size=64), "Cosmos3EdgeForConditionalGeneration", _VL,
       wrong=r"language_model\.layers\.0\.self_attn\.k_proj\.weight$", patch=_rows("fc2"))

# HY V4: DeepSeek-V3.2's MLA and DSA indexer (whole, some layers sharing the previous indexer), a per-head sigmoid
# output gate (saved as self_attn.linear_gate) and one attention sink per head (learnable_sink_param) split with the
# heads, hyper-connections whole; dense MLP and shared expert with linear_gate as the gate projection
_hy4 = _mla(num_hidden_layers=4, index_topk=8, index_head_dim=16, index_n_heads=4, hc_mult=2,
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
del _hy4["first_k_dense_replace"], _hy4["num_key_value_heads"]
family("hy_v4", "HYV4Config", _hy4, "HYV4ForCausalLM", MLA, ts=(2, 3, 4),
       wrong=r"layers\.1\.self_attn\.gate_proj\.weight$")
# HY V4 VL: the same text model under model.language_model (hc_head under its own name), the vision tower whole.
# Proves hy_v4_vl_text.
family("hy_v4_vl", "HYV4VLConfig", dict(
    text_config=dict(_hy4, rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1])),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       out_hidden_size=D), image_token_id=V - 1, video_token_id=V - 2),
       "HYV4VLForConditionalGeneration", [("text_config." + k, v) for k, v in MLA],
       wrong=r"layers\.2\.self_attn\.sinks$")

# Mistral Large 4: MLA without q-LoRA on Mistral's own names (attention.wq, wkv_a_with_mqa, kv_a_norm, wkv_b, wo),
# per-head softmax scaling (ssmax_scaling) with the heads, the DSA indexer and LeRoPE's alpha whole; a NoPE layer
# (its kv_b_proj wider by the rope width: layer 3, every 4th by default) and a layer reusing another's KV (no kv_a:
# layer 2 reads layer 1's), routed and shared experts. Proves mistral_large4_text.
_ml4 = dict(_mla(num_hidden_layers=4, index_topk=8, index_head_dim=16, index_n_heads=4, kv_source_layers=[0, 1, 1, 3],
                 first_k_dense_replace=1), rope_parameters=dict(rope_type="default", rope_theta=10000.0))
del _ml4["q_lora_rank"]
family("mistral_large4", "MistralLarge4Config", dict(
    text_config=_ml4, vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                         head_dim=16), image_token_index=V - 1),
       "MistralLarge4ForConditionalGeneration", [("text_config." + k, v) for k, v in MLA], ts=(2, 3, 4),
       wrong=r"layers\.3\.self_attn\.kv_b_proj\.weight$")

# MiniMax-M3 (text): GQA with per-head q/k norms and partial rotary, the block-sparse indexer (its query heads, one
# per KV group, split in the KV groups; its single key head whole; blocks of 4 keys so that the selection bites at
# 16 tokens), fused routed experts, a shared expert and a dense MLP with fused gate_up_proj in segments
_mm3 = _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, rotary_dim=8, intermediate_size=IM,
               dense_intermediate_size=I, shared_intermediate_size=IM, num_local_experts=8, num_experts_per_tok=2,
               index_n_heads=4, index_head_dim=16, index_block_size=4, index_topk_blocks=2, index_local_blocks=1,
               layer_types=["full_attention", "minimax_m3_sparse", "full_attention", "minimax_m3_sparse"],
               mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
family("minimax_m3_vl_text", "MiniMaxM3VLTextConfig", _mm3, "MiniMaxM3VLForCausalLM",
       GQA + [("index_n_heads", "groups"), ("dense_intermediate_size", "even"), ("shared_intermediate_size", "even")],
       wrong=r"layers\.1\.self_attn\.indexer\.q_proj\.weight$")
# MiniMax-M3 as published (MiniMaxM3SparseForConditionalGeneration): language_model.model.* with the original names
# (block_sparse_moe.experts.N.w1/w2/w3, self_attn.index_q_proj, dense mlp.gate_proj / up_proj), the vision tower and
# projectors whole
family("minimax_m3_vl", "MiniMaxM3VLConfig", dict(
    text_config=_mm3, vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
    projector_hidden_size=64, image_token_index=V - 1, video_token_index=V - 2),
       "MiniMaxM3SparseForConditionalGeneration",
       [("text_config." + k, v) for k, v in FAMILIES["minimax_m3_vl_text"]["per_rank"]],
       wrong=r"layers\.0\.mlp\.gate_up_proj\.weight$")



def _lfm_conv_whole(model, T, r, allsum):
    """LFM2 / LFM3: the short-conv blocks are whole on every rank (the model code sizes them by hidden_size), so
    their out_proj is not row-parallel: the generic out_proj hook is undone there (the attention's stays)."""
    for name, mod in model.named_modules():
        if name.endswith("conv.out_proj") and "forward" in mod.__dict__:
            del mod.forward


# LFM2: short-conv layers whole, GQA attention (out_proj row-parallel, q/k layernorms per head whole), SwiGLU w1/w3/w2
# whose width the model derives from intermediate_size (2/3, rounded up to block_multiple_of: 96 -> 64, and a rank's
# 48 -> 32 at T=2, 24 -> 16 at T=4); no head_dim in its config (a rank's config states it)
_lfm_types = ["conv", "full_attention", "conv", "full_attention"]
family("lfm2", "Lfm2Config", _common(num_key_value_heads=4, num_hidden_layers=4, layer_types=_lfm_types,
                                     block_multiple_of=8, conv_L_cache=3),
       "Lfm2ForCausalLM", GQA, wrong=r"layers\.1\.self_attn\.out_proj\.weight$", wrong_dim=1, patch=_lfm_conv_whole)
# LFM3: as LFM2, with a per-head sigmoid attention gate (saved as self_attn.gate_proj) split with the heads, sandwich
# norms, sliding-window layers and an MLP on intermediate_size as is
family("lfm3", "Lfm3Config", _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, sliding_window=8,
                                     layer_types=["conv", "sliding_attention", "conv", "full_attention"]),
       "Lfm3ForCausalLM", GQA, wrong=r"layers\.3\.self_attn\.g_proj\.weight$", patch=_lfm_conv_whole)
# LFM2-MoE: LFM2's conv and attention, a dense first layer on intermediate_size, routed experts (per expert on disk)
# on moe_intermediate_size, router and expert_bias whole. Its config never fills layer_types (given here)
family("lfm2_moe", "Lfm2MoeConfig", _common(num_key_value_heads=4, num_hidden_layers=4, layer_types=_lfm_types,
                                            moe_intermediate_size=IM, num_experts=8, num_experts_per_tok=2,
                                            num_dense_layers=1),
       "Lfm2MoeForCausalLM", GQA + [("moe_intermediate_size", "even")],
       wrong=r"layers\.0\.feed_forward\.w1\.weight$", patch=_lfm_conv_whole)
# Ling 3 (bailing_hybrid): KDA layers (q/k/v and their convs, the full-rank forget gate f_proj and dt_bias per channel,
# b_proj and A_log per head, the output gate g_proj, o_norm per head whole, saved as attention.*, the output as
# attention.dense) and MLA layers with one sigmoid gate per head (attention.g_proj [H, D]), the two kinds sharing names
# and told apart by layer_types; DeepSeek-style routed and shared experts. The KDA head count is num_attention_heads
# (configuration_bailing_hybrid.py __post_init__), so it splits with the MLA heads
_bh = _mla(num_hidden_layers=4, head_dim=16, q_lora_rank=None, num_experts=8, first_k_dense_replace=1,
           layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
del _bh["n_routed_experts"]
family("bailing_hybrid", "BailingHybridConfig", _bh, "BailingHybridForCausalLM",
       MLA + [("linear_num_heads", "same_as:num_attention_heads")],
       wrong=r"layers\.0\.self_attn\.forget_gate\.f_proj\.weight$")


def _bailing_underived(c):
    """A Ling config.json without the keys the config class derives (linear_num_heads = num_attention_heads,
    linear_head_dim = head_dim before head_dim becomes the rope width): head_dim is the KDA head width there."""
    c["head_dim"] = c.pop("linear_head_dim")
    del c["linear_num_heads"], c["linear_conv_kernel_dim"]


family("bailing_hybrid_underived", "BailingHybridConfig", _bh, "BailingHybridForCausalLM",
       FAMILIES["bailing_hybrid"]["per_rank"], wrong=r"layers\.2\.self_attn\.forget_gate\.A_log$",
       config_json=_bailing_underived)
# OLMo hybrid: OLMo 3's attention (q_norm [H*hd] and k_norm [KV*hd] over all heads, split with them) and Gated
# DeltaNet layers (q/k and their convs by key heads, v/g/a/b/A_log/dt_bias and o_proj by value heads, o_norm per head
# whole). 4 key heads of 32 and 8 value heads of 16 (each key head serves 2 value heads): the key and value widths
# are equal, since save_pretrained writes the fused conv as equal thirds (q_conv1d / k_conv1d / v_conv1d), which are
# the true parts only then (transformers' Concatenate reverts to an equal Chunk)
family("olmo_hybrid", "OlmoHybridConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, linear_num_key_heads=4, linear_num_value_heads=8,
               linear_key_head_dim=32, linear_value_head_dim=16,
               layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
       "OlmoHybridForCausalLM", GQA + GDN, wrong=r"layers\.0\.linear_attn\.conv1d\.weight$",
       global_norms=("q_norm", "k_norm"))
# Step 3.5 / 3.7 (Step3p7ForConditionalGeneration, text model_type step3p5): GQA with per-head q/k norms and one
# sigmoid gate per head (g_proj [H, D]) split with the heads; routed experts stacked on disk (moe.gate_proj /
# up_proj [E, I, D], moe.down_proj [E, D, I], moe.gate, moe.router_bias), the shared expert (share_expert.*) on
# share_expert_dim; the vision model and projector whole. Full-attention layers only: a sliding layer's head count
# is in per_layer_config, which the plan refuses by name. Proves step3p5.
_st = _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, moe_intermediate_size=IM, share_expert_dim=IM,
              num_local_experts=8, n_routed_experts=8, num_experts_per_tok=2,
              sliding_window=8, layer_types=["full_attention"] * 4,
              mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
family("step3p7", "Step3p7Config", dict(text_config=_st, vision_config=dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2), image_token_id=V - 1),
       "Step3p7ForConditionalGeneration",
       _VL + [("text_config.moe_intermediate_size", "even"), ("text_config.share_expert_dim", "even"),
              ("text_config.num_sliding_attention_heads", "even")],
       wrong=r"layers\.1\.self_attn\.g_proj\.weight$")
# Mellum: Qwen3-MoE's attention (per-head q/k norms whole) and fused experts, with dense layers (mlp_layer_types) and
# sliding-window layers (its MTP layer, mtp.*, which transformers ignores on load, is not in the test)
family("mellum", "MellumConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, moe_intermediate_size=IM, num_experts=8,
               num_experts_per_tok=2, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"] * 2, mlp_layer_types=["dense", "sparse"] * 2),
       "MellumForCausalLM", GQA + [("moe_intermediate_size", "even")],
       wrong=r"layers\.1\.mlp\.experts\.gate_up_proj$", wrong_dim=1)
# Emu3's text model (Emu3ForCausalLM on Emu3TextConfig): Llama's attention and MLP
family("emu3_text_model", "Emu3TextConfig", _common(**_dense), "Emu3ForCausalLM", GQA)
# Aria's text model: Llama's attention, routed experts fused in the transposed layout (saved as mlp.experts.fc1
# [E, D, 2I] and fc2 [E, I, D]), shared experts on intermediate_size * moe_num_shared_experts
family("aria_text", "AriaTextConfig", _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, intermediate_size=IM,
                                              moe_num_experts=8, moe_topk=2, moe_num_shared_experts=2),
       "AriaTextForCausalLM", GQA, wrong=r"layers\.1\.mlp\.experts\.gate_up_proj$", wrong_dim=2)
# dots.3 Note (text, Dots3NoteForCausalLM): DeepSeek-V3.2's MLA and DSA indexer with one sigmoid gate per head
# (g_proj [H, D]), shared experts on their own intermediate size; every layer indexed attention (use_sliding_window
# False): a sliding layer's heads are in per_layer_config, which the plan refuses by name
_d3 = _mla(num_hidden_layers=4, index_topk=8, index_head_dim=16, index_n_heads=4, shared_experts_intermediate_size=24,
           head_dim=8, use_sliding_window=False)
family("dots3_note_text", "Dots3NoteTextConfig", _d3, "Dots3NoteForCausalLM",
       MLA + [("shared_experts_intermediate_size", "even")], ts=(2, 3, 4),
       wrong=r"layers\.2\.self_attn\.g_proj\.weight$")
# Flint: Qwen3-MoE's attention with one sink per head (saved as self_attn.softmax_offset), rotary on the sliding
# layers only, routed experts with a shared expert, a dense first layer
family("flint", "FlintConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, moe_intermediate_size=IM,
               shared_expert_intermediate_size=IM, num_experts=8, num_experts_per_tok=2, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"] * 2, mlp_only_layers=[0]),
       "FlintForCausalLM", GQA + [("moe_intermediate_size", "even"), ("shared_expert_intermediate_size", "even")],
       wrong=r"layers\.1\.self_attn\.sinks$")
# Beam: Qwen3-MoE's attention with a sigmoid output gate per channel (self_attn.gate_proj [H*hd, D]) and a gate bias
# per head (gate_bias [H]), rotary on sliding layers, NoPE with position-dependent query scaling on full ones; fused
# routed experts, dense layers
family("beam", "BeamConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, moe_intermediate_size=IM, num_experts=8,
               num_experts_per_tok=2, n_group=1, topk_group=1, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"] * 2, mlp_layer_types=["dense", "sparse"] * 2),
       "BeamForCausalLM", GQA + [("moe_intermediate_size", "even")], wrong=r"layers\.1\.self_attn\.gate_proj\.weight$")
# Kolibri 1: Qwen3-MoE's attention and routed experts with shared experts on their own intermediate size, an
# expert bias in the router (saved as moe.router.expert_bias) and post-attention / post-MLP norms
family("kolibri1", "Kolibri1Config",
       _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, moe_intermediate_size=IM,
               shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"] * 2),
       "Kolibri1ForCausalLM", GQA + [("moe_intermediate_size", "even"), ("shared_expert_intermediate_size", "even")],
       wrong=r"layers\.0\.mlp\.shared_experts\.up_proj\.weight$")
# PaddleOCR-VL: an ERNIE 4.5-style dense text model (Llama's names) under model.language_model, saved at the root
# (model.layers.*), the vision tower (visual.*) and its projector (mlp_AR.*) whole. Proves paddleocr_vl_text.
family("paddleocr_vl", "PaddleOCRVLConfig", dict(
    text_config=_common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, rope_parameters=dict(
        rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
    image_token_id=V - 1), "PaddleOCRVLForConditionalGeneration", _VL,
       wrong=r"language_model\.layers\.1\.self_attn\.v_proj\.weight$")
# EuroBERT (EuroBertForMaskedLM): Llama's attention (bidirectional) and MLP under an encoder's masked-LM head
family("eurobert", "EuroBertConfig", _common(**_dense, mask_token_id=3), "EuroBertForMaskedLM", GQA)


# --- issue 30: the towers without a head, proven by their last hidden state (each rank's after the row-parallel
# sums, against the unsplit tower's) ---


def _hidden(model, ids):
    return model(input_ids=ids).last_hidden_state


def _encoder_hidden(model, ids):
    """DeepSeek-OCR-2's encoder takes embeddings, not ids: 16 positions of embeddings drawn from a generator
    seeded by the ids, the first 8 patches (bidirectional among themselves), the rest causal queries."""
    import torch
    g = torch.Generator().manual_seed(int(ids.sum()))
    x = torch.randn(ids.shape[0], ids.shape[1], model.config.hidden_size, generator=g).to(DTYPE())
    return model(inputs_embeds=x, num_patches=8).last_hidden_state


# GLM-Image's text tower (GlmImageTextModel): GLM-4's layers (q/k/v with biases, gate_up_proj fused in two
# segments, sandwich norms), M-RoPE; its composite's head (onto vision_vocab_size) is not part of it
family("glm_image_text", "GlmImageTextConfig", _common(num_key_value_heads=4, num_hidden_layers=2, vision_vocab_size=V,
                                                       eos_token_id=2, rope_parameters=dict(
    rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0, mrope_section=[2, 1, 1])), "GlmImageTextModel", GQA, output=_hidden,
       wrong=r"layers\.0\.mlp\.gate_up_proj\.weight$")
# Muse Glimmer's text tower (MuseGlimmerTextModel): GQA with weightless per-head q/k norms, a sigmoid output gate per
# channel (self_attn.gate_proj [H*hd, D], beam's rule), sandwich centered norms, a weightless norm after the embedding
# lookup (per token: the vocab-parallel sum is unchanged)
family("muse_glimmer_text", "MuseGlimmerTextConfig", _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16),
       "MuseGlimmerTextModel", GQA, output=_hidden, wrong=r"layers\.1\.self_attn\.gate_proj\.weight$")
# Muse Glimmer (MuseGlimmerForConditionalGeneration): that text tower under model.language_model with a head (tied
# by default: untied here), the vision tower, adapter and projection whole; text-only logits
family("muse_glimmer", "MuseGlimmerConfig", dict(
    text_config=_common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
    out_hidden_size=128, projector_hidden_size=64, image_token_id=V - 1, video_token_id=V - 2,
    tie_word_embeddings=False), "MuseGlimmerForConditionalGeneration", _VL,
       wrong=r"language_model\.layers\.0\.self_attn\.k_proj\.weight$")
# DeepSeek-OCR-2's vision encoder (DeepseekOcr2VisionEncoder): a Qwen2-style tower (q/k/v biases, SwiGLU) over
# embeddings, bidirectional over the patches; no embedding or head (its config's vocab_size sizes nothing)
family("deepseek_ocr2_encoder", "DeepseekOcr2VisionEncoderConfig", _common(num_key_value_heads=4, num_hidden_layers=2),
       "deepseek_ocr2.modeling_deepseek_ocr2:DeepseekOcr2VisionEncoder", GQA, output=_encoder_hidden,
       wrong=r"layers\.1\.self_attn\.v_proj\.weight$")



def text_of(cfg):
    return cfg.get("text_config") or cfg


def _get(d, path):
    for k in path.split("."):
        d = d[k]
    return d


def _set(d, path, v):
    ks = path.split(".")
    for k in ks[:-1]:
        d = d[k]
    d[ks[-1]] = v


def _has(d, path):
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return False
        d = d[k]
    return True


def local_count(n, T, r, kind):
    """Rank r's share of n units (tp-rules.md section 1): even, uneven (first n % T ranks one more),
    groups (one unit per rank when n < T)."""
    if kind == "groups" and n < T:
        assert T % n == 0, (n, T)
        return 1
    if kind == "uneven":
        return n // T + (1 if r < n % T else 0)
    assert n % T == 0, (n, T, kind)
    return n // T


def local_config(fam, cfg, T, r):
    """The config.json dict of rank r of T: the per-rank keys replaced by the rank's counts."""
    out = copy.deepcopy(cfg)
    text = "text_config." if "text_config" in cfg else ""
    t = text_of(out)
    if not t.get("head_dim") and "kv_lora_rank" not in t:  # the head width, implied by the global head count
        t["head_dim"] = t["hidden_size"] // t["num_attention_heads"]
    paths = [p for p, _ in fam["per_rank"]]
    if "linear_attn_config" in text_of(cfg):
        paths = [p.replace("linear_num_heads", "linear_attn_config.num_heads") for p in paths]
    for (path, kind) in zip(paths, [k for _, k in fam["per_rank"]]):
        if not _has(cfg, path):
            continue
        if kind.startswith("same_as:"):
            _set(out, path, _get(out, text + kind[8:]))
        else:
            _set(out, path, local_count(_get(cfg, path), T, r, kind))
    if text + "vocab_size" not in paths:  # a family that lists it keeps the vocabulary whole (deepseek_v4)
        _set(out, text + "vocab_size", local_count(_get(cfg, text + "vocab_size"), T, r, "even"))
    return out


def build(name, out_dir, seed=0):
    """Writes family `name`'s tiny checkpoint to out_dir (several files and an index); returns config.json's dict."""
    import torch
    import transformers
    fam = FAMILIES[name]
    torch.manual_seed(seed)
    cfg = getattr(transformers, fam["cfg_cls"])(**copy.deepcopy(fam["cfg"]))
    model = model_class(fam)(cfg).eval()
    with torch.no_grad():  # make the tiny model's numbers of a useful size: weights ~ 1/sqrt(fan-in), norms ~ 1
        g = torch.Generator().manual_seed(seed + 1)
        for n, p in model.named_parameters():
            if n.endswith("sinks"):  # attention sinks: one logit per head, of the size of attention scores
                p.copy_(2.0 * torch.randn(p.shape, generator=g, dtype=torch.float32))
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) / (p.shape[-1] ** 0.5))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float32))
    model.save_pretrained(out_dir, max_shard_size="64KB")
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        c = json.load(f)
    if fam["mxfp4"]:
        _to_mxfp4(out_dir, c, seed)
    if fam["mtp"]:
        _add_mtp(out_dir, c)
    if fam["config_json"]:
        fam["config_json"](c)
        with open(path, "w") as f:
            json.dump(c, f, indent=1)
    return c


def mtp_prefix(cfg):
    """Where DeepSeek-style checkpoints keep their MTP layer: layers.{num_hidden_layers}."""
    t = text_of(cfg)
    return ("model.language_model." if "text_config" in cfg else "model.") + "layers.%d." % t["num_hidden_layers"]


def _add_mtp(out_dir, c):
    """Appends a DeepSeek-style MTP layer at layers.{num_hidden_layers} (transformers does not build or
    run it: it ignores these tensors on load): a copy of the last decoder layer (MLA attention, MoE) plus
    eh_proj [D, 2D], enorm, hnorm, shared_head.norm [D], shared_head.head and embed_tokens [V, D]. The
    copy lets the test require each MTP tensor on each rank to equal the same rank's tensor of the copied,
    numerically proven layer."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    t = text_of(c)
    last = mtp_prefix(c).replace("layers.%d." % t["num_hidden_layers"], "layers.%d." % (t["num_hidden_layers"] - 1))
    ipath = os.path.join(out_dir, "model.safetensors.index.json")
    with open(ipath) as f:
        idx = json.load(f)
    wm = idx["weight_map"]
    out = {}
    for k, fn in sorted(wm.items()):
        if k.startswith(last):
            out[mtp_prefix(c) + k[len(last):]] = load_file(os.path.join(out_dir, fn))[k]
    rng = np.random.default_rng(11)
    Dm, Vm = t["hidden_size"], t["vocab_size"]
    for k, shape in (("eh_proj.weight", (Dm, 2 * Dm)), ("enorm.weight", (Dm,)), ("hnorm.weight", (Dm,)),
                     ("shared_head.norm.weight", (Dm,)), ("shared_head.head.weight", (Vm, Dm)),
                     ("embed_tokens.weight", (Vm, Dm))):
        out[mtp_prefix(c) + k] = rng.standard_normal(shape).astype(np.float32)
    save_file(out, os.path.join(out_dir, "model-mtp.safetensors"), metadata={"format": "pt"})
    for k in out:
        wm[k] = "model-mtp.safetensors"
    with open(ipath, "w") as f:
        json.dump(idx, f, indent=1)


def _to_mxfp4(out_dir, c, seed):
    """Rewrites the fused experts of a saved gpt-oss checkpoint as the published MXFP4 layout:
    gate_up_proj [E, D, 2I] becomes gate_up_proj_blocks [E, 2I, D/32, 16] (U8, two FP4 per byte) and
    gate_up_proj_scales [E, 2I, D/32] (U8, E8M0); down_proj [E, I, D] becomes [E, D, I/32, 16] and
    [E, D, I/32]. Random codes (the test compares dequantized models, so any codes do)."""
    import torch
    from safetensors.torch import load_file, save_file
    g = torch.Generator().manual_seed(seed + 7)
    ipath = os.path.join(out_dir, "model.safetensors.index.json")
    with open(ipath) as f:
        idx = json.load(f)
    wm = idx["weight_map"]
    for fn in sorted(set(wm.values())):
        t = load_file(os.path.join(out_dir, fn))
        names = [k for k in t if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
        for k in names:
            E, cols, rows = t.pop(k).shape
            t[k + "_blocks"] = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
            t[k + "_scales"] = torch.randint(122, 128, (E, rows, cols // 32), generator=g, dtype=torch.uint8)
            del wm[k]
            wm[k + "_blocks"] = wm[k + "_scales"] = fn
        if names:
            save_file(t, os.path.join(out_dir, fn), metadata={"format": "pt"})
    with open(ipath, "w") as f:
        json.dump(idx, f, indent=1)
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def _load_mxfp4(fam, path, cfg_dict):
    """Loads an MXFP4 gpt-oss folder the way transformers does without a GPU: every *_blocks / *_scales
    pair dequantized by transformers' own convert_moe_packed_tensors into the BF16 layout, then
    load_state_dict(strict=True) (missing, unexpected or mismatched tensors raise)."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    sd = {}
    for fn in files:
        sd.update(load_file(os.path.join(path, fn)))
    for k in [k for k in sd if k.endswith("_blocks")]:
        base = k[:-len("_blocks")]
        sd[base] = convert_moe_packed_tensors(sd.pop(k), sd.pop(base + "_scales"), dtype=DTYPE())
    torch.set_default_dtype(DTYPE())
    try:
        model = model_class(fam)(config_object(fam, cfg_dict))
    finally:
        torch.set_default_dtype(torch.float32)
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"
    model.load_state_dict({k: v.to(DTYPE()) for k, v in sd.items()}, strict=True)
    return model.eval()


def config_object(fam, cfg_dict):
    import transformers
    d = copy.deepcopy(cfg_dict)
    d.pop("model_type", None)
    d.pop("architectures", None)
    d.pop("transformers_version", None)
    d.pop("quantization_config", None)
    return getattr(transformers, fam["cfg_cls"])(**d)


def load(fam, path, cfg_dict):
    """The model at path under cfg_dict, loaded strictly: raises on any missing, unexpected or mismatched tensor."""
    import torch
    import transformers
    if fam["mxfp4"]:
        return _load_mxfp4(fam, path, cfg_dict)
    cls = model_class(fam)
    model, info = cls.from_pretrained(path, config=config_object(fam, cfg_dict), output_loading_info=True,
                                      dtype=DTYPE(), attn_implementation="eager",
                                      experts_implementation="eager")
    if fam["mtp"]:  # the MTP layer, which transformers neither builds nor runs: checked byte for byte instead
        pre = mtp_prefix(cfg_dict)
        info["unexpected_keys"] = [k for k in info["unexpected_keys"] if not k.startswith(pre)]
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                                          "error_msgs")}
    if bad:
        raise AssertionError("%s: loading %s is not strict: %s" % (fam["name"], path, bad))
    return model.eval()


def tp_patch(fam, model, T, r):
    """Makes `model` (rank r's local-size model) one rank of a tensor-parallel forward: the
    vocab-parallel embedding sums its rows over ranks, lm_head's vocab slices are gathered, every
    row-parallel output (o_proj, down_proj, out_proj, fused experts) is summed over ranks with its
    bias added once, and the norms named in global_norms reduce their variance over all ranks."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    def allsum(t):
        dist.all_reduce(t)
        return t

    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if ".visual" in name or "vision" in name:
            continue
        if isinstance(mod, nn.Embedding) and leaf == "embed_tokens":
            n = mod.weight.shape[0]
            orig = mod.forward

            def emb(ids, orig=orig, n=n):
                loc = ids - r * n
                miss = (loc < 0) | (loc >= n)
                out = orig(loc.masked_fill(miss, 0))
                return allsum(out.masked_fill(miss[..., None], 0.0))
            mod.forward = emb
        elif name.endswith("lm_head") and isinstance(mod, nn.Linear):
            orig = mod.forward

            def head(x, orig=orig):
                y = orig(x).contiguous()
                parts = [torch.empty_like(y) for _ in range(T)]
                dist.all_gather(parts, y)
                return torch.cat(parts, dim=-1)
            mod.forward = head
        elif isinstance(mod, nn.Linear) and leaf in ("o_proj", "down_proj", "out_proj", "w2"):
            def row(x, mod=mod):
                y = allsum(F.linear(x, mod.weight))
                return y + mod.bias if mod.bias is not None else y
            mod.forward = row
        elif leaf == "experts" and not isinstance(mod, nn.ModuleList):
            for b in fam["rank0_bias"]:
                if r != 0:
                    getattr(mod, b).data.zero_()
            mod.register_forward_hook(lambda m, a, out: allsum(out))
        elif leaf in fam["global_norms"]:
            w = mod.weight.shape[0]
            eps = mod.variance_epsilon

            def gnorm(x, mod=mod, w=w, eps=eps):
                x32 = x.float()
                ss = allsum(x32.pow(2).sum(-1, keepdim=True))
                n = allsum(torch.tensor([float(w)]))
                return mod.weight * (x32 * torch.rsqrt(ss / n + eps)).to(x.dtype)
            mod.forward = gnorm
    if fam["patch"]:
        fam["patch"](model, T, r, allsum)
    return model


def DTYPE():
    """The dtype of every forward: float64, so that the check measures the split, not float32's rounding
    (TPFS_REAL_DTYPE=float32 runs it in float32 instead, for comparison)."""
    import torch
    return getattr(torch, os.environ.get("TPFS_REAL_DTYPE", "float64"))


def input_ids():
    import torch
    g = torch.Generator().manual_seed(1234)
    return torch.randint(3, V, (2, 16), generator=g)


if __name__ == "__main__":  # dump every family's tensors: python realmodel.py OUT_DIR [families]
    import sys
    from safetensors import safe_open
    for nm in sys.argv[2:] or FAMILIES:
        d = os.path.join(sys.argv[1], nm)
        c = build(nm, d)
        print("==", nm, json.dumps({k: v for k, v in text_of(c).items() if not isinstance(v, (dict, list))})[:300])
        idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
        for k in sorted(idx):
            if "visual" in k:
                continue
            with safe_open(os.path.join(d, idx[k]), "pt") as f:
                s = f.get_slice(k)
                print("  ", k, list(s.get_shape()), s.get_dtype())
