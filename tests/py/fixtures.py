"""Small random-weight checkpoints with real tensor names and config.json keys, per family.

Each family function returns (config, tensors) with tensors {name: numpy array}; save() writes
them over several safetensors files with a model.safetensors.index.json, the way Hugging Face
checkpoints are laid out. Dimensions are chosen so that T = 1, 2 and 4 divide every split axis
(and T = 3 where the family allows uneven heads: the MLA families).

    python fixtures.py FAMILY OUT_DIR      writes one fixture (used by the demo)
"""
import json
import os
import struct
import sys

import numpy as np
from safetensors.numpy import save_file

import families


def _rng(seed):
    return np.random.default_rng(seed)


class Builder:
    def __init__(self, seed, dtype=np.float32):
        self.rng = _rng(seed)
        self.t = {}
        self.dtype = dtype

    def add(self, name, *shape, dtype=None):
        a = self.rng.standard_normal(shape).astype(dtype or self.dtype)
        self.t[name] = a
        return a


def _gqa(b, p, c, bias=False, qk_norm=False, o_bias=False, gated=False):
    H, KV, hd, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["hidden_size"]
    b.add(p + "self_attn.q_proj.weight", H * hd * (2 if gated else 1), D)
    b.add(p + "self_attn.k_proj.weight", KV * hd, D)
    b.add(p + "self_attn.v_proj.weight", KV * hd, D)
    b.add(p + "self_attn.o_proj.weight", D, H * hd)
    if bias:
        b.add(p + "self_attn.q_proj.bias", H * hd)
        b.add(p + "self_attn.k_proj.bias", KV * hd)
        b.add(p + "self_attn.v_proj.bias", KV * hd)
    if o_bias:
        b.add(p + "self_attn.o_proj.bias", D)
    if qk_norm:
        b.add(p + "self_attn.q_norm.weight", hd)
        b.add(p + "self_attn.k_norm.weight", hd)


def _mlp(b, p, D, I, prefix="mlp."):
    b.add(p + prefix + "gate_proj.weight", I, D)
    b.add(p + prefix + "up_proj.weight", I, D)
    b.add(p + prefix + "down_proj.weight", D, I)


def _norms(b, p, D):
    b.add(p + "input_layernorm.weight", D)
    b.add(p + "post_attention_layernorm.weight", D)


def llama(seed=1):
    """Llama with attention_bias (o_proj bias), GQA 8 heads / 2 KV heads, separate lm_head."""
    c = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=48, num_attention_heads=8,
             num_key_value_heads=2, head_dim=6, intermediate_size=96, vocab_size=128, num_hidden_layers=2,
             attention_bias=True, tie_word_embeddings=False, rms_norm_eps=1e-6)
    b = Builder(seed)
    b.add("model.embed_tokens.weight", c["vocab_size"], c["hidden_size"])
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        _gqa(b, p, c, bias=True, o_bias=True)
        _mlp(b, p, c["hidden_size"], c["intermediate_size"])
        _norms(b, p, c["hidden_size"])
    b.add("model.norm.weight", c["hidden_size"])
    b.add("lm_head.weight", c["vocab_size"], c["hidden_size"])
    return c, b.t


def qwen2(seed=2):
    """Qwen2: q/k/v biases, tied embeddings (no lm_head), F16 weights, head_dim from hidden/heads."""
    c = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=64, num_attention_heads=8,
             num_key_value_heads=4, intermediate_size=64, vocab_size=96, num_hidden_layers=2,
             tie_word_embeddings=True)
    c2 = dict(c, head_dim=8)
    b = Builder(seed, np.float16)
    b.add("model.embed_tokens.weight", c["vocab_size"], c["hidden_size"])
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        _gqa(b, p, c2, bias=True)
        _mlp(b, p, c["hidden_size"], c["intermediate_size"])
        _norms(b, p, c["hidden_size"])
    b.add("model.norm.weight", c["hidden_size"])
    return c, b.t


def qwen3(seed=3):
    """Qwen3: q_norm/k_norm, 2 KV heads (replicated groups at T = 4)."""
    c = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=32, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, intermediate_size=64, vocab_size=64, num_hidden_layers=2,
             tie_word_embeddings=False)
    b = Builder(seed)
    b.add("model.embed_tokens.weight", c["vocab_size"], c["hidden_size"])
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        _gqa(b, p, c, qk_norm=True)
        _mlp(b, p, c["hidden_size"], c["intermediate_size"])
        _norms(b, p, c["hidden_size"])
    b.add("model.norm.weight", c["hidden_size"])
    b.add("lm_head.weight", c["vocab_size"], c["hidden_size"])
    return c, b.t


def qwen3_moe(seed=4):
    """Qwen3-MoE: 4 experts, layer 0 dense (mlp_only_layers)."""
    c = dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=32, num_attention_heads=4,
             num_key_value_heads=4, head_dim=8, intermediate_size=64, moe_intermediate_size=16, num_experts=4,
             num_experts_per_tok=2, mlp_only_layers=[0], decoder_sparse_step=1, vocab_size=64, num_hidden_layers=2,
             norm_topk_prob=True)
    b = Builder(seed)
    D = c["hidden_size"]
    b.add("model.embed_tokens.weight", c["vocab_size"], D)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        _gqa(b, p, c, qk_norm=True)
        if i in c["mlp_only_layers"]:
            _mlp(b, p, D, c["intermediate_size"])
        else:
            b.add(p + "mlp.gate.weight", c["num_experts"], D)
            for e in range(c["num_experts"]):
                _mlp(b, p, D, c["moe_intermediate_size"], prefix="mlp.experts.%d." % e)
        _norms(b, p, D)
    b.add("model.norm.weight", D)
    b.add("lm_head.weight", c["vocab_size"], D)
    return c, b.t


def _mla(b, p, c, indexer=False, kpool=False):
    D, H = c["hidden_size"], c["num_attention_heads"]
    dn, dr, dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    Rq, Rkv = c.get("q_lora_rank"), c["kv_lora_rank"]
    if Rq:
        b.add(p + "self_attn.q_a_proj.weight", Rq, D)
        b.add(p + "self_attn.q_a_layernorm.weight", Rq)
        b.add(p + "self_attn.q_b_proj.weight", H * (dn + dr), Rq)
    else:
        b.add(p + "self_attn.q_proj.weight", H * (dn + dr), D)
    b.add(p + "self_attn.kv_a_proj_with_mqa.weight", Rkv + dr, D)
    b.add(p + "self_attn.kv_a_layernorm.weight", Rkv)
    b.add(p + "self_attn.kv_b_proj.weight", H * (dn + dv), Rkv)
    b.add(p + "self_attn.o_proj.weight", D, H * dv)
    if indexer:
        Hi, di = c["index_n_heads"], c["index_head_dim"]
        b.add(p + "self_attn.indexer.wq_b.weight", Hi * di, Rq)
        b.add(p + "self_attn.indexer.wk.weight", di, D)
        b.add(p + "self_attn.indexer.k_norm.weight", di)
        b.add(p + "self_attn.indexer.k_norm.bias", di)
        b.add(p + "self_attn.indexer.weights_proj.weight", Hi, D)
        if kpool:
            b.add(p + "self_attn.indexer.index_kpool_compress_gate.weight", di, D)
            b.add(p + "self_attn.indexer.index_kpool_compress_ape", c["index_kpool"], di)


def _ds_moe(b, p, c, dense):
    D = c["hidden_size"]
    if dense:
        _mlp(b, p, D, c["intermediate_size"])
        return
    E = c["n_routed_experts"]
    b.add(p + "mlp.gate.weight", E, D)
    b.add(p + "mlp.gate.e_score_correction_bias", E)
    for e in range(E):
        _mlp(b, p, D, c["moe_intermediate_size"], prefix="mlp.experts.%d." % e)
    _mlp(b, p, D, c["moe_intermediate_size"] * c["n_shared_experts"], prefix="mlp.shared_experts.")


def _mtp(b, p, c):
    D, V = c["hidden_size"], c["vocab_size"]
    b.add(p + "embed_tokens.weight", V, D)
    b.add(p + "enorm.weight", D)
    b.add(p + "hnorm.weight", D)
    b.add(p + "eh_proj.weight", D, 2 * D)
    b.add(p + "shared_head.norm.weight", D)
    b.add(p + "shared_head.head.weight", V, D)


def _ds_config(model_type, arch, **kw):
    c = dict(model_type=model_type, architectures=[arch], hidden_size=32, num_attention_heads=4,
             q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
             n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=24, intermediate_size=48,
             first_k_dense_replace=1, num_hidden_layers=2, num_nextn_predict_layers=1, vocab_size=96)
    c.update(kw)
    return c


def deepseek_v3(seed=5):
    """DeepSeek-V3: MLA (q_lora), MoE with a shared expert, layer 0 dense, one MTP layer."""
    c = _ds_config("deepseek_v3", "DeepseekV3ForCausalLM")
    b = Builder(seed)
    D = c["hidden_size"]
    b.add("model.embed_tokens.weight", c["vocab_size"], D)
    for i in range(c["num_hidden_layers"] + 1):
        p = "model.layers.%d." % i
        _mla(b, p, c)
        _ds_moe(b, p, c, dense=i < c["first_k_dense_replace"])
        _norms(b, p, D)
        if i == c["num_hidden_layers"]:
            _mtp(b, p, c)
    b.add("model.norm.weight", D)
    b.add("lm_head.weight", c["vocab_size"], D)
    return c, b.t


def glm_moe_dsa(seed=6):
    """GLM-5 (glm_moe_dsa): MLA + DSA indexer (replicated), MoE."""
    c = _ds_config("glm_moe_dsa", "GlmMoeDsaForCausalLM", index_n_heads=4, index_head_dim=8, index_topk=4)
    b = Builder(seed)
    D = c["hidden_size"]
    b.add("model.embed_tokens.weight", c["vocab_size"], D)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        _mla(b, p, c, indexer=True)
        _ds_moe(b, p, c, dense=i < c["first_k_dense_replace"])
        _norms(b, p, D)
    b.add("model.norm.weight", D)
    b.add("lm_head.weight", c["vocab_size"], D)
    return c, b.t


def _gdn_dims(c):
    return (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
            c["linear_value_head_dim"], c["linear_conv_kernel_dim"])


def _gdn(b, p, c, separate):
    Hk, Hv, dk, dv, Kc = _gdn_dims(c)
    D = c["hidden_size"]
    conv = 2 * Hk * dk + Hv * dv
    if separate:
        b.add(p + "linear_attn.in_proj_qkv.weight", conv, D)
        b.add(p + "linear_attn.in_proj_z.weight", Hv * dv, D)
        b.add(p + "linear_attn.in_proj_b.weight", Hv, D)
        b.add(p + "linear_attn.in_proj_a.weight", Hv, D)
    else:
        b.add(p + "linear_attn.in_proj_qkvz.weight", 2 * Hk * dk + 2 * Hv * dv, D)
        b.add(p + "linear_attn.in_proj_ba.weight", 2 * Hv, D)
    b.add(p + "linear_attn.conv1d.weight", conv, 1, Kc)
    b.add(p + "linear_attn.A_log", Hv, dtype=np.float32)
    b.add(p + "linear_attn.dt_bias", Hv, dtype=np.float32)
    b.add(p + "linear_attn.norm.weight", dv)
    b.add(p + "linear_attn.out_proj.weight", D, Hv * dv)


def _qn_config(model_type, arch):
    return dict(model_type=model_type, architectures=[arch], hidden_size=32, num_attention_heads=4,
                num_key_value_heads=4, head_dim=8, attn_output_gate=True, linear_num_key_heads=4,
                linear_num_value_heads=8, linear_key_head_dim=4, linear_value_head_dim=6, linear_conv_kernel_dim=4,
                num_hidden_layers=4, full_attention_interval=4,
                layer_types=["linear_attention"] * 3 + ["full_attention"], vocab_size=64)


def qwen3_next(seed=7):
    """Qwen3-Next: 3 GDN layers (grouped in_proj_qkvz/ba) + 1 gated full-attention layer, MoE with a
    shared expert and its gate."""
    c = _qn_config("qwen3_next", "Qwen3NextForCausalLM")
    c.update(num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=32, num_experts_per_tok=2)
    b = Builder(seed)
    D = c["hidden_size"]
    b.add("model.embed_tokens.weight", c["vocab_size"], D)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        if c["layer_types"][i] == "linear_attention":
            _gdn(b, p, c, separate=False)
        else:
            _gqa(b, p, c, qk_norm=True, gated=True)
        b.add(p + "mlp.gate.weight", c["num_experts"], D)
        for e in range(c["num_experts"]):
            _mlp(b, p, D, c["moe_intermediate_size"], prefix="mlp.experts.%d." % e)
        _mlp(b, p, D, c["shared_expert_intermediate_size"], prefix="mlp.shared_expert.")
        b.add(p + "mlp.shared_expert_gate.weight", 1, D)
        _norms(b, p, D)
    b.add("model.norm.weight", D)
    b.add("lm_head.weight", c["vocab_size"], D)
    return c, b.t


def qwen3_5(seed=8):
    """Qwen3.5 (dense, vision-language wrapper): separate in_proj_qkv/z/b/a under
    model.language_model, config nested in text_config, a vision tower (replicated)."""
    tc = _qn_config("qwen3_5_text", "Qwen3_5ForCausalLM")
    tc.update(intermediate_size=64)
    c = dict(model_type="qwen3_5", architectures=["Qwen3_5ForConditionalGeneration"], text_config=tc,
             vision_config=dict(hidden_size=16))
    b = Builder(seed)
    D = tc["hidden_size"]
    b.add("model.language_model.embed_tokens.weight", tc["vocab_size"], D)
    for i in range(tc["num_hidden_layers"]):
        p = "model.language_model.layers.%d." % i
        if tc["layer_types"][i] == "linear_attention":
            _gdn(b, p, tc, separate=True)
        else:
            _gqa(b, p, tc, qk_norm=True, gated=True)
        _mlp(b, p, D, tc["intermediate_size"])
        _norms(b, p, D)
    b.add("model.language_model.norm.weight", D)
    b.add("model.visual.blocks.0.attn.qkv.weight", 48, 16)
    b.add("model.visual.blocks.0.attn.proj.weight", 16, 16)
    b.add("lm_head.weight", tc["vocab_size"], D)
    return c, b.t


def _kda(b, p, c, a_log_4d):
    la = c["linear_attn_config"]
    H, hd, Kc = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
    D, P, rank = c["hidden_size"], la["num_heads"] * la["head_dim"], la["head_dim"]
    for x in "qkv":
        b.add(p + "self_attn.%s_proj.weight" % x, P, D)
        b.add(p + "self_attn.%s_conv1d.weight" % x, P, 1, Kc)
    b.add(p + "self_attn.f_a_proj.weight", rank, D)
    b.add(p + "self_attn.f_b_proj.weight", P, rank)
    b.add(p + "self_attn.g_a_proj.weight", rank, D)
    b.add(p + "self_attn.g_b_proj.weight", P, rank)
    b.add(p + "self_attn.b_proj.weight", H, D)
    if a_log_4d:
        b.add(p + "self_attn.A_log", 1, 1, H, 1, dtype=np.float32)
    else:
        b.add(p + "self_attn.A_log", H, dtype=np.float32)
    b.add(p + "self_attn.dt_bias", P, dtype=np.float32)
    b.add(p + "self_attn.o_norm.weight", hd)
    b.add(p + "self_attn.o_proj.weight", D, P)


def kimi_linear(seed=9):
    """Kimi Linear: KDA layers 1-3 (1-based kda_layers), an MLA layer without q_lora (q_proj) at 4,
    block_sparse_moe experts (w1/w2/w3) with shared experts, layer 0 dense, A_log as [1, 1, H, 1]."""
    c = dict(model_type="kimi_linear", architectures=["KimiLinearForCausalLM"], hidden_size=32,
             num_attention_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
             v_head_dim=8, num_hidden_layers=4, intermediate_size=64, moe_intermediate_size=16,
             num_experts=4, num_shared_experts=1, first_k_dense_replace=1, vocab_size=64,
             linear_attn_config=dict(num_heads=4, head_dim=8, short_conv_kernel_size=4, kda_layers=[1, 2, 3],
                                     full_attn_layers=[4]))
    b = Builder(seed)
    D = c["hidden_size"]
    b.add("model.embed_tokens.weight", c["vocab_size"], D)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        if (i + 1) in c["linear_attn_config"]["kda_layers"]:
            _kda(b, p, c, a_log_4d=True)
        else:
            _mla(b, p, c)
        if i < c["first_k_dense_replace"]:
            _mlp(b, p, D, c["intermediate_size"])
        else:
            b.add(p + "block_sparse_moe.gate.weight", c["num_experts"], D)
            b.add(p + "block_sparse_moe.gate.e_score_correction_bias", c["num_experts"])
            for e in range(c["num_experts"]):
                q = p + "block_sparse_moe.experts.%d." % e
                b.add(q + "w1.weight", c["moe_intermediate_size"], D)
                b.add(q + "w3.weight", c["moe_intermediate_size"], D)
                b.add(q + "w2.weight", D, c["moe_intermediate_size"])
            _mlp(b, p, D, c["moe_intermediate_size"], prefix="block_sparse_moe.shared_experts.")
        _norms(b, p, D)
    b.add("model.norm.weight", D)
    b.add("lm_head.weight", c["vocab_size"], D)
    return c, b.t


def glm5_next(seed=10):
    """GLM-5.3-like (glm5_next): model.language_model.layers, layer_types choose KDA or DSA (every 4th),
    DSA with the replicated indexer (kpool gate and ape included), MoE by mlp_layer_types, an MTP layer
    at num_hidden_layers, a vision tower, the text config nested in text_config."""
    tc = dict(model_type="glm5_next_text", hidden_size=32, num_hidden_layers=4,
              layer_types=["linear_attention"] * 3 + ["deepseek_sparse_attention"],
              mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
              linear_attn_config=dict(num_heads=4, head_dim=8, short_conv_kernel_size=4),
              num_attention_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=0,
              v_head_dim=8, index_n_heads=4, index_head_dim=8, index_kpool=4, index_topk=4,
              n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=16, intermediate_size=64,
              first_k_dense_replace=1, vocab_size=64, hc_mult=1)
    c = dict(model_type="glm5_next", architectures=["Glm5NextForConditionalGeneration"], text_config=tc)
    b = Builder(seed)
    D = tc["hidden_size"]
    b.add("model.language_model.embed_tokens.weight", tc["vocab_size"], D)
    for i in range(tc["num_hidden_layers"] + 1):
        p = "model.language_model.layers.%d." % i
        if i < tc["num_hidden_layers"] and tc["layer_types"][i] == "linear_attention":
            _kda(b, p, tc, a_log_4d=False)
        else:
            _mla(b, p, tc, indexer=True, kpool=True)
        _ds_moe(b, p, tc, dense=i < tc["num_hidden_layers"] and tc["mlp_layer_types"][i] == "dense")
        _norms(b, p, D)
        if i == tc["num_hidden_layers"]:
            _mtp(b, p, tc)
    b.add("model.language_model.norm.weight", D)
    b.add("model.visual.blocks.0.attn.qkv.weight", 48, 16)
    b.add("lm_head.weight", tc["vocab_size"], D)
    return c, b.t


# the families of the registry's `fixture` role (families.py), each the function of that name above
FAMILIES = {name: globals()[name] for name in families.table("fixture")}
# families whose plan allows uneven head splits (and whose other dims divide by 3): T = 3 in their row
UNEVEN = {name for name, ts in families.table("fixture").items() if 3 in ts}


def gpt_oss_layer(out, E, H, I, heads=64, kv=8, hd=64, vocab=2048):
    """One gpt-oss decoder layer of random BF16 bytes, of any size (config.json as transformers writes it,
    one model.safetensors written in 64 MB pieces; bench/transpose_bench.py writes 400 MB): the experts
    gate_up_proj [E, H, 2I] and down_proj [E, I, H] as transformers' GptOss stores them. Returns the data bytes."""
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


def save(out, config, tensors, nfiles=2, extra_files=True):
    """Writes tensors over nfiles safetensors files (with an index when nfiles > 1) and config.json."""
    os.makedirs(out, exist_ok=True)
    names = sorted(tensors)
    per = (len(names) + nfiles - 1) // nfiles
    wm, total = {}, 0
    for k in range(nfiles):
        part = names[k * per:(k + 1) * per]
        fn = "model.safetensors" if nfiles == 1 else "model-%05d-of-%05d.safetensors" % (k + 1, nfiles)
        save_file({n: tensors[n] for n in part}, os.path.join(out, fn), metadata={"format": "pt"})
        for n in part:
            wm[n] = fn
            total += tensors[n].nbytes
    if nfiles > 1:
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if extra_files:
        with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
            json.dump({"model_max_length": 4096}, f)
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump({"do_sample": False}, f)


def make(family, out, nfiles=2):
    c, t = FAMILIES[family]()
    save(out, c, t, nfiles)
    return c, t


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in FAMILIES:
        sys.exit("usage: fixtures.py {%s} OUT_DIR" % ",".join(FAMILIES))
    make(sys.argv[1], sys.argv[2])
    print("wrote %s checkpoint to %s" % (sys.argv[1], sys.argv[2]))


# ---- quantized checkpoints (written raw: numpy has no FP8 or FP4) ----

class RawBuilder:
    """{name: (dtype, shape, bytes)} for tpfs_test.write_raw; values are random bytes, so that a
    dequantization test can treat an FP8 byte or an FP4 nibble as its value."""

    def __init__(self, seed):
        self.rng = _rng(seed)
        self.t = {}

    def f32(self, name, *shape):
        self.t[name] = ("F32", shape, self.rng.standard_normal(shape).astype(np.float32).tobytes())

    def bytes_(self, name, dtype, *shape, nbytes=None):
        n = nbytes if nbytes is not None else int(np.prod(shape, dtype=np.int64)) * {"U8": 1, "F8_E4M3": 1, "BF16": 2}[dtype]
        self.t[name] = (dtype, shape, self.rng.integers(0, 256, n, dtype=np.uint8).tobytes())

    def fp8_block(self, name, n, k, block=128):
        """FP8 block-scaled linear: weight F8_E4M3 [n, k], weight_scale_inv F32 [ceil(n/b), ceil(k/b)]."""
        self.bytes_(name + ".weight", "F8_E4M3", n, k)
        self.f32(name + ".weight_scale_inv", -(-n // block), -(-k // block))

    def nvfp4(self, name, n, k, compressed=False, group=16):
        """NVFP4 linear: packed U8 [n, k/2], F8_E4M3 group scales [n, k/16], per-tensor scalars."""
        self.bytes_(name + (".weight_packed" if compressed else ".weight"), "U8", n, k // 2)
        self.bytes_(name + ".weight_scale", "F8_E4M3", n, k // group)
        if compressed:
            self.f32(name + ".weight_global_scale", 1)
            self.f32(name + ".input_global_scale", 1)
        else:
            self.f32(name + ".weight_scale_2")
            self.f32(name + ".input_scale")


def deepseek_fp8(seed=20, **overrides):
    """DeepSeek-V3-style FP8 with 128x128 block scales: MLA + MoE + a dense layer. T = 2 cuts on block
    boundaries; T = 4 cuts kv_b_proj (192 rows) and the experts (64 rows) inside a block. overrides
    change config keys (test_ep.py: 8 heads, 8 routed and 2 shared experts); the shared experts'
    intermediate size is moe_intermediate_size x n_shared_experts, as DeepseekV3MoE builds it."""
    kw = dict(hidden_size=256, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=64,
              v_head_dim=128, n_routed_experts=2, moe_intermediate_size=256, intermediate_size=512, vocab_size=128,
              num_nextn_predict_layers=0)
    kw.update(overrides)
    c = _ds_config("deepseek_v3", "DeepseekV3ForCausalLM", **kw)
    c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": [128, 128]}
    b = RawBuilder(seed)
    D, H = c["hidden_size"], c["num_attention_heads"]
    dn, dr, dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    b.bytes_("model.embed_tokens.weight", "BF16", c["vocab_size"], D)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        b.fp8_block(p + "self_attn.q_a_proj", c["q_lora_rank"], D)
        b.f32(p + "self_attn.q_a_layernorm.weight", c["q_lora_rank"])
        b.fp8_block(p + "self_attn.q_b_proj", H * (dn + dr), c["q_lora_rank"])
        b.fp8_block(p + "self_attn.kv_a_proj_with_mqa", c["kv_lora_rank"] + dr, D)
        b.f32(p + "self_attn.kv_a_layernorm.weight", c["kv_lora_rank"])
        b.fp8_block(p + "self_attn.kv_b_proj", H * (dn + dv), c["kv_lora_rank"])
        b.fp8_block(p + "self_attn.o_proj", D, H * dv)
        if i < c["first_k_dense_replace"]:
            for nm, n, k in (("gate_proj", c["intermediate_size"], D), ("up_proj", c["intermediate_size"], D),
                             ("down_proj", D, c["intermediate_size"])):
                b.fp8_block(p + "mlp." + nm, n, k)
        else:
            E, Im = c["n_routed_experts"], c["moe_intermediate_size"]
            b.f32(p + "mlp.gate.weight", E, D)
            b.f32(p + "mlp.gate.e_score_correction_bias", E)
            for e, I in [("experts.%d." % e, Im) for e in range(E)] + [("shared_experts.", Im * c["n_shared_experts"])]:
                b.fp8_block(p + "mlp." + e + "gate_proj", I, D)
                b.fp8_block(p + "mlp." + e + "up_proj", I, D)
                b.fp8_block(p + "mlp." + e + "down_proj", D, I)
        b.f32(p + "input_layernorm.weight", D)
        b.f32(p + "post_attention_layernorm.weight", D)
    b.f32("model.norm.weight", D)
    b.bytes_("lm_head.weight", "BF16", c["vocab_size"], D)
    return c, b.t


def llama_nvfp4(seed=21):
    """ModelOpt NVFP4 dense Llama: U8 weights packing two FP4 values along K, F8_E4M3 scales per group
    of 16, weight_scale_2 and input_scale scalars. intermediate 96: T = 2 cuts down_proj's K at 48
    (3 groups), T = 4 at 24, inside a group."""
    c = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=128, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, intermediate_size=96, vocab_size=64, num_hidden_layers=2,
             quantization_config={"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16})
    b = RawBuilder(seed)
    D, H, KV, hd, I = 128, 4, 2, 32, 96
    b.bytes_("model.embed_tokens.weight", "BF16", c["vocab_size"], D)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        b.nvfp4(p + "self_attn.q_proj", H * hd, D)
        b.nvfp4(p + "self_attn.k_proj", KV * hd, D)
        b.nvfp4(p + "self_attn.v_proj", KV * hd, D)
        b.nvfp4(p + "self_attn.o_proj", D, H * hd)
        b.nvfp4(p + "mlp.gate_proj", I, D)
        b.nvfp4(p + "mlp.up_proj", I, D)
        b.nvfp4(p + "mlp.down_proj", D, I)
        b.f32(p + "input_layernorm.weight", D)
        b.f32(p + "post_attention_layernorm.weight", D)
    b.f32("model.norm.weight", D)
    b.bytes_("lm_head.weight", "BF16", c["vocab_size"], D)
    return c, b.t


def qwen3_moe_nvfp4(seed=22):
    """compressed-tensors NVFP4 Qwen3-MoE: experts as weight_packed / weight_scale / weight_global_scale
    / input_global_scale, attention left in F32 (the config's ignore list). moe_intermediate 192:
    T = 4 cuts down_proj's K at 48 (3 groups), T = 8 at 24, inside a group of 16."""
    c = dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=64, num_attention_heads=8,
             num_key_value_heads=8, head_dim=8, moe_intermediate_size=192, num_experts=2, num_experts_per_tok=1,
             mlp_only_layers=[], vocab_size=64, num_hidden_layers=2,
             quantization_config={"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                      "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}},
                                  "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp.gate$"]})
    b = RawBuilder(seed)
    D, Im = 64, 192
    b.f32("model.embed_tokens.weight", c["vocab_size"], D)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        for nm, n in (("q_proj", 64), ("k_proj", 64), ("v_proj", 64)):
            b.f32(p + "self_attn." + nm + ".weight", n, D)
        b.f32(p + "self_attn.o_proj.weight", D, 64)
        b.f32(p + "self_attn.q_norm.weight", 8)
        b.f32(p + "self_attn.k_norm.weight", 8)
        b.f32(p + "mlp.gate.weight", c["num_experts"], D)
        for e in range(c["num_experts"]):
            q = p + "mlp.experts.%d." % e
            b.nvfp4(q + "gate_proj", Im, D, compressed=True)
            b.nvfp4(q + "up_proj", Im, D, compressed=True)
            b.nvfp4(q + "down_proj", D, Im, compressed=True)
        b.f32(p + "input_layernorm.weight", D)
        b.f32(p + "post_attention_layernorm.weight", D)
    b.f32("model.norm.weight", D)
    b.f32("lm_head.weight", c["vocab_size"], D)
    return c, b.t


def llama_fp8_f4(seed=23):
    """Per-tensor FP8 attention (F8_E4M3 weights with scalar weight_scale and input_scale) and an MLP
    stored in the safetensors F4 dtype (shape in logical elements, two per byte) with F8_E4M3 scales
    per group of 16 along K."""
    c = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, num_attention_heads=4,
             num_key_value_heads=4, head_dim=16, intermediate_size=128, vocab_size=64, num_hidden_layers=2,
             quantization_config={"quant_method": "fp8", "activation_scheme": "static"})
    b = RawBuilder(seed)
    D, I = 64, 128
    b.f32("model.embed_tokens.weight", c["vocab_size"], D)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        for nm, n, k in (("q_proj", D, D), ("k_proj", D, D), ("v_proj", D, D), ("o_proj", D, D)):
            b.bytes_(p + "self_attn." + nm + ".weight", "F8_E4M3", n, k)
            b.f32(p + "self_attn." + nm + ".weight_scale")
            b.f32(p + "self_attn." + nm + ".input_scale")
        for nm, n, k in (("gate_proj", I, D), ("up_proj", I, D), ("down_proj", D, I)):
            b.t[p + "mlp." + nm + ".weight"] = ("F4", (n, k), b.rng.integers(0, 256, n * k // 2, dtype=np.uint8).tobytes())
            b.bytes_(p + "mlp." + nm + ".weight_scale", "F8_E4M3", n, k // 16)
        b.f32(p + "input_layernorm.weight", D)
        b.f32(p + "post_attention_layernorm.weight", D)
    b.f32("model.norm.weight", D)
    b.f32("lm_head.weight", c["vocab_size"], D)
    return c, b.t


QUANTIZED = {f.__name__: f for f in [deepseek_fp8, llama_nvfp4, qwen3_moe_nvfp4, llama_fp8_f4]}


def save_raw(out, config, tensors, nfiles=2):
    """Like save(), for raw tensors."""
    import tpfs_test
    os.makedirs(out, exist_ok=True)
    names = sorted(tensors)
    per = (len(names) + nfiles - 1) // nfiles
    wm, total = {}, 0
    for k in range(nfiles):
        part = names[k * per:(k + 1) * per]
        fn = "model-%05d-of-%05d.safetensors" % (k + 1, nfiles)
        tpfs_test.write_raw(os.path.join(out, fn), {n: tensors[n] for n in part}, {"format": "pt"})
        for n in part:
            wm[n] = fn
            total += len(tensors[n][2])
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
