"""The load-only proof of a vLLM view: vLLM's own model class, built from each case's
config by vLLM's own config objects, loaded by vLLM's default loader from SRC and by its
sharded_state loader from the served folder, in one group of T worker processes per tensor-parallel
size (vLLM's own distributed init, gloo on CPU), with no engine: no scheduler, no KV cache, no
warm-up. A case costs seconds; an LLM() start costs 40-100 s on two cores.

python vllm_probe.py CASES.json RESULT.json     (in the vLLM venv, scripts/setup.sh --vllm)
  CASES:  [{"name", "src", "served", "tp", "pp" (optional, default 1: pipeline stages; the group then has
            tp x pp ranks, rank = stage x tp + TP rank, as vLLM numbers them), "dp" (optional, default 1: data-
            parallel ranks with expert parallelism; the group then has dp x tp ranks, DP rank d's TP rank t being
            rank d x tp + t, vLLM's EP rank; each DP rank's own VllmConfig says data_parallel_rank d, its ranks
            join one gloo world of dp x tp through the DP master address as vLLM's workers do, and its
            sharded_state reads model-dp-{d}-rank-{t}-part-* (the pattern extra config)),
            "loader": null or "tpfs" (the second loader is the tpfs plugin's, --load-format tpfs on SRC, instead of
            sharded_state on "served": the package under python/ and the tpfs program on PATH; its keys are checked
            against the mount the plugin made), "engine": {more EngineArgs fields},
            "env": {variables set while the case runs, e.g. VLLM_PP_LAYER_PARTITION}, "impersonate": null or
            "cuda-dsa", "nvfp4-emulation", "fp8-block-torch", "mxfp4-emulation" or "olmo-hybrid"
            (vllm_plugin.py), "casts": [regex, ...] (keys
            whose served dtype may differ from the parameter's: see 3), "stop": null or the text of vLLM's own
            error where vLLM cannot process the weights on this CPU (see verdict)}]
  RESULT: {name: {"ok": bool, "ranks": {rank: {"keys": [[key, served, vLLM's]], "cast": [the same],
           "loaded": [keys], "sequence_parallel_moe": vLLM's parallel_config says so (bool),
           "processed": [keys], "tensors": n, "stages": {loader: stages reached}, "error": text or
           null}}, "seconds": s}}

What each rank does for a case, as vLLM's CPU worker does it (v1/worker/cpu_model_runner.py
load_model -> model_loader.get_model -> BaseModelLoader.load_model):
  1. VllmConfig from EngineArgs(...).create_engine_config(), as LLM() makes it, one per loader (a
     model registers its attention layers in its config: two models cannot share one);
  2. the default loader on SRC, then sharded_state on the served folder, each through
     get_model(vllm_config): the model built, load_weights, process_weights_after_loading;
  3. "keys": the served files of this rank (model-rank-R-part-*.safetensors, read from their
     headers) against _filter_subtensors(model.state_dict()) as sharded_state sees it before it
     loads: a missing key (vLLM: "Missing keys"), an extra key (KeyError), a shape (vLLM narrows
     a smaller tensor and warns) or a dtype (vLLM casts and warns) that differs; a key matching one
     of the case's "casts" whose shape agrees and dtype differs goes to "cast" instead (a parameter
     vLLM makes in the model's dtype where checkpoints store F32: its sharded_state loader casts
     it with the same copy_ its default loader does, which 4 and 5 check bitwise);
  4. "loaded": every tensor of the filtered state dict right after load_weights, bitwise, default
     against sharded_state;
  5. "processed": after process_weights_after_loading, every parameter and buffer (aliases kept)
     and every tensor a module holds as a plain attribute (processing may move weights there),
     bitwise: key sets, shapes, dtypes and bytes.
A case is ok when every rank loaded both models and found no problem. An exception in a case is its
result; the next case still runs (a rank that failed waits for no other: loading runs no collective).
"""
import copy
import hashlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_DTYPE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64",
               "I32": "int32", "I16": "int16", "U8": "uint8", "I8": "int8", "BOOL": "bool",
               "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def part_prefix(rank, tp, pp, dp=1):
    """The start of a rank's part files' names: sharded_state's TP_ONLY_PATTERN, or with stages its
    PP_AND_TP_PATTERN (model_loader/sharded_state_loader.py), or with DP ranks tpfs's --dp names (rank
    d x tp + t: DP rank d's TP rank t)."""
    if dp > 1:
        return "model-dp-%d-rank-%d-part-" % (rank // tp, rank % tp)
    return "model-rank-%d-part-" % rank if pp == 1 else "model-pp-%d-tp-%d-part-" % (rank // tp, rank % tp)


def served_keys(folder, rank, tp=1, pp=1, dp=1):
    """{key: [shape, torch dtype name]} of rank's part files, from their headers; a key in two files
    is reported as KEY (twice)."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.startswith(part_prefix(rank, tp, pp, dp)) and f.endswith(".safetensors"):
            with open(os.path.join(folder, f), "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                h = json.loads(fh.read(n))
            h.pop("__metadata__", None)
            for k, v in h.items():
                if k in out:
                    out[k + " (twice)"] = None
                out[k] = [list(v["shape"]), TORCH_DTYPE.get(v["dtype"], v["dtype"])]
    return out


def digest(t):
    """sha1 of a tensor's bytes, with its shape and dtype."""
    import torch
    b = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return "%s %s %s" % (tuple(t.shape), str(t.dtype).replace("torch.", ""), hashlib.sha1(b).hexdigest())


# tensors vLLM allocates uninitialized (torch.empty) as workspaces, not weights: compared by shape and dtype only
# (the DSA indexer's top-k index buffer: deepseek_v32/nvidia/model.py, glm5next/common/model.py)
SCRATCH = re.compile(r"(^|\.)topk_indices_buffer$")


def all_tensors(model):
    """{name: digest} of every parameter and buffer (aliases kept), every tensor a module holds as a plain
    attribute (ATTR:module.name) and every tensor a function attribute holds in its closure or defaults
    (FN:module.name[i]: vLLM's CPU linear keeps its packed weight so, after replacing layer.weight by an
    empty parameter; a oneDNN handle holds its copy where no bytes can be read, and is made from the weight
    compared before processing). SCRATCH tensors give shape and dtype only."""
    import torch
    out = {k: digest(v) for k, v in model.named_parameters(remove_duplicate=False)}
    out.update({k: digest(v) for k, v in model.named_buffers(remove_duplicate=False)})
    for mname, m in model.named_modules(remove_duplicate=False):
        for k, v in vars(m).items():
            name = "%s%s%s" % (mname, "." if mname else "", k)
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter):
                out["ATTR:" + name] = digest(v)
            elif callable(v) and (getattr(v, "__closure__", None) or getattr(v, "__defaults__", None)):
                held = [c.cell_contents for c in (v.__closure__ or ()) if _filled(c)] + list(v.__defaults__ or ())
                for i, t in enumerate(x for x in held if isinstance(x, torch.Tensor)):
                    out["FN:%s[%d]" % (name, i)] = digest(t)
    return {k: (v.rsplit(" ", 1)[0] if SCRATCH.search(k.split(":")[-1]) else v) for k, v in out.items()}


def _filled(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def differ(a, b):
    """Keys whose digests differ or that one side lacks, sorted."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


class Hooks:
    """Wraps the two loaders' load_weights (once per process) so that a case sees what sharded_state
    expects before it loads and what each loader leaves right after load_weights."""

    def __init__(self):
        from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
        from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader
        self.expected, self.loaded = None, None
        self.filt = ShardedStateLoader._filter_subtensors
        hooks = self

        def wrap(cls, sharded):
            inner = cls.load_weights

            def load_weights(self, model, model_config):
                sd = hooks.filt(model.state_dict())
                if sharded:
                    hooks.expected = {k: [list(t.shape), str(t.dtype).replace("torch.", "")] for k, t in sd.items()}
                r = inner(self, model, model_config)
                hooks.loaded = {k: digest(t) for k, t in hooks.filt(model.state_dict()).items()}
                return r
            cls.load_weights = load_weights
        wrap(DefaultModelLoader, False)
        wrap(ShardedStateLoader, True)


def engine_config(case, how, dp_rank=0):
    """The VllmConfig of one loader (how) for DP rank dp_rank (with the case's "dp"; 0 without)."""
    from vllm.engine.arg_utils import EngineArgs
    world = case["tp"] * case.get("pp", 1)
    dp = case.get("dp", 1)
    plugin = how == "sharded_state" and case.get("loader") == "tpfs"
    args = dict(model=case["src"] if how == "auto" or plugin else case["served"],
                load_format="tpfs" if plugin else how,
                tensor_parallel_size=case["tp"], pipeline_parallel_size=case.get("pp", 1),
                dtype=case.get("dtype", "bfloat16"), enforce_eager=True,
                skip_tokenizer_init=True, max_model_len=case.get("max_model_len", 256), seed=0,
                distributed_executor_backend="mp" if world > 1 or dp > 1 else "uni")
    if dp > 1:
        args.update(data_parallel_size=dp)
        if how == "sharded_state" and not plugin:
            args["model_loader_extra_config"] = {"pattern": "model-dp-%d-rank-{rank}-part-{part}.safetensors" % dp_rank}
    args.update(case.get("engine") or {})
    vc = EngineArgs(**args).create_engine_config()
    if dp > 1:  # what vLLM's DP engine core dp_rank sets in its own copy (v1/engine/core.py DPEngineCoreProc)
        vc.parallel_config.data_parallel_rank = dp_rank
        vc.parallel_config.data_parallel_rank_local = dp_rank
        vc.parallel_config.data_parallel_master_ip = "127.0.0.1"
        vc.parallel_config.data_parallel_master_port = case["dp_port"]
        # the ports of the DP groups counted up from it alike in every rank (get_next_dp_init_port), not taken
        # from a list of this process's own free ports, nor published through a coordination store
        vc.parallel_config._data_parallel_master_port_list = []
        vc.parallel_config._coord_store_port = 0
    return vc


def worker(rank, tp, port, cases_path, out_path):
    """One rank of a group: every case of CASES (all of this tp, pp and dp), results to OUT (JSON, rewritten
    after each case so that a crash keeps the earlier ones). With DP ranks, rank is d x tp x pp + the rank
    within DP rank d's world."""
    import gc
    from vllm.platforms import current_platform
    if current_platform.is_cpu():
        # what vLLM's CPU worker process imports first (its first line): CUDA streams and events as CPU placeholders
        import vllm.v1.worker.cpu_worker  # noqa: F401
    import torch
    torch.set_num_threads(1)
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment
    import vllm_plugin
    from vllm.model_executor.models import registry
    # vLLM inspects a model class in a subprocess, only to keep CUDA uninitialized in the caller (registry.py
    # _run_in_subprocess), 8 s a class on two cores until its cache (VLLM_CACHE_ROOT/modelinfos) holds it; on
    # the CPU the same function runs here, with the same result
    registry._run_in_subprocess = lambda fn: fn()

    with open(cases_path) as f:
        cases = json.load(f)
    if any(c.get("loader") == "tpfs" for c in cases):  # as vLLM's plugin loading does in a worker
        import tpfs.vllm_plugin
        tpfs.vllm_plugin.register()
    hooks, results, initialized = Hooks(), {}, False
    per_dp = tp * (cases[0].get("pp", 1) if cases else 1)
    dp_rank, local = rank // per_dp, rank % per_dp
    for case in cases:
        t0 = time.time()
        # every object alive now (vLLM, torch, the process group: hundreds of thousands) out of the collector's
        # reach: vLLM's loader calls gc.collect() twice a model, 0.6 s each over that heap on two cores, 85% of
        # a case's time; the case's own objects stay collectable (vLLM freezes its heap so after its warm-up:
        # vllm/utils/gc_utils.py freeze_gc_heap)
        gc.collect()
        gc.freeze()
        res = {"keys": [], "loaded": [], "processed": [], "tensors": 0, "error": None}
        try:
            if case.get("impersonate") == "cuda-dsa":
                vllm_plugin.impersonate_cuda_dsa()
            if case.get("impersonate") == "nvfp4-emulation":
                vllm_plugin.impersonate_nvfp4_emulation()
            if case.get("impersonate") == "fp8-block-torch":
                vllm_plugin.impersonate_fp8_block_torch()
            if case.get("impersonate") == "mxfp4-emulation":
                vllm_plugin.impersonate_mxfp4_emulation()
            if case.get("impersonate") == "olmo-hybrid":
                vllm_plugin.impersonate_olmo_hybrid()
            got = {}
            saved_env = {k: os.environ.get(k) for k in case.get("env") or {}}
            os.environ.update(case.get("env") or {})  # vLLM reads its envs when asked (vllm/envs.py)
            for how in ("auto", "sharded_state"):
                vc = engine_config(case, how, dp_rank)
                if not initialized:
                    # as CPUWorker.init_device (its shared-memory groups are named by VLLM_DIST_IDENT), once for
                    # every case: under a config without a model, so that the expert-parallel group is made too
                    # (vLLM makes it for a MoE model only, and an MoE layer asks for it while it is built)
                    os.environ["VLLM_DIST_IDENT"] = str(port)
                    vc0 = copy.copy(vc)
                    vc0.model_config = None
                    # with DP ranks vLLM offsets the rank by data_parallel_rank x world and joins the world of
                    # every DP rank at the DP master address (distributed/parallel_state.py)
                    with set_current_vllm_config(vc0):
                        init_worker_distributed_environment(vc0, local, "tcp://127.0.0.1:%d" % port, local,
                                                            current_platform.dist_backend)
                    initialized = True
                hooks.expected = hooks.loaded = None
                g = got[how] = {"error": None, "processed": None}
                try:
                    with set_current_vllm_config(vc):
                        model = get_model(vllm_config=vc)
                    g["processed"] = all_tensors(model)
                    del model
                except Exception:  # noqa: BLE001 -- this loader's result; the other still runs
                    g["error"] = traceback.format_exc()[-3000:]
                g["loaded"], g["expected"] = hooks.loaded, hooks.expected
                gc.collect()
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            a, b = got["auto"], got["sharded_state"]
            # whether vLLM's MoE was sequence-parallel here (DP x EP at T > 1 with the default all2all backend:
            # DeepSeek's shared experts whole, models/deepseek_v2.py)
            res["sequence_parallel_moe"] = bool(vc.parallel_config.use_sequence_parallel_moe)
            served = case.get("served")
            if case.get("loader") == "tpfs":  # the mount the plugin made in this process
                import tpfs.node
                served = list(tpfs.node._held)[-1] if tpfs.node._held else None
                res["served"] = served
                if not served:
                    res["keys"] = [["(the plugin made no mount in this process)", None, None]]
            if b["expected"] is not None and served:
                have = served_keys(served, rank, case["tp"], case.get("pp", 1), case.get("dp", 1))
                res["keys"] = [[k, have.get(k), b["expected"].get(k)] for k in differ(b["expected"], have)]
                # keys the case lets differ in dtype only (vLLM casts them on load as its default loader does)
                casts = [re.compile(c) for c in case.get("casts") or []]
                cast = [row for row in res["keys"] if row[1] and row[2] and row[1][0] == row[2][0]
                        and any(c.search(row[0]) for c in casts)]
                res["cast"] = cast
                res["keys"] = [row for row in res["keys"] if row not in cast]
            if a["loaded"] is not None and b["loaded"] is not None:
                res["loaded"] = differ(a["loaded"], b["loaded"])
                res["tensors"] = len(a["loaded"])
            if a["processed"] is not None and b["processed"] is not None:
                res["processed"] = differ(a["processed"], b["processed"])
                res["tensors"] = len(a["processed"])
            res["errors"] = {how: got[how]["error"] for how in got if got[how]["error"]}
            res["error"] = "\n".join("%s: %s" % kv for kv in res["errors"].items()) or None
            res["stages"] = {how: [k for k in ("expected", "loaded", "processed") if got[how][k] is not None]
                             for how in got}
        except Exception:  # noqa: BLE001 -- the error is the case's result
            res["error"] = traceback.format_exc()[-3000:]
        res["seconds"] = round(time.time() - t0, 2)
        results[case["name"]] = res
        with open(out_path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(out_path + ".tmp", out_path)
        print("tpfs-probe rank %d: %s %.1f s%s" % (rank, case["name"], res["seconds"],
                                                    " (error)" if res["error"] else ""), file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(tp, pp, cases, work, timeout, dp=1):
    """Runs one group of dp x tp x pp ranks on CASES; returns {name: {rank: result}}."""
    cases_path = os.path.join(work, "cases-tp%d-pp%d-dp%d.json" % (tp, pp, dp))
    port = free_port()
    if dp > 1:  # the DP master's port, the same in every rank's config
        dp_port = free_port()
        cases = [dict(c, dp_port=dp_port) for c in cases]
    with open(cases_path, "w") as f:
        json.dump(cases, f)
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    out_of = lambda r: os.path.join(work, "tp%d-pp%d-dp%d-rank%d.json" % (tp, pp, dp, r))  # noqa: E731
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(r), str(tp), str(port),
                               cases_path, out_of(r)], env=env)
             for r in range(tp * pp * dp)]
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    out = {}
    for r, p in enumerate(procs):
        path = out_of(r)
        got = {}
        if os.path.exists(path):
            with open(path) as f:
                got = json.load(f)
        for c in cases:
            out.setdefault(c["name"], {})[str(r)] = got.get(c["name"]) or {
                "error": "rank %d ended (exit %s) before this case's result" % (r, p.returncode)}
    return out


def verdict(case, r):
    """Whether one rank's result proves the case. With the case's "stop" (a text vLLM's error holds
    where vLLM itself cannot process the weights on this CPU, both loaders alike): both loaders stopped
    with it after load_weights, and the key set and the loaded weights are equal. Else: both loaded and
    processed, and nothing differs."""
    if r.get("keys") or r.get("loaded") or r.get("processed"):
        return False
    stages = r.get("stages") or {}
    if case.get("stop") and r.get("errors"):  # where vLLM itself stops; elsewhere the full comparison
        errs = r.get("errors") or {}
        return (len(errs) == 2 and all(case["stop"] in e for e in errs.values())
                and all("loaded" in stages.get(h, []) for h in ("auto", "sharded_state"))
                and "expected" in stages.get("sharded_state", []))
    return not r.get("error") and all("processed" in stages.get(h, []) for h in ("auto", "sharded_state"))


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    work = tempfile.mkdtemp(prefix="tpfs-vllm-probe-")
    results = {}
    for tp, pp, dp in sorted({(c["tp"], c.get("pp", 1), c.get("dp", 1)) for c in cases}):
        group = [c for c in cases if c["tp"] == tp and c.get("pp", 1) == pp and c.get("dp", 1) == dp]
        # impersonated cases last: the impersonation stays in the process once made
        group.sort(key=lambda c: bool(c.get("impersonate")))
        t0 = time.time()
        for name, ranks in run_group(tp, pp, group, work, timeout=60 + 60 * len(group), dp=dp).items():
            case = next(c for c in group if c["name"] == name)
            ok = all(verdict(case, r) for r in ranks.values())
            results[name] = {"ok": ok, "ranks": ranks,
                             "seconds": max(r.get("seconds", 0) for r in ranks.values())}
        print("tpfs-probe: %d cases at TP=%d PP=%d DP=%d in %.0f s" % (len(group), tp, pp, dp, time.time() - t0),
              file=sys.stderr, flush=True)
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path.insert(0, HERE)
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
    else:
        main()
