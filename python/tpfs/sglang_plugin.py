"""SGLang's --load-format tpfs: `python -m sglang.launch_server --model-path SRC --load-format tpfs --tp N` and
`sglang.Engine(model_path=SRC, load_format="tpfs", tp_size=N)` serve the HF checkpoint SRC through a tpfs mount
that the engine makes and removes itself (README.md, "One flag"), as tpfs.vllm_plugin does for vLLM.

register() is the package's entry point in the group sglang.srt.plugins (pyproject.toml), which SGLang runs in each
of its processes, the schedulers that load the model included, before it parses its arguments or builds anything
(srt/plugins/__init__.py load_plugins). It
- adds "tpfs" to the --load-format choices (srt/arg_groups/choices.py add_load_format_choices: the list argparse
  and ServerArgs check);
- makes LoadConfig take "tpfs" as TpfsLoader: a HookRegistry AROUND hook on LoadConfig._verify_load_format
  (srt/configs/load_config.py), which otherwise turns the string into a LoadFormat and refuses one it does not
  name; get_model_loader (srt/model_loader/loader.py) returns load_config.load_format(load_config) where the load
  format is a class.

TpfsLoader is SGLang's ShardedStateLoader reading from a node mount (tpfs.node.acquire): in each scheduler, load_model
first takes the TP size and rank, the pipeline size, the node count and the node's rank from SGLang's published
parallel context (srt/runtime_context.py get_parallel); the node's ranks are those SGLang's engine starts on this
node (srt/entrypoints/engine.py _calculate_rank_ranges: tp/nnodes ranks from node_rank x tp/nnodes, so with
--tp 16 --nnodes 2 node 0 mounts ranks 0-7 and node 1 ranks 8-15); with data parallelism each scheduler mounts
its own rank alone. The first scheduler of the node mounts SRC with `tpfs mount SRC MNT --tp TP --view sglang
--ranks R`, the others wait for it and reuse the mount; a dead mount is replaced; the mount is removed when the
last process using it exits (tpfs.node). In SGLang's main process (`launch_server`, sglang.Engine), a BEFORE hook on
Engine._launch_scheduler_processes (srt/entrypoints/engine.py) makes the node's mount before the schedulers are
launched, from the server arguments (one pipeline stage, no data parallelism), so that the push-ahead runs while
they start; the schedulers then find it made (their log says "made before it"), and the main process stops counting
as its user once one of them uses it (tpfs.node.hand_over). TPFS_SGLANG_EARLY=0 leaves this out. Then
sharded_state's own reading loads the scheduler's
`model-rank-{r}-part-*` files from the mount (SGLang processes the weights before it copies them in; the view
serves what that needs, and refuses what it cannot: views/sglang/README.md). A checkpoint tpfs refuses stops the
engine at start: load_model raises tpfs.TpfsError, whose text is tpfs's message. Pipeline stages are passed to
tpfs as --pp, which the SGLang view refuses by name.

SRC is a local folder or, where it is no folder, a model id in the local Hugging Face cache (read offline: this
loader downloads nothing). --model-loader-extra-config '{"tpfs": {...}}' takes:
  "args": ["--unmatched", "replicate", ...]   more `tpfs mount` arguments;
  "view": "sglang"                            the view (default sglang; a view file for a form no built-in one serves).
"""
import json
import logging
import multiprocessing
import os
import sys
import threading
import time

import tpfs
from tpfs import node

logger = logging.getLogger("sglang.srt.model_loader.tpfs")  # under SGLang's logger, which SGLang configures

_OPTIONS = ("args", "view")


def node_ranks(tp, tp_rank, pp=1, nnodes=1, node_rank=0, dp=1):
    """The TP ranks SGLang's engine runs on this node: the block of tp/nnodes ranks from (node_rank mod nnodes) x
    tp/nnodes, where that block holds tp_rank (one pipeline stage, no data parallelism); tp_rank alone otherwise."""
    if pp == 1 and dp == 1 and nnodes >= 1 and tp % nnodes == 0:
        per = tp // nnodes
        lo = per * (node_rank % nnodes)
        if lo <= tp_rank < lo + per:
            return list(range(lo, lo + per))
    return [tp_rank]


def _parallel():
    """(tp, tp_rank, pp, nnodes, node_rank, dp) of this scheduler, from SGLang's parallel context."""
    from sglang.srt.runtime_context import get_parallel
    par = get_parallel()

    def get(name, default):
        try:
            v = getattr(par, name)
        except (AttributeError, RuntimeError, ValueError):
            return default
        return default if v is None else int(v)
    return (get("tp_size", 1), get("tp_rank", 0), get("pp_size", 1), get("nnodes", 1), get("node_rank", 0),
            get("dp_size", 1))


def source_folder(model_config):
    """The checkpoint folder of SRC: the folder itself, or the snapshot of a model id in the local Hugging Face
    cache (offline). Raises TpfsError where it is neither."""
    src = model_config.model_path
    if os.path.isdir(src):
        return src
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(src, revision=getattr(model_config, "revision", None), local_files_only=True)
    except Exception as e:  # noqa: BLE001 -- reported with the cause
        raise tpfs.TpfsError("--load-format tpfs: %s is neither a folder nor a model in the local Hugging Face "
                             "cache (%s: %s); download it first (huggingface-cli download %s)"
                             % (src, type(e).__name__, e, src)) from e


def _options(extra, opts):
    """(args, view) of --model-loader-extra-config: EXTRA, its keys other than "tpfs" (none are taken), and OPTS,
    its "tpfs" object. Raises ValueError naming what is wrong."""
    if extra:
        raise ValueError("Unexpected extra config keys for load format tpfs: %s (tpfs's options go under "
                         "\"tpfs\": %s)" % (sorted(extra), ", ".join(_OPTIONS)))
    if not isinstance(opts, dict) or set(opts) - set(_OPTIONS):
        raise ValueError("--model-loader-extra-config {\"tpfs\": ...}: give an object with the keys %s, "
                         "not %r" % (", ".join(_OPTIONS), opts))
    args = opts.get("args", [])
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise ValueError("--model-loader-extra-config {\"tpfs\": {\"args\": ...}}: give a list of strings, "
                         "not %r" % (args,))
    return list(args), opts.get("view", "sglang")


def _mount_early(server_args):
    """The node mount of a start with --load-format tpfs, made from SGLang's main process before it launches the
    schedulers, so that the push-ahead runs while they start (torch.distributed, the model's construction) instead
    of beginning when the first of them loads. Returns the mount point, or None where none is made here: another
    load format, data parallelism or pipeline stages (each scheduler then mounts its own rank), or a failure, which
    is only logged (the schedulers mount, and report it, as without this). This process counts as the mount's user
    only until a scheduler uses it (tpfs.node.hand_over): the mount goes with the engine, not with a process that
    outlives it (a notebook's sglang.Engine)."""
    try:
        if str(getattr(server_args, "load_format", "")).lower() != "tpfs":
            return None
        tp, pp, dp = (int(getattr(server_args, k, 1) or 1) for k in ("tp_size", "pp_size", "dp_size"))
        nnodes, node_rank = int(getattr(server_args, "nnodes", 1) or 1), int(getattr(server_args, "node_rank", 0) or 0)
        if pp != 1 or dp != 1 or tp % nnodes:
            return None
        text = node.ranks_text(node_ranks(tp, tp // nnodes * (node_rank % nnodes), pp, nnodes, node_rank, dp))
        extra = server_args.model_loader_extra_config or {}
        extra = dict(json.loads(extra) if isinstance(extra, str) else extra)
        args, view = _options(extra, extra.pop("tpfs", None) or {})
        src = source_folder(server_args)
        t = time.time()
        mnt = node.acquire(src, tp, None, text, view, node.engine_args(args))
        logger.info("tpfs: mounted %s for ranks %s of TP=%d at %s from SGLang's main process in %.2f s, before "
                    "the schedulers start (its push-ahead runs while they do)", src, text, tp, mnt, time.time() - t)
        threading.Thread(target=node.hand_over, args=(mnt, 900), name="tpfs-hand-over", daemon=True).start()
        return mnt
    except Exception as e:  # noqa: BLE001 -- the schedulers mount and report it
        logger.info("tpfs: no early mount from SGLang's main process (%s: %s); the first scheduler mounts",
                    type(e).__name__, e)
        return None


def _before_schedulers(*args, **kwargs):
    """BEFORE hook of Engine._launch_scheduler_processes(cls, server_args, ...): the early mount (_mount_early),
    unless TPFS_SGLANG_EARLY=0."""
    server_args = kwargs.get("server_args", args[1] if len(args) > 1 else None)
    if server_args is not None and os.environ.get("TPFS_SGLANG_EARLY", "1") != "0":
        _mount_early(server_args)
    return None


def _loader_class():
    """TpfsLoader, defined on first use (SGLang's loader module is imported only in a process that loads)."""
    global TpfsLoader
    if TpfsLoader is not None:
        return TpfsLoader
    from sglang.srt.model_loader.loader import BaseModelLoader, ShardedStateLoader

    class _TpfsLoader(ShardedStateLoader):
        """sharded_state's reading from the node's tpfs mount of the checkpoint (the module's text)."""

        def __init__(self, load_config):
            extra = dict(load_config.model_loader_extra_config or {})
            opts = extra.pop("tpfs", None) or {}
            BaseModelLoader.__init__(self, load_config)
            self.pattern = ShardedStateLoader.DEFAULT_PATTERN  # the names tpfs serves
            self.args, self.view = _options(extra, opts)
            self.mnt = None

        def mount(self, model_config):
            """The node's mount of SRC for this scheduler's split (made where missing or dead; tpfs.node)."""
            if self.mnt:
                return self.mnt
            tp, rank, pp, nnodes, node_rank, dp = _parallel()
            text = node.ranks_text(node_ranks(tp, rank, pp, nnodes, node_rank, dp))
            src = source_folder(model_config)
            key = (src, tp, pp if pp > 1 else None, text, self.view, node.engine_args(self.args))
            before = tpfs.mount_state(node.mount_path(*key)) == "healthy"
            self.mnt = node.acquire(*key)
            logger.info("tpfs: rank %d reads %s, the mount of %s for ranks %s of TP=%d%s", rank, self.mnt, src, text,
                        tp, ", made before it" if before else "")
            return self.mnt

        def download_model(self, model_config):
            source_folder(model_config)

        def load_model(self, *, model_config, device_config):
            mnt = self.mount(model_config)  # first: a refusal stops the start before the model is built
            src = model_config.model_path
            model_config.model_path = mnt  # what sharded_state reads its part files from
            try:
                return super().load_model(model_config=model_config, device_config=device_config)
            finally:
                model_config.model_path = src

    _TpfsLoader.__name__ = _TpfsLoader.__qualname__ = "TpfsLoader"
    TpfsLoader = _TpfsLoader
    return TpfsLoader


TpfsLoader = None  # the class, once _loader_class() has made it


def _verify_load_format(original, self, *args, **kwargs):
    """LoadConfig._verify_load_format, taking "tpfs" as TpfsLoader (which get_model_loader then instantiates)."""
    if isinstance(self.load_format, str) and self.load_format.lower() == "tpfs":
        self.load_format = _loader_class()
        return None
    return original(self, *args, **kwargs)


def register():
    """The sglang.srt.plugins entry point (in every SGLang process): --load-format tpfs is TpfsLoader; in a process
    that launches schedulers, the node mount is made before it does (_mount_early)."""
    from sglang.srt.arg_groups.choices import LOAD_FORMAT_CHOICES, add_load_format_choices
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    if "tpfs" not in LOAD_FORMAT_CHOICES:
        add_load_format_choices(["tpfs"])
    HookRegistry.register("sglang.srt.configs.load_config.LoadConfig._verify_load_format", _verify_load_format,
                          HookType.AROUND)
    # where schedulers may be launched: not in a scheduler (a child of multiprocessing), where resolving the hook's
    # target would import the engine's module for nothing
    if multiprocessing.parent_process() is None or "sglang.srt.entrypoints.engine" in sys.modules:
        HookRegistry.register("sglang.srt.entrypoints.engine.Engine._launch_scheduler_processes",
                              _before_schedulers, HookType.BEFORE)
