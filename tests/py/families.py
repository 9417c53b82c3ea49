"""The family registry of the tests: one row per model family, holding what every table that draws from it
needs of that family, so that adding a family (or proving an old one another way) touches one row.

A row is family(name, ...) for a family that transformers' model code proves as rank folders (the real-model
test, tests/py/test_real_models.py: its positional arguments and the keywords up to `output`), or row(name, ...)
for a form that only an engine view proves (a quantized checkpoint of a family, say). The keyword roles after
them each belong to one table, which reads them with table(ROLE):

  role        read by                                     value
  (family())  realmodel.FAMILIES (test_real_models,        the tiny transformers model: config class and
              test_rank_folders, scripts/tp_example.py,    arguments, model class, per-rank config keys, the
              scripts/coverage.py)                         Ts, the wrong-split tensor, TP hooks (realmodel_hooks)
  fixture     fixtures.FAMILIES and UNEVEN (test_families, the Ts test_families runs the numpy fixture of the
              the mount tests' checkpoints)                same name (fixtures.py) at; 3 where heads split unevenly
  vllm_nodes  test_vllm_nodes.py (PP_FAMILIES, PP_TP2,      dict(pp=(vLLM view, impersonation): probed at PP=2,
              LAYERS, EP_CASES)                            tp2: also at PP=2 x TP=2, layers: the layer count,
                                                           ep: [(view, placement, config fields, impersonation)])

The tables that have not joined yet, and how each will (they are being extended by other work now; each joins
by moving its per-family entries into these rows as a role, and reading table(ROLE) where it lists families):
- tests/py/vllm_models.py FAMILIES (the tiny config vLLM's model class is built from) and test_vllm.py FAMILIES
  (view, impersonation, engine arguments, expected stop): one role `vllm` = (config builder, view, impersonation,
  engine, stop); vllm_nodes' pp then names no view of its own (pp=True reads the vllm role's), and the quantized
  forms' row() entries below take their vllm role there.
- test_sglang.py FAMILIES (view, config overrides): a role `sglang`.
- scripts/tp_example.py FAMILIES stays a copy on purpose: it is a user's example that runs outside a checkout
  (without tests/py); tests/py/test_family_registry.py requires each of its families to be a row here, with
  realmodel's config class.
- test_rank_folders.py EXPECT (the config keys a rank's config.json divides, for tp_example's families): a role
  `rank_folders`, once each row also says the seed its checkpoint is made with (today its place in EXPECT);
  until then test_family_registry.py requires EXPECT and tp_example's FAMILIES to name the same families.
- fixtures.py QUANTIZED (quantized forms of llama, qwen3_moe, deepseek_v3 written raw) is not a family table:
  its forms are test_quant.py's cases.

Sizes of the tiny transformers models divide by 2 and 4 (and by 3 where the family allows uneven heads):
hidden 64, 8 heads of 16, intermediate 96, experts of 48, vocabulary 384. The TP hooks are realmodel_hooks.py's,
building and loading realmodel.py's. Importing this module imports neither torch nor transformers.
"""
from realmodel_hooks import (dsv4_rows, encoder_hidden, gathered_qk_norms, granite_hybrid_patch, granite_shared_rows,
                             hidden, jamba_patch, lfm_conv_whole, lightning_norm, longcat_identity_once, mamba2_patch,
                             rows)

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


# The rows: family -> {role: value}, in the order they are written (each table iterates in that order).
ROWS = {}
# realmodel's table (the family() role): each family: the config class and its arguments, the model class, the
# per-rank keys ("key" or "sub.key", kind: even / uneven / groups / same_as:<key>), the Ts it runs at, the
# tensor whose halves the wrong-split check swaps on rank 0 (a regex over the local state dict),
# and hooks (extra TP patching). `config_json` post-edits the saved config.json (other forms).
FAMILIES = {}


def row(name, **roles):
    """Registers family `name` with its roles (keyword: the table's role, value: what that table needs, see the
    module's table). A family is written once: a second row of the same name is an error."""
    if name in ROWS:
        raise ValueError("families.py: %s has two rows" % name)
    ROWS[name] = dict(roles)


def table(role):
    """{family: value} of every row that has `role`, in the rows' order."""
    return {name: roles[role] for name, roles in ROWS.items() if role in roles}


def family(name, cfg_cls, cfg, model_cls, per_rank, ts=(2, 4), wrong=r"layers\.0\.self_attn\.q_proj\.weight$",
           wrong_dim=0, config_json=None, global_norms=(), rank0_bias=(), mxfp4=False, mtp=False, forward_via=None,
           patch=None, output=None, **roles):
    """A row of a family the real-model test proves (its arguments: realmodel's, FAMILIES[name]) and its
    other roles. patch: a family's own TP hook, patch(model, T, r, allsum), run after tp_patch's generic ones
    (for module kinds the generic hooks do not know: a mixer's gated norm over all heads, fused experts
    of another class, ...). output: output(model, ids) -> the tensor compared instead of the logits, for
    a model without a head (a composite's text tower: its last hidden state, which every rank holds
    whole after the row-parallel sums; a vision encoder fed embeddings made from ids). model_cls: a
    class transformers exports, or "module:Class" under transformers.models for one it does not."""
    row(name, **roles)
    FAMILIES[name] = dict(name=name, cfg_cls=cfg_cls, cfg=cfg, model_cls=model_cls, per_rank=per_rank, ts=ts,
                          wrong=wrong, wrong_dim=wrong_dim, config_json=config_json, global_norms=global_norms,
                          rank0_bias=rank0_bias, mxfp4=mxfp4, mtp=mtp, forward_via=forward_via, patch=patch,
                          output=output)


GQA = [("num_attention_heads", "even"), ("num_key_value_heads", "groups"), ("intermediate_size", "even")]

family("llama", "LlamaConfig", _common(num_key_value_heads=2, num_hidden_layers=2, head_dim=16, attention_bias=True),
       "LlamaForCausalLM", GQA,
       fixture=(1, 2, 4),
       vllm_nodes=dict(pp=("llama", None), tp2=True))
family("mistral", "MistralConfig", _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16), "MistralForCausalLM", GQA,
       vllm_nodes=dict(pp=("llama", None)))
family("qwen2", "Qwen2Config", _common(num_key_value_heads=2, num_hidden_layers=2), "Qwen2ForCausalLM", GQA,
       fixture=(1, 2, 4))
family("qwen3", "Qwen3Config", _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, tie_word_embeddings=True),
       "Qwen3ForCausalLM", GQA,
       fixture=(1, 2, 4))
family("qwen2_moe", "Qwen2MoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, moe_intermediate_size=IM, shared_expert_intermediate_size=IM,
               num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[0]),
       "Qwen2MoeForCausalLM", GQA + [("moe_intermediate_size", "even"), ("shared_expert_intermediate_size", "even")],
       vllm_nodes=dict(pp=("qwen2_moe", None), ep=[("qwen2_moe", "linear", None, None)]))
family("qwen3_moe", "Qwen3MoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, moe_intermediate_size=IM, num_experts=8,
               num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[0]),
       "Qwen3MoeForCausalLM", GQA + [("moe_intermediate_size", "even")],
       fixture=(1, 2, 4),
       vllm_nodes=dict(pp=("qwen3_moe", None), tp2=True, ep=[("qwen3_moe", "linear", None, None)]))

MLA = [("num_attention_heads", "uneven"), ("num_key_value_heads", "same_as:num_attention_heads"),
       ("intermediate_size", "even"), ("moe_intermediate_size", "even")]
family("deepseek_v3", "DeepseekV3Config", _mla(), "DeepseekV3ForCausalLM", MLA, ts=(2, 3, 4), mtp=True,
       wrong=r"layers\.0\.self_attn\.q_b_proj\.weight$",
       fixture=(1, 2, 3, 4),
       vllm_nodes=dict(pp=("deepseek_v3", None), tp2=True,
                       ep=[("deepseek_v3", "linear", None, None),
                           ("deepseek_v3", "round_robin", {"n_group": 2, "topk_group": 1}, None)]))
family("kimi_k2", "DeepseekV3Config", _mla(), "DeepseekV3ForCausalLM", MLA, ts=(2, 3, 4), mtp=True,
       wrong=r"layers\.0\.self_attn\.kv_b_proj\.weight$",
       config_json=lambda c: c.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"]),
       vllm_nodes=dict(pp=("deepseek_v3", None), ep=[("deepseek_v3", "linear", None, None)]))
# DeepseekV2Config refuses a hidden size that is not a multiple of the head count (3 heads of 8 at T=3):
# the model code's check, not the split's, so T=3 is proven on the other MLA families.
family("deepseek_v2", "DeepseekV2Config", _mla(q_lora_rank=None, n_group=1, topk_group=1), "DeepseekV2ForCausalLM",
       MLA)
family("deepseek_v32", "DeepseekV32Config",
       _mla(index_topk=8, index_head_dim=16, index_n_heads=4, mlp_layer_types=["dense", "sparse", "sparse"]),
       "DeepseekV32ForCausalLM", MLA, ts=(2, 3, 4), mtp=True, wrong=r"layers\.0\.self_attn\.o_proj\.weight$", wrong_dim=1)
family("glm_moe_dsa", "GlmMoeDsaConfig",
       _mla(index_topk=8, index_head_dim=16, index_n_heads=4, mlp_layer_types=["dense", "sparse", "sparse"]),
       "GlmMoeDsaForCausalLM", MLA, ts=(2, 3, 4), mtp=True, wrong=r"layers\.0\.self_attn\.q_b_proj\.weight$",
       fixture=(1, 2, 3, 4))
family("glm4_moe", "Glm4MoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, moe_intermediate_size=IM, n_routed_experts=8,
               num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
               use_qk_norm=True, attention_bias=True),
       "Glm4MoeForCausalLM", GQA + [("moe_intermediate_size", "even")],
       vllm_nodes=dict(pp=("glm4_moe", None), layers=4,
                       ep=[("glm4_moe", "linear", None, None),
                           ("glm4_moe", "round_robin", {"n_group": 2, "topk_group": 1}, None)]))

KDA = [("linear_num_heads", "even"), ("num_attention_heads", "even"),
       ("num_key_value_heads", "same_as:num_attention_heads"), ("intermediate_size", "even"),
       ("moe_intermediate_size", "even")]
_kimi = _mla(num_hidden_layers=4, linear_num_heads=8, linear_head_dim=16, linear_conv_kernel_dim=4,
             layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
             mlp_layer_types=["dense", "sparse", "sparse", "sparse"], q_lora_rank=None, num_experts=8,
             num_local_experts=8, qk_rope_head_dim=0)
del _kimi["n_routed_experts"], _kimi["first_k_dense_replace"]
family("kimi_linear", "KimiLinearConfig", _kimi, "KimiLinearForCausalLM", KDA,
       wrong=r"layers\.0\.self_attn\.k_proj\.weight$",
       fixture=(1, 2, 4))


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
       wrong=r"layers\.0\.self_attn\.g_b_proj\.weight$", mtp=True,
       fixture=(1, 2, 4))


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
       wrong=r"layers\.0\.linear_attn\.in_proj_qkvz\.weight$",
       fixture=(1, 2, 4),
       vllm_nodes=dict(pp=("qwen3_next", None), tp2=True, ep=[("qwen3_next", "linear", None, None)]))
family("qwen3_5", "Qwen3_5TextConfig", _gdn, "Qwen3_5ForCausalLM", GQA + GDN,
       wrong=r"layers\.0\.linear_attn\.in_proj_qkv\.weight$",
       fixture=(1, 2, 4))
family("qwen3_5_moe", "Qwen3_5MoeTextConfig",
       dict(_gdn, moe_intermediate_size=IM, shared_expert_intermediate_size=IM, num_experts=8, num_experts_per_tok=2),
       "Qwen3_5MoeForCausalLM",
       GQA + GDN + [("moe_intermediate_size", "even"), ("shared_expert_intermediate_size", "even")],
       wrong=r"layers\.3\.self_attn\.q_proj\.weight$")

family("gemma3", "Gemma3TextConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True),
       "Gemma3ForCausalLM", GQA,
       vllm_nodes=dict(pp=("gemma3", None)))
family("gemma3_mm", "Gemma3Config", dict(
    text_config=_common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, query_pre_attn_scalar=16,
                        sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                       patch_size=14), mm_tokens_per_image=4, image_token_index=V - 1, boi_token_index=V - 3,
    eoi_token_index=V - 2), "Gemma3ForConditionalGeneration", [("text_config." + k, v) for k, v in GQA],
       wrong=r"layers\.1\.self_attn\.k_proj\.weight$")
family("phi3", "Phi3Config", _common(num_key_value_heads=4, num_hidden_layers=2), "Phi3ForCausalLM", GQA,
       wrong=r"layers\.0\.self_attn\.qkv_proj\.weight$",
       vllm_nodes=dict(pp=("phi3", None)))
family("mixtral", "MixtralConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, intermediate_size=IM, num_local_experts=8,
               num_experts_per_tok=2),
       "MixtralForCausalLM", GQA,
       vllm_nodes=dict(pp=("mixtral", None), ep=[("mixtral", "linear", None, None)]))
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
                                           attention_bias=True), "GraniteForCausalLM", GQA,
       vllm_nodes=dict(pp=("llama", None)))
family("smollm3", "SmolLM3Config", _common(**dict(_dense, num_hidden_layers=4), no_rope_layer_interval=2),
       "SmolLM3ForCausalLM", GQA)
family("seed_oss", "SeedOssConfig", _common(**_dense, attention_bias=True, attention_out_bias=True),
       "SeedOssForCausalLM", GQA)
family("ministral", "MinistralConfig", _common(**_dense, sliding_window=8), "MinistralForCausalLM", GQA)
family("exaone4", "Exaone4Config", _common(**dict(_dense, num_hidden_layers=4), sliding_window=8,
                                           sliding_window_pattern=2), "Exaone4ForCausalLM", GQA,
       vllm_nodes=dict(pp=("llama", None)))
family("cohere", "CohereConfig", _common(**_dense, logit_scale=0.5, tie_word_embeddings=True), "CohereForCausalLM", GQA,
       vllm_nodes=dict(pp=("cohere", None)))
family("cohere2", "Cohere2Config", _common(**_dense, sliding_window=8, logit_scale=0.5, tie_word_embeddings=True,
                                           layer_types=["sliding_attention", "full_attention"]), "Cohere2ForCausalLM", GQA)
family("cwm", "CwmConfig", _common(**_dense, sliding_window=8), "CwmForCausalLM", GQA)
family("ernie4_5", "Ernie4_5Config", _common(**_dense), "Ernie4_5ForCausalLM", GQA)
family("internlm3", "InternLM3Config", _common(**_dense), "LlamaForCausalLM", GQA)
family("iquestcoder", "IQuestCoderConfig", _common(**_dense), "LlamaForCausalLM", GQA)
family("sarvam_mla", "SarvamMLAConfig", _mla(), "DeepseekV3ForCausalLM", MLA, wrong=r"layers\.0\.self_attn\.q_b_proj\.weight$")


# --- dense families, more ---


family("olmo", "OlmoConfig", _common(**_dense, clip_qkv=0.5), "OlmoForCausalLM", GQA)
# OLMo 2/3: q_norm [H*hd] and k_norm [KV*hd] over all heads, split with the heads; olmo3 with KV heads in
# replicated groups at T=4 (2 KV heads), whose variance over all ranks counts each group T/KV times: the same mean
family("olmo2", "Olmo2Config", _common(**_dense), "Olmo2ForCausalLM", GQA,
       wrong=r"layers\.0\.self_attn\.q_norm\.weight$", global_norms=("q_norm", "k_norm"))
family("olmo3", "Olmo3Config", _common(**dict(_dense, num_key_value_heads=2), sliding_window=8,
                                       layer_types=["sliding_attention", "full_attention"]), "Olmo3ForCausalLM", GQA,
       wrong=r"layers\.1\.self_attn\.k_norm\.weight$", global_norms=("q_norm", "k_norm"))
family("starcoder2", "Starcoder2Config", _common(**_dense, use_bias=True, sliding_window=8), "Starcoder2ForCausalLM",
       GQA, wrong=r"layers\.0\.mlp\.c_fc\.weight$", patch=rows("c_proj"))
family("glm", "GlmConfig", _common(**dict(_dense, num_key_value_heads=2), attention_bias=True), "GlmForCausalLM", GQA,
       wrong=r"layers\.0\.mlp\.gate_up_proj\.weight$")
family("glm4", "Glm4Config", _common(**dict(_dense, num_key_value_heads=2), attention_bias=True), "Glm4ForCausalLM",
       GQA, wrong=r"layers\.1\.mlp\.gate_up_proj\.weight$",
       vllm_nodes=dict(pp=("llama", None)))
family("phi", "PhiConfig", _common(**dict(_dense, head_dim=8), partial_rotary_factor=0.5), "PhiForCausalLM", GQA,
       wrong=r"layers\.0\.mlp\.fc1\.weight$", patch=rows("dense", "fc2"))
# helium: refused by the llama plan (its o_proj is built [D, D] whatever the rank's head count)
family("arcee", "ArceeConfig", _common(**_dense), "ArceeForCausalLM", GQA, wrong=r"layers\.0\.mlp\.up_proj\.weight$")
family("apertus", "ApertusConfig", _common(**_dense), "ApertusForCausalLM", GQA,
       vllm_nodes=dict(pp=("llama", None)))
family("apertus1p5_text", "Apertus1p5TextConfig", _common(**_dense), "Apertus1p5TextForCausalLM", GQA)
family("hunyuan_v1_dense", "HunYuanDenseV1Config", _common(**_dense), "HunYuanDenseV1ForCausalLM", GQA)
family("nemotron", "NemotronConfig", _common(**_dense, partial_rotary_factor=0.5), "NemotronForCausalLM", GQA)
family("jais2", "Jais2Config", _common(**_dense, attention_bias=True, mlp_bias=True), "Jais2ForCausalLM", GQA,
       wrong=r"layers\.0\.mlp\.up_proj\.bias$")
family("hyperclovax", "HyperCLOVAXConfig", _common(**_dense, use_post_norm=True, embedding_multiplier=2.0,
                                                   residual_multiplier=0.5, attention_multiplier=0.1,
                                                   logits_scaling=4.0), "HyperCLOVAXForCausalLM", GQA)
family("ministral3", "Ministral3Config", _common(**_dense, sliding_window=8), "Ministral3ForCausalLM", GQA)
family("nanochat", "NanoChatConfig", _common(**_dense), "NanoChatForCausalLM", GQA, patch=rows("fc2"))
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


# --- mixture-of-experts families, more ---
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


family("olmoe", "OlmoeConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, intermediate_size=IM, num_experts=8, num_experts_per_tok=2),
       "OlmoeForCausalLM", GQA, wrong=r"layers\.0\.self_attn\.k_proj\.weight$", patch=gathered_qk_norms)
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


_longcat = _mla(num_layers=2, ffn_hidden_size=I, expert_ffn_hidden_size=IM, n_routed_experts=8, zero_expert_num=2,
                moe_topk=2, routed_scaling_factor=1.0, head_dim=8)
for _k in ("num_hidden_layers", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "intermediate_size",
           "num_experts_per_tok"):
    _longcat.pop(_k, None)
family("longcat_flash", "LongcatFlashConfig", _longcat, "LongcatFlashForCausalLM",
       [("num_attention_heads", "uneven"), ("num_key_value_heads", "same_as:num_attention_heads"),
        ("ffn_hidden_size", "even"), ("expert_ffn_hidden_size", "even")],
       wrong=r"layers\.0\.self_attn\.1\.kv_b_proj\.weight$", patch=longcat_identity_once)


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
       wrong=r"layers\.0\.self_attn\.o_a_proj\.weight$", patch=dsv4_rows)
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


family("minimax", "MiniMaxConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, intermediate_size=IM, num_local_experts=8,
               num_experts_per_tok=2, block_size=8,
               layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
       "MiniMaxForCausalLM", GQA, wrong=r"layers\.0\.self_attn\.qkv_proj\.weight$", patch=lightning_norm)
# Phi-3 with fewer KV heads than T at T=4 (4 heads, 2 KV heads): the fused qkv_proj's K and V blocks in replicated groups
family("phi3_gqa", "Phi3Config", _common(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2),
       "Phi3ForCausalLM", GQA, wrong=r"layers\.0\.self_attn\.qkv_proj\.weight$")


_granite_moe = dict(num_key_value_heads=4, num_hidden_layers=2, intermediate_size=IM, num_local_experts=8,
                    num_experts_per_tok=2, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1,
                    logits_scaling=4.0)
family("granitemoe", "GraniteMoeConfig", _common(**_granite_moe), "GraniteMoeForCausalLM", GQA,
       wrong=r"layers\.1\.block_sparse_moe\.experts\.gate_up_proj$", wrong_dim=1)
family("granitemoeshared", "GraniteMoeSharedConfig", _common(**_granite_moe, shared_intermediate_size=IM),
       "GraniteMoeSharedForCausalLM", GQA + [("shared_intermediate_size", "even")],
       wrong=r"layers\.0\.shared_mlp\.input_linear\.weight$", patch=granite_shared_rows)
family("granitemoe_swa", "GraniteMoeSWAConfig",
       _common(**_granite_moe, shared_intermediate_size=IM, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"]),
       "GraniteMoeSWAForCausalLM", GQA + [("shared_intermediate_size", "even")],
       wrong=r"layers\.0\.self_attn\.sinks$", patch=granite_shared_rows)
family("hunyuan_v1_moe", "HunYuanMoEV1Config",
       _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, intermediate_size=IM, num_experts=8, moe_topk=2),
       "HunYuanMoEV1ForCausalLM", GQA)


# --- SSM hybrids and vision-language families ---

# Vision-language composites as served: the language model split by its text plan, the vision tower and its merger
# (projector) whole. Text-only forwards (the tower is loaded strictly, not run). Qwen2-VL / Qwen2.5-VL save the
# published layout (model.layers..., visual.*); Qwen3-VL nests model.language_model / model.visual.
_VL = [("text_config." + k, v) for k, v in GQA]
_qvl_text = _common(num_key_value_heads=2, num_hidden_layers=2, rope_parameters=dict(
    rope_type="default", rope_theta=10000.0, mrope_section=[1, 1, 2]))



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


_nemo = _common(num_key_value_heads=4, head_dim=16, num_hidden_layers=4, layers_block_type=["mamba", "moe", "attention", "mlp"],
                mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, conv_kernel=4, chunk_size=8, use_mamba_kernels=False,
                time_step_limit=[0.0, 1000.0],
                moe_intermediate_size=IM, moe_shared_expert_intermediate_size=IM, n_routed_experts=8, num_experts_per_tok=2,
                n_group=1, topk_group=1)
family("nemotron_h", "NemotronHConfig", dict(_nemo, n_groups=4), "NemotronHForCausalLM",
       GQA + [("mamba_num_heads", "even"), ("n_groups", "groups"), ("moe_intermediate_size", "even"),
              ("moe_shared_expert_intermediate_size", "even")],
       wrong=r"layers\.0\.mixer\.in_proj\.weight$", patch=mamba2_patch(4))
# one SSM group (Nemotron-H 4B's, Bamba's and Granite 4.0's layout): B and C whole on every rank, the gated norm
# spans every rank; the wrong split: the norm's weight
family("nemotron_h_1group", "NemotronHConfig", dict(_nemo, n_groups=1), "NemotronHForCausalLM",
       FAMILIES["nemotron_h"]["per_rank"], wrong=r"layers\.0\.mixer\.norm\.weight$", patch=mamba2_patch(1))


# Bamba and Granite 4.0: mamba_expand 4 (I = 4 * 64) so that a rank's mamba_expand (4 / T) is whole at T=2 and 4
# (the published expand 2 is served at T=2 and refused at T=4 by name)
_bamba_ssm = dict(mamba_expand=4, mamba_n_heads=8, mamba_d_head=32, mamba_d_state=16, mamba_d_conv=4,
                  mamba_chunk_size=8, time_step_limit=[0.0, 1000.0])
_SSM = [("mamba_n_heads", "even"), ("mamba_n_groups", "groups"), ("mamba_expand", "even")]
family("bamba", "BambaConfig", _common(num_key_value_heads=4, num_hidden_layers=2, attn_layer_indices=[1],
                                       mamba_n_groups=1, **_bamba_ssm),
       "BambaForCausalLM", GQA + _SSM, wrong=r"layers\.0\.mamba\.conv1d\.weight$", patch=mamba2_patch(1))
family("granitemoehybrid", "GraniteMoeHybridConfig",
       _common(num_key_value_heads=4, num_hidden_layers=2, layer_types=["mamba", "attention"], mamba_n_groups=2,
               intermediate_size=IM, shared_intermediate_size=I, num_local_experts=4, num_experts_per_tok=2,
               embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=4.0,
               **_bamba_ssm),
       "GraniteMoeHybridForCausalLM", GQA + _SSM + [("shared_intermediate_size", "even")],
       wrong=r"layers\.0\.mamba\.in_proj\.weight$", patch=granite_hybrid_patch(2))
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
       wrong=r"layers\.1\.mamba\.in_proj\.weight$", patch=mamba2_patch(1))


family("jamba", "JambaConfig",
       _common(num_key_value_heads=4, num_hidden_layers=4, mamba_expand=4, mamba_d_state=16, mamba_d_conv=4,
               mamba_dt_rank=8, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
               num_experts=4, num_experts_per_tok=2, use_mamba_kernels=False),
       "JambaForCausalLM", GQA + [("mamba_expand", "even")], wrong=r"layers\.0\.mamba\.x_proj\.weight$", wrong_dim=1,
       patch=jamba_patch)


# --- the newest families ---

# Cosmos3 Edge: llama GQA with a relu2 MLP (fc1 / fc2, saved as mlp.up_proj / down_proj), saved by the composite as
# to_q / to_k / to_v / to_out at the root; the vision tower and projector whole. Proves cosmos3_edge_text too.
family("cosmos3_edge", "Cosmos3EdgeConfig", dict(
    text_config=_common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16, rope_parameters=dict(
        rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
    projector_hidden_size=64), "Cosmos3EdgeForConditionalGeneration", _VL,
       wrong=r"language_model\.layers\.0\.self_attn\.k_proj\.weight$", patch=rows("fc2"))

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


# LFM2: short-conv layers whole, GQA attention (out_proj row-parallel, q/k layernorms per head whole), SwiGLU w1/w3/w2
# whose width the model derives from intermediate_size (2/3, rounded up to block_multiple_of: 96 -> 64, and a rank's
# 48 -> 32 at T=2, 24 -> 16 at T=4); no head_dim in its config (a rank's config states it)
_lfm_types = ["conv", "full_attention", "conv", "full_attention"]
family("lfm2", "Lfm2Config", _common(num_key_value_heads=4, num_hidden_layers=4, layer_types=_lfm_types,
                                     block_multiple_of=8, conv_L_cache=3),
       "Lfm2ForCausalLM", GQA, wrong=r"layers\.1\.self_attn\.out_proj\.weight$", wrong_dim=1, patch=lfm_conv_whole)
# LFM3: as LFM2, with a per-head sigmoid attention gate (saved as self_attn.gate_proj) split with the heads, sandwich
# norms, sliding-window layers and an MLP on intermediate_size as is
family("lfm3", "Lfm3Config", _common(num_key_value_heads=4, num_hidden_layers=4, head_dim=16, sliding_window=8,
                                     layer_types=["conv", "sliding_attention", "conv", "full_attention"]),
       "Lfm3ForCausalLM", GQA, wrong=r"layers\.3\.self_attn\.g_proj\.weight$", patch=lfm_conv_whole)
# LFM2-MoE: LFM2's conv and attention, a dense first layer on intermediate_size, routed experts (per expert on disk)
# on moe_intermediate_size, router and expert_bias whole. Its config never fills layer_types (given here)
family("lfm2_moe", "Lfm2MoeConfig", _common(num_key_value_heads=4, num_hidden_layers=4, layer_types=_lfm_types,
                                            moe_intermediate_size=IM, num_experts=8, num_experts_per_tok=2,
                                            num_dense_layers=1),
       "Lfm2MoeForCausalLM", GQA + [("moe_intermediate_size", "even")],
       wrong=r"layers\.0\.feed_forward\.w1\.weight$", patch=lfm_conv_whole)
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


# --- the towers without a head, proven by their last hidden state (each rank's after the row-parallel
# sums, against the unsplit tower's) ---


# GLM-Image's text tower (GlmImageTextModel): GLM-4's layers (q/k/v with biases, gate_up_proj fused in two
# segments, sandwich norms), M-RoPE; its composite's head (onto vision_vocab_size) is not part of it
family("glm_image_text", "GlmImageTextConfig", _common(num_key_value_heads=4, num_hidden_layers=2, vision_vocab_size=V,
                                                       eos_token_id=2, rope_parameters=dict(
    rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0, mrope_section=[2, 1, 1])), "GlmImageTextModel", GQA, output=hidden,
       wrong=r"layers\.0\.mlp\.gate_up_proj\.weight$")
# Muse Glimmer's text tower (MuseGlimmerTextModel): GQA with weightless per-head q/k norms, a sigmoid output gate per
# channel (self_attn.gate_proj [H*hd, D], beam's rule), sandwich centered norms, a weightless norm after the embedding
# lookup (per token: the vocab-parallel sum is unchanged)
family("muse_glimmer_text", "MuseGlimmerTextConfig", _common(num_key_value_heads=4, num_hidden_layers=2, head_dim=16),
       "MuseGlimmerTextModel", GQA, output=hidden, wrong=r"layers\.1\.self_attn\.gate_proj\.weight$")
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
       "deepseek_ocr2.modeling_deepseek_ocr2:DeepseekOcr2VisionEncoder", GQA, output=encoder_hidden,
       wrong=r"layers\.1\.self_attn\.v_proj\.weight$")


# --- forms only an engine view proves (no transformers model of their own: a quantized checkpoint of a family) ---
row("llama_ct_int8", vllm_nodes=dict(pp=("llama_ct", None)))  # compressed-tensors INT8 (vllm_models.py CT)
row("llama_nvfp4", vllm_nodes=dict(pp=("llama_nvfp4", "nvfp4-emulation")))
row("qwen3_moe_nvfp4", vllm_nodes=dict(ep=[("qwen3_moe_nvfp4", "linear", None, "nvfp4-emulation")]))
