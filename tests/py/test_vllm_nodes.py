"""Several nodes: pipeline stages under --view vllm (--pp), proven by vLLM 0.32's own loaders, and
one vLLM run across two nodes, each node a mount namespace with its own tpfs serving only its ranks.

1. Stages as vLLM divides them: `tpfs plan --view vllm --pp P` on llama checkpoints of n layers against
   vLLM's own get_pp_indices (distributed/utils.py) for every n in 2..9 and P in 2..4 (P <= n); P > n refused.
2. The load-only probe (vllm_probe.py: vLLM's model class built in a group of TP x PP worker processes, the
   default loader on SRC against sharded_state on the mount, key sets and every tensor bitwise before and
   after processing) for every view family with stages, at PP=2 x TP=1 and, for some, PP=2 x TP=2; an uneven
   split (3 layers: vLLM gives stage 0 two); --pp-layers 1,2 with vLLM's VLLM_PP_LAYER_PARTITION=1,2; a
   quantized view (compressed-tensors INT8, NVFP4 with vLLM's emulation kernels). Every stage file also holds
   exactly the independent reference's tensors of its TP rank (vllm_view_ref.py), bytes equal, the stages
   together all of them. A broken split (the final norm moved to stage 0) must fail the probe.
3. Refusals by name: tied embeddings across stages, a model type the view's stages are not proven for, a
   view without stages, more stages than layers; round_robin where vLLM would place linearly, EP of a
   quantization not proven.
4. Two nodes (TPFS_VLLM_TOKENS other than none): vLLM's `serve` (vllm_serve.py: its own parser and command)
   on node 0 and `serve --headless` on node 1 (--nnodes 2, loopback), each node in its own mount namespace
   (unshare -m) with `tpfs mount SRC MNT --view vllm --ranks R` at the same MNT; TP=2 (rank 0 | rank 1) and
   PP=2 x TP=1 (stage 0 | stage 1). Greedy tokens and top-5 logprobs over HTTP equal to a one-node run of
   the default loader on SRC with the same split; each node saw only its ranks' part files, and its stats
   show only its ranks, having read the source bytes `tpfs plan --io --ranks R` computes for them (with the
   default push-ahead, plus at most what its demand reads served: pages read again through the daemon).
   Every process ended and no mount left.
5. The vLLM plugin across the same two nodes (TP=2; TPFS_NODES_PLUGIN=tp2,pp2 adds PP=2): each node runs only
   `serve SRC --load-format tpfs --nnodes 2 --node-rank R ...` (the plugin of this checkout, registered as
   `pip install .` registers it; a runtime folder per node), compared to the same one-node run of the default
   loader: tokens and logprobs equal; while it serves, each node holds exactly one tpfs mount, made by the
   plugin's `tpfs mount SRC MNT --tp 2 --view vllm --ranks R` (its daemon's command line and the plugin's log
   line), listing only rank R's part file and having read only rank R's source bytes (as in 4); once vLLM exits,
   no mount is left in either node and every daemon and reaper has ended. Each node's mount (daemon command line,
   mountinfo line, the plugin's log line) is printed and kept in WORK/tp2-plugin-nodeR.mount. Each node's mount was
   made early, by its vLLM main process (`serve`, and the headless node's `serve --headless`): its log says so.
Expert parallelism (--ep under the view, vLLM's enable_expert_parallel) by the probe only, at TP=2: linear placement
for every MoE view family, round_robin where vLLM uses it (several expert groups; the same files loaded by a
linear vLLM must differ); vLLM's CPU MoE cannot run a forward under EP (issue 32), so no token check.
Data parallelism with expert parallelism (--dp 2 --ep, vLLM's --data-parallel-size 2 --enable-expert-parallel) by
the probe, at DP=2 x TP=2 (one gloo world of 4 ranks, each DP rank its own VllmConfig, as vLLM's DP engines):
Qwen3-MoE with 5 routed experts over 4 EP ranks (vLLM: 2, 1, 1, 1), each DP rank's sharded_state reading its
model-dp-{d}-rank-{t} files; the same files with DP ranks 0 and 1 swapped must fail; and the plugin
(--load-format tpfs, the checkout's python/ package registered as vLLM registers plugins, in each worker) at the
same split: each DP rank's two workers share one mount of that DP rank's EP ranks, every tensor equal to the
default loader's, and no mount left once the probe has exited. DeepSeek-V3 at the same split with 5 experts: vLLM
builds its MoE sequence-parallel there (checked), with the shared experts whole, which the view serves whole under
--dp (the dense layer's MLP and the attention cut by TP rank as without DP).

TPFS_VLLM_TOKENS=none (the sanitized build) runs 1 to 3 only, for a few families. TPFS_NODES_PARTS=stages,probe,nodes,plugin
(the default) names the parts to run (nodes: 4, plugin: 5; either runs the one-node run it compares to).
"""
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import families
from tpfs_test import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
VIEWS = os.path.join(HERE, "..", "..", "views", "vllm")
TOKENS_MODE = os.environ.get("TPFS_VLLM_TOKENS") or "some"
# The families come from the registry's vllm_nodes role (families.py, one row per family):
# family -> (view, impersonation): every view family with stages (views' "pp"), probed at PP=2 x TP=1
PP_FAMILIES = {f: r["pp"] for f, r in families.table("vllm_nodes").items() if "pp" in r}
# the layer count where the probe's default does not do (vLLM's Glm4Moe needs a MoE layer on every stage: its
# first layer is dense)
LAYERS = {f: r["layers"] for f, r in families.table("vllm_nodes").items() if "layers" in r}
PP_TP2 = [f for f, r in families.table("vllm_nodes").items() if r.get("tp2")]  # also at PP=2 x TP=2 (4 processes)
# expert parallelism (--ep, vLLM's enable_expert_parallel) at TP=2, load-only: (family, view, placement, config
# fields, impersonation). vLLM places experts round-robin only in models with several expert groups (n_group > 1;
# expert_map_manager.py), else linearly whatever it was asked
EP_CASES = [(f,) + c for f, r in families.table("vllm_nodes").items() for c in r.get("ep", ())]
if TOKENS_MODE == "none":
    PP_FAMILIES = {f: PP_FAMILIES[f] for f in ("llama", "qwen3_moe", "deepseek_v3")}
    PP_TP2 = ["qwen3_moe"]
    EP_CASES = [c for c in EP_CASES if c[0] == "qwen3_moe" and c[2] == "linear" or
                c[0] == "deepseek_v3" and c[2] == "round_robin"]
PROMPTS = [[1, 5, 9, 600, 999], [3, 700, 20, 511, 512, 513]]


def tensors_of(files):
    from safetensors import safe_open
    out = {}
    for p in files:
        with safe_open(p, framework="pt") as h:
            for k in h.keys():
                out.setdefault(k, []).append(h.get_tensor(k))
    return out


def stage_files(folder, s, t):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                  if f.startswith("model-pp-%d-tp-%d-part-" % (s, t)) and f.endswith(".safetensors"))


def same_as_reference(fails, what, served, ref, tp, pp):
    """Stage s's files for TP rank t hold the reference's tensors of rank t (bytes equal), each once; the
    stages together hold every one of them."""
    import torch
    raw = lambda x: x.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    for t in range(tp):
        want = tensors_of(sorted(os.path.join(ref, f) for f in os.listdir(ref)
                                 if f.startswith("model-rank-%d-part-" % t)))
        seen = set()
        for s in range(pp):
            got = tensors_of(stage_files(served, s, t))
            fails.check(got, "%s: stage %d TP rank %d has no part file" % (what, s, t))
            for k, xs in got.items():
                seen.add(k)
                fails.check(len(xs) == 1, "%s: stage %d TP rank %d holds %s in %d files" % (what, s, t, k, len(xs)))
                ref_t = want.get(k, [None])[0]
                fails.check(ref_t is not None and ref_t.dtype == xs[0].dtype and ref_t.shape == xs[0].shape
                            and torch.equal(raw(ref_t), raw(xs[0])),
                            "%s: stage %d TP rank %d %s differs from the reference's (or is not in it)" % (what, s, t, k))
        fails.check(seen == set(want), "%s TP rank %d: the stages leave out %s" % (what, t, sorted(set(want) - seen)[:4]))


def stages_of_plan(src, pp):
    import tpfs_test
    p = tpfs_test.tpfs("plan", src, "--tp", 1, "--view", "vllm", "--pp", pp)
    m = re.search(r"^stages:(.*)$", p.stdout, re.M)
    return p, [tuple(map(int, x)) for x in re.findall(r"layers \[(\d+), (\d+)\)", m.group(1))] if m else None


def check_partitions(fails, work):
    """tpfs's stages against vLLM's get_pp_indices."""
    from vllm.distributed.utils import get_pp_indices
    import vllm_models
    rows = []
    for n in range(2, 10):
        src = vllm_models.make("llama", os.path.join(work, "layers", str(n)), layers=n)
        for pp in (2, 3, 4):
            p, got = stages_of_plan(src, pp)
            if pp > n:
                fails.check(p.returncode != 0 and "would hold no layer" in p.stderr,
                            "--pp %d over %d layers: refused by name, not %r" % (pp, n, p.stderr[-200:]))
                continue
            want = [get_pp_indices(n, s, pp) for s in range(pp)]
            fails.check(got == want, "%d layers over %d stages: tpfs %s, vLLM %s" % (n, pp, got, want))
            rows.append("%d/%d %s" % (n, pp, "-".join(str(b - a) for a, b in want)))
    print("stages as vLLM divides them (layers/stages layers each): " + ", ".join(rows))


def refusals(fails, work):
    import tpfs_test
    import vllm_models
    cases = [("qwen2", [], "tied embeddings"),  # tied (vllm_models' qwen2): lm_head on the last stage, made of the first's
             ("mellum", [], "not for model_type 'mellum'"),  # the qwen3_moe view's stages are probed for qwen3_moe
             ("ernie4_5", [], "not for model_type 'ernie4_5'"),  # vLLM's Ernie4_5ForCausalLM has no SupportsPP
             ("llama", ["--pp-layers", "1,2"], "hold 3 layers where config.json has 2"),
             # quantized forms not probed at PP > 1 (FP8 block and compressed-tensors experts: vLLM's CPU kernels need
             # AMX; NVFP4 experts: not tried)
             ("qwen3_moe_fp8", [], "pipeline stages (--pp) of FP8 block-scaled views"),
             ("qwen3_moe_nvfp4", [], "pipeline stages (--pp) of NVFP4 experts"),
             ("qwen3_moe_ct_int8", [], "pipeline stages (--pp) of compressed-tensors experts")]
    for fam, extra, want in cases:
        src = vllm_models.make(fam, os.path.join(work, "refused", fam))
        p = tpfs_test.tpfs("plan", src, "--tp", 2, "--view", "vllm", "--pp", 2, *extra)
        fails.check(p.returncode != 0 and want in p.stderr, "%s --pp 2 %s: refused with %r, got %d %r"
                    % (fam, " ".join(extra), want, p.returncode, p.stderr[-300:]))
        print("refused: %-10s %s" % (fam, p.stderr.strip().splitlines()[-1][:200] if p.stderr.strip() else ""))
    for fam, ep, want in (("deepseek_v3", "round_robin", "falls back to linear placement"),
                          ("qwen3_moe", "round_robin", "proven for no model type of this view"),
                          ("qwen3_moe_ct_int8", "linear", "expert parallelism (--ep) of compressed-tensors")):
        src = vllm_models.make(fam, os.path.join(work, "refused", fam))
        p = tpfs_test.tpfs("plan", src, "--tp", 2, "--view", "vllm", "--ep=" + ep)
        fails.check(p.returncode != 0 and want in p.stderr, "%s --ep=%s: refused with %r, got %d %r"
                    % (fam, ep, want, p.returncode, p.stderr[-300:]))
        print("refused: %-10s --ep=%s: %s" % (fam, ep, p.stderr.strip().splitlines()[-1][:160]))
    # DP x EP (--dp) where it is not proven: the quantized DeepSeek-V3 and Qwen3-MoE views (they drop their parents'
    # "dp_ep"), DeepSeek-V2 (its view extends deepseek_v3's, which lists deepseek_v3 and kimi_k2)
    for fam, want in (("deepseek_v3_fp8", "proven for no model type of this view"),
                      ("qwen3_moe_fp8", "proven for no model type of this view"),
                      ("deepseek_v2", "not for model_type 'deepseek_v2'")):
        src = os.path.join(work, "refused", fam)
        if not os.path.isdir(src):
            vllm_models.make(fam, src)
        p = tpfs_test.tpfs("plan", src, "--tp", 2, "--view", "vllm", "--dp", 2, "--ep")
        fails.check(p.returncode != 0 and "--dp 2" in p.stderr and want in p.stderr,
                    "%s --dp 2 --ep: refused with %r, got %d %r" % (fam, want, p.returncode, p.stderr[-300:]))
        print("refused: %-10s --dp 2 --ep: %s" % (fam, p.stderr.strip().splitlines()[-1][:160]))
    p = tpfs_test.tpfs("plan", os.path.join(work, "refused", "llama"), "--tp", 2, "--pp", 2)
    fails.check(p.returncode == 2 and "under an engine view only" in p.stderr, "--pp without --view: %r" % p.stderr)


class ViewMount:
    def __init__(self, src, tp, pp, *extra):
        import tpfs_test
        self.m = tpfs_test.Mount(src, tp, "--view", "vllm", "--pp", pp, *extra)

    def __enter__(self):
        return self.m.__enter__().path

    def __exit__(self, et, ev, tb):
        return self.m.__exit__(et, ev, tb)


def probe(fails, work, stack):
    import tpfs_test
    import vllm_models
    import vllm_view_ref
    cases, srcs = [], {}
    plan = [(f, 1) for f in PP_FAMILIES] + [(f, 2) for f in PP_TP2]
    for fam, tp in plan:
        view, imp = PP_FAMILIES[fam]
        src = srcs[fam, tp] = vllm_models.make(fam, os.path.join(work, "src%d" % tp, fam), tp=max(tp, 2),
                                               layers=LAYERS.get(fam))
        ref = os.path.join(work, "ref%d" % tp, fam)
        vllm_view_ref.write(src, vllm_view_ref.load_view(os.path.join(VIEWS, view + ".json")), tp, ref)
        mnt = stack.enter_context(ViewMount(src, tp, 2))
        same_as_reference(fails, "%s TP=%d PP=2" % (fam, tp), mnt, ref, tp, 2)
        cases.append({"name": "%s/tp%d-pp2" % (fam, tp), "src": src, "served": mnt, "tp": tp, "pp": 2,
                      "impersonate": imp})
    # 3 layers: vLLM's division (2 | 1), and --pp-layers 1,2 with its VLLM_PP_LAYER_PARTITION
    src3 = vllm_models.make("llama", os.path.join(work, "src-l3"), layers=3)
    for name, extra, env in (("llama3/even", [], {}), ("llama3/1,2", ["--pp-layers", "1,2"],
                                                        {"VLLM_PP_LAYER_PARTITION": "1,2"})):
        mnt = stack.enter_context(ViewMount(src3, 1, 2, *extra))
        cases.append({"name": name, "src": src3, "served": mnt, "tp": 1, "pp": 2, "env": env})
    # expert parallelism: tpfs's --ep[=round_robin] placement against vLLM's
    for fam, view, placement, cfg, imp in EP_CASES:
        tag = fam + ("_groups" if cfg else "")
        src = srcs.get((tag, "ep")) or vllm_models.make(fam, os.path.join(work, "src-ep", tag), config=cfg)
        srcs[tag, "ep"] = src
        mnt = stack.enter_context(tpfs_test.Mount(src, 2, "--view", "vllm", "--ep=" + placement))
        cases.append({"name": "%s/ep-%s" % (tag, placement), "src": src, "served": mnt.path, "tp": 2,
                      "engine": {"enable_expert_parallel": True, "expert_placement_strategy": placement},
                      "impersonate": imp})
        if placement == "round_robin":  # the same files to a vLLM placing linearly: other experts, caught
            cases.append({"name": "%s/rr-as-linear" % tag, "src": src, "served": mnt.path, "tp": 2,
                          "engine": {"enable_expert_parallel": True, "expert_placement_strategy": "linear"}})
    # DP x EP: 5 experts over DP=2 x TP=2 = 4 EP ranks (vLLM's remainder rule: 2, 1, 1, 1), and the DP ranks'
    # files swapped (DP rank 0 reading DP rank 1's experts: other shapes, caught)
    src = vllm_models.make("qwen3_moe", os.path.join(work, "src-dpep"), config={"num_experts": 5})
    mnt = stack.enter_context(tpfs_test.Mount(src, 2, "--view", "vllm", "--dp", 2, "--ep"))
    cases.append({"name": "qwen3_moe/dp2-tp2-ep", "src": src, "served": mnt.path, "tp": 2, "dp": 2,
                  "engine": {"enable_expert_parallel": True}})
    swapped = os.path.join(work, "broken-dp")
    os.makedirs(swapped)
    for fn in os.listdir(mnt.path):
        to = fn.replace("model-dp-0-", "model-dp-X-").replace("model-dp-1-", "model-dp-0-").replace("model-dp-X-",
                                                                                                      "model-dp-1-")
        if not fn.startswith("."):
            shutil.copyfile(os.path.join(mnt.path, fn), os.path.join(swapped, to))
    cases.append({"name": "qwen3_moe/dp-swapped", "src": src, "served": swapped, "tp": 2, "dp": 2,
                  "engine": {"enable_expert_parallel": True}})
    cases.append({"name": "qwen3_moe/dp2-tp2-ep-plugin", "src": src, "tp": 2, "dp": 2, "loader": "tpfs",
                  "engine": {"enable_expert_parallel": True}})
    # DeepSeek-V3 under DP x EP: vLLM's MoE sequence-parallel (default all2all backend, T > 1, D > 1), the shared
    # experts whole on every rank (the view's rule), the dense layer's MLP and the attention still cut by TP rank;
    # 5 experts over 4 EP ranks
    src = vllm_models.make("deepseek_v3", os.path.join(work, "src-dpep-ds"), config={"n_routed_experts": 5})
    mnt = stack.enter_context(tpfs_test.Mount(src, 2, "--view", "vllm", "--dp", 2, "--ep"))
    cases.append({"name": "deepseek_v3/dp2-tp2-ep", "src": src, "served": mnt.path, "tp": 2, "dp": 2,
                  "engine": {"enable_expert_parallel": True}})
    plugin_run = os.path.join(work, "plugin-run")
    os.mkdir(plugin_run, 0o700)
    # broken: the final norm on stage 0 (vLLM: an extra key there, a missing one on stage 1)
    bad = os.path.join(work, "broken-pp")
    shutil.copytree(cases[0]["served"], bad)
    from safetensors.torch import load_file, save_file
    s0, s1 = stage_files(bad, 0, 0)[0], stage_files(bad, 1, 0)[0]
    a, b = load_file(s0), load_file(s1)
    a["model.norm.weight"] = b.pop("model.norm.weight")
    save_file(a, s0, metadata={"format": "pt"})
    save_file(b, s1, metadata={"format": "pt"})
    cases.append({"name": "llama/broken", "src": cases[0]["src"], "served": bad, "tp": 1, "pp": 2})
    with open(os.path.join(work, "cases.json"), "w") as f:
        json.dump(cases, f)
    with open(os.path.join(work, "probe.log"), "w") as lf:
        p = subprocess.run([sys.executable, os.path.join(HERE, "vllm_probe.py"), os.path.join(work, "cases.json"),
                            os.path.join(work, "probe.json")], stdout=lf, stderr=subprocess.STDOUT, timeout=1800,
                           env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", TPFS_RUNTIME_DIR=plugin_run,
                                    TPFS_VLLM_EARLY="0",
                                    PYTHONPATH=os.path.join(HERE, "..", "..", "python") + os.pathsep +
                                    os.environ.get("PYTHONPATH", ""),
                                    PATH=os.path.dirname(os.path.abspath(tpfs_test.TPFS)) + os.pathsep +
                                    os.environ.get("PATH", "")))
    left = lambda: [ln for ln in open("/proc/self/mountinfo") if " %s/" % plugin_run in ln]  # noqa: E731
    fails.check(wait_until(lambda: not left(), 30), "the plugin's DP x EP mounts left after the probe: %s" % left())
    fails.check(p.returncode == 0, "vllm_probe.py exited %d (log %s/probe.log)" % (p.returncode, work))
    with open(os.path.join(work, "probe.json")) as f:
        res = json.load(f)
    print("%-24s %-6s %s" % ("probe case (PP=2)", "result", "tensors per rank"))
    for c in cases:
        r = res.get(c["name"], {})
        ranks = r.get("ranks", {})
        counts = [ranks[k].get("tensors", 0) for k in sorted(ranks, key=int)]
        if c["name"].endswith("/rr-as-linear"):
            caught = not r.get("ok") and any(x.get("loaded") for x in ranks.values())
            print("%-24s %-6s" % (c["name"], "caught" if caught else "MISSED"))
            fails.check(caught, "%s: round-robin files loaded by a linear vLLM must differ" % c["name"])
            continue
        if c["name"] == "qwen3_moe/dp2-tp2-ep-plugin":  # each DP rank's workers on one mount, its own
            mounts = [ranks.get(str(g), {}).get("served") for g in range(4)]
            fails.check(all(mounts) and mounts[0] == mounts[1] and mounts[2] == mounts[3] and mounts[0] != mounts[2],
                        "the plugin under DP x EP: one mount a DP rank, %s" % mounts)
        if c["name"] == "deepseek_v3/dp2-tp2-ep":  # the premise: vLLM built the MoE sequence-parallel
            sp = [ranks.get(str(g), {}).get("sequence_parallel_moe") for g in range(4)]
            fails.check(sp == [True] * 4, "deepseek_v3 under DP x EP: vLLM's MoE sequence-parallel on every rank: %s" % sp)
        if c["name"] == "qwen3_moe/dp-swapped":
            caught = not r.get("ok") and any(x.get("keys") for x in ranks.values())
            print("%-24s %-6s" % (c["name"], "caught" if caught else "MISSED"))
            fails.check(caught, "DP ranks reading each other's files must fail the probe: %s" % r)
            continue
        if c["name"] == "llama/broken":
            errs = " ".join(x.get("error") or "" for x in ranks.values())
            caught = not r.get("ok") and "KeyError" in errs and "Missing keys" in errs
            print("%-24s %-6s" % (c["name"], "caught" if caught else "MISSED"))
            fails.check(caught, "a stage file holding another stage's key must fail the probe: %s" % errs[-300:])
            continue
        probs = {k: v for x in ranks.values() for k, v in x.items() if k in ("keys", "loaded", "processed") and v}
        print("%-24s %-6s %s %s" % (c["name"], "ok" if r.get("ok") else "FAIL", counts, str(probs)[:200]))
        fails.check(r.get("ok") and all(counts), "%s: the probe found %s %s" % (
            c["name"], probs, [(x.get("error") or "")[-300:] for x in ranks.values() if x.get("error")]))


# ---- two nodes ----

NODE = r'''
mnt=$1; shift
"$TPFS" mount "$SRC" "$mnt" $TPFS_ARGS -f 2> "$OUT.tpfs.log" &
tpid=$!
for i in $(seq 300); do [ -e "$mnt/config.json" ] && break; sleep 0.1; done
ls "$mnt" > "$OUT.ls"
"$PY" "$SERVE" "$mnt" "$@" > "$OUT.vllm.log" 2>&1 &
echo $! > "$OUT.pid"
wait $!
echo "exit $?" >> "$OUT.vllm.log"
cp "$mnt/.tpfs-stats" "$OUT.stats"
fusermount3 -u "$mnt" || fusermount3 -u -z "$mnt"
wait $tpid
'''

# a node of the plugin's run: vLLM alone (`vllm serve SRC --load-format tpfs ...`), its workers mounting the node's
# ranks themselves (tpfs.node, in this namespace, under the node's runtime folder); once vLLM has exited, the
# node's mounts still there after 30 s
NODE_PLUGIN = r'''
"$PY" "$SERVE" "$SRC" "$@" > "$OUT.vllm.log" 2>&1 &
echo $! > "$OUT.pid"
wait $!
echo "exit $?" >> "$OUT.vllm.log"
for i in $(seq 300); do grep -q " $TPFS_RUNTIME_DIR/" /proc/self/mountinfo || break; sleep 0.1; done
grep " $TPFS_RUNTIME_DIR/" /proc/self/mountinfo > "$OUT.left"
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_args(split, port, http_port, nodes, rank):
    """vllm serve's options for SPLIT ("tp2" or "pp2") over NODES nodes, for node RANK."""
    a = ["--dtype", "bfloat16", "--skip-tokenizer-init", "--max-model-len", "256", "--max-num-seqs", "4", "--seed",
         "0", "--distributed-executor-backend", "mp"]
    if split == "tp2":
        a += ["--tensor-parallel-size", "2", "--enforce-eager"]
    else:  # PP on CPU: eager mode skips the warm-up that allocates the intermediate tensors (issue 32)
        a += ["--tensor-parallel-size", "1", "--pipeline-parallel-size", "2",
              "--compilation-config", '{"mode": 2, "backend": "eager"}']
    if nodes == 2:
        a += ["--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    if rank == 0:
        a += ["--host", "127.0.0.1", "--port", str(http_port), "--served-model-name", "m"]
    else:
        a += ["--headless"]
    return a


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def plugin_site(work):
    """A folder that, on PYTHONPATH, makes this checkout's tpfs package (python/tpfs) an installed distribution
    with the vllm.general_plugins entry point pyproject.toml declares (what `pip install .` installs), and a
    folder holding `tpfs`, the program under test, for PATH (tpfs.binary() finds it there). Returns (site, bin)."""
    import tpfs_test
    site, bindir = os.path.join(work, "plugin-site"), os.path.join(work, "plugin-bin")
    if not os.path.isdir(site):
        info = os.path.join(site, "tpfs-0.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: tpfs\nVersion: 0\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write("[vllm.general_plugins]\ntpfs = tpfs.vllm_plugin:register\n")
        os.symlink(os.path.join(HERE, "..", "..", "python", "tpfs"), os.path.join(site, "tpfs"))
        os.makedirs(bindir)
        os.symlink(os.path.abspath(tpfs_test.TPFS), os.path.join(bindir, "tpfs"))
    return site, bindir


def in_node(pid, *cmd):
    """CMD's output in the mount namespace of process PID (nsenter -m), "" where it fails."""
    p = subprocess.run(["nsenter", "-t", str(pid), "-m", "--"] + list(cmd), capture_output=True, text=True, timeout=30)
    return p.stdout if p.returncode == 0 else ""


def plugin_snapshot(pid, run, runs):
    """What the node of process PID shows while vLLM serves: its tpfs mounts under its runtime folder RUN
    (mountinfo lines), any mount under the other nodes' folders (of RUNS), and for the first of its own, its
    listing, its .tpfs-stats and its daemon's command line."""
    info = in_node(pid, "cat", "/proc/self/mountinfo").splitlines()
    snap = {"mounts": [ln for ln in info if " fuse.tpfs " in ln and ln.split()[4].startswith(run + "/")],
            "others": [ln for ln in info for o in runs if o != run and ln.split()[4].startswith(o + "/")],
            "ls": [], "stats_text": "", "daemon": []}
    if snap["mounts"]:
        mnt = snap["mounts"][0].split()[4]
        snap["mnt"] = mnt
        snap["ls"] = in_node(pid, "ls", mnt).split()
        snap["stats_text"] = in_node(pid, "cat", os.path.join(mnt, ".tpfs-stats"))
        snap["daemon"] = [" ".join(a.decode() for a in args) for args in cmdlines_with(mnt) if b"mount" in args]
    return snap


def cmdlines_with(word):
    """The argument lists (bytes) of the processes one of whose arguments is WORD."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    args = f.read().split(b"\0")
                if any(word.encode() in a for a in args):
                    out.append([a for a in args if a])
    return out


def stats_of(text):
    """{rank: {"served", "source"}} of a .tpfs-stats text."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 6 and f[0].isdigit():
            out[int(f[0])] = {"served": int(f[1]), "source": int(f[2])}
    return out


def run_split(work, src, split, mode):
    """One vLLM run of SPLIT. MODE "default": on one node with the default loader on SRC; "manual": across two
    nodes (mount namespaces), each `tpfs mount ... --ranks R` then `serve MNT --load-format sharded_state`;
    "plugin": across two nodes, each `serve SRC --load-format tpfs` alone (the plugin from this checkout, a
    runtime folder per node). Returns {"tokens", "logprobs", "nodes": [{"ls", "stats"}] (manual),
    "snaps": [plugin_snapshot per node] and "left": [mountinfo lines left per node] (plugin), "error", "seconds"}."""
    import tpfs_test
    two_nodes = mode != "default"
    tag = "%s-%s" % (split, {"default": "1node", "manual": "2nodes", "plugin": "plugin"}[mode])
    port, http = free_port(), free_port()
    mnt = os.path.join(work, "mnt-" + split)  # the same path on both nodes
    os.makedirs(mnt, exist_ok=True)
    procs, outs, runs = [], [], []
    t0 = time.time()
    res = {"error": None}
    nodes = 2 if two_nodes else 1
    for r in range(nodes):
        out = os.path.join(work, "%s-node%d" % (tag, r))
        outs.append(out)
        args = serve_args(split, port, http, nodes, r)
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=str(r) if two_nodes else "0|1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_HOST_IP="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OUT=out, SRC=src, PY=sys.executable, TPFS=tpfs_test.TPFS,
                   SERVE=os.path.join(HERE, "vllm_serve.py"))
        if mode == "manual":
            pp = split == "pp2"
            env["TPFS_ARGS"] = "--tp %d --pp %d --view vllm --ranks %d" % (1 if pp else 2, 2 if pp else 1, r)
            cmd = ["unshare", "-m", "--propagation", "private", "bash", "-c", NODE, "node", mnt] + \
                args + ["--load-format", "sharded_state"]
        elif mode == "plugin":
            site, bindir = plugin_site(work)
            run = os.path.join(work, "run-%s-node%d" % (split, r))  # each node's own runtime folder
            os.mkdir(run, 0o700)
            runs.append(run)
            env.update(TPFS_RUNTIME_DIR=run, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
                       PYTHONPATH=os.pathsep.join([site] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
            cmd = ["unshare", "-m", "--propagation", "private", "bash", "-c", NODE_PLUGIN, "node"] + \
                args + ["--load-format", "tpfs"]
        else:
            cmd = [sys.executable, os.path.join(HERE, "vllm_serve.py"), src] + args + ["--load-format", "auto"]
        with open(out + ".out", "w") as lf:
            procs.append(subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True))
    url = "http://127.0.0.1:%d" % http
    try:
        deadline = time.time() + 400
        while True:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a node ended before vLLM served (logs %s.*)" % outs[0])
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            if time.time() > deadline:
                raise RuntimeError("vLLM did not serve within 400 s (logs %s.*)" % outs[0])
            time.sleep(1)
        res["start_s"] = time.time() - t0
        got = [tpfs_test.vllm_complete(url, pr) for pr in PROMPTS]
        res["tokens"], res["logprobs"] = [g[0] for g in got], [g[1] for g in got]
        if mode == "plugin":  # each node's mounts, while it serves (unshare execs bash: procs are in the namespaces)
            res["snaps"] = [plugin_snapshot(p.pid, run, runs) for p, run in zip(procs, runs)]
    except Exception as e:  # noqa: BLE001 -- the run's result
        res["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        # SIGTERM to vLLM on every node (node 1's headless worker does not end when node 0's server does)
        for r, p in enumerate(procs):
            pidf = outs[r] + ".pid"
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                os.kill(int(open(pidf).read()) if two_nodes else p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                res["error"] = (res["error"] or "") + " (a node did not end within 90 s of SIGTERM)"
        for p in procs:  # every process of each node's session ends (vLLM's workers shortly after its server)
            end = time.time() + 60
            while time.time() < end and group_alive(p.pid):
                time.sleep(0.5)
            if group_alive(p.pid):
                res["error"] = (res["error"] or "") + " (processes of a node outlived it by 60 s)"
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
    res["seconds"] = time.time() - t0
    res["nodes"], res["left"] = [], []
    for out in outs if mode == "manual" else []:
        node = {"ls": [], "stats": {}}
        with contextlib.suppress(OSError):
            node["ls"] = open(out + ".ls").read().split()
        with contextlib.suppress(OSError):
            node["stats"] = stats_of(open(out + ".stats").read())
        res["nodes"].append(node)
    for out in outs if mode == "plugin" else []:
        try:
            res["left"].append(open(out + ".left").read().splitlines())
        except OSError:
            res["left"].append(["(%s.left not written)" % out])
        with contextlib.suppress(OSError):
            res.setdefault("logs", []).append(open(out + ".vllm.log", errors="replace").read())
    # every tpfs daemon and reaper of the plugin's nodes gone (both leave their session: not in the node's group)
    if runs and not wait_until(lambda: not any(cmdlines_with(run) for run in runs), 30):
        res["error"] = (res["error"] or "") + " (processes of the nodes' mounts outlived them by 30 s: %s)" % \
            [b" ".join(a).decode() for run in runs for a in cmdlines_with(run)]
    return res


def io_runs(src, split, r):
    """`tpfs plan --io --ranks R`: the source bytes rank r's part files are cut from."""
    import tpfs_test
    pp = split == "pp2"
    p = tpfs_test.tpfs("plan", src, "--tp", 1 if pp else 2, "--view", "vllm", *(["--pp", 2] if pp else []), "--io",
                       "--ranks", r, check=True)
    return int(re.search(r"^served\s+\d+\s+(\d+)", p.stdout, re.M).group(1))


def check_node(fails, what, split, src, r, parts, stats):
    """Node r of a two-node run of SPLIT saw only its own rank's part files (PARTS: the names listed), its stats
    list only its rank, and it read the source bytes `tpfs plan --io --ranks r` computes (push-ahead reads the runs
    once; a page the loader then reads through the daemon, the kernel having dropped it or read it before the push
    came, is read again: at most what the demand reads served). Returns "r: N B"."""
    parts = [f for f in parts if f.endswith(".safetensors")]
    want = ["model-rank-%d-part-0.safetensors" % r] if split == "tp2" else ["model-pp-%d-tp-0-part-0.safetensors" % r]
    fails.check(parts == want, "%s node %d saw part files %s, not only its own %s" % (what, r, parts, want))
    fails.check(sorted(stats) == [r], "%s node %d's stats list ranks %s" % (what, r, sorted(stats)))
    got = stats.get(r, {}).get("source", -1)
    demand = stats.get(r, {}).get("served", 0)
    runs = io_runs(src, split, r)
    fails.check(runs <= got <= runs + demand, "%s node %d read %d source bytes; its ranks' runs are %d, its "
                "demand reads served %d bytes" % (what, r, got, runs, demand))
    return "%d: %d B" % (r, got)


def check_plugin(fails, work, split, src, two):
    """The plugin's two-node run: each node made exactly one mount, in its own runtime folder, by `tpfs mount SRC
    MNT --tp T --view vllm [--pp P] --ranks r` (its daemon's command line; the plugin's log line says so too),
    which held only rank r's files and read only rank r's source bytes (check_node), the other node's mount not
    in its namespace; none was left on either node once vLLM exited. Writes each node's mount (daemon command line, mountinfo line, the plugin's log lines) to
    WORK/SPLIT-plugin-nodeR.mount and prints it. Returns check_node's texts."""
    per = []
    tp, pp = (1, 2) if split == "pp2" else (2, 1)
    snaps, logs = two.get("snaps") or [], two.get("logs") or []
    fails.check(len(snaps) == 2 and len(logs) == 2, "%s plugin: %d node snapshots, %d logs" % (split, len(snaps), len(logs)))
    for r, snap in enumerate(snaps):
        what = "%s plugin" % split
        fails.check(len(snap["mounts"]) == 1, "%s node %d: tpfs mounts %s (one wanted)" % (what, r, snap["mounts"]))
        fails.check(snap["others"] == [], "%s node %d sees the other node's mounts: %s" % (what, r, snap["others"]))
        # the plugin's default (tpfs.node.engine_args): the push's copies served by passthrough
        want = "mount %s %s --tp %d --view vllm%s --ranks %d --passthrough on" % (
            os.path.realpath(src), snap.get("mnt"), tp, " --pp %d" % pp if pp > 1 else "", r)
        fails.check(len(snap["daemon"]) == 1 and snap["daemon"][0].endswith(want),
                    "%s node %d: the mount's daemon runs %s, not ...%s" % (what, r, snap["daemon"], want))
        log = logs[r] if r < len(logs) else ""
        lines = [ln for ln in log.splitlines() if "tpfs: rank" in ln]
        fails.check(len(lines) == 1 and re.search(r"tpfs: rank %d reads %s, the mount of \S+ for ranks %d of TP=%d "
                                                  r"PP=%d" % (r, re.escape(snap.get("mnt") or "?"), r, tp, pp), lines[0]),
                    "%s node %d: the plugin's log lines %s" % (what, r, lines))
        # the mount made early, by the node's vLLM main process (`serve`, and `serve --headless` on node 1), before
        # the engine core or the workers start (tpfs.vllm_plugin._wrap_engine_config)
        early = [ln for ln in log.splitlines() if "from vLLM's main process" in ln]
        fails.check(len(early) == 1 and "for ranks %d of TP=%d PP=%d at %s" % (r, tp, pp, snap.get("mnt")) in early[0],
                    "%s node %d: no log line of the mount made by vLLM's main process: %s" % (what, r, early))
        lines = early + lines
        per.append(check_node(fails, what, split, src, r, snap["ls"], stats_of(snap["stats_text"])))
        fails.check(two["left"][r] == [], "%s node %d: mounts left after vLLM exited: %s" % (what, r, two["left"][r]))
        text = "node %d daemon: %s\nnode %d mountinfo: %s\n%s\n" % (
            r, " ".join(snap["daemon"]), r, " ".join(snap["mounts"]), "\n".join("node %d vLLM: %s" % (r, ln.strip())
                                                                                   for ln in lines))
        with open(os.path.join(work, "%s-plugin-node%d.mount" % (split, r)), "w") as f:
            f.write(text)
        print(text, end="")
    return per


def two_nodes(fails, work, manual=True, plugin=True):
    """4. For each split: the default loader on one node, then across two nodes the manual two commands (MANUAL)
    and the plugin (PLUGIN, the splits of TPFS_NODES_PLUGIN, default tp2), each compared to it."""
    import tpfs_test
    import vllm_models
    src = vllm_models.make("llama", os.path.join(work, "nodes-src"))
    plugin_splits = (os.environ.get("TPFS_NODES_PLUGIN") or "tp2").split(",") if plugin else []
    print("%-12s %-8s %-13s %-15s %-40s %s" % ("split", "nodes", "tokens equal", "logprobs equal", "bytes read per node",
                                              "start / total s"))
    for split in ("tp2", "pp2"):
        modes = (["manual"] if manual else []) + (["plugin"] if split in plugin_splits else [])
        if not modes:
            continue
        base = run_split(work, src, split, "default")
        fails.check(not base["error"] and base.get("tokens"), "%s on one node (default loader): %s"
                    % (split, base["error"]))
        for mode in modes:
            what = "%s %s" % (split, mode)
            two = run_split(work, src, split, mode)
            fails.check(not two["error"] and two.get("tokens"), "%s across two nodes: %s" % (what, two["error"]))
            tok = base.get("tokens") == two.get("tokens") and base.get("tokens") is not None
            lp = base.get("logprobs") == two.get("logprobs") and base.get("logprobs") is not None
            fails.check(tok, "%s: two nodes' tokens %s, one node's %s" % (what, two.get("tokens"), base.get("tokens")))
            fails.check(lp, "%s: two nodes' logprobs differ from one node's" % what)
            if mode == "manual":
                per = [check_node(fails, what, split, src, r, node["ls"], node["stats"])
                       for r, node in enumerate(two["nodes"])]
            else:
                per = check_plugin(fails, work, split, src, two)
            print("%-12s %-8s %-13s %-15s %-40s %.0f / %.0f (one node %.0f / %.0f)" % (
                "%s %s" % (split, mode), "2", tok, lp, ", ".join(per), two.get("start_s", 0), two["seconds"],
                base.get("start_s", 0), base["seconds"]), flush=True)
    left = [m for m in tpfs_test.mountpoints() if m.startswith(work)]
    fails.check(not left, "mounts left: %s" % left)


def main():
    import tpfs_test
    fails = tpfs_test.Failures()
    tpfs_test.require_fuse()
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="tpfs-nodes-")
    times = {}
    parts = (os.environ.get("TPFS_NODES_PARTS") or "stages,probe,nodes,plugin").split(",")  # for a rerun of one part
    if "stages" in parts:
        check_partitions(fails, work)
        refusals(fails, work)
        times["stages + refusals"] = time.time() - t0
    t1 = time.time()
    if "probe" in parts:
        with contextlib.ExitStack() as stack:
            probe(fails, work, stack)
        times["probe"] = time.time() - t1
    if TOKENS_MODE != "none" and ("nodes" in parts or "plugin" in parts):
        t1 = time.time()
        two_nodes(fails, work, "nodes" in parts, "plugin" in parts)
        times["two nodes (vLLM runs)"] = time.time() - t1
    tpfs_test.finish(fails, "vllm_nodes", work, times, t0)


if __name__ == "__main__":
    import tpfs_test
    tpfs_test.reexec(tpfs_test.vllm_python, "TPFS_VLLM_INNER", __file__)
    sys.path.insert(0, HERE)
    main()
