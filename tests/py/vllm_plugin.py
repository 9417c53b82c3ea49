"""vLLM hooks of the vLLM tests, loaded in every vLLM process (vllm_check.py installs this file as the
general plugin `tpfs_vllm_probe`, entry point group vllm.general_plugins, so that vLLM's spawned
workers load it too; vllm_probe.py imports it directly).

- impersonate_cuda_dsa(): lets the CPU platform build DSA models as vLLM on CUDA builds them.
- impersonate_nvfp4_emulation(): lets the CPU platform build ModelOpt NVFP4 linears (vLLM's emulation kernel).
- impersonate_fp8_block_torch(): lets the CPU platform build FP8 block checkpoints without AMX (vLLM's torch
  fallback kernel and Triton experts).
- impersonate_mxfp4_emulation(): lets the CPU platform build gpt-oss's MXFP4 experts without AMX (vLLM's OCP MX
  emulation backend).
- impersonate_olmo_hybrid(): lets the CPU platform build OLMo hybrid's Gated DeltaNet layers (a stand-in
  for Triton's allocator hook, which the CPU build of Triton lacks), and gives vLLM 0.32's default loader
  the one-line fix of vllm-project/vllm#55858 (open), without which it loads no OLMo hybrid checkpoint.
- register(): the plugin's entry point. With TPFS_VLLM_KEYS=DIR it wraps the loaders' load_weights so
  that each worker writes to DIR a digest of the weights each loader leaves (after load_weights,
  before process_weights_after_loading). (The key set is the probe's, vllm_probe.py.)
"""
import json
import os


def impersonate_cuda_dsa():
    """Lets vLLM's CPU platform CONSTRUCT a DSA model (DeepSeek-V3.2, GLM-5, GLM-5.3) as vLLM on CUDA
    builds it, so that its key set and what each loader puts into it can be probed (it cannot run:
    its forward needs CUDA kernels). The changes, nothing else: the CPU platform, asked for a sparse
    MLA backend (which it refuses), answers with its reference MLA backend, CPU_MLA (the backend picks
    MLAAttention's impl, which is no module: the parameters are those CUDA builds; not AMX_MLA, which
    it prefers where the CPU has AMX tiles: that impl refuses the sparse layer's topk_indices_buffer);
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
            from vllm.v1.attention.backends.registry import AttentionBackendEnum
            attn_selector_config = attn_selector_config._replace(use_sparse=False)
            selected_backend = AttentionBackendEnum.CPU_MLA
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


def impersonate_nvfp4_emulation():
    """Lets vLLM's CPU platform build a ModelOpt NVFP4 linear: vLLM 0.32 lists no NVFP4 GEMM kernel for the
    CPU platform (kernels/linear/__init__.py _POSSIBLE_NVFP4_KERNELS), so init_nvfp4_linear_kernel fails
    while the model is built, for every loader. The one change: the CPU platform's list gets vLLM's own
    EmulationNvFp4LinearKernel (dequantize, then a BF16 matmul), the fallback every other platform lists.
    The parameters the layer creates and its loaders fill do not depend on the kernel (ModelOptLinearMethod's
    scheme creates them); the kernel's processing is vLLM's own. Likewise for the experts, below."""
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.platforms import PlatformEnum
    have = linear._POSSIBLE_NVFP4_KERNELS.setdefault(PlatformEnum.CPU, [])
    if EmulationNvFp4LinearKernel not in have:
        have.append(EmulationNvFp4LinearKernel)
    # the experts: vLLM's NVFP4 MoE emulation backend (its last fallback) says it supports only CUDA and XPU
    # devices (TritonExperts._supports_current_device); on CPU it is let build (its forward needs Triton: no run)
    from vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe import (
        Nvfp4QuantizationEmulationTritonExperts as experts)
    experts._supports_current_device = staticmethod(lambda: True)


def impersonate_fp8_block_torch():
    """Lets vLLM's CPU platform build FP8 128x128-block checkpoints on a CPU without AMX: its CPU FP8 block linear
    (kernels/linear/scaled_mm/cpu.py CPUFp8BlockScaledMMKernel) and FP8 MoE (CPUExpertsFp8) take only CPUs with
    AMX tiles, so without AMX init_fp8_linear_kernel finds no kernel and the model cannot be built, by either
    loader. The changes: the CPU platform's block-kernel list gets vLLM's own torch fallback
    (BlockWiseTorchFP8ScaledMMLinearKernel, which CUDA and XPU list last), let build on CPU, and vLLM's Triton
    experts are let build on CPU (the FP8 MoE oracle's TRITON backend, as CUDA takes it). The parameters the layers
    create and the loaders fill do not depend on the kernel (Fp8LinearMethod / Fp8MoEMethod.create_weights); the
    processing is that kernel's and backend's own, the same for both loaders; no forward (torch._scaled_mm's block
    path and Triton need a GPU)."""
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.scaled_mm.pytorch import BlockWiseTorchFP8ScaledMMLinearKernel as k
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
    from vllm.platforms import PlatformEnum
    have = linear._POSSIBLE_FP8_BLOCK_KERNELS.setdefault(PlatformEnum.CPU, [])
    if k not in have:
        have.append(k)
    k.is_supported = classmethod(lambda cls, compute_capability=None: (True, None))
    TritonExperts._supports_current_device = staticmethod(lambda: True)


def impersonate_mxfp4_emulation():
    """Lets vLLM's CPU platform build gpt-oss's MXFP4 experts on a CPU without AMX: vLLM 0.32's CPU MXFP4 MoE
    backend (fused_moe/experts/cpu_moe.py CPUExpertsMxfp4) takes only CPUs with AMX tiles, and its last fallback,
    the OCP MX emulation backend (experts/ocp_mx_emulation_moe.py: dequantize, then Triton's MoE), says it needs
    the amd-quark package (for MXFP6 only: its MXFP4 dequantization is vLLM's own mxfp4_utils) and a CUDA or XPU
    device, so the model cannot be built, by either loader. The two changes: that backend is let build on CPU
    without amd-quark. The parameters the layer creates and the loaders fill do not depend on the backend
    (Mxfp4MoEMethod.create_weights); its processing (oracle/mxfp4.py, EMULATION: the weights kept as loaded) is
    vLLM's own; its forward needs Triton (no run)."""
    from vllm.model_executor.layers.fused_moe.experts import ocp_mx_emulation_moe as m
    m.has_quark = lambda: True
    m.OCP_MXQuantizationEmulationTritonExperts._supports_current_device = staticmethod(lambda: True)


def impersonate_olmo_hybrid():
    """Two changes to vLLM's layers/mamba/gdn/olmo_gdn_linear_attn.py, so that both loaders can be compared:
    1. a STAND-IN: OlmoHybridGatedDeltaNetAttention's __init__ calls set_triton_allocator(device), which
       calls triton.set_allocator, and vLLM's CPU install has no Triton with it (AttributeError: module
       'triton' has no attribute 'set_allocator'), so the model cannot be built for any loader: the
       module's set_triton_allocator does nothing. It only names where Triton kernels take scratch
       memory; the parameters and their loaders do not depend on it. The layer's forward needs Triton's
       FLA kernels, so such a model is built and loaded, never run.
    2. a FIX of vLLM's default loader, as vllm-project/vllm#55858 (open) makes it: the fused conv1d's
       weight loader (_make_fused_conv1d_weight_loader) reads its shard id from an argument
       AutoWeightsLoader never passes (WeightsMapper sets it on the tensor, loaded_weight.shard_id, which
       the merged linear loaders read), so vLLM 0.32's default loader fails on every OLMo hybrid
       checkpoint ("list indices must be integers or slices, not NoneType"); here the loader takes the
       tensor's shard id when the argument is missing, and is otherwise vLLM's own. The sharded_state
       loader calls no weight loader, so the view is read by vLLM 0.32 as it ships."""
    from vllm.model_executor.layers.mamba.gdn import olmo_gdn_linear_attn as gdn
    gdn.set_triton_allocator = lambda device: None
    if getattr(gdn, "_tpfs_fixed", False):
        return
    orig = gdn._make_fused_conv1d_weight_loader

    def fused_conv1d_weight_loader(dims, tp_size, tp_rank):
        inner = orig(dims, tp_size, tp_rank)

        def weight_loader(param, loaded_weight, loaded_shard_id=None):
            if loaded_shard_id is None:
                loaded_shard_id = getattr(loaded_weight, "shard_id", None)
            return inner(param, loaded_weight, loaded_shard_id)
        return weight_loader
    gdn._make_fused_conv1d_weight_loader = fused_conv1d_weight_loader
    gdn._tpfs_fixed = True


def register():
    d = os.environ.get("TPFS_VLLM_KEYS")
    if not d:
        return
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader
    if getattr(ShardedStateLoader, "_tpfs_probe", False):
        return
    ShardedStateLoader._tpfs_probe = True

    def dump(model):
        """weights-rank{rank}.json: a digest of each tensor of _filter_subtensors(model.state_dict())."""
        import hashlib
        import torch
        from vllm.distributed import get_tensor_model_parallel_rank
        sd = ShardedStateLoader._filter_subtensors(model.state_dict())
        out = {k: hashlib.sha1(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
               .hexdigest() for k, t in sd.items()}
        # the folder of the job now running: a process that runs several jobs (vllm_check.py's, with the
        # engine core and a TP=1 model in it) loads this plugin once, for the first
        path = os.path.join(os.environ.get("TPFS_VLLM_KEYS") or d, "weights-rank%d.json" % get_tensor_model_parallel_rank())
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(path + ".tmp", path)

    for cls in (ShardedStateLoader, DefaultModelLoader):  # the weights each leaves, before processing packs them
        def wrapped(self, model, model_config, inner=cls.load_weights):
            r = inner(self, model, model_config)
            dump(model)
            return r
        cls.load_weights = wrapped
