"""The hooks that turn a local-size transformers model into one rank of a tensor-parallel forward.

Owned here: tp_patch, the generic hooks every family gets (vocab-parallel embedding and lm_head, row-parallel
outputs summed over ranks with their bias added once, fused experts summed, norms over all heads with their
variance all-reduced); each family's own hooks, which the registry (families.py) names in its rows (patch=: a
mixer's gated norm over all heads, row-parallel modules under other names, ...; output=: what a tower without a
head is compared by); the patches to transformers' model code some families need to be built at a rank's
counts (qwen2_vl_patches); and DTYPE, the dtype of every forward. Knows no family by name: the table decides.
"""
import os


def rows(*leaves):
    """A patch= hook: the Linear modules whose last name is one of leaves are row-parallel (their
    input is the rank's slice; the output is summed over ranks and the bias added once), for the
    families that name their output projections otherwise (StarCoder2's c_proj, Phi's dense and fc2)."""
    def patch(model, T, r, allsum):
        import torch.nn.functional as F
        from torch import nn
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in leaves:
                def row(x, mod=mod):
                    y = allsum(F.linear(x, mod.weight))
                    return y + mod.bias if mod.bias is not None else y
                mod.forward = row
    return patch


def gathered_qk_norms(model, T, r, allsum):
    """OLMoE: q_norm [hidden_size] and k_norm [(hidden_size / H) * KV] are whole on every rank (the model
    code sizes them so): gather q (k) from every rank, normalize the whole, keep this rank's slice."""
    import torch
    import torch.distributed as dist
    for name, mod in model.named_modules():
        if name.rsplit(".", 1)[-1] in ("q_norm", "k_norm"):
            orig = mod.forward

            def gathered(x, orig=orig):
                x = x.contiguous()
                parts = [torch.empty_like(x) for _ in range(T)]
                dist.all_gather(parts, x)
                w = x.shape[-1]
                return orig(torch.cat(parts, dim=-1))[..., r * w:(r + 1) * w]
            mod.forward = gathered


def longcat_identity_once(model, T, r, allsum):
    """LongCat-Flash: the zero-computation experts return their (replicated) input times the routing weight
    inside the experts module, whose output is all-reduced: only rank 0 adds that share."""
    import torch
    for name, mod in model.named_modules():
        if name.endswith("experts.identity_expert") and r != 0:
            mod.forward = lambda x: torch.zeros_like(x)


def dsv4_rows(model, T, r, allsum):
    """DeepSeek-V4: the grouped output projection's o_b_proj is row-parallel over the rank's groups; the
    embedding and head are whole, so the generic vocab-parallel hooks are undone."""
    import torch.nn.functional as F
    for name, mod in model.named_modules():
        if name.endswith("self_attn.o_b_proj"):
            mod.forward = lambda x, mod=mod: allsum(F.linear(x, mod.weight))
        elif name.endswith(("embed_tokens", "lm_head")) and "forward" in mod.__dict__:
            del mod.forward  # whole vocabulary on every rank (the hash router's tid2eid needs it): the plain forward


def lightning_norm(model, T, r, allsum):
    """MiniMax-Text-01's lightning attention: self_attn.norm normalizes over all heads; each rank holds its
    heads' channels, so the sum of squares and the count are all-reduced (the final model.norm is whole)."""
    import torch
    for name, mod in model.named_modules():
        if name.endswith("self_attn.norm"):
            w, eps = mod.weight.shape[0], mod.variance_epsilon

            def gnorm(x, mod=mod, w=w, eps=eps):  # in float32, as MiniMaxRMSNorm
                x32 = x.to(torch.float32)
                ss = allsum(x32.pow(2).sum(-1, keepdim=True))
                n = allsum(torch.tensor([float(w)]))
                return mod.weight * (x32 * torch.rsqrt(ss / n + eps)).to(x.dtype)
            mod.forward = gnorm


def granite_shared_rows(model, T, r, allsum):
    """Granite MoE's shared MLP: output_linear is row-parallel (the generic hooks know it as down_proj only)."""
    import torch.nn.functional as F
    for name, mod in model.named_modules():
        if name.endswith("shared_mlp.output_linear"):
            mod.forward = lambda x, mod=mod: allsum(F.linear(x, mod.weight))


def attention_head_dim_from_config(module_name, cls_name):
    """Qwen2-VL's, Qwen2.5-VL's and GLM-4.1V's text attention derive head_dim as hidden_size / num_attention_heads, which at a
    rank's head count (4 of 8) is twice the width of the rank's heads; their rotary embedding already honours
    config.head_dim. A tensor-parallel engine keeps the global width (vLLM: hidden_size / total heads), and a rank's
    config.json states it (head_dim, tpfs's per-rank value). So that the local-size model is built from the
    rank's config.json as it is, the attention takes config.head_dim where the config has one and it differs (the
    unsplit model's config has none: unchanged); the projections are rebuilt at that width, the rest is the
    model code."""
    import importlib
    from torch import nn
    cls = getattr(importlib.import_module(module_name), cls_name)
    if getattr(cls, "_tpfs_head_dim", False):
        return
    orig = cls.__init__

    def init(self, config, layer_idx=None):
        orig(self, config, layer_idx)
        hd = getattr(config, "head_dim", None)
        if hd and hd != self.head_dim:
            self.head_dim, self.scaling = hd, hd ** -0.5
            H, KV, Dm = self.num_heads, self.num_key_value_heads, self.hidden_size
            self.q_proj = nn.Linear(Dm, H * hd, bias=True)
            self.k_proj = nn.Linear(Dm, KV * hd, bias=True)
            self.v_proj = nn.Linear(Dm, KV * hd, bias=True)
            self.o_proj = nn.Linear(H * hd, Dm, bias=False)
    cls.__init__ = init
    cls._tpfs_head_dim = True


def qwen2_vl_patches():
    attention_head_dim_from_config("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLAttention")
    attention_head_dim_from_config("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLAttention")
    attention_head_dim_from_config("transformers.models.glm4v.modeling_glm4v", "Glm4vTextAttention")


# Mamba2 hybrids (plan mamba2). The rank's Mamba2 mixer is the model code's at the rank's head and group counts;
# the hooks a TP engine adds: the vocab-parallel embedding under Nemotron-H's name (backbone.embeddings), the
# gated norm's mean square reduced over the ranks that share a group when the checkpoint has fewer groups than
# ranks (the local model holds one group, a 1/(T/G) slice of it), the row-parallel outputs (out_proj, o_proj,
# down_proj) summed by tp_patch.
def vocab_parallel(mod, r, allsum):
    n = mod.weight.shape[0]
    orig = mod.forward

    def emb(ids, orig=orig, n=n):
        loc = ids - r * n
        miss = (loc < 0) | (loc >= n)
        return allsum(orig(loc.masked_fill(miss, 0)).masked_fill(miss[..., None], 0.0))
    mod.forward = emb


def gated_norm_over_ranks(mod, G, T, r, allsum):
    """A Mamba2 gated RMSNorm (norm(x * silu(gate)) in groups) whose G global groups are fewer than T ranks: rank r
    holds a slice of group floor(r / (T / G)); the group's mean square is the sum over its ranks' slices."""
    import torch
    import torch.nn.functional as F
    n_loc = mod.weight.shape[0]
    g = r // (T // G)

    before = getattr(mod, "norm_before_gate", False)  # Falcon-H1: norm(x) * silu(gate)

    def fwd(x, gate=None, mod=mod):
        dt = x.dtype
        x = x.to(torch.float32)
        if gate is not None and not before:
            x = x * F.silu(gate.to(torch.float32))
        part = torch.zeros(*x.shape[:-1], G, dtype=x.dtype)
        part[..., g] = x.pow(2).sum(-1)
        ms = allsum(part)[..., g:g + 1] / (n_loc * (T // G))
        if before:
            y = mod.weight * (x * torch.rsqrt(ms + mod.variance_epsilon))
            return (y * F.silu(gate.to(torch.float32)) if gate is not None else y).to(dt)
        return mod.weight * (x * torch.rsqrt(ms + mod.variance_epsilon)).to(dt)
    mod.forward = fwd


def mamba2_patch(G):
    """The family's TP hook; G: the checkpoint's (global) number of SSM groups."""
    def patch(model, T, r, allsum):
        from torch import nn
        for name, mod in model.named_modules():
            if name.endswith("embeddings") and isinstance(mod, nn.Embedding):
                vocab_parallel(mod, r, allsum)
            elif type(mod).__name__.endswith("RMSNormGated") and G < T:
                gated_norm_over_ranks(mod, G, T, r, allsum)
    return patch


def granite_hybrid_patch(G):
    """Granite 4.0: the Mamba2 hooks, and its experts' and shared MLP's row-parallel output_linear summed over ranks."""
    base = mamba2_patch(G)

    def patch(model, T, r, allsum):
        base(model, T, r, allsum)
        for name, mod in model.named_modules():
            if name.endswith(("block_sparse_moe.output_linear", "shared_mlp.output_linear")):
                mod.register_forward_hook(lambda m, a, out: allsum(out))
    return patch


# Jamba: Mamba v1 mixers split by channel; x_proj's partial sums reduced before dt/B/C (the hook), out_proj by tp_patch
def jamba_patch(model, T, r, allsum):
    for name, mod in model.named_modules():
        if name.endswith("mamba.x_proj"):
            mod.register_forward_hook(lambda m, a, out: allsum(out))


def lfm_conv_whole(model, T, r, allsum):
    """LFM2 / LFM3: the short-conv blocks are whole on every rank (the model code sizes them by hidden_size), so
    their out_proj is not row-parallel: the generic out_proj hook is undone there (the attention's stays)."""
    for name, mod in model.named_modules():
        if name.endswith("conv.out_proj") and "forward" in mod.__dict__:
            del mod.forward


def hidden(model, ids):
    return model(input_ids=ids).last_hidden_state


def encoder_hidden(model, ids):
    """DeepSeek-OCR-2's encoder takes embeddings, not ids: 16 positions of embeddings drawn from a generator
    seeded by the ids, the first 8 patches (bidirectional among themselves), the rest causal queries."""
    import torch
    g = torch.Generator().manual_seed(int(ids.sum()))
    x = torch.randn(ids.shape[0], ids.shape[1], model.config.hidden_size, generator=g).to(DTYPE())
    return model(inputs_embeds=x, num_patches=8).last_hidden_state


def tp_patch(fam, model, T, r):
    """Makes `model` (rank r's local-size model) one rank of a tensor-parallel forward: the
    vocab-parallel embedding sums its rows over ranks, lm_head's vocab slices are gathered, every
    row-parallel output (o_proj, down_proj, out_proj, fused experts) is summed over ranks with its
    bias added once, and the norms named in global_norms reduce their variance over all ranks."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    def allsum(t):
        dist.all_reduce(t)
        return t

    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if ".visual" in name or "vision" in name:
            continue
        if isinstance(mod, nn.Embedding) and leaf == "embed_tokens":
            n = mod.weight.shape[0]
            orig = mod.forward

            def emb(ids, orig=orig, n=n):
                loc = ids - r * n
                miss = (loc < 0) | (loc >= n)
                out = orig(loc.masked_fill(miss, 0))
                return allsum(out.masked_fill(miss[..., None], 0.0))
            mod.forward = emb
        elif name.endswith("lm_head") and isinstance(mod, nn.Linear):
            orig = mod.forward

            def head(x, orig=orig):
                y = orig(x).contiguous()
                parts = [torch.empty_like(y) for _ in range(T)]
                dist.all_gather(parts, y)
                return torch.cat(parts, dim=-1)
            mod.forward = head
        elif isinstance(mod, nn.Linear) and leaf in ("o_proj", "down_proj", "out_proj", "w2"):
            def row(x, mod=mod):
                y = allsum(F.linear(x, mod.weight))
                return y + mod.bias if mod.bias is not None else y
            mod.forward = row
        elif leaf == "experts" and not isinstance(mod, nn.ModuleList):
            for b in fam["rank0_bias"]:
                if r != 0:
                    getattr(mod, b).data.zero_()
            mod.register_forward_hook(lambda m, a, out: allsum(out))
        elif leaf in fam["global_norms"]:
            w = mod.weight.shape[0]
            eps = mod.variance_epsilon

            def gnorm(x, mod=mod, w=w, eps=eps):
                x32 = x.float()
                ss = allsum(x32.pow(2).sum(-1, keepdim=True))
                n = allsum(torch.tensor([float(w)]))
                return mod.weight * (x32 * torch.rsqrt(ss / n + eps)).to(x.dtype)
            mod.forward = gnorm
    if fam["patch"]:
        fam["patch"](model, T, r, allsum)
    return model


def DTYPE():
    """The dtype of every forward: float64, so that the check measures the split, not float32's rounding
    (TPFS_REAL_DTYPE=float32 runs it in float32 instead, for comparison)."""
    import torch
    return getattr(torch, os.environ.get("TPFS_REAL_DTYPE", "float64"))
