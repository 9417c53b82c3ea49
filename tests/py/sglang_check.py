"""Runs SGLang on a list of jobs, one sglang.Engine start each, in the SGLang venv (tests/py/test_sglang.py).

python sglang_check.py JOBS.json RESULT.json    (PYTHONPATH=tests/py/sglang_site: the stand-in sgl_kernel and
                                                 the loader hook, sitecustomize.py)
  JOBS:   [{"name", "model", "load_format": "auto" | "sharded_state", "tp", "keys": DIR, "prompts": [[ids]] or
           [] (load only), "max_tokens", "engine_args": {more sglang.Engine arguments, none touching weights; they
           replace the defaults below where they name one},
           "mounts_under": DIR (optional: the mount points under DIR while the engine is up, as "mounts", and
           those left after its shutdown, this process still running, as "mounts_after_shutdown": [] once they are
           gone, within 30 s, "gone_after_s" seconds after it)}]
  RESULT: {name: {"tokens": [[ids]], "logprobs": [[[[id, logprob] top-5] per step]], "seconds": s} or
           {"error": text}}

Each job is SGLang as a user runs it: sglang.Engine(model_path=MODEL, load_format=..., tp_size=TP) with the
CPU engine (device "cpu", attention_backend "torch_native", the only attention SGLang runs on a CPU without
its CPU kernels), greedy generation with the top-5 logprobs of each step, then shutdown. TPFS_SGLANG_KEYS=DIR
is set for the job, so each TP worker's loader writes what it loaded (sitecustomize.py). A job with no
prompts loads only (families whose forward SGLang's torch_native backend cannot run).

FORKED, NOT SPAWNED: SGLang starts its scheduler (one per TP rank) and detokenizer processes with the "spawn"
method (entrypoints/engine.py: mp.set_start_method("spawn", force=True)), and each of them imports SGLang,
torch and transformers again: about 25 of an Engine start's 30-38 s on two cores. Here the start method SGLang
asks for is replaced by "fork" (start_forked), so those processes are copies of this one, which has imported
SGLang once and installed the loader hooks: about 5 s a start. The code that builds, loads and post-processes
the model is the same; only how the processes come to exist differs (measured: llama at TP=2, the same
tokens, logprobs and weights either way). TPFS_SGLANG_SPAWN=1 keeps SGLang's spawn.
"""
import json
import os
import sys
import time
import traceback


def run(job):
    import sglang
    os.makedirs(job["keys"], exist_ok=True)
    os.environ["TPFS_SGLANG_KEYS"] = job["keys"]  # read by the workers SGLang starts (sitecustomize.py)
    t0 = time.time()
    args = dict(model_path=job["model"], load_format=job["load_format"], tp_size=job["tp"], device="cpu",
                attention_backend="torch_native", skip_tokenizer_init=True, disable_cuda_graph=True,
                max_total_tokens=256, log_level="error", random_seed=0)
    args.update(job.get("engine_args", {}))  # may replace a default (a load-only job's attention_backend)
    eng = sglang.Engine(**args)
    try:
        out = {"tokens": [], "logprobs": []}
        if job.get("mounts_under"):  # the mounts under that folder while the engine is up (the tpfs plugin's)
            with open("/proc/self/mountinfo") as f:
                out["mounts"] = sorted(ln.split()[4] for ln in f if ln.split()[4].startswith(job["mounts_under"] + "/"))
        for p in job.get("prompts") or []:
            r = eng.generate(input_ids=[p], sampling_params={"max_new_tokens": job.get("max_tokens", 6),
                                                             "temperature": 0, "ignore_eos": True},
                             return_logprob=True, top_logprobs_num=5)[0]
            out["tokens"].append(r["output_ids"])
            out["logprobs"].append([[[t[1], t[0]] for t in step] for step in r["meta_info"]["output_top_logprobs"]])
    finally:
        eng.shutdown()
    out["seconds"] = round(time.time() - t0, 1)
    if job.get("mounts_under"):  # this process lives on (a notebook's): the mounts after the shutdown, within 30 s
        t1 = time.time()
        while True:
            with open("/proc/self/mountinfo") as f:
                left = sorted(ln.split()[4] for ln in f if ln.split()[4].startswith(job["mounts_under"] + "/"))
            if not left or time.time() - t1 > 30:
                break
            time.sleep(0.2)
        out["mounts_after_shutdown"], out["gone_after_s"] = left, round(time.time() - t1, 1)
    return out


def start_forked():
    """SGLang's processes forked from this one (see above): its call to mp.set_start_method gets "fork"."""
    import multiprocessing as mp
    real = mp.set_start_method
    mp.set_start_method = lambda method, force=False: real("fork", force=True)
    import sitecustomize  # tests/py/sglang_site: the loader hooks, here, before the first fork
    import sglang  # noqa: F401 -- imported once, before the first fork
    sitecustomize.install()


def main():
    if os.environ.get("TPFS_SGLANG_SPAWN") != "1":
        start_forked()
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    res = {}
    for job in jobs:
        try:
            res[job["name"]] = run(job)
        except Exception:  # noqa: BLE001 -- the job's result; the next job still runs
            res[job["name"]] = {"error": traceback.format_exc()[-3000:]}
        print(job["name"], json.dumps(res[job["name"]])[:200], flush=True)
        with open(sys.argv[2], "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    # SGLang's CPU engine; its NCCL loader pointed at nothing (the CUDA torch wheel ships libnccl, which a
    # CPU run must not load); one OpenMP thread per core and TP worker; a KV cache of 256 tokens (else the
    # scheduler sizes it to most of the memory)
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("SGLANG_NCCL_SO_PATH", os.devnull)
    os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "0|1")
    main()
