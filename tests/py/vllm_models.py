"""Tiny random checkpoints for the vLLM view test, made with transformers (seeded, bf16).

Each family is as small as vLLM's CPU backend allows: head_dim 64 (CPU attention takes 32, 64, 80,
96, ...), two layers, a vocabulary of 1000 (not a multiple of 64, so vLLM's padding shows: at TP=2
each rank holds 512 rows, rank 1's last 24 zero), KV heads fewer than T=2 where the family allows,
weights drawn wider than the default init so that greedy tokens are not decided by ties.

make(family, out) writes OUT/config.json, generation_config.json and model.safetensors (deepseek_v3,
glm5_next: also an MTP layer in model-mtp.safetensors, with an index; kimi_k2: its config.json retyped).
"""
import json
import os
import re
import sys

import torch
import transformers as tf

COMMON = dict(hidden_size=128, num_hidden_layers=2, vocab_size=1000, max_position_embeddings=256,
              num_attention_heads=2, head_dim=64, initializer_range=0.1, rms_norm_eps=1e-6)

# DeepSeek-style MLA + MoE as the CPU backend runs it (kv_lora_rank 512, qk_rope_head_dim 64), noaux_tc for the bias
_MLA = dict(hidden_size=128, num_hidden_layers=2, vocab_size=1000, max_position_embeddings=256, num_attention_heads=2,
            num_key_value_heads=2, initializer_range=0.1, rms_norm_eps=1e-6, intermediate_size=256,
            moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
            first_k_dense_replace=1, n_group=1, topk_group=1, topk_method="noaux_tc", kv_lora_rank=512,
            q_lora_rank=96, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64, tie_word_embeddings=False,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)

# Gated DeltaNet as the CPU backend runs it (Qwen3.5): bf16, linear head dims 128, a linear then a full layer
_GDN = dict(hidden_size=128, num_hidden_layers=2, vocab_size=1000, max_position_embeddings=256, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, initializer_range=0.1, rms_norm_eps=1e-6, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "full_attention"], tie_word_embeddings=False)

FAMILIES = {
    # untied, one KV head (fewer than T: replicated on both ranks)
    "llama": lambda: tf.LlamaConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                    **COMMON),
    # tied embeddings (served as lm_head.weight only), q/k/v biases
    "qwen2": lambda: tf.Qwen2Config(num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=True,
                                    **COMMON),
    # Mistral: llama's names in vLLM (MistralForCausalLM -> models/llama.py)
    "mistral": lambda: tf.MistralConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                        **COMMON),
    # q_norm / k_norm, tied
    "qwen3": lambda: tf.Qwen3Config(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=True,
                                    **COMMON),
    # routed experts stacked, router, q_norm / k_norm
    "qwen3_moe": lambda: tf.Qwen3MoeConfig(num_key_value_heads=1, intermediate_size=256, moe_intermediate_size=64,
                                           num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                                           norm_topk_prob=True, tie_word_embeddings=False, **COMMON),
    # shared expert and its gate, q/k/v biases
    "qwen2_moe": lambda: tf.Qwen2MoeConfig(num_key_value_heads=1, intermediate_size=256, moe_intermediate_size=64,
                                           shared_expert_intermediate_size=128, num_experts=4,
                                           num_experts_per_tok=2, decoder_sparse_step=1,
                                           tie_word_embeddings=False, **COMMON),
    # routed experts (block_sparse_moe) stacked, no shared expert
    "mixtral": lambda: tf.MixtralConfig(num_key_value_heads=1, intermediate_size=64, num_local_experts=4,
                                        num_experts_per_tok=2, tie_word_embeddings=False, **COMMON),
    # q/k/v and gate/up fused already in the checkpoint (qkv_proj, gate_up_proj): cut per segment
    "phi3": lambda: tf.Phi3Config(num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=False,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2, **COMMON),
    # sandwich norms, q/k norms, sliding and full attention layers, tied
    "gemma3": lambda: tf.Gemma3TextConfig(num_key_value_heads=1, intermediate_size=256, query_pre_attn_scalar=64,
                                          sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                          pad_token_id=0, bos_token_id=2, eos_token_id=1, **COMMON),
    # llama's vLLM names, each with what it adds: Granite's multipliers (embedding, residual, attention,
    # logits: config only); EXAONE 4's q/k norms, post-feedforward norms and sliding layers; GLM-4's
    # gate_up_proj fused in the checkpoint (cut per half), q/k/v biases and sandwich norms; Apertus's
    # xIELU parameters per layer (alpha_p, alpha_n, beta, eps: whole) and no gate
    "granite": lambda: tf.GraniteConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                        embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1,
                                        logits_scaling=2.0, **COMMON),
    "exaone4": lambda: tf.Exaone4Config(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                        sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                        **COMMON),
    "glm4": lambda: tf.Glm4Config(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                  pad_token_id=0, **COMMON),
    # ERNIE 4.5 (dense): llama's names; Cohere: LayerNorms, tied, and no lm_head in vLLM (logits from the embedding)
    "ernie4_5": lambda: tf.Ernie4_5Config(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                          **COMMON),
    "cohere": lambda: tf.CohereConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=True,
                                      **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"}),
    # Cohere 2 (vLLM: Cohere2ForCausalLM -> models/commandr.py, cohere's names) with sliding and full layers;
    # Granite SWA (vLLM: GraniteSWAForCausalLM -> models/granite.py), granite's multipliers and sliding layers
    "cohere2": lambda: tf.Cohere2Config(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=True,
                                        sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                        pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                        **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"}),
    "granite_swa": lambda: tf.GraniteSWAConfig(num_key_value_heads=1, intermediate_size=256,
                                               tie_word_embeddings=False, embedding_multiplier=2.0,
                                               residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=2.0,
                                               sliding_window=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                               **COMMON),
    # HyperCLOVA X (vLLM's own models/hyperclovax.py): llama's names, Granite's multipliers, post-norms per layer
    "hyperclovax": lambda: tf.HyperCLOVAXConfig(num_key_value_heads=1, intermediate_size=256,
                                                tie_word_embeddings=False, embedding_multiplier=2.0,
                                                residual_multiplier=0.5, attention_multiplier=0.1,
                                                logits_scaling=2.0, use_post_norm=True, pad_token_id=0,
                                                bos_token_id=1, eos_token_id=2, **COMMON),
    "apertus": lambda: tf.ApertusConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                        **COMMON),
    # vLLM's Transformers backend (TransformersForCausalLM; served by views/vllm/llama.json): the HF modules with vLLM's
    # parallel linears per base_model_tp_plan; Arcee's up_proj alone (ReLU^2), Seed-OSS's q/k/v biases, SmolLM3's
    # NoPE layers, StarCoder2's c_fc / c_proj and LayerNorm biases, CWM's sliding layers, HunYuan's q/k norms
    # (query_layernorm, key_layernorm), Jais2's LayerNorms, OLMo's norms without weights, VaultGemma's sandwich norms
    "arcee": lambda: tf.ArceeConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False, **COMMON),
    "seed_oss": lambda: tf.SeedOssConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                         pad_token_id=0, **COMMON),
    "smollm3": lambda: tf.SmolLM3Config(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                        pad_token_id=0, **COMMON),
    "starcoder2": lambda: tf.Starcoder2Config(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                              **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"}),
    "cwm": lambda: tf.CwmConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                pad_token_id=0, bos_token_id=1, eos_token_id=2, **COMMON),
    "hunyuan_v1_dense": lambda: tf.HunYuanDenseV1Config(num_key_value_heads=1, intermediate_size=256,
                                                        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                                                        eos_token_id=2, **COMMON),
    "jais2": lambda: tf.Jais2Config(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                    pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                    **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"}),
    "olmo": lambda: tf.OlmoConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                  **{k: v for k, v in COMMON.items() if k not in ("rms_norm_eps", "head_dim")}),
    "vaultgemma": lambda: tf.VaultGemmaConfig(num_key_value_heads=1, intermediate_size=256, pad_token_id=0,
                                              bos_token_id=2, eos_token_id=1, query_pre_attn_scalar=64,
                                              sliding_window=16, **COMMON),
    # Nemotron (vLLM's models/nemotron.py): llama's names, up_proj alone (ReLU^2), LayerNorm1P with biases, partial
    # rotary
    "nemotron": lambda: tf.NemotronConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2, norm_eps=1e-5,
                                          **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"}),
    # OLMo 2 / 3 (vLLM's Transformers backend): q_norm [H * hd] and k_norm [KV * hd] over all heads, kept whole by
    # vLLM (q, k, v colwise_gather_output in the model's base_model_tp_plan); OLMo 3 with sliding and full layers
    "olmo2": lambda: tf.Olmo2Config(num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=False,
                                    pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                    **{k: v for k, v in COMMON.items() if k != "head_dim"}),
    "olmo3": lambda: tf.Olmo3Config(num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=False,
                                    sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                    pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                    **{k: v for k, v in COMMON.items() if k != "head_dim"}),
    # GLM (vLLM's Transformers backend): the checkpoint's fused gate_up_proj (colwise_gather_output: one column block),
    # q/k/v biases, partial rotary
    "glm": lambda: tf.GlmConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                pad_token_id=0, bos_token_id=1, eos_token_id=2, **COMMON),
    # Phi (vLLM's Transformers backend): q/k/v with biases, self_attn.dense, mlp.fc1 / fc2 with biases, LayerNorms,
    # lm_head with a bias, partial rotary
    "phi": lambda: tf.PhiConfig(num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=False,
                                pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"}),
    # Gemma 4 (dense text model, vLLM's models/gemma4.py): a sliding and a full layer (the full layer's heads
    # global_head_dim wide), per-layer embeddings, tied
    "gemma4_text": lambda: tf.Gemma4TextConfig(num_key_value_heads=1, intermediate_size=256, global_head_dim=128,
                                               sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                               vocab_size_per_layer_input=1000, hidden_size_per_layer_input=16,
                                               tie_word_embeddings=True, pad_token_id=0, bos_token_id=2,
                                               eos_token_id=1, **COMMON),
    # Gemma 4 with its MoE block (num_experts: vLLM's Gemma4DecoderLayer adds the router and FusedMoE experts beside
    # the dense MLP): the fused experts gate_up_proj [E, 2I, H] and down_proj [E, H, I], cut as FusedMoE cuts them
    "gemma4_text_moe": lambda: tf.Gemma4TextConfig(num_key_value_heads=1, intermediate_size=256, global_head_dim=128,
                                                   sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                                   vocab_size_per_layer_input=1000, hidden_size_per_layer_input=16,
                                                   num_experts=4, top_k_experts=2, moe_intermediate_size=64,
                                                   enable_moe_block=True, tie_word_embeddings=True, pad_token_id=0,
                                                   bos_token_id=2, eos_token_id=1, **COMMON),
    # EXAONE 3 / 3.5, InternLM3, IQuestCoder: natively registered by vLLM (exaone.py ExaoneForCausalLM; InternLM3
    # and IQuestCoder map to llama.py's LlamaForCausalLM), but the vLLM venv's transformers (5.19) has no
    # configuration class for them: their published checkpoints carry one (trust_remote_code). Made as Llama, then
    # retyped (REMOTE)
    "exaone": lambda: tf.LlamaConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False, **COMMON),
    # EXAONE 3.5 2.4B's form: tied
    "exaone_tied": lambda: tf.LlamaConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=True,
                                          **COMMON),
    "internlm3": lambda: tf.LlamaConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                        **COMMON),
    "iquestcoder": lambda: tf.LlamaConfig(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                          **COMMON),
    # Nemotron-H and Falcon-H1 (plan mamba2): refused under --view vllm (test_vllm.py REFUSED); a Mamba2 layer and an
    # attention layer each
    "nemotron_h": lambda: tf.NemotronHConfig(hidden_size=128, layers_block_type=["mamba", "attention"],
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                             intermediate_size=256, mamba_num_heads=4, mamba_head_dim=32, n_groups=2,
                                             ssm_state_size=16, vocab_size=1000, tie_word_embeddings=False),
    "falcon_h1": lambda: tf.FalconH1Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, head_dim=64, intermediate_size=256, mamba_d_ssm=128,
                                           mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16,
                                           vocab_size=1000, tie_word_embeddings=False),
    # Ministral 3: vLLM's registry maps Ministral3ForCausalLM to MistralForCausalLM (models/llama.py): llama's names
    "ministral3": lambda: tf.Ministral3Config(num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=False,
                                              pad_token_id=0, bos_token_id=1, eos_token_id=2, **COMMON),
    # Gemma and Gemma 2: vLLM's own classes (models/gemma.py, gemma2.py), the head tied to the embedding
    "gemma": lambda: tf.GemmaConfig(num_key_value_heads=1, intermediate_size=256, pad_token_id=0, bos_token_id=2,
                                    eos_token_id=1, **COMMON),
    "gemma2": lambda: tf.Gemma2Config(num_key_value_heads=1, intermediate_size=256, query_pre_attn_scalar=64,
                                      sliding_window=16, pad_token_id=0, bos_token_id=2, eos_token_id=1, **COMMON),
    # shared experts, router bias, partial rotary, a first dense layer
    "glm4_moe": lambda: tf.Glm4MoeConfig(num_key_value_heads=1, intermediate_size=256, moe_intermediate_size=64,
                                         n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                         first_k_dense_replace=1, n_group=1, topk_group=1, use_qk_norm=True,
                                         attention_bias=True, tie_word_embeddings=False,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=2, **COMMON),
    # MLA as the CPU backend runs it (kv_lora_rank 512, qk_rope_head_dim 64), noaux_tc for the bias
    "deepseek_v3": lambda: tf.DeepseekV3Config(**_MLA),
    # Kimi K2: DeepSeek-V3's model under model_type "kimi_k2" (vLLM maps it to DeepseekV3Config; no MTP layer,
    # as in the published checkpoint); config.json is rewritten after saving (transformers has no such type)
    "kimi_k2": lambda: FAMILIES["deepseek_v3"](),
    # GLM-4.7-Flash: DeepSeek's MLA with GLM-4.5's MoE (F32 router, correction bias). vLLM reads
    # first_k_dense_replace, which the published config.json holds beside transformers' mlp_layer_types, and
    # topk_method noaux_tc, published too
    "glm4_moe_lite": lambda: tf.Glm4MoeLiteConfig(**_MLA),
    # OLMoE: q_norm / k_norm over all heads (vLLM gathers q and k), experts without a shared one, the router
    # kept as mlp.gate; KV heads as many as the ranks (the view refuses fewer)
    "olmoe": lambda: tf.OlmoeConfig(num_key_value_heads=2, intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                                    tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                    **COMMON),
    # Granite MoE: the experts fused in the checkpoint (block_sparse_moe.input_linear [E, 2I, D], output_linear),
    # the router as router.layer, the head tied as published (granite-3.0-*-a*m), one KV head
    "granitemoe": lambda: tf.GraniteMoeConfig(num_key_value_heads=1, intermediate_size=64, num_local_experts=4,
                                              num_experts_per_tok=2, embedding_multiplier=2.0, residual_multiplier=0.5,
                                              attention_multiplier=0.1, logits_scaling=4.0, tie_word_embeddings=True,
                                              pad_token_id=0, bos_token_id=1, eos_token_id=2, **COMMON),
    # Granite MoE with shared experts (vLLM: models/granitemoeshared.py): granitemoe's fused experts plus the shared
    # MLP's fused input_linear [2S, D] (MergedColumnParallelLinear, loaded whole: [gate_r | up_r]) and output_linear;
    # and its SWA form (GraniteMoeSWAForCausalLM -> the same class): a sliding and a full layer, one sink per head
    "granitemoeshared": lambda: tf.GraniteMoeSharedConfig(
        num_key_value_heads=1, intermediate_size=64, shared_intermediate_size=128, num_local_experts=4,
        num_experts_per_tok=2, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1,
        logits_scaling=4.0, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2, **COMMON),
    "granitemoe_swa": lambda: tf.GraniteMoeSWAConfig(
        num_key_value_heads=1, intermediate_size=64, shared_intermediate_size=128, num_local_experts=4,
        num_experts_per_tok=2, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1,
        logits_scaling=4.0, tie_word_embeddings=True, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"], layer_rope_theta=[10000.0, 10000.0],
        pad_token_id=0, bos_token_id=1, eos_token_id=2, **COMMON),
    # FlexOlmo (vLLM's Transformers MoE backend): OLMo 2's q_norm / k_norm over all heads, routed experts, no shared
    # one; HunYuan MoE (the same backend): q/k norms (query_layernorm, key_layernorm), routed and shared experts
    "flex_olmo": lambda: tf.FlexOlmoConfig(num_key_value_heads=2, intermediate_size=64, num_experts=4,
                                           num_experts_per_tok=2, tie_word_embeddings=False, pad_token_id=0,
                                           bos_token_id=1, eos_token_id=2,
                                           **{k: v for k, v in COMMON.items() if k != "head_dim"}),
    "hunyuan_v1_moe": lambda: tf.HunYuanMoEV1Config(num_key_value_heads=1, intermediate_size=64, num_experts=4,
                                                    moe_topk=2, tie_word_embeddings=False, pad_token_id=0,
                                                    bos_token_id=1, eos_token_id=2, **COMMON),
    # DeepSeek-V2-Lite: no q-LoRA (q_proj), topk_method greedy (no correction bias)
    "deepseek_v2": lambda: tf.DeepseekV2Config(**dict(_MLA, q_lora_rank=None, topk_method="greedy")),
    # DeepSeek-V2: q-LoRA, topk_method group_limited_greedy over expert groups (no correction bias)
    "deepseek_v2_q": lambda: tf.DeepseekV2Config(**dict(_MLA, topk_method="group_limited_greedy", n_group=2,
                                                          topk_group=1)),
    # DeepSeek-V3.2 / GLM-5 (DSA): MLA as above plus the lightning indexer (wq_b, wk, k_norm, weights_proj);
    # vLLM cannot run these on CPU: test_vllm.py checks their key set and loaded weights only (KEY_CASES).
    # topk_method noaux_tc for both (_MLA): without it vLLM's CUDA class has no e_score_correction_bias and its
    # own default loader fails on the checkpoint's (KeyError); sharded_state fails on the view's alike
    "deepseek_v32": lambda: tf.DeepseekV32Config(index_topk=16, index_head_dim=128, index_n_heads=2, **_MLA),
    "glm_moe_dsa": lambda: tf.GlmMoeDsaConfig(index_topk=16, index_head_dim=128, index_n_heads=2,
                                              mlp_layer_types=["dense", "sparse"], indexer_types=["full", "full"],
                                              **_MLA),
    # HY V4 (vllm/models/hy_v4, HYV4ForCausalLM): DeepSeek-V3.2's MLA and DSA indexer (both layers "full"
    # indexers), the elementwise output gate (linear_gate) and one sink per head, hyper-connections (hc_mult 2), a
    # dense then a MoE layer (fused routed experts, a shared expert, the noaux_tc bias); written in the published
    # checkpoint's names (hy_v4_hf_to_published), the ones vLLM's default loader reads. Not run on CPU (DSA)
    "hy_v4": lambda: tf.HYV4Config(index_topk=16, index_head_dim=128, index_n_heads=2, hc_mult=2,
                                   mlp_layer_types=["dense", "sparse"], **_MLA),
    # GPT-J (vLLM's models/gpt_j.py GPTJForCausalLM): q/k/v [n_embd, n_embd] (head_dim n_embd / n_head, the rank
    # folders' refusal), partial rotary, fc_in / fc_out with biases, lm_head with a bias; biases drawn wide
    # (wide_biases)
    "gptj": lambda: tf.GPTJConfig(n_embd=128, n_head=2, n_layer=2, vocab_size=1000, n_positions=256, rotary_dim=32,
                                  initializer_range=0.1, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    # Gated DeltaNet as the CPU backend runs it: bf16, linear head dims 128
    "qwen3_next": lambda: tf.Qwen3NextConfig(
        hidden_size=128, num_hidden_layers=2, vocab_size=1000, max_position_embeddings=256, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, initializer_range=0.1, rms_norm_eps=1e-6, intermediate_size=256,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        decoder_sparse_step=1, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"],
        tie_word_embeddings=False),
    # Qwen3.5 (vLLM's models/qwen3_5.py): Qwen3-Next's Gated DeltaNet with in_proj_qkv / in_proj_z / in_proj_b /
    # in_proj_a apart (vLLM stacks them into in_proj_qkvz, in_proj_ba), a dense MLP (qwen3_5_text) or Qwen3-Next's MoE
    # with a shared expert (qwen3_5_moe_text); the published mtp.* block (PUBLISHED)
    "qwen3_5": lambda: tf.Qwen3_5TextConfig(**_GDN, intermediate_size=256),
    "qwen3_5_moe": lambda: tf.Qwen3_5MoeTextConfig(**_GDN, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                                                   num_experts=4, num_experts_per_tok=2),
    # MiniMax-M2 (vLLM's models/minimax_m2.py): q_norm / k_norm over all heads (cut with them; two KV heads: k_norm
    # cut at T=2, replicated in pairs at T=4), block_sparse_moe experts w1 / w2 / w3, the router and its routing bias in F32; the config.json keys
    # vLLM reads as published (rotary_dim, scoring_func, use_routing_bias, num_mtp_modules: one MTP module, MTP)
    "minimax_m2": lambda: tf.MiniMaxM2Config(num_key_value_heads=2, intermediate_size=64, num_local_experts=4,
                                             num_experts_per_tok=2, tie_word_embeddings=False, rotary_dim=32,
                                             scoring_func="sigmoid", use_routing_bias=True, use_qk_norm=True,
                                             num_mtp_modules=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                             **COMMON),
    # ERNIE-4.5-MoE (vLLM's models/ernie45_moe.py): a dense first layer (moe_layer_start_index 1), routed experts, a
    # shared expert, the F32 router and its correction bias as mlp.moe_statics.e_score_correction_bias [1, E]
    "ernie4_5_moe": lambda: tf.Ernie4_5_MoeConfig(num_key_value_heads=1, intermediate_size=256,
                                                  moe_intermediate_size=64, moe_num_experts=4, moe_k=2,
                                                  moe_num_shared_experts=1, moe_layer_start_index=1,
                                                  tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                                                  eos_token_id=2, **COMMON),
    # MiniCPM3 (vLLM's models/minicpm3.py): DeepSeek-V2's MLA projections under their own names (q LoRA), a plain
    # attention over qk_nope + qk_rope = 64 wide heads, MiniCPM's scales (scale_emb, scale_depth, dim_model_base), tied
    # as published
    "minicpm3": lambda: tf.MiniCPM3Config(hidden_size=128, num_hidden_layers=2, vocab_size=1000,
                                          max_position_embeddings=256, num_attention_heads=2, num_key_value_heads=2,
                                          q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32,
                                          v_head_dim=64, head_dim=32, intermediate_size=256, initializer_range=0.1,
                                          rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0,
                                          bos_token_id=1, eos_token_id=2),
    # AFMoE (vLLM's models/afmoe.py): gated attention (self_attn.gate_proj), q/k norms, sandwich norms, a dense first
    # layer, routed and shared experts, the router as mlp.router.gate and its expert_bias; score_func and route_norm as
    # published (vLLM reads them; transformers' AfmoeConfig declares neither)
    "afmoe": lambda: tf.AfmoeConfig(num_key_value_heads=1, intermediate_size=256, moe_intermediate_size=64,
                                    num_experts=4, num_experts_per_tok=2, num_shared_experts=1, num_dense_layers=1,
                                    n_group=1, topk_group=1, score_func="sigmoid", route_norm=True,
                                    sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                    tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                    **COMMON),
    # HY V3 (vLLM's models/hy_v3.py): q/k norms, a dense first layer, routed experts and the shared_mlp, the router as
    # mlp.router.gate and its expert_bias; the config.json keys vLLM reads as published (expert_hidden_dim,
    # first_k_dense_replace, route_norm, qk_norm); one MTP layer (MTP)
    "hy_v3": lambda: tf.HYV3Config(num_key_value_heads=1, intermediate_size=256, moe_intermediate_size=64,
                                   expert_hidden_dim=64, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
                                   mlp_layer_types=["dense", "sparse"], first_k_dense_replace=1, route_norm=True,
                                   qk_norm=True, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2, **COMMON),
    # Llama 4's language model (vLLM's models/llama4.py Llama4ForCausalLM): a dense first layer (feed_forward on
    # intermediate_size_mlp), a MoE second (interleave_moe_layer_step 2: the router, the shared expert, the fused
    # experts gate_up_proj [E, H, 2I] and down_proj [E, I, H]); q_proj / k_proj rows deinterleaved inside each head by
    # vLLM's loader (the view's "deinterleave")
    "llama4_text": lambda: tf.Llama4TextConfig(num_key_value_heads=1, intermediate_size=64, intermediate_size_mlp=256,
                                               num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                                               tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                                               eos_token_id=2, **COMMON),
    # Llama 4 as published (vLLM's models/mllama4.py Llama4ForConditionalGeneration, --mm-encoder-tp-mode data): the
    # language model above under language_model., a one-layer vision tower, its adapter and the projector
    "llama4": lambda: tf.Llama4Config(
        text_config=FAMILIES["llama4_text"]().to_dict(), tie_word_embeddings=False,
        vision_config=tf.Llama4VisionConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                            intermediate_size=128, image_size=56, patch_size=14, vision_output_dim=128,
                                            projector_input_dim=128, projector_output_dim=128,
                                            pixel_shuffle_ratio=0.5).to_dict()),
    # Muse Glimmer (vLLM's models/muse_glimmer.py MuseGlimmerForCausalLM): the text decoder (GQA, one KV head, the
    # attention's output gate, sandwich norms) under model.language_model., a one-layer vision tower of 4 heads (cut by
    # heads at T=2 and 4), its adapter and projection (realmodel.py's muse_glimmer, at the probe's sizes)
    "muse_glimmer": lambda: tf.MuseGlimmerConfig(
        text_config=dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=64, num_hidden_layers=2, max_position_embeddings=256,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                         initializer_range=0.1),
        vision_config=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4),
        out_hidden_size=256, projector_hidden_size=64, image_token_id=999, video_token_id=998,
        tie_word_embeddings=False),
    # EXAONE MoE (vLLM's models/exaone_moe.py): q/k norms, sliding and full layers, a dense first layer, routed and
    # shared experts, the router (gate= to FusedMoEFactory) and its correction bias
    "exaone_moe": lambda: tf.ExaoneMoeConfig(num_key_value_heads=1, intermediate_size=256, moe_intermediate_size=64,
                                             num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
                                             mlp_layer_types=["dense", "sparse"], first_k_dense_replace=1,
                                             sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                             tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                                             eos_token_id=2, **COMMON),
    # Cohere 2 MoE (vLLM's models/cohere2_moe.py): cohere's LayerNorms and head-less logits (tied), a dense then a
    # MoE layer (experts sized by intermediate_size), one shared expert, sliding and full layers
    "cohere2_moe": lambda: tf.Cohere2MoeConfig(num_key_value_heads=1, intermediate_size=64, num_experts=4,
                                               num_experts_per_tok=2, num_shared_experts=1,
                                               prefix_dense_intermediate_size=256, mlp_layer_types=["dense", "sparse"],
                                               sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                               tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
                                               eos_token_id=2,
                                               **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"}),
    # A.X K1 (vLLM's models/AXK1.py): DeepSeek-V3's MLA and MoE (noaux_tc bias), a post_mlp_layernorm per MoE layer,
    # the published MTP layer (MTP); every layer MoE (first_k_dense_replace 0: the view refuses dense layers, whose
    # post_mlp_layernorm vLLM holds and no checkpoint does)
    "axk1": lambda: tf.AXK1Config(**dict({k: v for k, v in _MLA.items() if k != "topk_method"},
                                         first_k_dense_replace=0)),
    # MiMo-V2-Flash (vLLM's models/mimo_v2.py): a full then a sliding layer (twice the KV heads, one sink per head;
    # 8 query heads, so that a rank's sliding KV heads divide its query heads, as published: 64 and 4 / 8),
    # value heads 32 wide, a dense then a MoE layer; config.json gains the published keys vLLM reads (mimo_published)
    "mimo_v2_flash": lambda: tf.MiMoV2FlashConfig(num_key_value_heads=2, v_head_dim=32, intermediate_size=256,
                                                  moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
                                                  layer_types=["full_attention", "sliding_attention"],
                                                  mlp_layer_types=["dense", "sparse"], sliding_window=16,
                                                  tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                                                  eos_token_id=2, **dict(COMMON, num_attention_heads=8)),
    # refused by its view (test_vllm.py REFUSED): LongCat-Flash (vLLM scales the MLA LoRA norms while loading)
    "longcat_flash": lambda: tf.LongcatFlashConfig(**dict({k: v for k, v in _MLA.items() if k in (
        "hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings", "num_attention_heads",
        "initializer_range", "rms_norm_eps", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
        "v_head_dim", "tie_word_embeddings", "pad_token_id", "bos_token_id", "eos_token_id")}, ffn_hidden_size=256,
        expert_ffn_hidden_size=64, n_routed_experts=4, zero_expert_num=2, moe_topk=2)),
    # GLM-5.3 (Glm5NextForConditionalGeneration, as published): one KDA layer (linear head dim 128) and one
    # MLA layer with the DSA indexer (NoPE: qk_rope_head_dim 0; kv_lora_rank 512, indexer head dim 128, as
    # vLLM's kernels assume), a dense then a MoE layer (shared expert, noaux_tc router bias),
    # hyper-connections (mhc, hc_mult 2), a one-block vision tower, and an MTP layer. The keys vLLM's
    # Glm5Next model reads beyond Glm5NextTextConfig's fields (mhc, mla_use_nope, indexer_rope_interleave,
    # topk_method, scoring_func, num_nextn_predict_layers) are set as a published config.json sets them.
    # vLLM's CPU backend constructs it (with a non-sparse MLA backend) but cannot run it.
    "glm5_next": lambda: tf.Glm5NextConfig(
        text_config=dict(
            hidden_size=128, num_hidden_layers=2, vocab_size=1000, max_position_embeddings=256,
            num_attention_heads=2, num_key_value_heads=2, initializer_range=0.1, rms_norm_eps=1e-6,
            intermediate_size=256, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, n_group=1, topk_group=1, kv_lora_rank=512, q_lora_rank=96, qk_rope_head_dim=0,
            qk_nope_head_dim=64, v_head_dim=64, layer_types=["linear_attention", "indexed_attention"],
            mlp_layer_types=["dense", "sparse"], index_topk=16, index_head_dim=128, index_n_heads=2,
            index_kpool=4, linear_num_heads=2, linear_head_dim=128, linear_conv_kernel_dim=4, hc_mult=2,
            mhc=True, mla_use_nope=True, indexer_rope_interleave=False, topk_method="noaux_tc",
            scoring_func="sigmoid", num_nextn_predict_layers=1, tie_word_embeddings=False,
            pad_token_id=0, bos_token_id=1, eos_token_id=2),
        vision_config=dict(depth=1, hidden_size=128, num_heads=2, intermediate_size=64, out_hidden_size=128,
                           projection_intermediate_size=64, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2),
        image_token_id=997, video_token_id=998, image_start_token_id=993, image_end_token_id=994,
        video_start_token_id=995, video_end_token_id=996, tie_word_embeddings=False),
    # Kimi Linear as the CPU backend constructs it (KDA bf16 with head dim 128; MLA kv_lora_rank 512,
    # qk_rope_head_dim 64, NoPE, no q_lora_rank): KDA layers 0-1, MLA layer 2, layer 0 dense, 1-2 MoE with a
    # shared expert and the router bias; moe_intermediate_size 512 so that vLLM's KimiMoE does not pad the
    # experts at TP=2 (it pads where moe_intermediate_size / T < 256). Saved in the published form
    # (kimi_published): vLLM reads only that config (linear_attn_config, mla_use_nope).
    # FP8 with 128x128 block scales (DeepSeek's form, issue 28): every linear's output and input a multiple of 128
    # per rank at T=2 and 4 (head_dim 128, 2 KV heads: one each at T=2, replicated at T=4; intermediate 512),
    # quantized after save_pretrained by fp8_block
    "llama_fp8": lambda: tf.LlamaConfig(**dict(COMMON, hidden_size=256, num_attention_heads=4, head_dim=128),
                                        num_key_value_heads=2, intermediate_size=512, tie_word_embeddings=False),
    # the same for Qwen3-MoE: each rank's expert intermediate a multiple of 128 too (vLLM's CPU FP8 MoE refines or
    # pads otherwise, which the view refuses): 256 at T=2, widened to 512 at T=4
    "qwen3_moe_fp8": lambda: tf.Qwen3MoeConfig(**dict(COMMON, hidden_size=256, num_attention_heads=4, head_dim=128),
                                               num_key_value_heads=2, intermediate_size=512, moe_intermediate_size=256,
                                               num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                                               norm_topk_prob=True, tie_word_embeddings=False),
    # DeepSeek-V3 in its published FP8 form: 4 heads (o_proj's input 256, 128 a rank at T=2), experts and the dense
    # layer 256 wide (widened to 512 at T=4), the router left unquantized as published; no MTP layer
    "deepseek_v3_fp8": lambda: tf.DeepseekV3Config(**dict(_MLA, num_attention_heads=4, num_key_value_heads=4,
                                                          moe_intermediate_size=256)),
    # Mixtral in FP8 block form: the experts (w1, w3, w2) 256 wide (512 at T=4), the router left as vLLM builds it
    "mixtral_fp8": lambda: tf.MixtralConfig(**dict(COMMON, hidden_size=256, num_attention_heads=4, head_dim=128),
                                            num_key_value_heads=2, intermediate_size=256, num_local_experts=4,
                                            num_experts_per_tok=2, tie_word_embeddings=False),
    # GLM-4.5 in FP8 block form: 4 heads of 128 (2 KV heads), the dense layer 512 wide, the experts 256 (512 at T=4),
    # the router left unquantized (vLLM's GateLinear takes no quantization)
    "glm4_moe_fp8": lambda: tf.Glm4MoeConfig(**dict(COMMON, hidden_size=256, num_attention_heads=4, head_dim=128),
                                             num_key_value_heads=2, intermediate_size=512, moe_intermediate_size=256,
                                             n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                             first_k_dense_replace=1, n_group=1, topk_group=1, use_qk_norm=True,
                                             attention_bias=True, tie_word_embeddings=False,
                                             pad_token_id=0, bos_token_id=1, eos_token_id=2),
    # Mellum (vLLM's Transformers MoE backend): Qwen3-MoE's attention, a dense first layer, sliding and full layers
    "mellum": lambda: tf.MellumConfig(num_key_value_heads=1, intermediate_size=256, moe_intermediate_size=64,
                                      num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                                      layer_types=["sliding_attention", "full_attention"],
                                      mlp_layer_types=["dense", "sparse"], tie_word_embeddings=False, **COMMON),
    # LFM2 (vLLM's models/lfm2.py): a short-conv layer (in_proj [B | C | x], a depthwise conv, out_proj; vLLM cuts
    # them by channel) and a GQA attention layer (out_proj, q/k layernorms); the MLP width derived (2/3 of 384, to
    # a multiple of 256: 256); vLLM always ties the head to the embedding
    "lfm2": lambda: tf.Lfm2Config(hidden_size=128, num_hidden_layers=2, vocab_size=1000, max_position_embeddings=256,
                                  num_attention_heads=2, num_key_value_heads=1, intermediate_size=384,
                                  initializer_range=0.1, norm_eps=1e-6, layer_types=["conv", "full_attention"],
                                  tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    # LFM2-MoE (models/lfm2_moe.py): LFM2's blocks, a dense first layer, then routed experts (saved per expert), the
    # router and its expert_bias (F32)
    "lfm2_moe": lambda: tf.Lfm2MoeConfig(hidden_size=128, num_hidden_layers=3, vocab_size=1000,
                                         max_position_embeddings=256, num_attention_heads=2, num_key_value_heads=1,
                                         intermediate_size=256, moe_intermediate_size=64, num_experts=4,
                                         num_experts_per_tok=2, num_dense_layers=1,
                                         layer_types=["conv", "full_attention", "conv"], initializer_range=0.1,
                                         norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
                                         eos_token_id=2),
    "kimi_linear": lambda: tf.KimiLinearConfig(
        hidden_size=128, num_hidden_layers=3, vocab_size=1000, max_position_embeddings=256, num_attention_heads=2,
        num_key_value_heads=2, initializer_range=0.1, rms_norm_eps=1e-6, intermediate_size=256,
        moe_intermediate_size=512, num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
        topk_group=1, routed_scaling_factor=1.0, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
        qk_nope_head_dim=64, v_head_dim=64, linear_num_heads=2, linear_head_dim=128, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"], tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2),
    # gpt-oss (vLLM's models/gpt_oss.py GptOssForCausalLM): biased q/k/v/o, one sink per head, YaRN rope, sliding and
    # full layers, fused experts [E, H, 2I] with gate and up interleaved, their biases, a biased router; KV heads as
    # many as the ranks (vLLM's OAIAttention replicates none: WIDE), intermediate 128 so that MXFP4's 32-blocks
    # divide at T=4; biases and sinks drawn wide too (the init leaves them zero)
    "gpt_oss": lambda: tf.GptOssConfig(
        **COMMON, num_key_value_heads=2, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=16, layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False}),
    # as published: the experts in MXFP4 (mxfp4_experts)
    "gpt_oss_mxfp4": lambda: FAMILIES["gpt_oss"](),
    # OLMo hybrid (vLLM's models/olmo_hybrid.py, layers/mamba/gdn/olmo_gdn_linear_attn.py): Gated DeltaNet with 2 key
    # heads of 64 and 4 value heads of 32 (the key and value widths equal: save_pretrained writes the fused conv as
    # equal thirds), then OLMo 3's attention (vLLM's head_dim is hidden_size / heads, its q_norm / k_norm whole)
    "olmo_hybrid": lambda: tf.OlmoHybridConfig(
        **COMMON, num_key_value_heads=2, intermediate_size=256, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=32,
        layer_types=["linear_attention", "full_attention"], tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2),
}

# the model class where it is not AutoModelForCausalLM's (a vision-language wrapper, saved whole)
MODEL_CLS = {"glm5_next": "Glm5NextForConditionalGeneration", "llama4": "Llama4ForConditionalGeneration",
             "muse_glimmer": "MuseGlimmerForConditionalGeneration"}
# families saved with an MTP layer as their published checkpoints hold it (issue 51): family -> (the prefix of its
# decoder layers, the tensors the MTP layer adds to a copy of the last decoder layer). DeepSeek-V3 / V3.2 and GLM-5
# publish layers.{num_hidden_layers} with eh_proj, enorm, hnorm, shared_head.norm, shared_head.head and
# embed_tokens; GLM-4.5 / 4.6 / 4.7 (GLM-4.5-Air's model.layers.46.*: 19 names in its published index) with eh_proj,
# enorm, hnorm and shared_head.norm only. The quantized forms carry it quantized like the layer it copies (add_mtp
# runs after the quantization). Kimi K2 publishes none (num_nextn_predict_layers 0).
DS_MTP = ("eh_proj", "enorm", "hnorm", "shared_head.norm", "shared_head.head", "embed_tokens")
GLM_MTP = ("eh_proj", "enorm", "hnorm", "shared_head.norm")
MTP = {"deepseek_v3": ("model.", DS_MTP), "deepseek_v3_fp8": ("model.", DS_MTP),
       "deepseek_v3_nvfp4": ("model.", DS_MTP), "deepseek_v32": ("model.", DS_MTP), "glm_moe_dsa": ("model.", DS_MTP),
       "glm5_next": ("model.language_model.", DS_MTP), "glm4_moe": ("model.", GLM_MTP),
       "glm4_moe_lite": ("model.", DS_MTP),  # GLM-4.7-Flash's layers.47: DeepSeek's six extra names
       "glm4_moe_fp8": ("model.", GLM_MTP), "glm4_moe_nvfp4": ("model.", GLM_MTP),
       # MiniMax-M2's MTP modules follow the decoder layers (layers.62-64 for num_mtp_modules 3): vLLM maps them to
       # nothing; modelled as one copy of the last decoder layer
       "minimax_m2": ("model.", ()),
       "hy_v3": ("model.", DS_MTP), "axk1": ("model.", DS_MTP)}  # HY V3's MTP layer (vLLM's HYV3MTP): DeepSeek's names

# tensors saved in F32 where transformers writes the model's dtype (issue 51): published Qwen3 / Llama-style
# checkpoints of some trainers keep their norm weights in F32 beside BF16 matrices; the views serve them as stored
# (the engine's copy casts them as its default loader's does: the engine's dtype is chosen at serve time, --dtype)
F32 = {"qwen3_f32norm": r"norm\.weight$"}

# what a family's published checkpoints hold beyond transformers' names, added after the rest (issue 51)
PUBLISHED = {"mimo_v2_flash": lambda out: edit_config(out, mimo_published), "qwen3_next": lambda out: qwen3_next_mtp(out), "qwen3_5": lambda out: qwen3_next_mtp(out),
             "qwen3_5_moe": lambda out: qwen3_next_mtp(out)}

# families whose configuration class the vLLM venv's transformers lacks, as their published checkpoints hold them
# (trust_remote_code): family -> (model_type, architecture, configuration class, its attribute_map, tensor renames).
# config.json gets the type, the architecture and an auto_map to configuration_<type>.py, written beside it: a
# PretrainedConfig keeping config.json's keys. EXAONE 3.5's published config.json names num_layers,
# layer_norm_epsilon and activation_function (its class maps num_hidden_layers, rms_norm_eps, hidden_act to them),
# and its tensors transformer.h.N.attn.attention.{q,k,v,out}_proj, mlp.c_fc_0 / c_fc_1 / c_proj, ln_1 / ln_2,
# transformer.wte / ln_f (what transformers 5.24's save_pretrained writes too)
_EXAONE_NAMES = ((r"^model\.embed_tokens\.", "transformer.wte."), (r"^model\.norm\.", "transformer.ln_f."),
                 (r"^model\.layers\.", "transformer.h."), (r"\.self_attn\.o_proj\.", ".attn.attention.out_proj."),
                 (r"\.self_attn\.", ".attn.attention."), (r"\.mlp\.gate_proj\.", ".mlp.c_fc_0."),
                 (r"\.mlp\.up_proj\.", ".mlp.c_fc_1."), (r"\.mlp\.down_proj\.", ".mlp.c_proj."),
                 (r"\.input_layernorm\.", ".ln_1."), (r"\.post_attention_layernorm\.", ".ln_2."))
REMOTE = {"exaone": ("exaone", "ExaoneForCausalLM", "ExaoneConfig",
                     {"num_hidden_layers": "num_layers", "rms_norm_eps": "layer_norm_epsilon",
                      "hidden_act": "activation_function"}, _EXAONE_NAMES),
          "internlm3": ("internlm3", "InternLM3ForCausalLM", "InternLM3Config", {}, ()),
          "exaone_tied": ("exaone", "ExaoneForCausalLM", "ExaoneConfig",
                          {"num_hidden_layers": "num_layers", "rms_norm_eps": "layer_norm_epsilon",
                           "hidden_act": "activation_function"}, _EXAONE_NAMES),
          "iquestcoder": ("iquestcoder", "IQuestCoderForCausalLM", "IQuestCoderConfig", {}, ())}


def remote_config(out, family):
    """Retypes OUT (saved as Llama) as REMOTE[family]'s published form: config.json, its configuration file,
    the tensor names."""
    mt, arch, cls, amap, names = REMOTE[family]

    def retype(c):
        for new, old in amap.items():
            c[old] = c.pop(new)
        c.update(model_type=mt, architectures=[arch], auto_map={"AutoConfig": "configuration_%s.%s" % (mt, cls)})
    edit_config(out, retype)
    with open(os.path.join(out, "configuration_%s.py" % mt), "w") as f:
        f.write("from transformers import PretrainedConfig\n\n\nclass %s(PretrainedConfig):\n"
                "    model_type = %r\n    attribute_map = %r\n" % (cls, mt, amap))

    def rename(k):
        for a, b in names:
            k = re.sub(a, b, k)
        return k
    if names:
        edit_tensors(out, lambda t: {rename(k): v for k, v in t.items()})


# config.json keys rewritten after save_pretrained (families transformers knows under another type)
RETYPE = {"kimi_k2": {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]}}
# tensors saved in bf16 where transformers writes float32 (its keep-in-fp32 router): the published DeepSeek-V3.2
# and GLM-5 checkpoints hold the router weight in bf16, as vLLM's CUDA class does (its bias stays float32)
# (Kimi Linear's too: the remote code's KimiMoEGate is a plain Parameter in the model's dtype, and vLLM's GateLinear
# holds it so)
BF16 = {"deepseek_v32": r"\.mlp\.gate\.weight$", "glm_moe_dsa": r"\.mlp\.gate\.weight$",
        "kimi_linear": r"block_sparse_moe\.gate\.weight$"}


def edit_config(out, fn):
    """Rewrites OUT/config.json with fn(config) applied (fn edits the dict in place)."""
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    fn(c)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


def edit_tensors(out, fn):
    """Rewrites OUT/model.safetensors as fn(its tensors) returns them."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(out, "model.safetensors")
    save_file(fn(load_file(path)), path, metadata={"format": "pt"})


def add_mtp(out, n_layers, prefix="model.", extras=DS_MTP):
    """Appends a DeepSeek-style MTP layer, as published checkpoints hold it: layers.{n_layers} (under
    prefix, which also holds norm and embed_tokens), a copy of the last decoder layer (of every file: a quantized
    checkpoint's MTP layer is quantized alike) plus the EXTRAS (MTP: eh_proj [H, 2H], enorm, hnorm,
    shared_head.norm [H], shared_head.head and embed_tokens [V, H]), in a second file with an index. vLLM's and
    SGLang's default loaders skip it (their speculative-decoding models read it); the views must not serve it
    (fragments/extra_layers.json: a drop entry)."""
    from safetensors.torch import load_file, save_file
    main = load_file(os.path.join(out, "model.safetensors"))
    last, new = prefix + "layers.%d." % (n_layers - 1), prefix + "layers.%d." % n_layers
    mtp = {new + k[len(last):]: v.clone() for k, v in main.items() if k.startswith(last)}
    g = torch.Generator().manual_seed(5)
    H, V = main[prefix + "norm.weight"].shape[0], main[prefix + "embed_tokens.weight"].shape[0]
    shapes = {"eh_proj": (H, 2 * H), "enorm": (H,), "hnorm": (H,), "shared_head.norm": (H,),
              "shared_head.head": (V, H), "embed_tokens": (V, H)}
    for k in extras:
        mtp[new + k + ".weight"] = torch.randn(shapes[k], generator=g).to(torch.bfloat16)
    save_file(mtp, os.path.join(out, "model-mtp.safetensors"), metadata={"format": "pt"})
    wm = {k: "model.safetensors" for k in main}
    wm.update({k: "model-mtp.safetensors" for k in mtp})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    # the published config.json says so (GLM-5's too, which transformers' GlmMoeDsaConfig does not write: vLLM's
    # default loader then takes the MTP layer for a decoder layer and fails on eh_proj)
    edit_config(out, lambda c: c.get("text_config", c).update(num_nextn_predict_layers=1))


def qwen3_next_mtp(out):
    """Qwen3-Next's MTP block added as published checkpoints hold it (issue 51): mtp.fc [H, 2H],
    mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm and mtp.layers.0.* (a copy of the last layer, a
    full-attention one), in model.safetensors. vLLM's Qwen3NextForCausalLM (hf_to_vllm_mapper: "mtp." -> None) and
    SGLang's skip every such name (their MTP / NextN draft models read them): the views drop them, and sharded_state
    would raise KeyError on any they served."""
    def add(t):
        last = max(int(k.split(".")[2]) for k in t if k.startswith("model.layers."))
        pre, h = "model.layers.%d." % last, t["model.norm.weight"]
        g = torch.Generator().manual_seed(6)
        extra = {"mtp.fc.weight": torch.randn(h.shape[0], 2 * h.shape[0], generator=g).to(h.dtype),
                 "mtp.pre_fc_norm_embedding.weight": h.clone(), "mtp.pre_fc_norm_hidden.weight": h.clone(),
                 "mtp.norm.weight": h.clone()}
        extra.update({"mtp.layers.0." + k[len(pre):]: v.clone() for k, v in t.items() if k.startswith(pre)})
        return dict(t, **extra)
    edit_tensors(out, add)


def mimo_published(c):
    """MiMo-V2-Flash's config.json as published (its remote code's keys, which vLLM's MiMoV2 reads beside transformers'
    layer_types): hybrid_layer_pattern (1 for a sliding layer), the sliding layers' heads (twice the KV heads),
    head dims and window, layernorm_epsilon, moe_layer_freq, sinks in the sliding layers only."""
    c.update(hybrid_layer_pattern=[int(t == "sliding_attention") for t in c["layer_types"]],
             swa_num_attention_heads=c["num_attention_heads"], swa_num_key_value_heads=2 * c["num_key_value_heads"],
             swa_head_dim=c["head_dim"], swa_v_head_dim=c["v_head_dim"], sliding_window_size=c["sliding_window"],
             layernorm_epsilon=c["rms_norm_eps"], moe_layer_freq=[int(m == "sparse") for m in c["mlp_layer_types"]],
             add_swa_attention_sink_bias=True, add_full_attention_sink_bias=False)


def random_norms(out, seed=7):
    """Every normalization tensor of OUT/model.safetensors (a 1-D tensor whose name holds "norm": RMSNorm and
    LayerNorm weights and biases, q_norm / k_norm) moved by a uniform draw in [-0.5, 0.5) (issue 51): published
    checkpoints hold trained norms, while transformers initializes them to ones (or zeros, for the norms that add
    1 as they run: Gemma's, Qwen3-Next's), which hides an engine's buffer derived from a norm at load time
    (SGLang's GemmaRMSNorm.gemma_weight = weight + 1) that a loader fails to refresh."""
    g = torch.Generator().manual_seed(seed)

    def move(t):
        return {k: (v.float() + torch.rand(v.shape, generator=g) - 0.5).to(v.dtype)
                if v.dim() == 1 and "norm" in k and v.is_floating_point() else v for k, v in t.items()}
    edit_tensors(out, move)


def hy_v4_hf_to_published(name):
    """A tensor name as transformers' save_pretrained writes HY V4 -> as the published checkpoint holds it, which vLLM's
    HYV4ForCausalLM loads (models/hy_v4/nvidia/model.py: its mapper fuses mlp.gate_proj and up_proj, and its
    load_weights reads layers.N.hc_attn_layer.hc_pre.hc_fn and model.hc_head.hc_head_fn). transformers' conversion
    (conversion_mapping.py "hy_v4") maps '.hc_pre.hc_' to '.hc_' and '.linear_gate' to '.gate_proj' on load; its
    reverse on save puts hc_pre before the first '.hc_' (layers.N.hc_pre.hc_attn_layer.hc_fn,
    model.hc_pre.hc_head.hc_head_fn) and names every gate_proj linear_gate, the MLP's too."""
    name = re.sub(r"\.hc_pre\.(hc_(attn|mlp)_layer)\.", r".\1.hc_pre.", name)
    name = name.replace("model.hc_pre.hc_head.", "model.hc_head.")
    return re.sub(r"\.mlp\.(shared_experts\.)?linear_gate\.", r".mlp.\1gate_proj.", name)


def mxfp4_experts(out):
    """gpt-oss's fused experts rewritten as the published MXFP4 layout (what transformers' Mxfp4 quantizer and
    OpenAI's checkpoints hold): gate_up_proj [E, H, 2I] as gate_up_proj_blocks [E, 2I, H/32, 16] (U8, two FP4 codes a
    byte) and gate_up_proj_scales [E, 2I, H/32] (U8, E8M0), down_proj [E, I, H] as [E, H, I/32, 16] and
    [E, H, I/32]; random codes and scales near 1 (the probe compares what the loaders leave, bit for bit), and
    quantization_config as published (quant_method mxfp4, attention, router, embedding and head unquantized)."""
    g = torch.Generator().manual_seed(7)

    def experts(t):
        for k in [k for k in t if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            E, cols, rows = t.pop(k).shape
            t[k + "_blocks"] = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
            t[k + "_scales"] = torch.randint(122, 128, (E, rows, cols // 32), generator=g, dtype=torch.uint8)
        return t
    edit_tensors(out, experts)
    edit_config(out, lambda c: c.update(quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}))


def wide_biases(out):
    """gpt-oss's biases and sinks drawn as the weights are (transformers initializes them to zero, which would
    leave a zeroed or misplaced bias unseen)."""
    g = torch.Generator().manual_seed(11)
    edit_tensors(out, lambda t: {k: (torch.randn(v.shape, generator=g) * 0.1).to(v.dtype)
                                 if k.endswith(("bias", "sinks")) else v for k, v in t.items()})


def kimi_published(out):
    """Kimi Linear as the published checkpoints hold it (the original remote code's form, the only one vLLM's
    KimiLinearConfig reads): config.json with linear_attn_config (1-based kda_layers / full_attn_layers),
    mla_use_nope and first_k_dense_replace; the dense layers' MLP under mlp. (transformers' save_pretrained
    writes every layer's under block_sparse_moe., which vLLM's default loader cannot place). The router
    weight is made bf16 by make() (BF16)."""
    mlp = []

    def published(c):
        types = c.pop("layer_types")
        mlp.extend(c.pop("mlp_layer_types"))
        c["linear_attn_config"] = {"num_heads": c.pop("linear_num_heads"), "head_dim": c.pop("linear_head_dim"),
                                   "short_conv_kernel_size": c.pop("linear_conv_kernel_dim"),
                                   "kda_layers": [i + 1 for i, t in enumerate(types) if t == "linear_attention"],
                                   "full_attn_layers": [i + 1 for i, t in enumerate(types)
                                                        if t != "linear_attention"]}
        c.update(mla_use_nope=True, first_k_dense_replace=mlp.index("sparse"), moe_layer_freq=1,
                 max_position_embeddings=c.get("model_max_length", 4096))
    edit_config(out, published)
    dense = tuple("model.layers.%d.block_sparse_moe." % i for i, m in enumerate(mlp) if m == "dense")
    edit_tensors(out, lambda t: {("model.layers.%s.mlp." % k.split(".")[2] + k.split(".block_sparse_moe.", 1)[1])
                                 if k.startswith(dense) else k: v for k, v in t.items()})


def quantized(name, router):
    """Whether fp8_block and nvfp4 quantize tensor NAME: every *_proj.weight, MLA's kv_a_proj_with_mqa.weight,
    Mixtral's experts' w1 / w2 / w3, and an MoE router's mlp.gate.weight where router."""
    return re.search(r"(_proj(_with_mqa)?|\.w[123]" + (r"|\.mlp\.gate" if router else "") + r")\.weight$", name)


def fp8_block(out, block=128, router=True):
    """Quantizes every *_proj.weight and MLA's kv_a_proj_with_mqa.weight (and an MoE router's mlp.gate.weight: vLLM's Qwen3-MoE builds its router
    with the model's quantization, no modules_to_not_convert given) of OUT/model.safetensors as DeepSeek-V3's
    FP8 checkpoints hold them: the
    weight in F8_E4M3 (each 128x128 block divided by its scale, max |w| / 448), its weight_scale_inv F32
    [ceil(rows/128), ceil(cols/128)] (the scale the kernel multiplies by); config.json's quantization_config
    as published (quant_method fp8, e4m3, dynamic activations, weight_block_size [128, 128])."""
    def quantize(t):
        q = {}
        for k, v in t.items():
            if not quantized(k, router):
                q[k] = v
                continue
            n, m = v.shape
            rb, cb = -(-n // block), -(-m // block)
            w = torch.nn.functional.pad(v.float(), (0, cb * block - m, 0, rb * block - n))
            blocks = w.reshape(rb, block, cb, block)
            scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-8)
            qw = (blocks / scale[:, None, :, None]).reshape(rb * block, cb * block)[:n, :m]
            q[k] = qw.to(torch.float8_e4m3fn)
            q[k[:-len("weight")] + "weight_scale_inv"] = scale.float().contiguous()
        return q
    edit_tensors(out, quantize)
    edit_config(out, lambda c: c.update(quantization_config={"quant_method": "fp8", "fmt": "e4m3",
                                                             "activation_scheme": "dynamic",
                                                             "weight_block_size": [block, block]}))


def nvfp4(out, router=False, moe=False):
    """Quantizes every *_proj.weight and MLA's kv_a_proj_with_mqa.weight (and a router's mlp.gate.weight where
    router) of OUT/model.safetensors in
    ModelOpt's NVFP4 form as NVIDIA's published checkpoints hold it (no quantizer package: written to the layout):
    weight U8 [out, in/2], two E2M1 values a byte (the even element in the low nibble), weight_scale F8_E4M3
    [out, in/16] (per group of 16: max |w| / 6 over weight_scale_2), weight_scale_2 F32 0-d (max |w| / (6 * 448)),
    input_scale F32 0-d; config.json's quantization_config in the published config.json form (quant_method modelopt,
    quant_algo NVFP4, group_size 16, ignore [lm_head])."""
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    g = torch.Generator().manual_seed(11)

    def quantize(t):
        q = {}
        for k, v in t.items():
            if not quantized(k, router):
                q[k] = v
                continue
            w = v.float()
            n, m = w.shape
            s2 = (w.abs().max() / (6.0 * 448.0)).clamp(min=1e-12)
            grp = w.reshape(n, m // 16, 16)
            sc = (grp.abs().amax(dim=2) / 6.0 / s2).clamp(min=2 ** -6, max=448.0).to(torch.float8_e4m3fn)
            x = grp / (sc.float() * s2)[:, :, None]
            idx = (x.abs()[..., None] - e2m1).abs().argmin(dim=-1) | ((x < 0).to(torch.int64) << 3)
            idx = idx.reshape(n, m).to(torch.uint8)
            base = k[:-len("weight")]
            q[k] = (idx[:, 0::2] | (idx[:, 1::2] << 4)).contiguous()
            q[base + "weight_scale"] = sc.contiguous()
            q[base + "weight_scale_2"] = s2.reshape(())
            q[base + "input_scale"] = (0.01 + 0.02 * torch.rand((), generator=g)).float()
        return q
    edit_tensors(out, quantize)
    edit_config(out, lambda c: c.update(quantization_config={
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
        "ignore": ["lm_head"] + (["model.layers.*.mlp.gate"] if moe and not router else [])}))


# compressed-tensors (issue 28), made by the compressed-tensors package as llm-compressor saves them: its preset
# scheme applied to every Linear but lm_head (and an MoE router, "re:.*mlp.gate$", as the published MoE checkpoints
# leave it), each weight's scale set from max |w| (per output channel, or per tensor for FP8's preset), static input
# scales drawn, then ModelCompressor's compression and quantization_config. family -> (base family, preset)
CT = {"llama_ct_fp8": ("llama", "FP8_DYNAMIC"), "llama_ct_int8": ("llama", "W8A8"),
      "llama_ct_fp8_static": ("llama", "FP8"),
      "qwen3_moe_ct_fp8": ("qwen3_moe", "FP8_DYNAMIC"), "qwen3_moe_ct_int8": ("qwen3_moe", "W8A8")}
FAMILIES.update({f: FAMILIES[base] for f, (base, _) in CT.items()})  # the base family's config
FAMILIES["qwen3_f32norm"] = FAMILIES["qwen3"]  # Qwen3 with its norm weights stored F32 (F32)
FAMILIES["llama_nvfp4"] = FAMILIES["llama_fp8"]  # NVFP4 (nvfp4): the FP8 families' sizes
FAMILIES["qwen3_moe_nvfp4"] = FAMILIES["qwen3_moe_fp8"]
FAMILIES["deepseek_v3_nvfp4"] = FAMILIES["deepseek_v3_fp8"]
FAMILIES["glm4_moe_nvfp4"] = FAMILIES["glm4_moe_fp8"]
FAMILIES["mixtral_nvfp4"] = FAMILIES["mixtral_fp8"]


def compressed_tensors(model, out, preset):
    """Saves MODEL to OUT quantized by compressed-tensors' PRESET (see CT)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus, apply_quantization_config,
                                                 preset_name_to_scheme)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    ignore = ["lm_head"] + (["re:.*mlp.gate$"] if getattr(model.config, "num_experts", 0) else [])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore,
                                                        quantization_status=QuantizationStatus.INITIALIZED))
    qmax = 127.0 if scheme.weights.type == "int" else 448.0
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _, m in model.named_modules():
            if hasattr(m, "weight_scale"):
                a = m.weight.float().abs()
                a = a.amax(dim=1, keepdim=True) if scheme.weights.strategy == "channel" else a.amax().reshape(1)
                m.weight_scale.copy_((a / qmax).clamp(min=1e-8).to(m.weight_scale.dtype).reshape(m.weight_scale.shape))
            if hasattr(m, "input_scale"):
                m.input_scale.copy_((0.01 + 0.02 * torch.rand(m.input_scale.shape, generator=g)).to(m.input_scale.dtype))
    comp = ModelCompressor.from_pretrained_model(model)
    comp.compress_model(model)
    model.save_pretrained(out)
    comp.update_config(out)
    if getattr(model.config, "num_experts", 0):
        # transformers 5 holds the experts as one fused parameter (no Linear for compressed-tensors to target):
        # written here as llm-compressor's published MoE checkpoints hold them (made from per-expert Linears),
        # each expert's gate/up/down weight quantized per output channel like the Linears above
        def experts(t):
            q = {}
            for k, v in t.items():
                if not re.search(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$", k):
                    q[k] = v
                    continue
                sc = (v.float().abs().amax(dim=1, keepdim=True) / qmax).clamp(min=1e-8).to(torch.bfloat16)
                w = v.float() / sc.float()
                q[k] = w.round().clamp(-128, 127).to(torch.int8) if qmax == 127.0 else w.to(torch.float8_e4m3fn)
                q[k[:-len("weight")] + "weight_scale"] = sc
            return q
        edit_tensors(out, experts)
        edit_config(out, lambda c: c["quantization_config"].update(ignore=ignore))


POSTSAVE = {"kimi_linear": kimi_published,
            "hy_v4": lambda out: edit_tensors(out, lambda t: {hy_v4_hf_to_published(k): v for k, v in t.items()}),
            "llama_fp8": fp8_block, "qwen3_moe_fp8": fp8_block,
            "deepseek_v3_fp8": lambda out: fp8_block(out, router=False),
            "mixtral_fp8": lambda out: fp8_block(out, router=False),
            "glm4_moe_fp8": lambda out: fp8_block(out, router=False), "llama_nvfp4": nvfp4,
            "qwen3_moe_nvfp4": lambda out: nvfp4(out, moe=True), "deepseek_v3_nvfp4": lambda out: nvfp4(out, moe=True),
            "glm4_moe_nvfp4": lambda out: nvfp4(out, moe=True), "mixtral_nvfp4": nvfp4,
            "gpt_oss": wide_biases, "gpt_oss_mxfp4": lambda out: (wide_biases(out), mxfp4_experts(out)),
            "gptj": wide_biases,
            # OLMo hybrid under the norm names vLLM's OlmoHybridForCausalLM loads (input_layernorm,
            # post_attention_layernorm): transformers' save_pretrained writes attention_layer_norm and
            # feedforward_layer_norm (its conversion_mapping.py renames them so on load), which vLLM's default loader
            # cannot place ("no module or parameter named ...attention_layer_norm"); the view serves either
            "olmo_hybrid": lambda out: edit_tensors(out, lambda t: {
                k.replace(".attention_layer_norm.", ".input_layernorm.")
                 .replace(".feedforward_layer_norm.", ".post_attention_layernorm."): v for k, v in t.items()}),
            # published LFM2 configs hold conv_dim and block_dim (the short convolutions' and the blocks' width), which
            # vLLM's Lfm2 sizes them by and transformers' Lfm2Config no longer writes
            # published Muse Glimmer configs state the vision tower's output_dim and adapter_dim, which vLLM's
            # MuseGlimmerVisionConfig reads (defaults 6144, 4096) and transformers' (out_hidden_size,
            # projector_hidden_size) does not write
            "muse_glimmer": lambda out: edit_config(out, lambda c: c["vision_config"].update(
                output_dim=c["out_hidden_size"], adapter_dim=c["projector_hidden_size"])),
            "lfm2": lambda out: edit_config(out, lambda c: c.update(conv_dim=c["hidden_size"],
                                                                    block_dim=c["hidden_size"]))}


# At T=4 (the probe's second size, vllm_probe.py) every head count is doubled (2 -> 4 attention heads, and
# the linear-attention and indexer heads alike: each must divide by T; KV heads stay below T where they were:
# replicated), and hidden_size with them (vLLM's Qwen2 takes head_dim as hidden_size / heads, not from the
# config); the sizes vLLM pads below 256 per rank are widened (Kimi Linear's experts), and GLM-5.3's KV heads
# follow its attention heads (its config requires them equal).
WIDE_KEYS = ("hidden_size", "num_attention_heads", "linear_num_key_heads", "linear_num_value_heads",
             "linear_num_heads", "index_n_heads")
WIDE = {"kimi_linear": {"moe_intermediate_size": 1024}, "glm5_next": {"num_key_value_heads": 4},
        "olmo_hybrid": {"num_key_value_heads": 4},  # the view refuses fewer KV heads than ranks
        "olmoe": {"num_key_value_heads": 4},  # the view refuses fewer KV heads than ranks
        "mimo_v2_flash": {"num_key_value_heads": 4},  # the mimo-v2 plan replicates no KV heads
        "gpt_oss": {"num_key_value_heads": 4}, "gpt_oss_mxfp4": {"num_key_value_heads": 4},  # vLLM replicates none
        "qwen3_moe_fp8": {"moe_intermediate_size": 512},
        "deepseek_v3_fp8": {"moe_intermediate_size": 512, "intermediate_size": 512},
        "mixtral_fp8": {"intermediate_size": 512}, "glm4_moe_fp8": {"moe_intermediate_size": 512},
        "qwen3_moe_nvfp4": {"moe_intermediate_size": 512},
        "deepseek_v3_nvfp4": {"moe_intermediate_size": 512, "intermediate_size": 512},
        "glm4_moe_nvfp4": {"moe_intermediate_size": 512}, "mixtral_nvfp4": {"intermediate_size": 512},
        # vLLM's CPU Int8 MoE kernel (CPUExpertsInt8) takes expert intermediates divisible by 32 per rank only
        "qwen3_moe_ct_int8": {"moe_intermediate_size": 128}, "qwen3_moe_ct_fp8": {"moe_intermediate_size": 128}}


def widen(cfg, family, tp):
    """cfg (its text_config, where it has one) with its head counts scaled for T=tp (tp > 2: WIDE_KEYS
    times tp/2, then WIDE; a vision tower's output width follows the text width)."""
    if tp <= 2:
        return cfg
    text = getattr(cfg, "text_config", None) or cfg
    for k in WIDE_KEYS:
        if getattr(text, k, None):
            setattr(text, k, getattr(text, k) * tp // 2)
    for k, v in WIDE.get(family, {}).items():
        setattr(text, k, v)
    vision = getattr(cfg, "vision_config", None)
    if vision is not None and getattr(vision, "out_hidden_size", None):
        vision.out_hidden_size = text.hidden_size
    return cfg


def make(family, out, seed=0, tp=2, layers=None, config=None):
    """Writes family's tiny checkpoint to OUT for a split of at most tp ranks (see widen), with `layers`
    decoder layers where given (pipeline stages need more than the default 2) and the config fields of
    `config` set (a dict); returns OUT."""
    torch.manual_seed(seed)
    cfg = widen(FAMILIES[family](), family, tp)
    for k, v in (config or {}).items():
        setattr(getattr(cfg, "text_config", cfg), k, v)
    if layers:
        text = getattr(cfg, "text_config", cfg)
        text.num_hidden_layers = layers
        if getattr(text, "layer_types", None):  # hybrids: the pattern of the first layers, repeated
            text.layer_types = [text.layer_types[i % len(text.layer_types)] for i in range(layers)]
    if family in MODEL_CLS:
        model = getattr(tf, MODEL_CLS[family])(cfg).to(torch.bfloat16)
    else:
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    if family in CT:
        compressed_tensors(model, out, CT[family][1])
    else:
        model.save_pretrained(out)
    random_norms(out)
    if family in BF16:
        edit_tensors(out, lambda t: {k: v.to(torch.bfloat16) if re.search(BF16[family], k) else v
                                     for k, v in t.items()})
    if family in F32:
        edit_tensors(out, lambda t: {k: v.to(torch.float32) if re.search(F32[family], k) else v
                                     for k, v in t.items()})
    if family in RETYPE:
        edit_config(out, lambda c: c.update(RETYPE[family]))
    if family in REMOTE:
        remote_config(out, family)
    if family in POSTSAVE:
        POSTSAVE[family](out)
    if family in MTP:
        add_mtp(out, getattr(cfg, "text_config", cfg).num_hidden_layers, *MTP[family])
    if family in PUBLISHED:
        PUBLISHED[family](out)
    return out


if __name__ == "__main__":
    make(sys.argv[1], sys.argv[2], tp=int(sys.argv[3]) if len(sys.argv) > 3 else 2)
