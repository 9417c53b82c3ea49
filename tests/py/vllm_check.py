"""Runs vLLM (in the vLLM venv, scripts/setup.sh --vllm) on a list of jobs, one LLM at a time in this
one process, and writes what each produced: greedy tokens and their top logprobs, and for a
sharded_state job the key set vLLM's loader expected on each rank.

python vllm_check.py JOBS.json RESULT.json
  JOBS: [{"name", "model", "load_format": "auto" | "sharded_state", "tp", "dtype", "prompts": [[ids]],
          "max_tokens", "keys": true|false, "engine": {more LLM(...) arguments, e.g. "mm_encoder_tp_mode"}}]
  RESULT: {name: {"tokens": [[ids] per prompt], "logprobs": [[[[id, logprob] top-k] per step] per
           prompt], "keys": {rank: {key: [shape, dtype]}} or null, "weights": {rank: {key: sha1 of
           its bytes}} (what the loader left in the model), "error": text or null}}
  A job's "impersonate": "cuda-dsa" builds a DSA model (DeepSeek-V3.2, GLM-5) as vLLM on CUDA does
  (impersonate_cuda_dsa below): its key set and loaded weights are probed; it cannot generate.

The key set is vLLM's own: a general plugin (entry point group vllm.general_plugins, loaded in every
vLLM process, workers included) wraps ShardedStateLoader.load_weights so that, before loading, each
worker writes `_filter_subtensors(model.state_dict())` (the dict it then fills, key by key: an extra
file key is a KeyError, a missing one "Missing keys") with each tensor's shape and dtype. The plugin
lives in a temporary folder put on PYTHONPATH (a .dist-info with its entry point), so nothing is
installed. A job that fails records its error and the next one still runs.
"""
import gc
import json
import os
import shutil
import sys
import tempfile
import traceback

PROBE = '''
import json, os

def impersonate_cuda_dsa():
    """Lets vLLM's CPU platform CONSTRUCT a DSA model (DeepSeek-V3.2, GLM-5, GLM-5.3) as vLLM on CUDA
    builds it, so that its key set and what each loader puts into it can be probed (it cannot run:
    its forward needs CUDA kernels). The changes, nothing else: the CPU platform, asked for a sparse
    MLA backend (which it refuses), answers with its non-sparse MLA backend (the backend picks
    MLAAttention's impl, which is no module: the parameters are those CUDA builds);
    vllm.models.deepseek_v32's DeepseekV32ForCausalLM and GlmMoeDsaForCausalLM are the CUDA class
    (nvidia/model.py) that its __init__ picks on CUDA, not deepseek_v2's generic class that it picks
    on CPU (vllm.models.glm5next builds one class everywhere); and, for a multimodal model started
    without a tokenizer (skip_tokenizer_init), the front end's processor is let start and the encoder
    budget is given 16 tokens an item (it sizes caches, not modules)."""
    from vllm.platforms import cpu
    if getattr(cpu.CpuPlatform, "_tpfs_impersonated", False):
        return
    cpu.CpuPlatform._tpfs_impersonated = True
    inner = cpu.CpuPlatform.get_attn_backend_cls.__func__

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        if attn_selector_config.use_sparse:
            attn_selector_config = attn_selector_config._replace(use_sparse=False)
        return inner(cls, selected_backend, attn_selector_config, num_heads=num_heads)
    cpu.CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)
    import vllm.models.deepseek_v32 as pkg
    from vllm.models.deepseek_v32.nvidia import model as cuda_model
    pkg.DeepseekV32ForCausalLM = cuda_model.DeepseekV32ForCausalLM
    pkg.GlmMoeDsaForCausalLM = cuda_model.DeepseekV32ForCausalLM
    from vllm.multimodal import encoder_budget
    from vllm.multimodal.processing import processor
    processor.BaseMultiModalProcessor.requires_tokenizer = False
    encoder_budget.get_mm_max_toks_per_item = lambda proc, mm_counts, cache: {m: 16 for m in mm_counts}

def register():
    if os.environ.get("TPFS_VLLM_IMPERSONATE") == "cuda-dsa":
        impersonate_cuda_dsa()
    d = os.environ.get("TPFS_VLLM_KEYS")
    if not d:
        return
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader
    if getattr(ShardedStateLoader, "_tpfs_probe", False):
        return
    ShardedStateLoader._tpfs_probe = True

    def dump(model, name):
        """D/name{rank}.json from _filter_subtensors(model.state_dict()): "rank", each key's shape and
        dtype; "weights-rank", a digest of each tensor's bytes."""
        import hashlib
        import torch
        from vllm.distributed import get_tensor_model_parallel_rank
        sd = ShardedStateLoader._filter_subtensors(model.state_dict())
        if name == "rank":
            out = {k: [list(t.shape), str(t.dtype).replace("torch.", "")] for k, t in sd.items()}
        else:
            out = {k: hashlib.sha1(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
                   .hexdigest() for k, t in sd.items()}
        path = os.path.join(d, "%s%d.json" % (name, get_tensor_model_parallel_rank()))
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(path + ".tmp", path)

    def wrap(cls, keys):
        """cls.load_weights, recording the key set it fills (keys: before loading, which fails on a
        wrong one) and the weights it leaves (after; before process_weights_after_loading packs them)."""
        inner = cls.load_weights

        def load_weights(self, model, model_config):
            if keys:
                dump(model, "rank")
            r = inner(self, model, model_config)
            dump(model, "weights-rank")
            return r
        cls.load_weights = load_weights

    wrap(ShardedStateLoader, True)
    wrap(DefaultModelLoader, False)
'''


def install_probe():
    """A folder with the probe plugin, put on PYTHONPATH for this process and the ones vLLM spawns."""
    d = tempfile.mkdtemp(prefix="tpfs-vllm-probe-")
    with open(os.path.join(d, "tpfs_vllm_probe.py"), "w") as f:
        f.write(PROBE)
    info = os.path.join(d, "tpfs_vllm_probe-0.dist-info")
    os.mkdir(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: tpfs-vllm-probe\nVersion: 0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\ntpfs_vllm_probe = tpfs_vllm_probe:register\n")
    os.environ["PYTHONPATH"] = d + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, d)
    return d


def run_job(job, keys_dir):
    from vllm import LLM, SamplingParams

    os.environ["TPFS_VLLM_KEYS"] = keys_dir  # the weights' digests always; the key set for sharded_state
    os.environ["TPFS_VLLM_IMPERSONATE"] = job.get("impersonate") or ""  # read by the workers it spawns
    if job.get("impersonate") == "cuda-dsa":  # and here, where the front end runs (vLLM loads plugins once)
        import tpfs_vllm_probe
        tpfs_vllm_probe.impersonate_cuda_dsa()
    llm = LLM(model=job["model"], load_format=job["load_format"], tensor_parallel_size=job["tp"],
              dtype=job.get("dtype", "bfloat16"), enforce_eager=True, skip_tokenizer_init=True,
              max_model_len=job.get("max_model_len", 256), max_num_seqs=4, seed=0,
              distributed_executor_backend="mp" if job["tp"] > 1 else None, **job.get("engine", {}))
    try:
        sp = SamplingParams(max_tokens=job.get("max_tokens", 8), temperature=0.0,
                            logprobs=job.get("logprobs", 5), detokenize=False, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in job["prompts"]], sp, use_tqdm=False)
        tokens, logprobs = [], []
        for o in outs:
            c = o.outputs[0]
            tokens.append(list(c.token_ids))
            logprobs.append([sorted([int(t), float(lp.logprob)] for t, lp in step.items())
                             for step in c.logprobs])
        return {"tokens": tokens, "logprobs": logprobs}
    finally:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 -- best effort: the next LLM needs the cores
            pass
        del llm
        gc.collect()


def per_rank(d, name, tp):
    """{rank: what the probe wrote in D/name{rank}.json}, for the ranks that wrote one."""
    out = {}
    for r in range(tp):
        p = os.path.join(d, "%s%d.json" % (name, r))
        if os.path.exists(p):
            with open(p) as f:
                out[str(r)] = json.load(f)
    return out


def main():
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    probe = install_probe()
    results = {}
    for job in jobs:
        keys_dir = tempfile.mkdtemp(prefix="tpfs-vllm-keys-")
        res = {"keys": None, "error": None}
        print("tpfs-vllm-job: %s" % job["name"], file=sys.stderr, flush=True)  # splits the log by job
        try:
            res.update(run_job(job, keys_dir))
        except Exception:  # noqa: BLE001 -- the error is the result
            res["error"] = traceback.format_exc()[-4000:]
            print("job %s failed:\n%s" % (job["name"], res["error"]), file=sys.stderr, flush=True)
        if job.get("keys"):
            res["keys"] = per_rank(keys_dir, "rank", job["tp"])
        res["weights"] = per_rank(keys_dir, "weights-rank", job["tp"])
        shutil.rmtree(keys_dir, ignore_errors=True)
        results[job["name"]] = res
        with open(sys.argv[2], "w") as f:
            json.dump(results, f)
    shutil.rmtree(probe, ignore_errors=True)


if __name__ == "__main__":
    main()
