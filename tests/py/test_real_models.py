"""Real model code: every built-in plan proven against the real model code of transformers.

For every family of realmodel.FAMILIES: a tiny random checkpoint written by transformers'
save_pretrained (several files and an index) is mounted at T = 2 and 4 (and 3 where uneven heads
are allowed); each rank's folder is loaded strictly (no missing, unexpected or mismatched tensor)
into a local-size model of the same class built from that rank's counts (computed by realmodel
from the rules, not by tpfs); one process per rank runs the tensor-parallel forward over
torch.distributed (gloo, CPU) and the logits must equal the unsplit model's to 1e-5 relative (for a
tower without a head, realmodel's `output` for the family: its last hidden state, every rank's whole).
Then, at T = 2, rank 0's halves of one head-carrying tensor are swapped: the same check must fail.

Workers are spawned once per T and loop over the families (torch's import dominates the cost).
Usage: test_real_models.py [FAMILY...]   (internal: --worker T RANK JOBS OUT)
TPFS_REAL_FAMILIES=a,b: those families only, with the seeds and the refusals (the sanitized build: what it
adds is the daemon under ASan/UBSan, which a dozen families' reads exercise as well as all of them).
"""
import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import realmodel as RM

TOL = 1e-5  # the unsplit logits, relative to their largest magnitude; a wrong split must miss it
# mounts (daemons) at once: each daemon takes an inotify instance to watch its sources, and Linux allows 128 a
# user by default (fs.inotify.max_user_instances); past it a daemon warns that it cannot watch, which fails the
# test. More families than this at one T are run in balanced chunks, each with its own T workers.
MAX_MOUNTS = 100


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max())


def worker(T, r, jobs_path, out_path):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    with open(jobs_path) as f:
        jobs = json.load(f)
    dist.init_process_group("gloo", init_method="file://" + jobs_path + ".rdzv", rank=r, world_size=T,
                            timeout=datetime.timedelta(seconds=300))
    ids = RM.input_ids()
    results = {}
    for job in jobs:
        fam = RM.FAMILIES[job["family"]]
        res = {}
        t0 = time.time()
        try:
            with open(os.path.join(job["src"], "config.json")) as f:
                cfg = json.load(f)
            model = RM.load(fam, os.path.join(job["mnt"], "rank%d" % r), RM.local_config(fam, cfg, T, r))
            RM.tp_patch(fam, model, T, r)
            ok = 1
        except Exception as e:  # reported by rank 0 once every rank knows
            res["error"] = "rank %d: %s: %s" % (r, type(e).__name__, str(e)[:2000])
            ok = 0
        flag = torch.tensor([ok])
        dist.all_reduce(flag)
        if int(flag) == T:
            ref = torch.load(job["ref"])
            with torch.no_grad():
                res["err"] = rel_err(RM.logits(fam, model, ids), ref)
                if job["wrong"]:
                    names = [n for n in model.state_dict() if re.search(fam["wrong"], n)]
                    assert len(names) == 1, (fam["wrong"], names)
                    res["wrong_tensor"] = names[0]
                    if r == 0:
                        p = model.state_dict()[names[0]]
                        a, b = p.chunk(2, dim=fam["wrong_dim"])
                        p.copy_(torch.cat([b, a], dim=fam["wrong_dim"]))
                    res["wrong_err"] = rel_err(RM.logits(fam, model, ids), ref)
        elif "error" not in res:
            res["error"] = "another rank failed to load"
        res["seconds"] = round(time.time() - t0, 2)
        results[job["family"]] = res
    with open(out_path + ".%d" % r, "w") as f:
        json.dump(results, f)
    # Tearing the gloo group down at exit sometimes aborts ("terminate called without an active
    # exception") after all the work is done: wait for every rank, then leave at once.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def read_dir(path):
    """{name: array} of a checkpoint folder, through its index (numpy)."""
    from safetensors import safe_open
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    out = {}
    for fn in sorted(set(wm.values())):
        with safe_open(os.path.join(path, fn), framework="np") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
    return out


def check_mtp(name, src, mnt, T, F):
    """The MTP layer (transformers does not run it) byte for byte: each rank's copy of a decoder tensor
    equals that rank's tensor of the layer it copies (proven by the forward), the vocabulary tensors are
    the rank's rows, eh_proj and the norms whole."""
    import numpy as np
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    pre = RM.mtp_prefix(cfg)
    n = RM.text_of(cfg)["num_hidden_layers"]
    last = pre.replace("layers.%d." % n, "layers.%d." % (n - 1))
    full = read_dir(src)
    mtp = [k for k in full if k.startswith(pre)]
    for r in range(T):
        loc = read_dir(os.path.join(mnt, "rank%d" % r))
        bad = []
        for k in mtp:
            sfx = k[len(pre):]
            if last + sfx in full:
                want = loc[last + sfx]
            elif sfx in ("shared_head.head.weight", "embed_tokens.weight"):
                V = full[k].shape[0]
                want = full[k][r * V // T:(r + 1) * V // T]
            else:
                want = full[k]
            if k not in loc or loc[k].shape != want.shape or not np.array_equal(loc[k], want):
                bad.append(k)
        F.check(not bad and len(mtp) > 10, "%s T=%d rank %d: MTP layer %s (%d tensors) split like the layer it copies: %s"
                % (name, T, r, pre, len(mtp), bad[:5]))


def seeds_glm53(tmp, F):
    """The seeds' byte counts on one header-only GLM-5.3-Flash KDA layer whose names, shapes and config.json
    come from transformers' glm5_next code (a meta-device model at the seeds' geometry, its state dict
    turned back into the checkpoint's names as save_pretrained does): D 4096, 64 heads x 128, conv 4,
    gate rank 128. BF16 but A_log and dt_bias (F32), as the seeds measured."""
    import struct
    import torch
    import transformers
    import tpfs_test as tt
    from transformers.core_model_loading import revert_weight_conversion
    tc = dict(vocab_size=64, hidden_size=4096, intermediate_size=128, num_hidden_layers=1, num_attention_heads=64,
              num_key_value_heads=64, linear_num_heads=64, linear_head_dim=128, linear_conv_kernel_dim=4,
              layer_types=["linear_attention"], mlp_layer_types=["dense"], pad_token_id=0)
    cfg = transformers.Glm5NextConfig(text_config=tc, vision_config=dict(
        depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=4096, projection_intermediate_size=64))
    with torch.device("meta"):
        model = transformers.Glm5NextForConditionalGeneration(cfg)
    sd = revert_weight_conversion(model, model.state_dict())
    layer = "model.language_model.layers.0.self_attn."
    shapes = {k: ("F32" if k.endswith(("A_log", "dt_bias")) else "BF16", list(v.shape))
              for k, v in sd.items() if k.startswith(layer)}
    F.check(len(shapes) == 15 and layer + "q_conv1d.weight" in shapes and layer + "dt_bias" in shapes,
            "glm5_next's KDA layer is 15 tensors on disk, separate q/k/v convs, dt_bias and A_log under self_attn: %s"
            % sorted(shapes))
    geo = os.path.join(tmp, "glm53-seeds")
    cfg.save_pretrained(geo)
    hdr, off = tt.write_header_only(os.path.join(geo, "model.safetensors"), shapes)
    F.check(off == 275481088, "one GLM-5.3-Flash KDA layer is 275,481,088 bytes in BF16 (got %d)" % off)
    with tt.Mount(geo, 2) as m:
        for r in range(2):
            lh = tt.read_header(os.path.join(m.rank(r), "model.safetensors"))[1]
            local_b = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in lh.values())
            repl = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in lh.items() if v["shape"] == hdr[k]["shape"])
            F.check(local_b == 138789248, "GLM-5.3 KDA at T=2, rank %d keeps 138,789,248 bytes (got %d)" % (r, local_b))
            F.check(repl == 2097408, "of which 2,097,408 replicated (got %d)" % repl)
            F.check(lh[layer + "A_log"]["shape"] == [32] and lh[layer + "dt_bias"]["shape"] == [4096],
                    "A_log per head [32], dt_bias per channel [4096]: %s %s"
                    % (lh[layer + "A_log"]["shape"], lh[layer + "dt_bias"]["shape"]))
    print("seeds' GLM-5.3 KDA byte counts hold with glm5_next's names and config", flush=True)


def refusals(tmp, F):
    """No silent guesses, on checkpoints written by transformers: an architecture without a built-in plan
    (GPT-NeoX) is refused before mounting with the message naming model_type, the built-ins and the two
    ways on; under --plan generic every tensor whose layout a name cannot tell is refused by name, with
    the rule's reason: GPT-NeoX's fused query_key_value, Phi-3's qkv_proj and gate_up_proj, gpt-oss's 3-D
    experts and per-head sinks, Llama 4's 3-D experts."""
    import torch
    import transformers
    import tpfs_test as tt
    neox = os.path.join(tmp, "gpt_neox")
    torch.manual_seed(0)
    transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=RM.V, hidden_size=RM.D, num_hidden_layers=1, num_attention_heads=4, intermediate_size=RM.I,
        max_position_embeddings=64)).save_pretrained(neox, max_shard_size="64KB")
    # GPT-NeoX was examined and is not served (docs/ARCHITECTURES.md): refused with the reason found in its model code
    def refused_as_examined(err):
        return (err.startswith("tpfs: no built-in plan knows model_type 'gpt_neox', a family whose model code tpfs "
                               "has read and does not serve") and "query_key_value" in err and err.count("\n") == 1)
    p = tt.tpfs("plan", neox, "--tp", 2)
    F.check(p.returncode == 1 and refused_as_examined(p.stderr) and not p.stdout,
            "gpt_neox is refused by tpfs plan: %r" % p.stderr)
    want = p.stderr
    mnt = tempfile.mkdtemp(prefix="tpfs-real-mnt-")
    p = subprocess.run([tt.TPFS, "mount", neox, mnt, "--tp", "2", "-f"], capture_output=True, text=True, timeout=120)
    F.check(p.returncode == 1 and p.stderr == want and not tt.is_mounted(mnt), "and by tpfs mount: %r" % p.stderr)
    os.rmdir(mnt)

    reasons = {
        "fused_projection": "a fused projection: where its [q|k|v] or [gate|up] blocks lie (and whether they are "
                            "interleaved) is not in its name, so the generic rules cannot cut it next to its split "
                            "partners; give a plan that splits it per segment (--plan FILE)",
        "fused_experts": "a 3-D experts tensor [E, ...]: which axis is the expert's intermediate size is not in its "
                         "name; give a plan that names the axis (--plan FILE)",
        "per_head_vector": "a per-head vector: it must be cut with the heads, which the generic rules cannot tie it "
                           "to; give a plan that splits it with the heads (--plan FILE)"}
    cases = {"gpt_neox": {r"\.attention\.query_key_value\.": "fused_projection"},
             "phi3": {r"\.qkv_proj\.": "fused_projection", r"\.gate_up_proj\.": "fused_projection"},
             "gpt_oss": {r"\.experts\.": "fused_experts", r"\.sinks$": "per_head_vector"},
             "llama4": {r"\.experts\.": "fused_experts"}}
    for name, pats in cases.items():
        src = os.path.join(tmp, name)
        if not os.path.isdir(src):
            RM.build(name, src)
        with open(os.path.join(src, "model.safetensors.index.json")) as f:
            wm = json.load(f)["weight_map"]
        want = sorted("tpfs: error: %s: tensor '%s' (rule '%s'): refused by plan 'generic': %s"
                      % (wm[k], k, rule, reasons[rule]) for k in wm for pat, rule in pats.items() if re.search(pat, k))
        p = tt.tpfs("plan", src, "--tp", 2, "--plan", "generic")
        got = sorted(l for l in p.stderr.splitlines() if "refused by plan" in l)
        F.check(p.returncode == 1 and want and got == want,
                "%s under --plan generic: %d tensors refused by name, exactly as expected (%d): %s"
                % (name, len(got), len(want), "\n".join(sorted(set(got) ^ set(want)))[:3000]))
        mnt = tempfile.mkdtemp(prefix="tpfs-real-mnt-")
        p = subprocess.run([tt.TPFS, "mount", src, mnt, "--tp", "2", "-f", "--plan", "generic"], capture_output=True,
                           text=True, timeout=120)
        # the first tensor it cannot serve ends the mount: a fused one, or one no generic rule names
        # (gpt_neox's embed_in), refused by name as well
        F.check(p.returncode == 1 and not tt.is_mounted(mnt) and ("refused by plan 'generic'" in p.stderr or
                                                                  "no rule of plan 'generic' matches it" in p.stderr),
                "%s: tpfs mount --plan generic refuses before mounting: %s" % (name, p.stderr[-500:]))
        os.rmdir(mnt)
    print("refusals checked", flush=True)


def main(only):
    import torch
    import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    import tpfs_test as tt
    tt.require_fuse()
    fams = [f for f in RM.FAMILIES if not only or f in only]
    subset = [f for f in (os.environ.get("TPFS_REAL_FAMILIES") or "").split(",") if f]
    if subset:  # the sanitized build: a few families (the seeds and refusals still run)
        unknown = sorted(set(subset) - set(RM.FAMILIES))
        if unknown:
            sys.exit("TPFS_REAL_FAMILIES names no family of realmodel.py: %s" % unknown)
        fams = [f for f in fams if f in subset]
    F = tt.Failures()
    table = {}
    with tempfile.TemporaryDirectory(prefix="tpfs-real-") as tmp:
        if not only:
            seeds_glm53(tmp, F)
            refusals(tmp, F)
        t0 = time.time()
        for name in fams:
            fam = RM.FAMILIES[name]
            src = os.path.join(tmp, name)
            cfg = RM.build(name, src)
            p = tt.tpfs("plan", src, "--tp", 2, "--strict")  # every tensor named by a rule of the detected plan
            F.check(p.returncode == 0 and "unmatched tensors (refused): 0" in p.stdout,
                    "%s: every tensor is matched by a rule (--strict): %s" % (name, p.stderr[-1500:]))
            model = RM.load(fam, src, cfg)
            with torch.no_grad():
                torch.save(RM.logits(fam, model, RM.input_ids()), os.path.join(tmp, name + ".ref.pt"))
        print("built %d tiny models in %.1f s" % (len(fams), time.time() - t0), flush=True)
        for T in (2, 3, 4):
            at_t = [f for f in fams if T in RM.FAMILIES[f]["ts"]]
            if not at_t:
                continue
            t1 = time.time()
            res, refused = {}, set()
            n_chunks = -(-len(at_t) // MAX_MOUNTS)
            size = -(-len(at_t) // n_chunks)
            for c0 in range(0, len(at_t), size):  # at most MAX_MOUNTS daemons at once (see MAX_MOUNTS)
                with contextlib.ExitStack() as stack:
                    jobs = []
                    for name in at_t[c0:c0 + size]:
                        try:
                            m = stack.enter_context(tt.Mount(os.path.join(tmp, name), T))
                        except AssertionError as e:
                            F.check(False, "%s T=%d: %s" % (name, T, str(e)[:1500]))
                            table[(name, T)] = "REFUSED"
                            refused.add(name)
                            continue
                        jobs.append(dict(family=name, src=os.path.join(tmp, name), mnt=m.path,
                                         ref=os.path.join(tmp, name + ".ref.pt"), wrong=T == 2))
                    jp = os.path.join(tmp, "jobs%d-%d.json" % (T, c0))
                    with open(jp, "w") as f:
                        json.dump(jobs, f)
                    out = os.path.join(tmp, "out%d-%d" % (T, c0))
                    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(T), str(r), jp,
                                               out], stderr=subprocess.PIPE, text=True) for r in range(T)]
                    errs = []
                    for p in procs:
                        try:
                            errs.append(p.communicate(timeout=900)[1])
                        except subprocess.TimeoutExpired:
                            for q in procs:
                                q.kill()
                            errs.append("timed out after 900 s: " + (p.communicate()[1] or ""))
                    for job in jobs:
                        if RM.FAMILIES[job["family"]]["mtp"]:
                            check_mtp(job["family"], job["src"], job["mnt"], T, F)
                    for r, p in enumerate(procs):
                        F.check(p.returncode == 0, "T=%d rank %d worker exited %d: %s"
                                % (T, r, p.returncode, errs[r][-3000:]))
                if procs[0].returncode != 0:
                    continue  # its families: "no result" below
                ranks = []
                for r in range(T):
                    with open(out + ".%d" % r) as f:
                        ranks.append(json.load(f))
                for name, x in ranks[0].items():  # each rank's own loading error, not only rank 0's view of it
                    if "error" in x:
                        x["error"] = "; ".join(rk[name]["error"] for rk in ranks
                                               if "another rank" not in rk[name]["error"])
                res.update(ranks[0])
            at_t = [f for f in at_t if f not in refused]
            for name in at_t:
                x = res.get(name, {"error": "no result"})
                if "error" in x:
                    F.check(False, "%s T=%d: %s" % (name, T, x["error"]))
                    table[(name, T)] = "ERROR"
                    continue
                table[(name, T)] = "%.1e" % x["err"]
                F.check(x["err"] <= TOL, "%s T=%d: logits differ from the unsplit model by %.3g relative (> %g)"
                        % (name, T, x["err"], TOL))
                if "wrong_err" in x:
                    F.check(x["wrong_err"] > TOL,
                            "%s T=%d: swapping rank 0's halves of %s went unnoticed (%.3g)"
                            % (name, T, x["wrong_tensor"], x["wrong_err"]))
                    table[(name, "wrong")] = "%.1e (%s)" % (x["wrong_err"], x["wrong_tensor"])
            print("T=%d: %d families in %.1f s" % (T, len(at_t), time.time() - t1), flush=True)
    print("\nfamily x T -> max relative logit error (wrong split at T=2: its error)")
    for name in fams:
        print("  %-20s %s  wrong: %s" % (name, "  ".join("T=%d %-8s" % (T, table.get((name, T), "-")) for T in (2, 3, 4)),
                                           table.get((name, "wrong"), "-")))
    F.done("real models")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        main(sys.argv[1:])
