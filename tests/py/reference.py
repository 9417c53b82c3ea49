"""An independent reference for what each rank must hold, and TP-equivalence block functions.

Written from ../shared/reference/tp-rules.md and the seeds, in numpy, without looking at the C plan
or the plan files: `expected(family, config, name, full, T, r)` slices a full tensor the way the
rules say; the block functions compute a layer on full weights and on each rank's local weights
so that the tests can check that concatenating column outputs and summing row-parallel outputs
gives back the full result.
"""
import re

import numpy as np


class Unservable(Exception):
    pass


def share(units, T, r, uneven=False, groups=False):
    """(first, count) of rank r: even; replicated groups when units < T; first units % T ranks get
    one more when uneven."""
    if units % T == 0:
        return r * (units // T), units // T
    if groups and units < T and T % units == 0:
        return r // (T // units), 1
    if uneven and units >= T:
        base, rem = divmod(units, T)
        return r * base + min(r, rem), base + (1 if r < rem else 0)
    raise Unservable("%d units over %d ranks" % (units, T))


def cut(x, axis, heads, T, r, **kw):
    """Whole heads [first, first + count) along axis; unit = len / heads."""
    axis = axis % x.ndim
    unit = x.shape[axis] // heads
    assert unit * heads == x.shape[axis], (x.shape, axis, heads)
    f, c = share(heads, T, r, **kw)
    return np.take(x, range(f * unit, (f + c) * unit), axis=axis)


def segments(x, axis, parts, T, r):
    """Each (size, heads) block of the axis cut on its own, pieces packed in order."""
    out, lo = [], 0
    for size, heads in parts:
        block = np.take(x, range(lo, lo + size), axis=axis)
        out.append(cut(block, axis, heads, T, r))
        lo += size
    assert lo == x.shape[axis]
    return np.concatenate(out, axis=axis)


def vocab(x, T, r, pad=None):
    """Vocab-parallel rows; with pad (vLLM): Vp = ceil(V/pad)*pad, P = Vp/T rows per rank, zeros past V."""
    V = x.shape[0]
    if not pad:
        if V % T:
            raise Unservable("vocab %d over %d" % (V, T))
        return x[r * V // T:(r + 1) * V // T]
    Vp = -(-V // pad) * pad
    if Vp % T:
        raise Unservable("padded vocab %d over %d" % (Vp, T))
    P = Vp // T
    lo, hi = min(r * P, V), min((r + 1) * P, V)
    z = np.zeros((P - (hi - lo),) + x.shape[1:], x.dtype)
    return np.concatenate([x[lo:hi], z])


def text_config(c):
    return c.get("text_config", c)


def _kda_layer(c, i):
    la = c.get("linear_attn_config") or {}
    if "layer_types" in c:
        return i < len(c["layer_types"]) and c["layer_types"][i] == "linear_attention"
    return (i + 1) in la.get("kda_layers", [])


def expected(family, config, name, x, T, r, pad=None):
    """What rank r of T must hold for tensor `name` (full value x) of a `family` checkpoint."""
    c = text_config(config)
    H = c.get("num_attention_heads")
    KV = c.get("num_key_value_heads") or H
    mla = "kv_lora_rank" in c
    m = re.search(r"layers\.(\d+)\.", name)
    i = int(m.group(1)) if m else -1
    if name.startswith("model.visual."):
        return x
    if re.search(r"(^|\.)embed_tokens\.weight$", name) or name == "lm_head.weight" or name.endswith("shared_head.head.weight"):
        return vocab(x, T, r, pad)
    if re.search(r"\.(eh_proj|enorm|hnorm|shared_head\.norm)\.weight$", name):
        return x
    # KDA (seed 002)
    if re.search(r"self_attn\.(q|k|v)_conv1d\.weight$|self_attn\.[fg]_b_proj\.weight$", name):
        return cut(x, 0, c["linear_attn_config"]["num_heads"], T, r)
    if re.search(r"self_attn\.[fg]_a_proj\.weight$|self_attn\.o_norm\.weight$", name):
        return x
    if name.endswith("self_attn.b_proj.weight"):
        return cut(x, 0, c["linear_attn_config"]["num_heads"], T, r)
    if name.endswith("self_attn.A_log"):
        Hl = c["linear_attn_config"]["num_heads"]
        return cut(x, list(x.shape).index(Hl), Hl, T, r)
    if name.endswith("self_attn.dt_bias"):  # per channel, whole heads of head_dim
        return cut(x, 0, c["linear_attn_config"]["num_heads"], T, r)
    if _kda_layer(c, i) and re.search(r"self_attn\.(q|k|v)_proj\.weight$", name):
        return cut(x, 0, c["linear_attn_config"]["num_heads"], T, r)
    if _kda_layer(c, i) and name.endswith("self_attn.o_proj.weight"):
        return cut(x, -1, c["linear_attn_config"]["num_heads"], T, r)
    # MLA and the DSA indexer (seed 001)
    if re.search(r"self_attn\.(q_a_proj|q_a_layernorm|kv_a_proj_with_mqa|kv_a_layernorm)\.weight$", name):
        return x
    if ".self_attn.indexer." in name:
        return x
    if mla and re.search(r"self_attn\.(q_b_proj|q_proj|kv_b_proj)\.weight$", name):
        return cut(x, 0, H, T, r, uneven=True)
    if mla and name.endswith("self_attn.o_proj.weight"):
        return cut(x, -1, H, T, r, uneven=True)
    # Gated DeltaNet
    if "linear_attn." in name:
        Hk, Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        if re.search(r"in_proj_(qkvz|ba)\.weight$", name):
            return cut(x, 0, Hk, T, r)  # grouped per key head
        if re.search(r"(conv1d|in_proj_qkv)\.weight$", name):
            return segments(x, 0, [(Hk * dk, Hk), (Hk * dk, Hk), (Hv * dv, Hv)], T, r)
        if re.search(r"in_proj_(z|b|a)\.weight$|A_log$|dt_bias$", name):
            return cut(x, 0, Hv, T, r)
        if name.endswith("norm.weight"):
            return x
        if name.endswith("out_proj.weight"):
            return cut(x, -1, Hv, T, r)
    # dense GQA attention (Llama, Qwen; also Qwen3-Next's gated q_proj: whole [q|gate] heads)
    if re.search(r"self_attn\.q_proj\.(weight|bias)$", name):
        return cut(x, 0, H, T, r)
    if re.search(r"self_attn\.[kv]_proj\.(weight|bias)$", name):
        return cut(x, 0, KV, T, r, groups=True)
    if name.endswith("self_attn.o_proj.weight"):
        return cut(x, -1, H, T, r)
    if name.endswith("self_attn.o_proj.bias"):
        return x  # row-parallel bias: whole on every rank
    # MLPs and experts: column gate/up (w1/w3), row down (w2); routers replicated
    if re.search(r"\.(gate_proj|up_proj|w1|w3)\.weight$", name):
        return cut(x, 0, x.shape[0], T, r)
    if re.search(r"\.(down_proj|w2)\.weight$", name):
        return cut(x, -1, x.shape[-1], T, r)
    return x  # norms, q_norm/k_norm, routers, e_score_correction_bias, shared_expert_gate


# ---- TP-equivalence blocks (float64) ----

def f64(a):
    return np.asarray(a, dtype=np.float64)


def silu(x):
    return x / (1 + np.exp(-x))


def rmsnorm(x, w, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def mlp(x, g, u, d):
    return f64(d) @ (silu(f64(g) @ x) * (f64(u) @ x))


def gqa(xq, xk, xv, W, hd, gated=False):
    """Attention of one query against one key/value with a per-head bilinear nonlinearity:
    o_h = (q_h . k_g) * v_g (g = the KV head of h), then o_proj. Works for full or local weights
    (local head counts come from the shapes). W: q, k, v, o, optional qb, kb, vb, qn, kn."""
    q = f64(W["q"]) @ xq + (f64(W["qb"]) if "qb" in W else 0)
    k = f64(W["k"]) @ xk + (f64(W["kb"]) if "kb" in W else 0)
    v = f64(W["v"]) @ xv + (f64(W["vb"]) if "vb" in W else 0)
    w = 2 * hd if gated else hd
    Hq, Hkv = q.size // w, k.size // hd
    q = q.reshape(Hq, w)
    gate = None
    if gated:
        q, gate = q[:, :hd], q[:, hd:]
    k, v = k.reshape(Hkv, hd), v.reshape(Hkv, hd)
    if "qn" in W:
        q, k = rmsnorm(q, f64(W["qn"])), rmsnorm(k, f64(W["kn"]))
    per = Hq // Hkv
    o = np.stack([(q[h] @ k[h // per]) * v[h // per] for h in range(Hq)])
    if gated:
        o = o * (1 / (1 + np.exp(-gate)))
    return f64(W["o"]) @ o.reshape(-1)


def mla(x, W, c):
    """MLA with q_lora (or plain q_proj): per head, (q_h . [k_nope_h, k_rope]) * v_h."""
    dn, dr, dv, Rkv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    if "q_b" in W:
        q = f64(W["q_b"]) @ rmsnorm(f64(W["q_a"]) @ x, f64(W["q_a_norm"]))
    else:
        q = f64(W["q"]) @ x
    kva = f64(W["kv_a"]) @ x
    lat, k_rope = rmsnorm(kva[:Rkv], f64(W["kv_a_norm"])), kva[Rkv:]
    kv = f64(W["kv_b"]) @ lat
    Hq = q.size // (dn + dr)
    q = q.reshape(Hq, dn + dr)
    kv = kv.reshape(Hq, dn + dv)
    o = np.stack([(q[h] @ np.concatenate([kv[h, :dn], k_rope])) * kv[h, dn:] for h in range(Hq)])
    return f64(W["o"]) @ o.reshape(-1)


def indexer_topk(x, keys, W, c, q_lat):
    """The DSA lightning indexer: score(key) = sum_h w_h * relu(q_h . k); returns the top-k keys."""
    Hi, di = c["index_n_heads"], c["index_head_dim"]
    q = (f64(W["wq_b"]) @ q_lat).reshape(-1, di)
    w = f64(W["weights_proj"]) @ x
    ks = np.stack([rmsnorm(f64(W["wk"]) @ kx, f64(W["k_norm"])) + f64(W["k_norm_b"]) for kx in keys])
    scores = np.array([np.sum(w[:q.shape[0]] * np.maximum(q @ k, 0)) for k in ks])
    return tuple(np.argsort(-scores, kind="stable")[:c["index_topk"]])


def kda(x, W, hd):
    """One KDA step, simplified but head-structured: per-channel q/k/v with conv taps, low-rank
    forget and output gates, per-head beta, per-head A_log, per-channel dt_bias, per-head o_norm."""
    P = W["q"].shape[0]
    H = P // hd
    q = (f64(W["q"]) @ x) * f64(W["qc"])[:, 0, -1]
    k = (f64(W["k"]) @ x) * f64(W["kc"])[:, 0, -1]
    v = (f64(W["v"]) @ x) * f64(W["vc"])[:, 0, -1]
    f = f64(W["f_b"]) @ (f64(W["f_a"]) @ x)
    g = f64(W["g_b"]) @ (f64(W["g_a"]) @ x)
    beta = 1 / (1 + np.exp(-(f64(W["b"]) @ x)))
    a_log = f64(W["A_log"]).reshape(-1)
    decay = -np.exp(a_log).repeat(hd) * np.log1p(np.exp(f + f64(W["dt_bias"])))
    q, k, v, g, decay = (t.reshape(H, hd) for t in (q, k, v, g, decay))
    o = np.stack([rmsnorm((q[h] @ k[h]) * beta[h] * v[h] * np.exp(decay[h] / 8), f64(W["o_norm"])) *
                  (1 / (1 + np.exp(-g[h]))) for h in range(H)])
    return f64(W["o"]) @ o.reshape(-1)


def gdn(x, W, c, grouped):
    """One Gated DeltaNet step: per value head j of key group g, (q_g . k_g) * v_j with its b/a
    gates, A_log and dt_bias, a per-head norm and the z gate, then out_proj. grouped: Qwen3-Next's
    in_proj_qkvz/in_proj_ba; else Qwen3.5's in_proj_qkv/z/b/a. The conv acts per channel on
    [Q all | K all | V all]."""
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    Hv_full, Hk_full = c["linear_num_value_heads"], c["linear_num_key_heads"]
    ratio = Hv_full // Hk_full
    if grouped:
        y = f64(W["qkvz"]) @ x
        Hk = y.size // (2 * dk + 2 * ratio * dv)
        y = y.reshape(Hk, 2 * dk + 2 * ratio * dv)
        qs, ks = y[:, :dk], y[:, dk:2 * dk]
        vs, zs = y[:, 2 * dk:2 * dk + ratio * dv], y[:, 2 * dk + ratio * dv:]
        ba = (f64(W["ba"]) @ x).reshape(Hk, 2 * ratio)
        b, a = ba[:, :ratio].reshape(-1), ba[:, ratio:].reshape(-1)
        mixed = np.concatenate([qs.reshape(-1), ks.reshape(-1), vs.reshape(-1)])
        z = zs.reshape(-1, dv)
    else:
        mixed = f64(W["qkv"]) @ x
        z = (f64(W["z"]) @ x).reshape(-1, dv)
        b, a = f64(W["b"]) @ x, f64(W["a"]) @ x
        Hk = (mixed.size - z.size) // (2 * dk)
    mixed = mixed * f64(W["conv"])[:, 0, -1]
    Hv = Hk * ratio
    q = mixed[:Hk * dk].reshape(Hk, dk)
    k = mixed[Hk * dk:2 * Hk * dk].reshape(Hk, dk)
    v = mixed[2 * Hk * dk:].reshape(Hv, dv)
    decay = np.exp(-np.exp(f64(W["A_log"])) * np.log1p(np.exp(a + f64(W["dt_bias"]))))
    o = np.stack([rmsnorm((q[j // ratio] @ k[j // ratio]) * v[j] * (1 / (1 + np.exp(-b[j]))) * decay[j],
                          f64(W["norm"])) * silu(z[j]) for j in range(Hv)])
    return f64(W["out"]) @ o.reshape(-1)


def moe(x, router, experts, shared=None, top=2):
    """Routed experts (expert TP: every rank holds every expert, split on the intermediate size) plus
    an optional shared expert; the router is replicated so every rank routes alike."""
    logits = f64(router) @ x
    sel = np.argsort(-logits, kind="stable")[:top]
    w = np.exp(logits[sel]) / np.sum(np.exp(logits[sel]))
    y = sum(wi * mlp(x, *experts[e]) for wi, e in zip(w, sel))
    if shared is not None:
        y = y + mlp(x, *shared)
    return y


def embed(ids, table_local, r, rows_per_rank):
    """Vocab-parallel lookup of rank r: its rows, zero for tokens it does not hold."""
    out = np.zeros((len(ids), table_local.shape[1]))
    for n, t in enumerate(ids):
        j = t - r * rows_per_rank
        if 0 <= j < table_local.shape[0]:
            out[n] = table_local[j]
    return out


def close(a, b, tol=1e-9):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(np.max(np.abs(b)), 1e-300)
    return a.shape == b.shape and np.max(np.abs(a - b)) <= tol * scale
