"""Every fixture family's plan, byte level and numeric, first without a mount, then through it:

- without a mount (runs wherever the binary does, /dev/fuse or not): the plan `tpfs plan --json`
  resolves, applied to the full tensors in numpy (axis, units, segments, divisor, distribution),
  gives every rank exactly the slice the independent numpy reference expects;
- through the mount (skipped, with the reason, where FUSE is missing):
  every tensor of every rank equals the slice the independent numpy reference (reference.py,
  written from tp-rules.md) expects, at T = 1, 2, 4 (and 3 where uneven heads are allowed);
- TP equivalence in float64: for every block type present (MLP, GQA attention with a per-head
  nonlinearity, MLA, the DSA indexer's top-k, KDA, GDN, MoE experts, vocab-parallel embedding and
  lm_head), computing on each rank's local weights and combining (sum of row-parallel outputs,
  concatenation of column outputs) equals computing on the full weights, to 1e-9 relative.
"""
import json
import os
import re
import sys
import tempfile

import numpy as np
from safetensors import safe_open

import fixtures
import reference as R
import tpfs_test as tt

only = sys.argv[1:]  # optional: families to run


def load_dir(path):
    out = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(path, fn), framework="np") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
    return out


def layer_prefixes(full):
    return sorted({m.group(0) for k in full for m in [re.match(r".*?layers\.\d+\.", k)] if m},
                  key=lambda p: int(re.search(r"(\d+)\.$", p).group(1)))


def tp_checks(family, cfg, full, local, T, F, rng):
    """Numeric TP equivalence of every block in the checkpoint; returns the block types checked."""
    c = R.text_config(cfg)
    D = c["hidden_size"]
    x = rng.standard_normal(D)
    checked = set()

    def sum_over(fn):
        return sum(fn(local[r], r) for r in range(T))

    def W(t, p, names):
        return {k: t[p + v] for k, v in names.items() if p + v in t}

    for p in layer_prefixes(full):
        i = int(re.search(r"(\d+)\.$", p).group(1))
        # MLP (dense)
        for mp in ("mlp.", "block_sparse_moe.shared_experts.", "mlp.shared_experts.", "mlp.shared_expert."):
            if p + mp + "gate_proj.weight" in full:
                g = lambda t, r, mp=mp: R.mlp(x, t[p + mp + "gate_proj.weight"], t[p + mp + "up_proj.weight"], t[p + mp + "down_proj.weight"])
                F.check(R.close(sum_over(g), g(full, 0)), "%s T=%d %s%s: MLP" % (family, T, p, mp))
                checked.add("mlp")
        # MoE experts
        for rp, ep, (a, b_, d) in (("mlp.gate.weight", "mlp.experts.%d.", ("gate_proj", "up_proj", "down_proj")),
                                    ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.%d.", ("w1", "w3", "w2"))):
            if p + rp in full:
                E = full[p + rp].shape[0]

                def f(t, r, rp=rp, ep=ep, a=a, b_=b_, d=d, E=E):
                    ex = [(t[p + ep % e + a + ".weight"], t[p + ep % e + b_ + ".weight"], t[p + ep % e + d + ".weight"]) for e in range(E)]
                    return R.moe(x, t[p + rp], ex)
                F.check(R.close(sum_over(f), f(full, 0)), "%s T=%d %s: MoE experts" % (family, T, p))
                checked.add("moe")
        # KDA
        if p + "self_attn.q_conv1d.weight" in full:
            names = dict(q="self_attn.q_proj.weight", k="self_attn.k_proj.weight", v="self_attn.v_proj.weight",
                         qc="self_attn.q_conv1d.weight", kc="self_attn.k_conv1d.weight", vc="self_attn.v_conv1d.weight",
                         f_a="self_attn.f_a_proj.weight", f_b="self_attn.f_b_proj.weight", g_a="self_attn.g_a_proj.weight",
                         g_b="self_attn.g_b_proj.weight", b="self_attn.b_proj.weight", A_log="self_attn.A_log",
                         dt_bias="self_attn.dt_bias", o_norm="self_attn.o_norm.weight", o="self_attn.o_proj.weight")
            hd = c["linear_attn_config"]["head_dim"]
            f = lambda t, r: R.kda(x, W(t, p, names), hd)
            F.check(R.close(sum_over(f), f(full, 0)), "%s T=%d %s: KDA" % (family, T, p))
            checked.add("kda")
        # MLA (+ DSA indexer)
        elif p + "self_attn.kv_b_proj.weight" in full:
            names = dict(q_a="self_attn.q_a_proj.weight", q_a_norm="self_attn.q_a_layernorm.weight",
                         q_b="self_attn.q_b_proj.weight", q="self_attn.q_proj.weight",
                         kv_a="self_attn.kv_a_proj_with_mqa.weight", kv_a_norm="self_attn.kv_a_layernorm.weight",
                         kv_b="self_attn.kv_b_proj.weight", o="self_attn.o_proj.weight")
            f = lambda t, r: R.mla(x, W(t, p, names), c)
            F.check(R.close(sum_over(f), f(full, 0)), "%s T=%d %s: MLA" % (family, T, p))
            checked.add("mla")
            if p + "self_attn.indexer.wq_b.weight" in full:
                keys = [rng.standard_normal(D) for _ in range(8)]
                ix = dict(wq_b="self_attn.indexer.wq_b.weight", wk="self_attn.indexer.wk.weight",
                          k_norm="self_attn.indexer.k_norm.weight", k_norm_b="self_attn.indexer.k_norm.bias",
                          weights_proj="self_attn.indexer.weights_proj.weight")

                def topk(t):
                    q_lat = R.rmsnorm(R.f64(t[p + "self_attn.q_a_proj.weight"]) @ x, R.f64(t[p + "self_attn.q_a_layernorm.weight"]))
                    return R.indexer_topk(x, keys, W(t, p, ix), c, q_lat)
                want = topk(full)
                for r in range(T):
                    F.check(topk(local[r]) == want, "%s T=%d r=%d %s: DSA indexer top-k" % (family, T, r, p))
                checked.add("dsa_indexer")
        # GDN
        elif p + "linear_attn.out_proj.weight" in full:
            grouped = p + "linear_attn.in_proj_qkvz.weight" in full
            names = dict(qkvz="linear_attn.in_proj_qkvz.weight", ba="linear_attn.in_proj_ba.weight",
                         qkv="linear_attn.in_proj_qkv.weight", z="linear_attn.in_proj_z.weight",
                         b="linear_attn.in_proj_b.weight", a="linear_attn.in_proj_a.weight",
                         conv="linear_attn.conv1d.weight", A_log="linear_attn.A_log", dt_bias="linear_attn.dt_bias",
                         norm="linear_attn.norm.weight", out="linear_attn.out_proj.weight")
            f = lambda t, r: R.gdn(x, W(t, p, names), c, grouped)
            F.check(R.close(sum_over(f), f(full, 0)), "%s T=%d %s: GDN" % (family, T, p))
            checked.add("gdn")
        # GQA attention
        elif p + "self_attn.k_proj.weight" in full:
            names = dict(q="self_attn.q_proj.weight", k="self_attn.k_proj.weight", v="self_attn.v_proj.weight",
                         o="self_attn.o_proj.weight", qb="self_attn.q_proj.bias", kb="self_attn.k_proj.bias",
                         vb="self_attn.v_proj.bias", qn="self_attn.q_norm.weight", kn="self_attn.k_norm.weight")
            hd = c.get("head_dim") or D // c["num_attention_heads"]
            gated = full[p + "self_attn.q_proj.weight"].shape[0] == 2 * c["num_attention_heads"] * hd
            xs = [rng.standard_normal(D) for _ in range(3)]
            f = lambda t, r: R.gqa(*xs, W(t, p, names), hd, gated)
            F.check(R.close(sum_over(f), f(full, 0)), "%s T=%d %s: GQA attention" % (family, T, p))
            checked.add("gqa")
    # vocab-parallel embedding and lm_head
    for name in [k for k in full if k.endswith("embed_tokens.weight")]:
        V = full[name].shape[0]
        ids = [0, 1, V // 2, V - 1]
        emb = sum(R.embed(ids, R.f64(local[r][name]), r, local[r][name].shape[0]) for r in range(T))
        F.check(R.close(emb, R.f64(full[name])[ids]), "%s T=%d %s: vocab-parallel embedding" % (family, T, name))
        checked.add("embedding")
    for name in [k for k in full if k == "lm_head.weight" or k.endswith("shared_head.head.weight")]:
        h = rng.standard_normal(D)
        logits = np.concatenate([R.f64(local[r][name]) @ h for r in range(T)])[:full[name].shape[0]]
        F.check(R.close(logits, R.f64(full[name]) @ h), "%s T=%d %s: vocab-parallel lm_head" % (family, T, name))
        checked.add("lm_head")
    return checked


def apply_resolved(rule, x, T, r):
    """Rank r's slice of x under one rule of a resolved plan (`tpfs plan --json`), in numpy: the
    axis in segments of units, each segment's units shared over T (even, uneven, groups), stored
    elements = logical features / div. Only reads the rule; what it must give is R.expected's."""
    if rule["split"] == "replicate":
        return x
    assert rule["split"] == "axis", rule
    axis, div, size = rule["axis"], rule["div"], rule["size"]
    segs = [(s["size"], s["unit"]) for s in rule.get("segments", [])] or [(size, rule["unit"])]
    assert sum(s for s, _ in segs) == size and x.shape[axis] * div >= size, (rule, x.shape)
    out, lo = [], 0
    for seg, unit in segs:
        f, c = R.share(seg // unit, T, r, uneven=rule.get("uneven", False), groups=rule.get("groups", False))
        a, b = lo + f * unit, lo + (f + c) * unit
        assert a % div == 0 and b % div == 0, (rule, a, b)
        out.append(np.take(x, range(a // div, b // div), axis=axis))
        lo += seg
    return np.concatenate(out, axis=axis)


def plan_json_check(F, family, cfg, full, src, T):
    """`tpfs plan --json` at T, applied in numpy, against the reference, for every tensor and rank."""
    p = tt.tpfs("plan", src, "--tp", T, "--json")
    F.check(p.returncode == 0, "%s T=%d: tpfs plan --json runs: %s" % (family, T, p.stderr.strip()[:300]))
    if p.returncode != 0:
        return
    rules = {r["match"]: r for r in json.loads(p.stdout)["rules"]}
    F.check(set(rules) == set(full), "%s T=%d: plan --json has one rule per tensor" % (family, T))
    for k, x in full.items():
        if k not in rules:
            continue
        for r in range(T):
            want = R.expected(family, cfg, k, x, T, r)
            got = apply_resolved(rules[k], x, T, r)
            F.check(got.shape == want.shape and np.array_equal(got, want),
                    "%s T=%d r=%d %s (plan --json %s): %s, want %s" % (family, T, r, k, rules[k], got.shape, want.shape))


def main():
    F = tt.Failures()
    rng = np.random.default_rng(0)
    work = tempfile.mkdtemp(prefix="tpfs-families-")
    all_blocks = set()
    no_fuse = tt.fuse_missing()
    for family in fixtures.FAMILIES:
        if only and family not in only:
            continue
        src = os.path.join(work, family)
        cfg, full = fixtures.make(family, src, nfiles=3)
        Ts = [1, 2, 4] + ([3] if family in fixtures.UNEVEN else [])
        for T in Ts:
            plan_json_check(F, family, cfg, full, src, T)
            if no_fuse:
                continue
            with tt.Mount(src, T) as m:
                local = [load_dir(m.rank(r)) for r in range(T)]
            for r in range(T):
                F.check(set(local[r]) == set(full), "%s T=%d r=%d: tensor names" % (family, T, r))
                for k, x in full.items():
                    want = R.expected(family, cfg, k, x, T, r)
                    got = local[r].get(k)
                    F.check(got is not None and got.shape == want.shape and np.array_equal(got, want),
                            "%s T=%d r=%d %s: %s, want %s" % (family, T, r, k, None if got is None else got.shape, want.shape))
            blocks = tp_checks(family, cfg, full, local, T, F, rng)
            all_blocks |= blocks
        if no_fuse:
            print("%s: T=%s, plan --json checked" % (family, Ts), flush=True)
            continue
        print("%s: T=%s, blocks %s" % (family, Ts, sorted(blocks)), flush=True)
    if no_fuse:
        print("SKIP (the mount part only): " + no_fuse)
    elif not only:
        want = {"mlp", "moe", "gqa", "mla", "dsa_indexer", "kda", "gdn", "embedding", "lm_head"}
        F.check(want <= all_blocks, "every block type was checked: missing %s" % (want - all_blocks))
    F.done("test_families")


if __name__ == "__main__":
    main()
