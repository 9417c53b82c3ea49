"""Tiny random checkpoints written by the real transformers model code, one per architecture family,
and what a tensor-parallel rank of each looks like to that code.

Owned here, the machinery: building and saving a family's checkpoint (`save_pretrained` with a small
max_shard_size, so the index is used; fixed seeds; the published forms: an MTP layer, MXFP4 experts, other
config.json forms), loading a folder strictly, and each rank's local config (computed from the rules of the
family, independently of tpfs). The family table is the registry's (families.py: FAMILIES, re-exported here);
the hooks that turn a local-size model into one rank of a tensor-parallel forward over torch.distributed are
realmodel_hooks.py's (tp_patch and DTYPE, re-exported here). test_real_models.py, test_rank_folders.py (through
scripts/tp_example.py) and scripts/coverage.py use this module.
"""
import copy
import json
import os

from families import D, FAMILIES, I, IM, V  # noqa: F401 (the table and its sizes, for this module's users)
from realmodel_hooks import DTYPE, qwen2_vl_patches, tp_patch  # noqa: F401 (tp_patch: for this module's users)

qwen2_vl_patches()  # the VL families' attention takes a rank's head_dim (realmodel_hooks.py says why)


def model_class(fam):
    """The model class fam["model_cls"] names (see family)."""
    import importlib
    import transformers
    mod, _, cls = fam["model_cls"].rpartition(":")
    return getattr(importlib.import_module("transformers.models." + mod) if mod else transformers, cls)


def logits(fam, model, ids):
    """The logits of token ids: the model's forward, or that of the submodule forward_via names (a
    wrapper whose text-only forward transformers cannot run: Llama4ForConditionalGeneration's returns
    through image outputs its language model does not have; the wrapper calls the same submodule)."""
    m = getattr(model, fam["forward_via"]) if fam["forward_via"] else model
    if fam["output"]:
        return fam["output"](m, ids)
    return m(input_ids=ids).logits


def text_of(cfg):
    return cfg.get("text_config") or cfg


def _get(d, path):
    for k in path.split("."):
        d = d[k]
    return d


def _set(d, path, v):
    ks = path.split(".")
    for k in ks[:-1]:
        d = d[k]
    d[ks[-1]] = v


def _has(d, path):
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return False
        d = d[k]
    return True


def local_count(n, T, r, kind):
    """Rank r's share of n units (tp-rules.md section 1): even, uneven (first n % T ranks one more),
    groups (one unit per rank when n < T)."""
    if kind == "groups" and n < T:
        assert T % n == 0, (n, T)
        return 1
    if kind == "uneven":
        return n // T + (1 if r < n % T else 0)
    assert n % T == 0, (n, T, kind)
    return n // T


def local_config(fam, cfg, T, r):
    """The config.json dict of rank r of T: the per-rank keys replaced by the rank's counts."""
    out = copy.deepcopy(cfg)
    text = "text_config." if "text_config" in cfg else ""
    t = text_of(out)
    if not t.get("head_dim") and "kv_lora_rank" not in t:  # the head width, implied by the global head count
        t["head_dim"] = t["hidden_size"] // t["num_attention_heads"]
    paths = [p for p, _ in fam["per_rank"]]
    if "linear_attn_config" in text_of(cfg):
        paths = [p.replace("linear_num_heads", "linear_attn_config.num_heads") for p in paths]
    for (path, kind) in zip(paths, [k for _, k in fam["per_rank"]]):
        if not _has(cfg, path):
            continue
        if kind.startswith("same_as:"):
            _set(out, path, _get(out, text + kind[8:]))
        else:
            _set(out, path, local_count(_get(cfg, path), T, r, kind))
    if text + "vocab_size" not in paths:  # a family that lists it keeps the vocabulary whole (deepseek_v4)
        _set(out, text + "vocab_size", local_count(_get(cfg, text + "vocab_size"), T, r, "even"))
    return out


def build(name, out_dir, seed=0):
    """Writes family `name`'s tiny checkpoint to out_dir (several files and an index); returns config.json's dict."""
    import torch
    import transformers
    fam = FAMILIES[name]
    torch.manual_seed(seed)
    cfg = getattr(transformers, fam["cfg_cls"])(**copy.deepcopy(fam["cfg"]))
    model = model_class(fam)(cfg).eval()
    with torch.no_grad():  # make the tiny model's numbers of a useful size: weights ~ 1/sqrt(fan-in), norms ~ 1
        g = torch.Generator().manual_seed(seed + 1)
        for n, p in model.named_parameters():
            if n.endswith("sinks"):  # attention sinks: one logit per head, of the size of attention scores
                p.copy_(2.0 * torch.randn(p.shape, generator=g, dtype=torch.float32))
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) / (p.shape[-1] ** 0.5))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float32))
    model.save_pretrained(out_dir, max_shard_size="64KB")
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        c = json.load(f)
    if fam["mxfp4"]:
        _to_mxfp4(out_dir, c, seed)
    if fam["mtp"]:
        _add_mtp(out_dir, c)
    if fam["config_json"]:
        fam["config_json"](c)
        with open(path, "w") as f:
            json.dump(c, f, indent=1)
    return c


def mtp_prefix(cfg):
    """Where DeepSeek-style checkpoints keep their MTP layer: layers.{num_hidden_layers}."""
    t = text_of(cfg)
    return ("model.language_model." if "text_config" in cfg else "model.") + "layers.%d." % t["num_hidden_layers"]


def _add_mtp(out_dir, c):
    """Appends a DeepSeek-style MTP layer at layers.{num_hidden_layers} (transformers does not build or
    run it: it ignores these tensors on load): a copy of the last decoder layer (MLA attention, MoE) plus
    eh_proj [D, 2D], enorm, hnorm, shared_head.norm [D], shared_head.head and embed_tokens [V, D]. The
    copy lets the test require each MTP tensor on each rank to equal the same rank's tensor of the copied,
    numerically proven layer."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    t = text_of(c)
    last = mtp_prefix(c).replace("layers.%d." % t["num_hidden_layers"], "layers.%d." % (t["num_hidden_layers"] - 1))
    ipath = os.path.join(out_dir, "model.safetensors.index.json")
    with open(ipath) as f:
        idx = json.load(f)
    wm = idx["weight_map"]
    out = {}
    for k, fn in sorted(wm.items()):
        if k.startswith(last):
            out[mtp_prefix(c) + k[len(last):]] = load_file(os.path.join(out_dir, fn))[k]
    rng = np.random.default_rng(11)
    Dm, Vm = t["hidden_size"], t["vocab_size"]
    for k, shape in (("eh_proj.weight", (Dm, 2 * Dm)), ("enorm.weight", (Dm,)), ("hnorm.weight", (Dm,)),
                     ("shared_head.norm.weight", (Dm,)), ("shared_head.head.weight", (Vm, Dm)),
                     ("embed_tokens.weight", (Vm, Dm))):
        out[mtp_prefix(c) + k] = rng.standard_normal(shape).astype(np.float32)
    save_file(out, os.path.join(out_dir, "model-mtp.safetensors"), metadata={"format": "pt"})
    for k in out:
        wm[k] = "model-mtp.safetensors"
    with open(ipath, "w") as f:
        json.dump(idx, f, indent=1)


def _to_mxfp4(out_dir, c, seed):
    """Rewrites the fused experts of a saved gpt-oss checkpoint as the published MXFP4 layout:
    gate_up_proj [E, D, 2I] becomes gate_up_proj_blocks [E, 2I, D/32, 16] (U8, two FP4 per byte) and
    gate_up_proj_scales [E, 2I, D/32] (U8, E8M0); down_proj [E, I, D] becomes [E, D, I/32, 16] and
    [E, D, I/32]. Random codes (the test compares dequantized models, so any codes do)."""
    import torch
    from safetensors.torch import load_file, save_file
    g = torch.Generator().manual_seed(seed + 7)
    ipath = os.path.join(out_dir, "model.safetensors.index.json")
    with open(ipath) as f:
        idx = json.load(f)
    wm = idx["weight_map"]
    for fn in sorted(set(wm.values())):
        t = load_file(os.path.join(out_dir, fn))
        names = [k for k in t if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
        for k in names:
            E, cols, rows = t.pop(k).shape
            t[k + "_blocks"] = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
            t[k + "_scales"] = torch.randint(122, 128, (E, rows, cols // 32), generator=g, dtype=torch.uint8)
            del wm[k]
            wm[k + "_blocks"] = wm[k + "_scales"] = fn
        if names:
            save_file(t, os.path.join(out_dir, fn), metadata={"format": "pt"})
    with open(ipath, "w") as f:
        json.dump(idx, f, indent=1)
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def _load_mxfp4(fam, path, cfg_dict):
    """Loads an MXFP4 gpt-oss folder the way transformers does without a GPU: every *_blocks / *_scales
    pair dequantized by transformers' own convert_moe_packed_tensors into the BF16 layout, then
    load_state_dict(strict=True) (missing, unexpected or mismatched tensors raise)."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    sd = {}
    for fn in files:
        sd.update(load_file(os.path.join(path, fn)))
    for k in [k for k in sd if k.endswith("_blocks")]:
        base = k[:-len("_blocks")]
        sd[base] = convert_moe_packed_tensors(sd.pop(k), sd.pop(base + "_scales"), dtype=DTYPE())
    torch.set_default_dtype(DTYPE())
    try:
        model = model_class(fam)(config_object(fam, cfg_dict))
    finally:
        torch.set_default_dtype(torch.float32)
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"
    model.load_state_dict({k: v.to(DTYPE()) for k, v in sd.items()}, strict=True)
    return model.eval()


def config_object(fam, cfg_dict):
    import transformers
    d = copy.deepcopy(cfg_dict)
    d.pop("model_type", None)
    d.pop("architectures", None)
    d.pop("transformers_version", None)
    d.pop("quantization_config", None)
    return getattr(transformers, fam["cfg_cls"])(**d)


def load(fam, path, cfg_dict):
    """The model at path under cfg_dict, loaded strictly: raises on any missing, unexpected or mismatched tensor."""
    import torch
    import transformers
    if fam["mxfp4"]:
        return _load_mxfp4(fam, path, cfg_dict)
    cls = model_class(fam)
    model, info = cls.from_pretrained(path, config=config_object(fam, cfg_dict), output_loading_info=True,
                                      dtype=DTYPE(), attn_implementation="eager",
                                      experts_implementation="eager")
    if fam["mtp"]:  # the MTP layer, which transformers neither builds nor runs: checked byte for byte instead
        pre = mtp_prefix(cfg_dict)
        info["unexpected_keys"] = [k for k in info["unexpected_keys"] if not k.startswith(pre)]
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                                          "error_msgs")}
    if bad:
        raise AssertionError("%s: loading %s is not strict: %s" % (fam["name"], path, bad))
    return model.eval()


def input_ids():
    import torch
    g = torch.Generator().manual_seed(1234)
    return torch.randint(3, V, (2, 16), generator=g)


if __name__ == "__main__":  # dump every family's tensors: python realmodel.py OUT_DIR [families]
    import sys
    from safetensors import safe_open
    for nm in sys.argv[2:] or FAMILIES:
        d = os.path.join(sys.argv[1], nm)
        c = build(nm, d)
        print("==", nm, json.dumps({k: v for k, v in text_of(c).items() if not isinstance(v, (dict, list))})[:300])
        idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
        for k in sorted(idx):
            if "visual" in k:
                continue
            with safe_open(os.path.join(d, idx[k]), "pt") as f:
                s = f.get_slice(k)
                print("  ", k, list(s.get_shape()), s.get_dtype())
