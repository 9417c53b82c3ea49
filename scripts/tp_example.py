#!/usr/bin/env python3
"""Tensor-parallel inference over tpfs rank folders with stock transformers code.

Each process loads its own rank folder with the ordinary TP=1 loader:

    model = AutoModelForCausalLM.from_pretrained(MNT/rank{r})

(the rank's config.json gives the rank's own head counts, intermediate sizes and vocabulary rows,
so the model is built with exactly the served shapes), and four small additions make the ranks
compute the unsplit model together:

  1. after each row-parallel module (attention o_proj / out_proj, the MLP's down_proj, a whole
     MoE block) the partial outputs are summed over the ranks (all-reduce); a row-parallel bias,
     which every rank holds whole, is counted once;
  2. the embedding is vocab-parallel: rank r holds rows [r*V/T, (r+1)*V/T), looks up the token
     ids in its range (offset by r*V/T), zeroes the others, and the ranks sum;
  3. lm_head gives each rank its slice of the logits; the ranks gather them (and drop padded rows);
  4. one process per rank (torch.multiprocessing), gloo on CPU, NCCL where a GPU is present.

Run as a script it builds a tiny random checkpoint with transformers, mounts it with tpfs, and
prints the next tokens of the unsplit model and of the ranks together:

    python scripts/tp_example.py --family llama --tp 2 [--tokens 8] [--tpfs build/src/tpfs]

Every family that tests/py/realmodel.py proves is a --family too, without a second table here: a
family not in this script's FAMILIES is taken from realmodel.FAMILIES (imported from tests/py,
found relative to this file, put on sys.path). Such a family runs realmodel's way rather than
with the four additions above: realmodel.build writes the tiny checkpoint, each rank loads
MNT/rank{r} strictly into the local-size model of realmodel.local_config (the rank's counts,
computed from the family's rules, not read from tpfs), realmodel.tp_patch adds that family's TP
hooks, and the logits come from realmodel.logits, in float64 (realmodel.DTYPE), over gloo on
CPU; the unsplit model is realmodel.load of the source folder with the global config. Either way
the script prints the next tokens of both and the worst relative logit difference. --realmodel
runs a family that both tables have realmodel's way.

The functions are importable (tests/py/test_rank_folders.py uses them).
"""
import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

# ---- tiny checkpoints, built by transformers itself ----

_BASE = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, max_position_embeddings=128,
             tie_word_embeddings=False, initializer_range=0.1, pad_token_id=200, bos_token_id=None,
             eos_token_id=None)

# MLA attention + MoE, as DeepSeek-V2/V3 and GLM-5 (glm_moe_dsa) write it
_MLA = dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=32, kv_lora_rank=16,
            qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=4, n_shared_experts=1,
            num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=48)

FAMILIES = {
    # family: (config class name, config arguments)
    "llama": ("LlamaConfig", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=2,
                                  attention_bias=True)),
    "qwen2": ("Qwen2Config", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=4,
                                  head_dim=16)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=4,
                                         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=48)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=4,
                                         head_dim=16, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32)),
    "deepseek_v3": ("DeepseekV3Config", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=8,
                                             q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8,
                                             qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=4,
                                             n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                                             first_k_dense_replace=1, moe_intermediate_size=48)),
    "glm4_moe": ("Glm4MoeConfig", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=4,
                                       head_dim=16, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                       n_group=1, topk_group=1, first_k_dense_replace=1, moe_intermediate_size=32,
                                       attention_bias=True)),
    "qwen3_next": ("Qwen3NextConfig", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=4,
                                           head_dim=16, linear_num_key_heads=4, linear_num_value_heads=8,
                                           linear_key_head_dim=16, linear_value_head_dim=16,
                                           linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                           layer_types=["linear_attention", "full_attention"])),
    "mistral": ("MistralConfig", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=2,
                                      head_dim=8)),
    "deepseek_v2": ("DeepseekV2Config", dict(_MLA, first_k_dense_replace=1)),
    "deepseek_v32": ("DeepseekV32Config", dict(_MLA, index_topk=4, index_head_dim=16, index_n_heads=2,
                                               first_k_dense_replace=1)),
    "glm_moe_dsa": ("GlmMoeDsaConfig", dict(_MLA, index_topk=4, index_head_dim=16, index_n_heads=2,
                                            mlp_layer_types=["dense", "sparse"])),
    "kimi_linear": ("KimiLinearConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_attention_heads=8,
                                             num_key_value_heads=8, q_lora_rank=None, kv_lora_rank=16,
                                             qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                                             num_experts_per_tok=2, num_local_experts=4, n_shared_experts=1,
                                             linear_head_dim=8, linear_num_heads=8,
                                             layer_types=["linear_attention", "full_attention"],
                                             mlp_layer_types=["dense", "sparse"])),
    "qwen3_5_moe": ("Qwen3_5MoeConfig", dict(
        text_config=dict(num_attention_heads=8, num_key_value_heads=4, head_dim=16, linear_num_key_heads=4,
                         linear_num_value_heads=8, linear_key_head_dim=16, linear_value_head_dim=16,
                         linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         shared_expert_intermediate_size=48, layer_types=["linear_attention", "full_attention"]),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64))),
    "phi3": ("Phi3Config", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=4)),
    "mixtral": ("MixtralConfig", dict(intermediate_size=32, num_attention_heads=8, num_key_value_heads=4, head_dim=8,
                                      num_local_experts=4, num_experts_per_tok=2)),
    "gemma3": ("Gemma3TextConfig", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=4,
                                        head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                        layer_types=["sliding_attention", "full_attention"])),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", dict(intermediate_size=96, num_attention_heads=8, num_key_value_heads=4,
                                                moe_intermediate_size=32, moe_num_experts=4, moe_k=2,
                                                moe_num_shared_experts=1, moe_layer_start_index=1, use_bias=False)),
    "gpt_oss": ("GptOssConfig", dict(intermediate_size=32, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                                     num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                                     layer_types=["sliding_attention", "full_attention"])),
    "llama4": ("Llama4TextConfig", dict(intermediate_size=32, intermediate_size_mlp=96, num_attention_heads=8,
                                        num_key_value_heads=4, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
                                        interleave_moe_layer_step=2, attention_chunk_size=8)),
    # GLM-5.3-like: KDA linear attention and MLA + DSA indexer layers, hyper-connections, a dense
    # and an MoE layer, a (replicated) vision tower; transformers builds it for image-text-to-text
    "glm5_next": ("Glm5NextConfig", dict(
        text_config=dict(intermediate_size=96, moe_intermediate_size=32, num_attention_heads=8,
                         num_key_value_heads=8, n_shared_experts=1, n_routed_experts=4, kv_lora_rank=16,
                         q_lora_rank=32, qk_rope_head_dim=0, v_head_dim=8, qk_nope_head_dim=8,
                         num_experts_per_tok=2, index_topk=4, index_head_dim=16, index_n_heads=2,
                         linear_head_dim=8, linear_num_heads=8, index_kpool=2,
                         layer_types=["linear_attention", "full_attention"],
                         mlp_layer_types=["dense", "sparse"]),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, out_hidden_size=64, intermediate_size=32,
                           projection_intermediate_size=32))),
}


def auto_class(config):
    """The transformers Auto class that builds a language model for config: AutoModelForCausalLM,
    or AutoModelForImageTextToText for a vision-language wrapper (glm5_next)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return transformers.AutoModelForCausalLM
    return transformers.AutoModelForImageTextToText


def make_checkpoint(family, out, seed=0):
    """Saves a tiny random model of family into folder out (config.json + safetensors)."""
    import transformers
    transformers.utils.logging.disable_progress_bar()
    cls_name, kw = FAMILIES[family]
    torch.manual_seed(seed)
    if "text_config" in kw:
        cfg = getattr(transformers, cls_name)(**dict(kw, text_config={**_BASE, **kw["text_config"]}))
    else:
        cfg = getattr(transformers, cls_name)(**{**_BASE, **kw})
    model = auto_class(cfg).from_config(cfg)
    # a random model: lift norms and biases off their constant init so that a mix-up shows
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    return out


# ---- the four additions ----

def _sum_over_ranks(bias):
    """A forward hook that all-reduces a module's output, counting bias (held whole by every
    rank, or None) once."""
    def hook(mod, args, out):
        t = out[0] if isinstance(out, tuple) else out
        if bias is not None and dist.get_rank() != 0:
            t = t - bias
        t = t.contiguous()
        dist.all_reduce(t)
        return (t,) + tuple(out[1:]) if isinstance(out, tuple) else t
    return hook


class VocabParallelEmbedding(torch.nn.Module):
    """Rank r's rows [lo, lo + n) of the embedding: ids outside give zeros; the ranks sum."""

    def __init__(self, emb, rank):
        super().__init__()
        self.emb = emb
        self.lo = rank * emb.num_embeddings

    @property
    def weight(self):  # code that reads the embedding's weight (its dtype, tying) still finds it
        return self.emb.weight

    def forward(self, ids):
        n = self.emb.num_embeddings
        mine = (ids >= self.lo) & (ids < self.lo + n)
        # the model's own embedding module (some scale the rows, as Gemma does)
        out = self.emb(torch.where(mine, ids - self.lo, torch.zeros_like(ids)))
        out = out * mine.unsqueeze(-1).to(out.dtype)
        dist.all_reduce(out)
        return out


def _gather_logits(vocab):
    """A forward hook on lm_head: every rank gets all vocab logits (padded rows dropped)."""
    def hook(mod, args, out):
        parts = [torch.empty_like(out) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, out.contiguous())
        return torch.cat(parts, dim=-1)[..., :vocab]
    return hook


ROW_PARALLEL = ("self_attn.o_proj", "linear_attn.out_proj", "attn.o_proj")
MLP_BLOCKS = ("mlp", "block_sparse_moe", "feed_forward")


def make_tensor_parallel(model, rank, vocab):
    """Adds the all-reduces, the vocab-parallel embedding and the logits gather to model (a
    rank's model as from_pretrained built it). vocab: the unsplit vocabulary size."""
    for name, mod in model.named_modules():
        if name.endswith(ROW_PARALLEL) and isinstance(mod, torch.nn.Linear):
            mod.register_forward_hook(_sum_over_ranks(mod.bias))
        elif name.split(".")[-1] in MLP_BLOCKS and ".layers." in "." + name:
            down = getattr(mod, "down_proj", None)
            if isinstance(down, torch.nn.Linear):  # a dense MLP: its down_proj is row-parallel
                down.register_forward_hook(_sum_over_ranks(down.bias))
            else:  # an MoE block: routed and shared experts all end row-parallel
                mod.register_forward_hook(_sum_over_ranks(None))
    # experts whose down projection has a bias (gpt-oss): every rank holds it whole; count it once
    for name, mod in model.named_modules():
        if name.endswith("experts") and isinstance(getattr(mod, "down_proj_bias", None), torch.nn.Parameter):
            if rank != 0:
                with torch.no_grad():
                    mod.down_proj_bias.zero_()
    inner = model.get_input_embeddings()
    model.set_input_embeddings(VocabParallelEmbedding(inner, rank))
    model.get_output_embeddings().register_forward_hook(_gather_logits(vocab))
    return model


def load_rank(folder, dtype=torch.float32):
    """from_pretrained(folder) with nothing but stock options; returns (model, loading info)."""
    from transformers import AutoConfig
    from transformers.utils import logging
    logging.disable_progress_bar()
    config = AutoConfig.from_pretrained(folder)
    model, info = auto_class(config).from_pretrained(folder, dtype=dtype, output_loading_info=True)
    model.eval()
    return model, info


# ---- one process per rank ----

def init_process(rank, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group("nccl", rank=rank, world_size=world)
        return torch.device("cuda", rank % torch.cuda.device_count())
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return torch.device("cpu")


def finish():
    """Ends a rank process once every rank is done. Tearing the gloo group down at interpreter
    exit sometimes aborts ("terminate called without an active exception") after all the work
    is done; the results are already in the queue's pipe, so the process leaves at once."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def tp_logits(folder_of_rank, rank, vocab, ids, device, dtype=torch.float32):
    """Loads this rank's folder, makes it tensor-parallel, and returns (logits of ids, loading info)."""
    model, info = load_rank(folder_of_rank, dtype)
    model.to(device)
    make_tensor_parallel(model, rank, vocab)
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=device), use_cache=False).logits[0].float().cpu()
    return logits, info


def greedy(step, ids, n):
    """n next tokens, each the argmax of step(ids so far)'s last logits."""
    ids = list(ids)
    out = []
    for _ in range(n):
        nxt = int(step(ids)[-1].argmax())
        out.append(nxt)
        ids.append(nxt)
    return out


def _example_worker(rank, world, port, mnt, vocab, prompt, n, results):
    device = init_process(rank, world, port)
    model, _ = load_rank(os.path.join(mnt, "rank%d" % rank))
    model.to(device)
    make_tensor_parallel(model, rank, vocab)

    logits = []

    def step(ids):
        with torch.no_grad():
            out = model(torch.tensor([ids], device=device), use_cache=False).logits[0].float().cpu()
        logits.append(out)
        return out
    toks = greedy(step, prompt, n)
    if rank == 0:
        results.put((toks, [x.numpy() for x in logits]))  # numpy: a tensor would be shared through the exiting process
    finish()


def check_worker(rank, world, port, jobs, results, dtype=torch.float32):
    """For tests: for each job (name, mount point, unsplit vocab, token ids) loads MNT/rank{rank},
    runs the tensor-parallel forward, and puts (name, rank, loading info, logits or None) on
    results (logits from rank 0 only). A failure is put as (name, rank, "error: ...", None)."""
    device = init_process(rank, world, port)
    for name, mnt, vocab, ids in jobs:
        try:
            logits, info = tp_logits(os.path.join(mnt, "rank%d" % rank), rank, vocab, ids, device, dtype)
            info = {k: sorted(map(str, v)) for k, v in info.items()}
            results.put((name, rank, info, logits.numpy() if rank == 0 else None))
        except Exception as e:  # report and go on: the other ranks of this job fail the same way or hang
            results.put((name, rank, "error: %s: %s" % (type(e).__name__, e), None))
            raise
    finish()


def run_ranks(world, jobs, dtype=torch.float32, timeout=600):
    """Runs check_worker in world processes (spawned once for every job); returns their results,
    read while the ranks run (a full pipe would otherwise stop them). A rank that fails ends the
    others; its error is among the results."""
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.SimpleQueue()
    pc = torch.multiprocessing.start_processes(check_worker, nprocs=world, start_method="spawn", join=False,
                                               args=(world, free_port(), jobs, results, dtype))
    out, end = [], time.time() + timeout
    try:
        while True:
            while not results.empty():
                out.append(results.get())
            if pc.join(timeout=0.05):
                break
            if time.time() > end:
                raise RuntimeError("the ranks did not finish within %d s" % timeout)
    except Exception as e:
        for p in pc.processes:
            if p.is_alive():
                p.kill()
        out.append(("?", -1, "error: %s" % e, None))
    while not results.empty():
        out.append(results.get())
    return out


def spawn_ranks(worker, world, args):
    """Spawns world ranks of worker(rank, world, port, *args, results) and returns the one result
    rank 0 puts on results, read while the ranks run (the logits are more than a pipe holds). A
    rank that fails ends the others: join raises with its error."""
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.SimpleQueue()
    pc = torch.multiprocessing.start_processes(worker, nprocs=world, start_method="spawn", join=False,
                                               args=(world, free_port()) + tuple(args) + (results,))
    got = None
    while not pc.join(timeout=0.1):
        if got is None and not results.empty():
            got = results.get()
    return results.get() if got is None else got


def free_port():
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == os.path.realpath(path) for line in f)


@contextlib.contextmanager
def tpfs_mount(tpfs, src, tp, *extra):
    """Mounts src with tpfs (in the foreground, in a child process); yields the mount point."""
    mnt = tempfile.mkdtemp(prefix="tpfs-tp-")
    p = subprocess.Popen([tpfs, "mount", src, mnt, "--tp", str(tp), "-f", *extra], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        end = time.time() + 60
        while not mounted(mnt):
            if p.poll() is not None:
                raise RuntimeError("tpfs mount failed: " + p.stderr.read())
            if time.time() > end:
                raise RuntimeError("tpfs did not mount within 60 s")
            time.sleep(0.05)
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=30)
        if p.poll() is None:
            p.kill()
            p.wait()
        with contextlib.suppress(OSError):
            os.rmdir(mnt)


# ---- the families of tests/py/realmodel.py ----

def realmodel():
    """tests/py/realmodel.py as a module (tests/py, relative to this file, appended to sys.path),
    or None where this script runs outside a tpfs checkout."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "py")
    if not os.path.isfile(os.path.join(here, "realmodel.py")):
        return None
    if os.path.realpath(here) not in map(os.path.realpath, sys.path):
        sys.path.append(here)
    import realmodel as RM
    return RM


def _realmodel_worker(rank, world, port, mnt, src, family, prompt, n, results):
    """Rank `rank` of a realmodel family: loads MNT/rank{rank} under the rank's local config, adds
    the family's TP hooks, decodes n tokens greedily (every rank runs every step; the hooks'
    collectives meet), and rank 0 puts (tokens, each step's logits) on results."""
    RM = realmodel()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    fam = RM.FAMILIES[family]
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    model = RM.load(fam, os.path.join(mnt, "rank%d" % rank), RM.local_config(fam, cfg, world, rank))
    RM.tp_patch(fam, model, world, rank)
    logits = []

    def step(ids):
        with torch.no_grad():
            out = RM.logits(fam, model, torch.tensor([ids]))[0].cpu()
        logits.append(out)
        return out
    toks = greedy(step, prompt, n)
    if rank == 0:
        results.put((toks, [x.numpy() for x in logits]))
    finish()


def _run_realmodel(a, RM, tmp):
    """--family F of realmodel.FAMILIES: (model label, model_type, prompt, unsplit tokens, TP tokens,
    unsplit step logits, TP step logits as numpy), as main prints them."""
    fam = RM.FAMILIES[a.family]
    src = a.src or os.path.join(tmp, a.family)
    if not a.src:
        RM.build(a.family, src)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    vocab = RM.text_of(cfg)["vocab_size"]
    # ids 0..2 are pad, bos and eos in realmodel's configs
    prompt = [int(x) for x in torch.randint(3, vocab, (6,), generator=torch.Generator().manual_seed(1))]
    full = RM.load(fam, src, cfg)
    ref = []

    def step(ids):
        with torch.no_grad():
            out = RM.logits(fam, full, torch.tensor([ids]))[0]
        ref.append(out)
        return out
    want = greedy(step, prompt, a.tokens)
    with tpfs_mount(a.tpfs, src, a.tp, *(["--plan", a.plan] if a.plan else [])) as mnt:
        got = spawn_ranks(_realmodel_worker, a.tp, (mnt, src, a.family, prompt, a.tokens))
    kind = "%s; tests/py/realmodel.py, %s" % (cfg.get("model_type"), str(RM.DTYPE()).split(".")[-1])
    return a.family if not a.src else src, kind, prompt, want, got[0], ref, got[1]


def main():
    RM = realmodel()
    extra = sorted(set(RM.FAMILIES) - set(FAMILIES)) if RM else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="llama", choices=sorted(set(FAMILIES) | set(extra)), metavar="F",
                    help="the model family (default llama): one of this script's FAMILIES (%s), run with "
                         "from_pretrained and the four additions; or one of tests/py/realmodel.py's FAMILIES "
                         "(%s), run with realmodel's config, strict loading and TP hooks, in float64"
                    % (", ".join(sorted(FAMILIES)), ", ".join(extra) or "not found"))
    ap.add_argument("--realmodel", action="store_true",
                    help="run a family of both tables realmodel's way (its tiny model gives varied tokens where "
                         "this script's own may repeat one)")
    ap.add_argument("--src", help="an existing checkpoint folder (default: a tiny random one of --family)")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--plan", help="a plan for tpfs mount (--plan NAME|FILE)")
    ap.add_argument("--tpfs", default=os.environ.get("TPFS_BIN") or shutil.which("tpfs") or "build/src/tpfs")
    a = ap.parse_args()
    if a.tokens < 1:
        ap.error("--tokens: at least 1")
    if a.realmodel and not (RM and a.family in RM.FAMILIES):
        ap.error("--realmodel: %s is not a family of tests/py/realmodel.py" % a.family)
    if a.realmodel:
        extra.append(a.family)
    if a.family in extra and a.tp not in RM.FAMILIES[a.family]["ts"]:
        ap.error("tests/py/realmodel.py proves %s at T in %s, not %d" % (a.family, RM.FAMILIES[a.family]["ts"], a.tp))
    tmp = tempfile.mkdtemp(prefix="tpfs-example-")
    try:
        if a.family in extra:
            return report(a.tp, *_run_realmodel(a, RM, tmp))
        src = a.src or make_checkpoint(a.family, os.path.join(tmp, a.family))
        with open(os.path.join(src, "config.json")) as f:
            cfg = json.load(f)
        vocab = cfg.get("text_config", cfg).get("vocab_size", cfg.get("vocab_size"))
        prompt = [int(x) for x in torch.randint(0, vocab, (6,), generator=torch.Generator().manual_seed(1))]
        full, _ = load_rank(src)

        ref = []

        def step(ids):
            with torch.no_grad():
                out = full(torch.tensor([ids]), use_cache=False).logits[0].float()
            ref.append(out)
            return out
        want = greedy(step, prompt, a.tokens)
        with tpfs_mount(a.tpfs, src, a.tp, *(["--plan", a.plan] if a.plan else [])) as mnt:
            got, tp = spawn_ranks(_example_worker, a.tp, (mnt, vocab, prompt, a.tokens))
        return report(a.tp, a.family if not a.src else src, cfg.get("model_type"), prompt, want, got, ref, tp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(T, label, model_type, prompt, want, got, ref, tp):
    """Prints the run's lines; returns 0 when the TP tokens are the unsplit ones, else 1. ref, tp:
    each step's logits (tensors, numpy arrays) of the unsplit model and of the ranks."""
    # every step's logits of every position, where both ran on the same prefix (the tokens agreed so far)
    same = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), len(want))
    worst = max(float((torch.from_numpy(t) - r).abs().max() / r.abs().max())
                for t, r in zip(tp[:same + 1], ref[:same + 1]))
    print("model:              %s (%s)" % (label, model_type))
    print("prompt:             %s" % prompt)
    print("unsplit next tokens: %s" % want)
    print("TP=%d next tokens:   %s" % (T, got))
    print("worst relative logit difference: %.2e (over %d steps, every position; relative to the largest logit)"
          % (worst, min(same + 1, len(want))))
    print("same" if got == want else "DIFFERENT")
    return 0 if got == want else 1


if __name__ == "__main__":
    sys.exit(main())
