"""Expert parallelism (--ep): rank folders that hold whole routed experts.

The placement rule, written here from the issue (not from the C code): with E routed experts and
N ranks, rank r holds experts [r*E/N, (r+1)*E/N) whole, with every tensor of each (weights,
biases, FP8 block scales, MXFP4 blocks and scales), under their global names, and no other
expert; fused experts tensors [E, ...] are cut on the expert axis; everything else is split as
without --ep. Checked through real mounts, for four checkpoints:

- Qwen3-MoE (F32, per-expert tensors, experts spread so that some rank files hold no tensor);
- DeepSeek-V3 with FP8 128x128 block-scaled experts, at T = 4 where the tensor-parallel cut of
  the experts (64 rows, inside a block) is refused: the mount without --ep is refused and the
  refusal names --ep, the mount with --ep is served;
- the transformers 5 fused layout of Qwen3-MoE (experts.gate_up_proj [E, 2I, D], down_proj
  [E, D, I], with [E, ...] biases);
- gpt-oss's fused MXFP4 layout (blocks, scales and biases per expert), under the built-in plan at
  T = 4 where its tensor-parallel cut is refused, and under a user plan's experts declaration;
- a tiny Qwen3-MoE written by transformers' save_pretrained, its MoE block run by transformers.

Byte level: every expert tensor of rank r is the source's whole tensor for the experts in r's
range (fused: the source's [r*E/N, (r+1)*E/N) slice), no other expert is in the rank's headers
or its index's weight_map, every other tensor is byte-identical to the mount without --ep, every
rank file (empty ones included) opens with the official parser, and the index's total_size is the
rank's bytes. Numerically (float64): the MoE block computed with expert parallelism (each rank
routes with its own router copy, computes the routed experts it holds for the tokens routed to
them, shared experts tensor-parallel from its local slices, outputs summed over ranks) equals the
unsplit block to 1e-5 relative. E not divisible by N is refused naming E and the N that work.
`tpfs plan --ep` prints each rank's experts.
"""
import hashlib
import json
import os
import re
import shutil
import tempfile

import numpy as np
from safetensors import safe_open

import fixtures
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-ep-")
rng = np.random.default_rng(15)
EXPERT = re.compile(r"\.experts\.(\d+)\.")
FUSED = re.compile(r"\.experts\.(gate_up_proj|down_proj)")


def plan_digest(src, T, *extra):
    """The plan digest as rank_folder.h defines it, from `tpfs plan --json`: SHA-256 of the compact
    {"per_rank", "rules"} (and "experts" under --ep) of the resolved plan."""
    pr = tt.tpfs("plan", src, "--tp", T, "--json", *extra, check=True)
    plan = json.loads(pr.stdout)
    canon = {"per_rank": plan.get("per_rank", []), "rules": plan["rules"]}
    if "--ep" in extra and "experts" in plan:
        canon["experts"] = plan["experts"]
    text = json.dumps(canon, separators=(",", ":"), ensure_ascii=False)
    return "%s sha256:%s" % (plan["name"][:-len("-resolved")], hashlib.sha256(text.encode()).hexdigest())


def rank_meta_configs(src, T, *extra):
    """Per rank: ({file: __metadata__} of its safetensors files, its config.json parsed)."""
    out = []
    with tt.Mount(src, T, *extra) as m:
        for r in range(T):
            metas = {fn: tt.read_raw(os.path.join(m.rank(r), fn))[1] or {} for fn in sorted(os.listdir(m.rank(r)))
                     if fn.endswith(".safetensors")}
            with open(os.path.join(m.rank(r), "config.json")) as f:
                out.append((metas, json.load(f)))
    return out


def check_rank_folders(what, src, T, E, expert_keys):
    """Under --ep each rank file's __metadata__ says tpfs.ep_size = T and
    tpfs.ep_experts = "first-last" (inclusive, global numbers: [r*E/T, (r+1)*E/T)); the plan digest
    differs from the mount without --ep and is the one recomputed from `tpfs plan --json --ep`; each
    rank's config.json is the one without --ep except that the keys sizing routed experts
    (expert_keys) keep the source's value, plus "tpfs_ep_size" and "tpfs_ep_experts"."""
    with open(os.path.join(src, "config.json")) as f:
        src_cfg = json.load(f)
    ep, tp = rank_meta_configs(src, T, "--ep"), rank_meta_configs(src, T)
    d_ep, d_tp = plan_digest(src, T, "--ep"), plan_digest(src, T)
    F.check(d_ep != d_tp, "%s T=%d: the plan digest differs with --ep (%s) and without (%s)" % (what, T, d_ep, d_tp))
    for r in range(T):
        rng_r = "%d-%d" % (r * E // T, (r + 1) * E // T - 1)
        for fn, meta in ep[r][0].items():
            F.check(meta.get("tpfs.ep_size") == str(T) and meta.get("tpfs.ep_experts") == rng_r and
                    meta.get("tpfs.tp_size") == str(T) and meta.get("tpfs.tp_rank") == str(r) and
                    meta.get("tpfs.plan") == d_ep,
                    "%s T=%d r=%d %s: --ep metadata %s (want ep_experts %s, plan %s)" % (what, T, r, fn, meta, rng_r, d_ep))
        for fn, meta in tp[r][0].items():
            F.check("tpfs.ep_size" not in meta and "tpfs.ep_experts" not in meta and meta.get("tpfs.plan") == d_tp,
                    "%s T=%d r=%d %s: no ep keys without --ep: %s" % (what, T, r, fn, meta))
        want = json.loads(json.dumps(tp[r][1]))
        for k in expert_keys:
            for obj, sobj in ((want, src_cfg), (want.get("text_config"), src_cfg.get("text_config"))):
                if isinstance(obj, dict) and k in obj:
                    obj[k] = sobj[k]
        want["tpfs_ep_size"], want["tpfs_ep_experts"] = T, rng_r
        got = ep[r][1]
        F.check(got == want and list(got) == list(want),
                "%s T=%d r=%d: --ep config.json: %s, want %s" % (
                    what, T, r, {k: got.get(k) for k in list(expert_keys) + ["num_attention_heads", "tpfs_ep_size",
                                                                             "tpfs_ep_experts"]},
                    {k: want.get(k) for k in list(expert_keys) + ["num_attention_heads", "tpfs_ep_size",
                                                                 "tpfs_ep_experts"]}))
    results.append("%s T=%d --ep: rank metadata, plan digest and config.json keys checked" % (what, T))
    return ep


# ---- checkpoints ----

def save_raw_files(out, config, tensors, file_of):
    """Raw tensors {name: (dtype, shape, bytes)} over the files file_of(name) names, with an index."""
    os.makedirs(out, exist_ok=True)
    files = {}
    for n in tensors:
        files.setdefault(file_of(n), {})[n] = tensors[n]
    wm, total = {}, 0
    for fn, part in sorted(files.items()):
        tt.write_raw(os.path.join(out, fn), part, {"format": "pt"})
        for n, t in part.items():
            wm[n] = fn
            total += len(t[2])
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def as_raw(tensors):
    return {k: ("F32", v.shape, np.ascontiguousarray(v, np.float32).tobytes()) for k, v in tensors.items()}


def qwen_moe():
    """fixtures.qwen3_moe (E = 4, layer 1 MoE), experts 0-1 in one file and 2-3 in another, so
    that at T = 2 each rank has a file with no tensor."""
    c, t = fixtures.qwen3_moe()
    def file_of(n):
        m = EXPERT.search(n)
        return "model-00001-of-00003.safetensors" if not m else \
            "model-%05d-of-00003.safetensors" % (2 + int(m.group(1)) // 2)
    return c, as_raw(t), file_of


def deepseek_fp8_ep():
    """DeepSeek-V3-like FP8 (128x128 block scales): 8 heads of (64 nope + 64 rope, 64 v), so that
    attention cuts on block boundaries at T = 4; a dense layer 0; layer 1 with E = 8 routed experts
    of intermediate 256 (T = 4 would cut them at 64 rows, inside a block) and 2 shared experts
    (512 rows, 128 per rank at T = 4)."""
    return fixtures.deepseek_fp8(25, num_attention_heads=8, v_head_dim=64, n_routed_experts=8, n_shared_experts=2,
                                 num_experts_per_tok=3, n_group=1, topk_group=1, norm_topk_prob=True,
                                 routed_scaling_factor=2.5)


def qwen_fused():
    """The transformers 5 layout of Qwen3-MoE: experts.gate_up_proj [E, 2I, D] ([gate | up] rows),
    experts.down_proj [E, D, I], here with per-expert biases [E, 2I] and [E, D]; E = 8."""
    c, full = fixtures.qwen3_moe(seed=31)
    E, I, D = 8, c["moe_intermediate_size"], c["hidden_size"]
    c["num_experts"] = E
    t = {k: v for k, v in full.items() if not EXPERT.search(k) and ".mlp.gate." not in k}
    g = np.random.default_rng(31)
    for i in range(c["num_hidden_layers"]):
        if i in c["mlp_only_layers"]:
            continue
        p = "model.layers.%d.mlp." % i
        t[p + "gate.weight"] = g.standard_normal((E, D)).astype(np.float32)
        t[p + "experts.gate_up_proj"] = g.standard_normal((E, 2 * I, D)).astype(np.float32)
        t[p + "experts.gate_up_proj_bias"] = g.standard_normal((E, 2 * I)).astype(np.float32)
        t[p + "experts.down_proj"] = g.standard_normal((E, D, I)).astype(np.float32)
        t[p + "experts.down_proj_bias"] = g.standard_normal((E, D)).astype(np.float32)
    return c, as_raw(t)


def gptoss_mxfp4(model_type):
    """A gpt-oss MXFP4 MoE layer (the published layout): experts.gate_up_proj_blocks U8
    [E, 2I, D/32, 16], _scales U8 [E, 2I, D/32], _bias F32 [E, 2I], down_proj_blocks [E, D, I/32, 16],
    _scales, _bias [E, D]; E = 4, I = 64: T = 4 would cut down's 2 blocks of 32 over 4 ranks."""
    c = dict(model_type=model_type, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
             num_local_experts=4, intermediate_size=64, vocab_size=64, num_hidden_layers=1)
    b = fixtures.RawBuilder(33)
    E, D, I = 4, 64, 64
    p = "model.layers.0."
    for nm in ("q_proj", "k_proj", "v_proj", "o_proj"):
        b.f32(p + "self_attn." + nm + ".weight", D, D)
    b.f32(p + "self_attn.sinks", 4)
    b.f32(p + "mlp.router.weight", E, D)
    b.f32(p + "mlp.router.bias", E)
    b.bytes_(p + "mlp.experts.gate_up_proj_blocks", "U8", E, 2 * I, D // 32, 16)
    b.bytes_(p + "mlp.experts.gate_up_proj_scales", "U8", E, 2 * I, D // 32)
    b.f32(p + "mlp.experts.gate_up_proj_bias", E, 2 * I)
    b.bytes_(p + "mlp.experts.down_proj_blocks", "U8", E, D, I // 32, 16)
    b.bytes_(p + "mlp.experts.down_proj_scales", "U8", E, D, I // 32)
    b.f32(p + "mlp.experts.down_proj_bias", E, D)
    b.f32(p + "input_layernorm.weight", D)
    return c, b.t


GPTOSS_PLAN = {
    "tpfs_plan": 1, "name": "test-gptoss", "extends": "llama",
    "rules": [{"name": "router", "match": "**.layers.{i}.mlp.router", "split": "replicate"},
              {"name": "down_bias", "match": "**.layers.{i}.mlp.experts.down_proj_bias", "split": "replicate"},
              {"name": "sinks", "match": "**.layers.{i}.self_attn.sinks", "split": "column", "heads": "num_attention_heads"}],
    "experts": [{"name": "fused", "match": "**.layers.{i}.mlp.experts", "count": "num_local_experts"}],
}


# ---- reading rank folders ----

def read_rank(path):
    """{name: (dtype, shape, bytes)} of every safetensors file of a rank folder (the official
    parser must open each, empty ones included), the index, and the files with no tensor."""
    out, empty = {}, []
    for fn in sorted(os.listdir(path)):
        if not fn.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(path, fn), framework="np") as f:
            keys = set(f.keys())
        t, _ = tt.read_raw(os.path.join(path, fn))
        F.check(keys == set(t), "%s: safe_open sees the tensors the header lists" % fn)
        if not t:
            empty.append(fn)
        for k, v in t.items():
            out[k] = v + (fn,)
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    return out, idx, empty


def mount_read(src, T, *extra):
    with tt.Mount(src, T, *extra) as m:
        return [read_rank(m.rank(r)) for r in range(T)]


def held(E, T, r):
    return range(r * E // T, (r + 1) * E // T)


def expert_of(name):
    m = EXPERT.search(name)
    return int(m.group(1)) if m else None


def check_bytes(what, full, E, T, ep, tp=None, fused_axis0=()):
    """The byte-level demands for one --ep mount (ep: per-rank read_rank results); tp: the same
    checkpoint mounted without --ep at the same T (None when that is refused)."""
    for r in range(T):
        local, idx, _ = ep[r]
        mine = set(held(E, T, r))
        for k, (dt, shape, b) in full.items():
            e = expert_of(k)
            if e is not None:
                if e in mine:
                    F.check(k in local and local[k][:3] == (dt, tuple(shape), b),
                            "%s T=%d r=%d: %s is the source's whole tensor" % (what, T, r, k))
                else:
                    F.check(k not in local, "%s T=%d r=%d: %s (expert %d) absent" % (what, T, r, k, e))
                    F.check(k not in idx["weight_map"], "%s T=%d r=%d: %s not in weight_map" % (what, T, r, k))
            elif FUSED.search(k):
                per = len(b) // shape[0]
                lo, hi = r * shape[0] // T, (r + 1) * shape[0] // T
                want = (dt, (hi - lo,) + tuple(shape[1:]), b[lo * per:hi * per])
                F.check(k in local and local[k][:3] == want,
                        "%s T=%d r=%d: %s holds experts [%d, %d) of the source" % (what, T, r, k, lo, hi))
            elif tp is not None:
                F.check(k in local and local[k][:3] == tp[r][0].get(k, (None,))[:3],
                        "%s T=%d r=%d: %s byte-identical to the mount without --ep" % (what, T, r, k))
            else:
                F.check(k in local, "%s T=%d r=%d: %s present" % (what, T, r, k))
        F.check(set(idx["weight_map"]) == set(local) and all(idx["weight_map"][k] == local[k][3] for k in local),
                "%s T=%d r=%d: weight_map lists exactly the rank's tensors, in their files" % (what, T, r))
        F.check(idx["metadata"]["total_size"] == sum(len(v[2]) for v in local.values()),
                "%s T=%d r=%d: total_size is the rank's bytes" % (what, T, r))
    n_exp = {k for k in full if expert_of(k) is not None}
    got = [k for r in range(T) for k in ep[r][0] if expert_of(k) is not None]
    F.check(sorted(got) == sorted(n_exp), "%s T=%d: every expert tensor on exactly one rank" % (what, T))


# ---- numerics (float64) ----

def f32(t):
    return np.frombuffer(t[2], np.float32).reshape(t[1]).astype(np.float64)


def deq(t, w):
    """A weight as float64: F32 as is, FP8 block-scaled as byte value x its 128x128 block scale."""
    mod = w[:-len(".weight")]
    if t[w][0] == "F32":
        return f32(t[w])
    q = np.frombuffer(t[w][2], np.uint8).reshape(t[w][1]).astype(np.float64)
    s = f32(t[mod + ".weight_scale_inv"])
    n, k = q.shape
    return q * s[np.arange(n)[:, None] // 128, np.arange(k)[None, :] // 128]


def silu(x):
    return x * 0.5 * (1 + np.tanh(x / 2))  # x * sigmoid(x), without overflow


def swiglu(x, g, u, d):
    return (silu(x @ g.T) * (x @ u.T)) @ d.T


def route_softmax(x, t, p, k, norm):
    logits = x @ f32(t[p + "gate.weight"]).T
    s = np.exp(logits - logits.max(axis=1, keepdims=True))
    s /= s.sum(axis=1, keepdims=True)
    top = np.argsort(-s, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(s, top, axis=1)
    return top, (w / w.sum(axis=1, keepdims=True) if norm else w)


def route_deepseek(x, t, p, k, scale):
    s = 0.5 * (1 + np.tanh((x @ f32(t[p + "gate.weight"]).T) / 2))  # sigmoid
    top = np.argsort(-(s + f32(t[p + "gate.e_score_correction_bias"])), axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(s, top, axis=1)
    return top, w / w.sum(axis=1, keepdims=True) * scale


def routed(x, top, w, experts, expert_fn):
    """Sum over the given experts of weight x expert(tokens routed to it)."""
    out = np.zeros_like(x)
    for e in experts:
        rows, slot = np.nonzero(top == e)
        if len(rows):
            out[rows] += w[rows, slot][:, None] * expert_fn(e, x[rows])
    return out


def held_experts(local, p):
    return sorted({expert_of(k) for k in local if k.startswith(p) and expert_of(k) is not None})


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def check_moe(what, T, full, ranks, block):
    """block(t, r or None) is the MoE block output from tensors t (None: the unsplit block)."""
    want = block(full, None)
    got = sum(block(ranks[r][0], r) for r in range(T))
    err = rel(got, want)
    F.check(err < 1e-5, "%s T=%d: EP MoE block equals the unsplit block (max rel err %.2e)" % (what, T, err))
    if T > 1:  # the check can fail: without the last rank's output the sum is far off
        part = sum(block(ranks[r][0], r) for r in range(T - 1))
        F.check(rel(part, want) > 1e-3, "%s T=%d: dropping rank %d's output breaks the equality" % (what, T, T - 1))
    return err


results = []

# ---- 1. Qwen3-MoE, per-expert tensors ----
src = os.path.join(work, "qwen3_moe")
cfg, full, file_of = qwen_moe()
save_raw_files(src, cfg, full, file_of)
E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
x = rng.standard_normal((16, cfg["hidden_size"]))
p = "model.layers.1.mlp."


def qwen_block(t, r):
    top, w = route_softmax(x, t, p, k, cfg["norm_topk_prob"])
    mine = range(E) if r is None else held_experts(t, p)
    def expert(e, xs):
        q = p + "experts.%d." % e
        return swiglu(xs, f32(t[q + "gate_proj.weight"]), f32(t[q + "up_proj.weight"]), f32(t[q + "down_proj.weight"]))
    return routed(x, top, w, mine, expert)


for T in (1, 2, 4):
    ep = mount_read(src, T, "--ep")
    tp = mount_read(src, T)
    check_bytes("qwen3_moe", full, E, T, ep, tp)
    for r in range(T):
        F.check(held_experts(ep[r][0], p) == list(held(E, T, r)),
                "qwen3_moe T=%d r=%d: holds experts %s" % (T, r, list(held(E, T, r))))
    if T == 2:
        F.check(ep[0][2] == ["model-00003-of-00003.safetensors"] and ep[1][2] == ["model-00002-of-00003.safetensors"],
                "qwen3_moe T=2: the file of the other rank's experts is an empty, valid file (%s, %s)" % (ep[0][2], ep[1][2]))
    err = check_moe("qwen3_moe", T, full, ep, qwen_block)
    results.append("qwen3_moe T=%d --ep: experts whole per rank, MoE block rel err %.1e" % (T, err))

# rank metadata, plan digest and config.json under --ep (attention heads still split)
check_rank_folders("qwen3_moe", src, 4, E, ["moe_intermediate_size"])

# E not divisible by N: refused before mounting, naming E and the N that work
mnt = tempfile.mkdtemp(prefix="tpfs-ep-mnt-")
want_msg = "--ep: 4 routed experts (num_experts=4; plan 'qwen-moe', experts 'routed') do not divide over 3 ranks"
for cmd in (["mount", src, mnt, "--tp", 3, "--ep", "-f"], ["plan", src, "--tp", 3, "--ep"]):
    pr = tt.tpfs(*cmd)
    F.check(pr.returncode == 1 and want_msg in pr.stderr and "N must divide 4: --tp 1, 2, 4" in pr.stderr,
            "tpfs %s --tp 3 --ep refused naming E = 4 and N = 1, 2, 4: %s" % (cmd[0], pr.stderr.strip()))
F.check(not tt.is_mounted(mnt), "nothing mounted at T = 3")
os.rmdir(mnt)
# a plan without experts declarations: --ep refused
pr = tt.tpfs("plan", src, "--tp", 2, "--ep", "--plan", "llama")
F.check(pr.returncode == 1 and "--ep: plan 'llama' declares no routed experts" in pr.stderr,
        "--ep with a plan that declares no experts is refused: %s" % pr.stderr.strip())

# tpfs plan --ep: each rank's experts
pr = tt.tpfs("plan", src, "--tp", 4, "--ep")
rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^(\d+)\s+(\d+-\d+)\s+\d+\s", pr.stdout, re.M)}
F.check(pr.returncode == 0 and rows == {r: "%d-%d" % (r, r) for r in range(4)},
        "tpfs plan --tp 4 --ep prints each rank's expert range: %s" % rows)

# ---- 2. DeepSeek-V3, FP8 block-scaled experts, at T = 4 where the TP cut of the experts is refused ----
src = os.path.join(work, "deepseek_fp8")
cfg, full = deepseek_fp8_ep()
fixtures.save_raw(src, cfg, full)
E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
D = cfg["hidden_size"]
x = rng.standard_normal((24, D))
p = "model.layers.1.mlp."


def ds_block(t, r):
    top, w = route_deepseek(x, t, p, k, cfg["routed_scaling_factor"])
    mine = range(E) if r is None else held_experts(t, p)
    def expert(e, xs):
        q = p + "experts.%d." % e
        return swiglu(xs, deq(t, q + "gate_proj.weight"), deq(t, q + "up_proj.weight"), deq(t, q + "down_proj.weight"))
    q = p + "shared_experts."  # tensor-parallel: local column slices, a partial row-parallel sum
    shared = swiglu(x, deq(t, q + "gate_proj.weight"), deq(t, q + "up_proj.weight"), deq(t, q + "down_proj.weight"))
    return routed(x, top, w, mine, expert) + shared


mnt = tempfile.mkdtemp(prefix="tpfs-ep-mnt-")
pr = tt.tpfs("mount", src, mnt, "--tp", 4, "-f")
F.check(pr.returncode == 1 and "experts." in pr.stderr and "128" in pr.stderr and "(--ep)" in pr.stderr,
        "deepseek_fp8 T=4 without --ep: refused, the refusal names --ep: %s" % pr.stderr.strip())
F.check(not tt.is_mounted(mnt), "deepseek_fp8 T=4 without --ep: nothing mounted")
os.rmdir(mnt)
pr = tt.tpfs("plan", src, "--tp", 4, "--ep")
F.check(pr.returncode == 0, "tpfs plan --tp 4 --ep of the FP8 checkpoint succeeds: %s" % pr.stderr.strip())
rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^(\d+)\s+(\d+-\d+)\s+\d+\s", pr.stdout, re.M)}
F.check(rows == {r: "%d-%d" % (2 * r, 2 * r + 1) for r in range(4)}, "plan --ep: ranks hold experts 0-1 .. 6-7: %s" % rows)
print("---- tpfs plan %s --tp 4 --ep: the placement ----" % os.path.basename(src))
print(pr.stdout[pr.stdout.find("expert parallelism"):pr.stdout.find("source:", pr.stdout.find("expert parallelism"))])
for T in (2, 4):
    ep = mount_read(src, T, "--ep")
    tp = mount_read(src, T) if T == 2 else None
    check_bytes("deepseek_fp8", full, E, T, ep, tp)
    for r in range(T):
        loc = ep[r][0]
        for e in held(E, T, r):
            F.check(p + "experts.%d.down_proj.weight_scale_inv" % e in loc,
                    "deepseek_fp8 T=%d r=%d: expert %d's block scales travel with it" % (T, r, e))
        F.check(loc[p + "shared_experts.gate_proj.weight"][1] == (512 // T, D),
                "deepseek_fp8 T=%d r=%d: shared experts column-parallel" % (T, r))
    err = check_moe("deepseek_fp8", T, full, ep, ds_block)
    results.append("deepseek_fp8 T=%d --ep: FP8 experts whole with their scales, MoE block rel err %.1e" % (T, err))

# the config.json keys under --ep: moe_intermediate_size (which also sizes the shared experts)
# keeps the source's value; the shared experts are still column-parallel: a loader sizes them
# moe_intermediate_size * n_shared_experts / tpfs_ep_size
for r, (_, c) in enumerate(check_rank_folders("deepseek_fp8", src, 2, E, ["moe_intermediate_size"])):
    F.check(c["moe_intermediate_size"] == cfg["moe_intermediate_size"] and
            c["moe_intermediate_size"] * c["n_shared_experts"] // c["tpfs_ep_size"] == 512 // 2 and
            c["num_attention_heads"] == cfg["num_attention_heads"] // 2,
            "deepseek_fp8 T=2 r=%d: config %s sizes the shared experts' rows as served (256)" % (
                r, {k: c.get(k) for k in ("moe_intermediate_size", "n_shared_experts", "num_attention_heads")}))

# ---- 3. fused experts, the transformers 5 layout (with biases) ----
src = os.path.join(work, "qwen_fused")
cfg, full = qwen_fused()
fixtures.save_raw(src, cfg, full)
E, k, I = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
x = rng.standard_normal((16, cfg["hidden_size"]))
p = "model.layers.1.mlp."


def fused_block(t, r):
    top, w = route_softmax(x, t, p, k, cfg["norm_topk_prob"])
    gu, gub = f32(t[p + "experts.gate_up_proj"]), f32(t[p + "experts.gate_up_proj_bias"])
    dn, dnb = f32(t[p + "experts.down_proj"]), f32(t[p + "experts.down_proj_bias"])
    first = 0 if r is None else r * E // T
    def expert(e, xs):
        j = e - first  # the rank's local index of global expert e
        h = xs @ gu[j].T + gub[j]
        return (silu(h[:, :I]) * h[:, I:]) @ dn[j].T + dnb[j]
    return routed(x, top, w, range(first, first + gu.shape[0]), expert)


for T in (2, 4):
    ep = mount_read(src, T, "--ep")
    check_bytes("qwen_fused", full, E, T, ep, mount_read(src, T) if T == 2 else None)
    err = check_moe("qwen_fused", T, full, ep, fused_block)
    results.append("qwen_fused T=%d --ep: [E, ...] tensors cut on the expert axis, MoE block rel err %.1e" % (T, err))

# ---- 4. gpt-oss MXFP4 fused experts: the built-in plan, and a user plan's declaration ----
for kind in ("gpt_oss", "tpfs_test_moe"):
    src = os.path.join(work, kind)
    cfg, full = gptoss_mxfp4(kind)
    fixtures.save_raw(src, cfg, full)
    extra = []
    if kind != "gpt_oss":  # an architecture no built-in knows: the user's plan declares the experts
        extra = ["--plan", os.path.join(work, "gptoss-plan.json")]
        with open(extra[1], "w") as f:
            json.dump(GPTOSS_PLAN, f)
        # its rules do not say how to cut the fused experts: without --ep they are refused, not served whole
        pr = tt.tpfs("plan", src, "--tp", 2, *extra)
        F.check(pr.returncode == 1 and "tensor 'model.layers.0.mlp.experts.gate_up_proj_blocks'" in pr.stderr
                and "no rule of plan 'test-gptoss' matches it" in pr.stderr,
                "a user plan's experts without a rule are refused without --ep: %s" % pr.stderr.strip()[:600])
    else:
        mnt = tempfile.mkdtemp(prefix="tpfs-ep-mnt-")
        pr = tt.tpfs("mount", src, mnt, "--tp", 4, "-f")
        F.check(pr.returncode == 1 and "down_proj_blocks" in pr.stderr and "(--ep)" in pr.stderr,
                "gpt_oss T=4 without --ep: refused (down's 2 blocks over 4 ranks), naming --ep: %s" % pr.stderr.strip())
        os.rmdir(mnt)
    for T in (2, 4):
        ep = mount_read(src, T, "--ep", *extra)
        check_bytes(kind, full, cfg["num_local_experts"], T, ep, mount_read(src, T, *extra) if T == 2 and not extra else None)
        results.append("%s MXFP4 T=%d --ep: blocks, scales and biases of experts [r*E/N, (r+1)*E/N) per rank" % (kind, T))

# ---- 5. real model code: a tiny Qwen3-MoE saved by transformers, the block by transformers ----
def real_qwen3_moe():
    """transformers' Qwen3MoeForCausalLM (E = 8) written by save_pretrained over several files (its
    per-expert layout, E as num_local_experts); for each T, each rank's MoE tensors (router, its
    experts) plus zeros for the experts it lacks (which must be exactly the other ranks' experts)
    and for the tensors outside the block are loaded by from_pretrained with no missing, unexpected
    or mismatched key, and the sum over ranks of the real MoE block's outputs equals the block of
    the model loaded from the source."""
    import torch
    from safetensors.torch import load, load_file, save_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(15)
    c = Qwen3MoeConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
                       moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
                       vocab_size=64, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    src = os.path.join(work, "real_qwen3_moe")
    Qwen3MoeForCausalLM(c).save_pretrained(src, max_shard_size="40KB")
    names = {}
    for fn in os.listdir(src):
        if fn.endswith(".safetensors"):
            for k, v in load_file(os.path.join(src, fn)).items():
                names[k] = v
    F.check(any(expert_of(k) is not None for k in names), "transformers saved per-expert tensors: %d" % len(names))

    def block(path):
        m, info = Qwen3MoeForCausalLM.from_pretrained(path, output_loading_info=True)
        F.check(not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"],
                "real_qwen3_moe: %s loads strictly: %s" % (os.path.basename(path), info))
        m = m.float().eval()  # float32: the experts' grouped matmul takes no float64
        with torch.no_grad():
            return m.model.layers[1].mlp(xt).double().numpy()

    xt = torch.from_numpy(rng.standard_normal((1, 24, 32)).astype(np.float32))
    want = block(src)
    for T in (2, 4):
        filled = []
        with tt.Mount(src, T, "--ep") as mt:
            for r in range(T):
                local = {}
                for fn in os.listdir(mt.rank(r)):
                    if fn.endswith(".safetensors"):
                        with open(os.path.join(mt.rank(r), fn), "rb") as f:  # read, not mapped: the mount goes
                            local.update(load(f.read()))
                lacks = {k for k in names if k not in local}
                others = {k for k in names if expert_of(k) is not None and expert_of(k) not in held(8, T, r)}
                F.check(lacks == others, "real_qwen3_moe T=%d r=%d: lacks exactly the other ranks' experts" % (T, r))
                path = os.path.join(work, "real_r%d_%d" % (T, r))
                os.makedirs(path)
                # the MoE block's tensors (router, experts) from the rank; the rest (attention,
                # tensor-parallel, not part of the block) and the absent experts as zeros
                save_file({k: local[k] if k in local and ".mlp." in k else torch.zeros_like(v) for k, v in names.items()},
                          os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
                with open(os.path.join(src, "config.json")) as f:  # the global config: whole experts
                    cfg_text = f.read()
                with open(os.path.join(path, "config.json"), "w") as f:
                    f.write(cfg_text)
                filled.append(path)
        got = sum(block(path) for path in filled)
        err = rel(got, want)
        F.check(err < 1e-5, "real_qwen3_moe T=%d: sum of the ranks' real MoE blocks equals the block (%.2e)" % (T, err))
        results.append("real_qwen3_moe T=%d --ep: transformers' MoE block summed over ranks, rel err %.1e" % (T, err))


real_qwen3_moe()


# ---- 6. Data parallelism with expert parallelism (--dp D --ep --view vllm) ----

def vllm_ep_block(E, N, g):
    """vLLM 0.32's linear placement (fused_moe/expert_map_manager.py determine_expert_map), written here
    from its text: EP rank g of N holds E // N experts, one more on the first E % N ranks, starting at
    g * (E // N) + min(g, E % N)."""
    base, rem = E // N, E % N
    return range(g * base + min(g, rem), g * base + min(g, rem) + base + (g < rem))


def read_parts(folder, prefix):
    """{name: numpy array} of every file folder/prefix*-part-*.safetensors (read, not mapped), and the
    file names."""
    from safetensors.numpy import load
    out, files = {}, sorted(fn for fn in os.listdir(folder) if fn.startswith(prefix) and fn.endswith(".safetensors"))
    for fn in files:
        with open(os.path.join(folder, fn), "rb") as f:
            out.update(load(f.read()))
    return out, files


def dp_ep():
    """Under --dp D --ep --view vllm, MNT holds for DP rank d and TP rank t the files
    model-dp-{d}-rank-{t}-part-{p}.safetensors (and no model-rank-* file): the routed experts those of
    EP rank g = d x T + t of N = D x T by vLLM's rule (vllm_ep_block; E = 5 does not divide over 4 or 3
    ranks, so the remainder rule is exercised), stacked as vLLM stacks them (w13_weight[i] = gate_e then
    up_e, w2_weight[i] = down_e, whole: the MoE layer is not tensor-parallel under EP), numpy slices of
    the source; every other tensor byte-equal to TP rank t's file of the mount without --dp and --ep.
    E below N, --dp without --ep, and a view that does not list the model type are refused."""
    c, t = fixtures.qwen3_moe()
    Dh, I = c["hidden_size"], c["moe_intermediate_size"]
    extra = fixtures.Builder(61)
    fixtures._mlp(extra, "model.layers.1.", Dh, I, prefix="mlp.experts.4.")
    t.update(extra.t)
    t["model.layers.1.mlp.gate.weight"] = rng.standard_normal((5, Dh)).astype(np.float32)
    c["num_experts"] = E = 5
    src = os.path.join(work, "dp_ep")
    fixtures.save(src, c, t)
    p = "model.layers.1.mlp."
    for T, D in ((2, 2), (1, 3)):
        N = D * T
        with tt.Mount(src, T, "--view", "vllm") as m:
            dense = [read_parts(m.path, "model-rank-%d-" % r)[0] for r in range(T)]
        with tt.Mount(src, T, "--dp", D, "--ep", "--view", "vllm") as m:
            names = sorted(os.listdir(m.path))
            F.check(not [n for n in names if n.startswith("model-rank-")] and "config.json" in names,
                    "dp_ep T=%d D=%d: no model-rank-* file, the source's other files: %s" % (T, D, names))
            for d in range(D):
                for r in range(T):
                    g = d * T + r
                    got, files = read_parts(m.path, "model-dp-%d-rank-%d-" % (d, r))
                    F.check(len(files) >= 1, "dp_ep T=%d D=%d: DP rank %d TP rank %d has files" % (T, D, d, r))
                    held_e = list(vllm_ep_block(E, N, g))
                    w13, w2 = got.get(p + "experts.routed_experts.w13_weight"), got.get(p + "experts.routed_experts.w2_weight")
                    want13 = np.stack([np.concatenate([t[p + "experts.%d.gate_proj.weight" % e],
                                                       t[p + "experts.%d.up_proj.weight" % e]]) for e in held_e])
                    want2 = np.stack([t[p + "experts.%d.down_proj.weight" % e] for e in held_e])
                    F.check(w13 is not None and w13.shape == want13.shape and np.array_equal(w13, want13) and
                            w2 is not None and w2.shape == want2.shape and np.array_equal(w2, want2),
                            "dp_ep T=%d D=%d g=%d: experts %s stacked as vLLM holds them (w13 %s, want %s)" % (
                                T, D, g, held_e, None if w13 is None else w13.shape, want13.shape))
                    rest = {k: v for k, v in got.items() if ".routed_experts." not in k}
                    want_rest = {k: v for k, v in dense[r].items() if ".routed_experts." not in k}
                    F.check(sorted(rest) == sorted(want_rest) and
                            all(rest[k].dtype == want_rest[k].dtype and np.array_equal(rest[k], want_rest[k])
                                for k in rest),
                            "dp_ep T=%d D=%d g=%d: every dense tensor is TP rank %d's (%d tensors)" % (T, D, g, r, len(rest)))
        results.append("dp_ep T=%d D=%d: %d EP ranks, experts %s, dense tensors TP rank's" % (
            T, D, N, [list(vllm_ep_block(E, N, g)) for g in range(N)]))
    pr = tt.tpfs("plan", src, "--tp", 2, "--dp", 3, "--ep", "--view", "vllm")
    F.check(pr.returncode != 0 and "5 routed experts" in pr.stderr and "6 ranks" in pr.stderr,
            "dp_ep: E = 5 over 6 EP ranks is refused naming both: %s" % pr.stderr.strip()[-300:])
    pr = tt.tpfs("plan", src, "--tp", 2, "--dp", 2, "--view", "vllm")
    F.check(pr.returncode == 2 and "--dp" in pr.stderr and "--ep" in pr.stderr,
            "dp_ep: --dp without --ep is a usage error: %s" % pr.stderr.strip()[-300:])
    c2 = dict(c, model_type="mellum")  # the qwen3_moe view's other model type: its DP x EP is not listed
    src2 = os.path.join(work, "dp_ep_mellum")
    fixtures.save(src2, c2, t)
    pr = tt.tpfs("plan", src2, "--tp", 2, "--dp", 2, "--ep", "--view", "vllm")
    F.check(pr.returncode != 0 and "not for model_type 'mellum'" in pr.stderr,
            "dp_ep: a model type the view does not list under dp_ep is refused: %s" % pr.stderr.strip()[-300:])
    pr = tt.tpfs("plan", src, "--tp", 2, "--dp", 2, "--ep", "--view", "vllm")
    rows = re.findall(r"^(\d+) +(\d+) +(\d+) +(\S+)$", pr.stdout, re.M)
    want_rows = [(str(g), str(g // 2), str(g % 2), "%d-%d" % (vllm_ep_block(E, 4, g)[0], vllm_ep_block(E, 4, g)[-1]))
                 for g in range(4)]
    F.check(pr.returncode == 0 and "model-dp-0-rank-0-part-0.safetensors" in pr.stdout and rows == want_rows,
            "dp_ep: tpfs plan --dp shows the DP rank's files and each EP rank's experts %s: %s" % (want_rows, rows))



def dp_ep_deepseek():
    """DeepSeek-V3 under --dp 2 --ep --view vllm at T=2: vLLM's MoE is then sequence-parallel (its default
    all2all backend, EP, T > 1, D > 1: config/parallel.py use_sequence_parallel_moe) and DeepseekV2MoE builds
    the shared experts whole (models/deepseek_v2.py, disable_tp=is_sequence_parallel). So every rank's
    shared experts are the source's whole (gate_up_proj = gate then up, down_proj), the routed experts EP rank
    d x T + t's, and every other tensor (attention, the dense layer 0's MLP, router, norms, embeddings) TP rank
    t's file of the mount without --dp, the dense MLP cut in two. At T=1 (D=3) the shared experts are whole
    anyway; without --dp they stay cut by TP rank (test above)."""
    c, t = fixtures.deepseek_v3()
    src = os.path.join(work, "dp_ep_ds")
    fixtures.save(src, c, t)
    E, I, H = c["n_routed_experts"], c["moe_intermediate_size"] * c["n_shared_experts"], c["hidden_size"]
    p = "model.layers.1.mlp."
    sh = p + "experts._shared_experts._layer."
    whole_gu = np.concatenate([t[p + "shared_experts.gate_proj.weight"], t[p + "shared_experts.up_proj.weight"]])
    whole_d = t[p + "shared_experts.down_proj.weight"]
    for T, D in ((2, 2), (1, 3)):
        N = D * T
        if E < N:
            continue
        with tt.Mount(src, T, "--view", "vllm") as m:
            dense = [read_parts(m.path, "model-rank-%d-" % r)[0] for r in range(T)]
        if T > 1:
            F.check(dense[0][sh + "gate_up_proj.weight"].shape == (2 * I // T, H),
                    "dp_ep deepseek T=%d without --dp: the shared experts cut by TP rank: %s" % (
                        T, dense[0][sh + "gate_up_proj.weight"].shape))
        with tt.Mount(src, T, "--dp", D, "--ep", "--view", "vllm") as m:
            for d in range(D):
                for r in range(T):
                    g = d * T + r
                    got, files = read_parts(m.path, "model-dp-%d-rank-%d-" % (d, r))
                    F.check(len(files) >= 1, "dp_ep deepseek T=%d D=%d: DP rank %d TP rank %d has files" % (T, D, d, r))
                    gu, dn = got.get(sh + "gate_up_proj.weight"), got.get(sh + "down_proj.weight")
                    F.check(gu is not None and np.array_equal(gu, whole_gu) and dn is not None and
                            np.array_equal(dn, whole_d),
                            "dp_ep deepseek T=%d D=%d g=%d: the shared experts whole (gate_up %s, want %s)" % (
                                T, D, g, None if gu is None else gu.shape, whole_gu.shape))
                    held_e = list(vllm_ep_block(E, N, g))
                    w13 = got.get(p + "experts.routed_experts.w13_weight")
                    want13 = np.stack([np.concatenate([t[p + "experts.%d.gate_proj.weight" % e],
                                                       t[p + "experts.%d.up_proj.weight" % e]]) for e in held_e])
                    F.check(w13 is not None and w13.shape == want13.shape and np.array_equal(w13, want13),
                            "dp_ep deepseek T=%d D=%d g=%d: routed experts %s" % (T, D, g, held_e))
                    rest = {k: v for k, v in got.items() if ".routed_experts." not in k and not k.startswith(sh)}
                    want_rest = {k: v for k, v in dense[r].items() if ".routed_experts." not in k and not k.startswith(sh)}
                    F.check(sorted(rest) == sorted(want_rest) and
                            all(rest[k].dtype == want_rest[k].dtype and np.array_equal(rest[k], want_rest[k])
                                for k in rest),
                            "dp_ep deepseek T=%d D=%d g=%d: every other tensor is TP rank %d's (%d tensors)" % (
                                T, D, g, r, len(rest)))
                    F.check(got.get("model.layers.0.mlp.gate_up_proj.weight") is not None and
                            got["model.layers.0.mlp.gate_up_proj.weight"].shape[0] == 2 * c["intermediate_size"] // T,
                            "dp_ep deepseek T=%d D=%d g=%d: the dense layer's MLP cut by TP rank" % (T, D, g))
        results.append("dp_ep deepseek_v3 T=%d D=%d: shared experts whole, routed experts %s, the rest TP rank's" % (
            T, D, [list(vllm_ep_block(E, N, g)) for g in range(N)]))


dp_ep()
dp_ep_deepseek()
shutil.rmtree(work, ignore_errors=True)
print("\n".join(results))
F.done("test_ep")
