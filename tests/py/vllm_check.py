"""Runs vLLM (in the vLLM venv, scripts/setup.sh --vllm) on a list of jobs, one LLM at a time in this
one process, and writes what each produced: greedy tokens and their top logprobs, and the digest of
every weight each loader left in the model on each rank.

python vllm_check.py JOBS.json RESULT.json
  JOBS: [{"name", "model", "load_format": "auto" | "sharded_state", "tp", "dtype", "prompts": [[ids]],
          "max_tokens", "engine": {more LLM(...) arguments, e.g. "mm_encoder_tp_mode"}}]
  RESULT: {name: {"tokens": [[ids] per prompt], "logprobs": [[[[id, logprob] top-k] per step] per
           prompt], "weights": {rank: {key: sha1 of its bytes}} (what the loader left in the model),
           "error": text or null}}

The digests come from a general plugin (vllm_plugin.py, entry point group vllm.general_plugins,
loaded in every vLLM process, workers included) that wraps the loaders' load_weights. The plugin
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


def install_probe():
    """A folder with the probe plugin, put on PYTHONPATH for this process and the ones vLLM spawns."""
    d = tempfile.mkdtemp(prefix="tpfs-vllm-probe-")
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_plugin.py"),
                os.path.join(d, "tpfs_vllm_probe.py"))
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

    os.environ["TPFS_VLLM_KEYS"] = keys_dir  # the weights' digests each loader leaves
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
        res = {"error": None}
        print("tpfs-vllm-job: %s" % job["name"], file=sys.stderr, flush=True)  # splits the log by job
        try:
            res.update(run_job(job, keys_dir))
        except Exception:  # noqa: BLE001 -- the error is the result
            res["error"] = traceback.format_exc()[-4000:]
            print("job %s failed:\n%s" % (job["name"], res["error"]), file=sys.stderr, flush=True)
        res["weights"] = per_rank(keys_dir, "weights-rank", job["tp"])
        shutil.rmtree(keys_dir, ignore_errors=True)
        results[job["name"]] = res
        with open(sys.argv[2], "w") as f:
            json.dump(results, f)
    shutil.rmtree(probe, ignore_errors=True)


if __name__ == "__main__":
    main()
