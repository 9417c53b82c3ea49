"""vLLM's --load-format tpfs: `vllm serve SRC --load-format tpfs -tp N [-pp P]` serves the HF checkpoint SRC through
a tpfs mount that the engine makes and removes itself (docs/VLLM.md, "One flag").

register() is the package's entry point in the group vllm.general_plugins (pyproject.toml), which vLLM runs in
every process, its workers included (vllm/plugins/__init__.py load_general_plugins); it registers TpfsLoader under
the load format "tpfs" (vllm/model_executor/model_loader/__init__.py register_model_loader).

TpfsLoader is vLLM's ShardedStateLoader reading from a node mount (tpfs.node.acquire): in each worker, load_model
first takes the worker's TP size and rank and PP size and rank from vLLM's groups, and its rank in vLLM's numbering
(stage x TP + TP rank, what `tpfs mount --ranks` takes under --pp); the node's ranks are those vLLM's multiprocessing
executor starts on this node (vllm/v1/executor/multiproc_executor.py: local_world_size ranks from
node_rank_within_dp x local_world_size, so with `--nnodes K` node n mounts ranks [n*W/K, (n+1)*W/K) of the W =
PP x TP ranks: with -tp 16 over two 8-GPU nodes, node 0 ranks 0-7 and node 1 ranks 8-15; with -tp 8 -pp 2, one
stage a node). Under another executor (Ray, an external launcher), whose placement of ranks on nodes vLLM's config
does not say, each worker mounts its own rank alone. The first worker of the node mounts SRC for those ranks with
`tpfs mount SRC MNT --tp TP [--pp PP] --view vllm --ranks R`, the others wait for it and reuse the mount; a dead
mount is replaced; the mount is removed when the last worker using it exits (tpfs.node). Then sharded_state's own
reading loads the worker's `model-rank-{r}-part-*` (`model-pp-{s}-tp-{t}-part-*`) files from the mount. A checkpoint
tpfs refuses stops the engine at start: load_model raises tpfs.TpfsError, whose text is tpfs's message.

The mount is made early, where vLLM lets a plugin see the engine's configuration, as the same node mount the
workers will ask for (the node's block of ranks under the multiprocessing executor, computed from the parallel
config as node_ranks does):
- first from vLLM's main process (`vllm serve`, LLM(), a headless node's `vllm serve --headless`: test_vllm_nodes
  checks its log line): register()
  runs there from EngineArgs.__post_init__ (vllm/engine/arg_utils.py, load_general_plugins) and wraps
  EngineArgs.create_engine_config, which then mounts as soon as it has made the configuration, before vLLM
  spawns its engine core (in the call, under a second: no lock is held across vLLM's forks). That process counts
  as the mount's user only until the engine core or a worker uses it too (tpfs.node.hand_over), so the mount
  goes with the engine, not with a notebook that outlives it;
- else from the engine-core process: register() runs there inside EngineCore.__init__ (vllm/v1/engine/core.py),
  whose vllm_config it finds in that caller's frame, and mounts on a thread of its own (where the main process
  has mounted, it finds the mount made and uses it); it then counts as a user until it exits (tpfs.node).
So the mount and its push-ahead run while vLLM spawns its engine core and workers, and the workers find the mount
made: on two cores the engine core's mount made its copies while the workers spawned, and its start was slower
(docs/PERFORMANCE.md, stop 58). Where neither applies (another vLLM, Ray, data parallelism) or the early mount
fails, nothing changes: the first worker mounts as before, and a refusal stops the start there with tpfs's
message. TPFS_VLLM_EARLY=0 in the environment leaves the mount to the first worker.

SRC is a local folder or, where it is no folder, a model id in the local Hugging Face cache (read offline: this
loader downloads nothing). --model-loader-extra-config '{"tpfs": {...}}' takes:
  "args": ["--ep", ...]   more `tpfs mount` arguments (--ep, --pp-layers, --unmatched, a --plan, ...);
  "view": "vllm"          the view (default vllm; a view file for a form no built-in view serves).
VLLM_PP_LAYER_PARTITION, where set, is passed as --pp-layers (vLLM then divides the layers by it). No other extra
config key is taken (sharded_state's "pattern" is not: tpfs serves its default names).

Data parallelism with expert parallelism (`--data-parallel-size D --enable-expert-parallel`): vLLM's MoE layers
place the routed experts over D x TP ranks (EP rank = DP rank x TP + TP rank), every other tensor by TP rank. Each
DP rank's workers then mount with `--dp D --ep` for their own EP ranks (dp_ranks: DP rank d's node block of TP
ranks, moved to d x TP + t), so the DP rank is in the mount's key, and read `model-dp-{d}-rank-{t}-part-*` with
sharded_state's reading under the pattern `model-dp-{d}-rank-{rank}-part-{part}.safetensors`. Without
--enable-expert-parallel every DP rank reads the same files, TP rank t's, as without DP. The files hold what vLLM
holds with its MoE sequence-parallel (its default all2all backend: DeepSeek's shared experts whole), so at TP > 1
another --all2all-backend, under which it is not, is refused.
"""
import functools
import os
import sys
import threading
import time

from vllm.logger import init_logger
from vllm.model_executor.model_loader import ShardedStateLoader, register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

import tpfs
from tpfs import node
from tpfs.node import ranks_text

logger = init_logger("vllm.tpfs")  # under vLLM's logger, which vLLM's logging configures

_OPTIONS = ("args", "view")


def node_ranks(tp, pp, tp_rank, pp_rank, parallel_config):
    """(this worker's rank, the ranks its node runs) in vLLM's numbering (stage x tp + TP rank): the block of
    local_world_size ranks from node_rank_within_dp x local_world_size where vLLM's multiprocessing executor (or
    the single-process one) starts the workers; the worker's own rank alone otherwise, or where that block does
    not hold it."""
    rank = pp_rank * tp + tp_rank
    backend = getattr(parallel_config, "distributed_executor_backend", None)
    if backend in (None, "mp", "uni"):
        local = parallel_config.local_world_size
        lo = parallel_config.node_rank_within_dp * local
        if lo <= rank < lo + local and lo + local <= tp * pp:
            return rank, list(range(lo, lo + local))
    return rank, [rank]


def dp_ranks(parallel_config, ranks):
    """(D, d, ranks) for a worker of DP rank d of D with expert parallelism, ranks (its node's TP ranks, as
    node_ranks gives them) moved to EP ranks d x TP + t; (1, 0, ranks) without DP or without expert parallelism
    (every DP rank then reads TP rank t's files). Raises TpfsError where TP > 1 and vLLM's MoE is not
    sequence-parallel (an all2all backend other than its default's kind): tpfs's --dp files hold what vLLM
    holds with it (DeepSeek's shared experts whole), proven only so."""
    D = int(getattr(parallel_config, "data_parallel_size", 1) or 1)
    if D <= 1 or not getattr(parallel_config, "enable_expert_parallel", False):
        return 1, 0, ranks
    d, tp = int(parallel_config.data_parallel_rank), int(parallel_config.tensor_parallel_size)
    if tp > 1 and not getattr(parallel_config, "use_sequence_parallel_moe", True):
        raise tpfs.TpfsError("--load-format tpfs: data parallelism with expert parallelism at TP=%d is served as vLLM "
                             "holds the model with a sequence-parallel MoE (its default --all2all-backend, "
                             "allgather_reducescatter: DeepSeek's shared experts whole on every rank), not with "
                             "--all2all-backend %s" % (tp, getattr(parallel_config, "all2all_backend", "?")))
    return D, d, [d * tp + r for r in ranks]


def dp_args(args, D):
    """The `tpfs mount` arguments for D DP ranks with expert parallelism: args with --dp D, and --ep where args
    do not place the experts themselves (--ep=round_robin)."""
    if D <= 1:
        return list(args)
    out = [a for a in args]
    if not any(a == "--ep" or a.startswith("--ep=") for a in out):
        out.append("--ep")
    return out + ["--dp", str(D)]


def source_folder(model_config):
    """The checkpoint folder of SRC: the folder itself, or the snapshot of a model id in the local Hugging Face
    cache (offline). Raises TpfsError where it is neither."""
    src = model_config.model_weights or model_config.model
    if os.path.isdir(src):
        return src
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(src, revision=model_config.revision, local_files_only=True)
    except Exception as e:  # noqa: BLE001 -- reported with the cause
        raise tpfs.TpfsError("--load-format tpfs: %s is neither a folder nor a model in the local Hugging Face "
                             "cache (%s: %s); download it first (huggingface-cli download %s)"
                             % (src, type(e).__name__, e, src)) from e


class _At:
    """model_config as sharded_state reads it, pointed at the mount (its model path; no weights override)."""

    def __init__(self, model_config, path):
        self._mc, self.model, self.model_weights = model_config, path, ""

    def __getattr__(self, name):
        return getattr(self._mc, name)


class TpfsLoader(ShardedStateLoader):
    """sharded_state's reading from the node's tpfs mount of the checkpoint (the module's text)."""

    def __init__(self, load_config):
        extra = dict(load_config.model_loader_extra_config or {})
        opts = extra.pop("tpfs", None) or {}
        BaseModelLoader.__init__(self, load_config)
        self.pattern = None  # sharded_state's default names: those tpfs serves
        if extra:
            raise ValueError("Unexpected extra config keys for load format tpfs: %s (tpfs's options go under "
                             "\"tpfs\": %s)" % (sorted(extra), ", ".join(_OPTIONS)))
        if not isinstance(opts, dict) or set(opts) - set(_OPTIONS):
            raise ValueError("--model-loader-extra-config {\"tpfs\": ...}: give an object with the keys %s, not %r"
                             % (", ".join(_OPTIONS), opts))
        args = opts.get("args", [])
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ValueError("--model-loader-extra-config {\"tpfs\": {\"args\": ...}}: give a list of strings, "
                             "e.g. [\"--ep\"], not %r" % (args,))
        self.args, self.view = list(args), opts.get("view", "vllm")
        self.mnt = None

    def mount_args(self, pp):
        """The extra `tpfs mount` arguments: the configured ones (with node.engine_args's default), and
        --pp-layers from VLLM_PP_LAYER_PARTITION under PP where they do not say it."""
        args = node.engine_args(self.args)
        layers = os.environ.get("VLLM_PP_LAYER_PARTITION")
        if pp > 1 and layers and not any(a.startswith("--pp-layers") for a in args):
            args += ["--pp-layers", layers]
        return args

    def mount(self, vllm_config, model_config):
        """The node's mount of SRC for this worker's split (made where missing or dead; tpfs.node.acquire)."""
        if self.mnt:
            return self.mnt
        from vllm.distributed import get_pp_group, get_tp_group
        tp, pp = get_tp_group().world_size, get_pp_group().world_size
        rank, ranks = node_ranks(tp, pp, get_tp_group().rank_in_group, get_pp_group().rank_in_group,
                                 vllm_config.parallel_config)
        D, d, ranks = dp_ranks(vllm_config.parallel_config, ranks)
        args = dp_args(self.mount_args(pp), D)
        if D > 1:  # DP rank d's files (the module's text); sharded_state's reading fills {rank} and {part}
            self.pattern = "model-dp-%d-rank-{rank}-part-{part}.safetensors" % d
        src = source_folder(model_config)
        self.mnt = node.acquire(src, tp, pp, ranks_text(ranks), self.view, args)
        logger.info("tpfs: rank %d%s reads %s, the mount of %s for ranks %s of TP=%d PP=%d%s", rank,
                    " of DP rank %d" % d if D > 1 else "", self.mnt, src, ranks_text(ranks), tp, pp,
                    " DP=%d (EP ranks)" % D if D > 1 else "")
        return self.mnt

    def download_model(self, model_config):
        source_folder(model_config)

    def load_model(self, vllm_config, model_config, prefix=""):
        self.mount(vllm_config, model_config)  # first: a refusal stops the start before the model is built
        return super().load_model(vllm_config, model_config, prefix)

    def load_weights(self, model, model_config):
        if not self.mnt:
            from vllm.config import get_current_vllm_config
            self.mount(get_current_vllm_config(), model_config)
        return super().load_weights(model, _At(model_config, self.mnt))


def node_block(parallel_config):
    """The ranks vLLM's multiprocessing executor runs on this node (vLLM's numbering), from the parallel config
    alone (what node_ranks gives every worker of the node), or None where the executor is another."""
    backend = getattr(parallel_config, "distributed_executor_backend", None)
    if backend not in (None, "mp", "uni"):
        return None
    local, world = parallel_config.local_world_size, parallel_config.world_size
    lo = parallel_config.node_rank_within_dp * local
    return list(range(lo, lo + local)) if lo + local <= world else None


def _engine_config():
    """The vllm_config of the EngineCore.__init__ that is loading the plugins (a caller's frame), or None."""
    from vllm.config import VllmConfig
    f = sys._getframe(1)
    for _ in range(12):
        f = f.f_back
        if f is None:
            return None
        if f.f_code.co_name == "__init__" and type(f.f_locals.get("self")).__name__.startswith("EngineCore"):
            c = f.f_locals.get("vllm_config")
            return c if isinstance(c, VllmConfig) else None
    return None


def _mount_early(vllm_config, where):
    """The node mount for vllm_config, made from WHERE ("vLLM's main process" or "the engine core"); returns its
    mount point, or None where none is made here (another executor, DP) or it failed: failures are only logged
    (the workers mount, and report, as without it)."""
    try:
        pc, lc = vllm_config.parallel_config, vllm_config.load_config
        ranks = node_block(pc)
        if ranks is None or getattr(pc, "data_parallel_size", 1) != 1:
            return None
        loader = TpfsLoader(lc)
        pp, tp = pc.pipeline_parallel_size, pc.tensor_parallel_size
        args = loader.mount_args(pp)
        src = source_folder(vllm_config.model_config)
        t = time.time()
        made = tpfs.mount_state(node.mount_path(src, tp, pp, ranks_text(ranks), loader.view, args)) != "healthy"
        mnt = node.acquire(src, tp, pp, ranks_text(ranks), loader.view, args)
        if made:
            logger.info("tpfs: mounted %s for ranks %s of TP=%d PP=%d at %s from %s in %.2f s, before the workers "
                        "start (its push-ahead runs while they do)", src, ranks_text(ranks), tp, pp, mnt, where,
                        time.time() - t)
        else:
            logger.info("tpfs: %s uses the node mount of %s for ranks %s of TP=%d PP=%d at %s, made before it", where,
                        src, ranks_text(ranks), tp, pp, mnt)
        return mnt
    except Exception as e:  # noqa: BLE001 -- the workers mount and report it
        logger.info("tpfs: no early mount from %s (%s: %s); the first worker mounts", where, type(e).__name__, e)
        return None


def _wrap_engine_config():
    """Makes EngineArgs.create_engine_config, in the process that makes the engine's configuration (vLLM's main
    process: `vllm serve`, LLM(), a headless node's `vllm serve --headless`), mount the node for a start with
    --load-format tpfs as soon as the configuration exists, before vLLM spawns its engine core: the push-ahead
    then runs while the engine core and its workers start, seconds earlier than from the engine core itself. The
    mount is made in the call (a second or less: tpfs waits for its daemon to serve), not in a thread, so that no
    lock of tpfs.node is held across a fork of this process. This process counts as the mount's user only until
    another process uses it too (the engine core or a worker: tpfs.node.hand_over), so the mount goes with the
    engine, not with a process that outlives it (a notebook's LLM())."""
    from vllm.engine.arg_utils import EngineArgs
    orig = EngineArgs.create_engine_config
    if getattr(orig, "_tpfs_early", False):
        return

    @functools.wraps(orig)
    def create_engine_config(self, *args, **kwargs):
        cfg = orig(self, *args, **kwargs)
        if getattr(cfg.load_config, "load_format", None) == "tpfs" and os.environ.get("TPFS_VLLM_EARLY", "1") != "0":
            mnt = _mount_early(cfg, "vLLM's main process")
            if mnt:
                threading.Thread(target=node.hand_over, args=(mnt, 900), name="tpfs-hand-over", daemon=True).start()
        return cfg
    create_engine_config._tpfs_early = True
    EngineArgs.create_engine_config = create_engine_config


def register():
    """The vllm.general_plugins entry point: --load-format tpfs is TpfsLoader (in every vLLM process); the node
    mount of a start with --load-format tpfs is begun early, from vLLM's main process once it has made the
    engine's configuration, else from the engine-core process (the module's text)."""
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER
    if _LOAD_FORMAT_TO_MODEL_LOADER.get("tpfs") is not TpfsLoader:
        register_model_loader("tpfs")(TpfsLoader)
    if os.environ.get("TPFS_VLLM_EARLY", "1") == "0":
        return
    try:
        _wrap_engine_config()
    except Exception:  # noqa: BLE001 -- another vLLM: the engine core mounts early, or the first worker
        pass
    try:
        cfg = _engine_config()
    except Exception:  # noqa: BLE001 -- another vLLM: no early mount
        cfg = None
    if cfg is not None and getattr(cfg.load_config, "load_format", None) == "tpfs":
        threading.Thread(target=_mount_early, args=(cfg, "the engine core"), name="tpfs-early-mount",
                         daemon=True).start()
