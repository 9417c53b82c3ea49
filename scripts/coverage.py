#!/usr/bin/env python3
"""Which transformers families tpfs serves, generated from the model code (docs/COVERAGE.md).

For every configuration class of the installed transformers that declares a `base_model_tp_plan`
(the families transformers itself knows how to split), a tiny model is built from the class's
default configuration with small sizes (hidden 64, 8 heads of 16, 4 experts, ...; where those do
not build: the default sizes with fewer layers, then the default configuration) on the meta
device, so no weight is allocated. Its checkpoint is written header-only: the names, shapes and
dtypes save_pretrained would write (transformers' own tied-weight removal and its reverse key
conversion to the checkpoint layout), the data a sparse hole. Then `tpfs plan --tp 2` and
`--tp 4` are run on it, and each family is one of:

  served    tpfs plans it at T=2 and 4; the numeric test that proves it is named (a family of
            tests/py/families.py, the registry, that tests/py/test_real_models.py runs at T=2 and 4)
  refused   tpfs refuses it by name: an architecture no built-in plan knows, or a tensor a plan
            cannot serve (the first reason is shown)
  error     `tpfs plan` crashed or failed without a clear refusal (a bug)
  not built transformers cannot build the family's default configuration (not a tpfs result)

    python scripts/coverage.py [--tpfs BIN] [--out docs/COVERAGE.md] [--check] [--jobs 2] [FAMILY...]

The vLLM columns: whether vLLM (the venv of `scripts/setup.sh --vllm`, TPFS_VLLM_VENV or
build/venv-vllm; its model registry, vllm/model_executor/models/registry.py) registers the family's
architecture natively or runs it through its Transformers backend (TransformersForCausalLM), and what
`tpfs plan --tp 2` and `--tp 4` with `--view vllm` say: served (and proven by the load-only probe of
tests/py/test_vllm.py, which names the families it probes) or refused, with the reason.

The SGLang columns: whether SGLang (the venv of `scripts/setup.sh --sglang`, TPFS_SGLANG_VENV or
build/venv-sglang; its model registry, sglang/srt/models/registry.py ModelRegistry) registers the family's
architecture natively, or, where not, runs it through its Transformers backend (model_loader/utils.py
resolve_transformers_arch: the transformers class exists and says it is backend-compatible), and what
`tpfs plan --tp 2` and `--tp 4` with `--view sglang` say: served (and proven by tests/py/test_sglang.py,
whose FAMILIES name the families it probes) or refused, with the reason; and, for each family it serves,
what it says at T=2 of the same checkpoint said to be FP8 with 128x128 block scales (the "SGLang FP8" line:
views/sglang/fp8.json refuses them, with the reason from SGLang's code).

--check (CI): also fails when a family is served but no numeric test proves it, when --view vllm
serves a family the vLLM probe does not probe, when --view sglang serves a family test_sglang does
not probe, when any family
is an error, and when the table differs from the committed docs/COVERAGE.md (run without --check
to regenerate it). Nothing is cached: every run builds every family again (about a minute on
two cores).
"""
import argparse
import concurrent.futures
import contextlib
import io
import json
import math
import multiprocessing
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# small sizes, applied to the keys a configuration has (the values divide by 2 and 4; the MLP and expert widths
# by 32 x 4 too, as published widths do: SGLang's CPU path pads other widths, which --view sglang refuses)
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
             vocab_size=256, max_position_embeddings=256, moe_intermediate_size=128,
             shared_expert_intermediate_size=128, num_experts=4, num_local_experts=4, n_routed_experts=4,
             moe_num_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
             kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
             linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16, linear_value_head_dim=16)
LAYERS = 4  # enough for the families that alternate layer kinds every 2 (or are dense for the first)
DTYPE_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
               "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
               "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "complex64": "C64"}
BITS = {"F32": 32, "F16": 16, "BF16": 16, "F64": 64, "I64": 64, "I32": 32, "I16": 16, "I8": 8, "U8": 8, "BOOL": 8,
        "F8_E4M3": 8, "F8_E5M2": 8, "C64": 64}


def families():
    """{model_type: config class} of every configuration class that declares base_model_tp_plan."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    out = {}
    for mt in CONFIG_MAPPING.keys():
        try:
            cls = CONFIG_MAPPING[mt]
        except Exception:  # a class whose module does not import here
            continue
        if getattr(cls, "base_model_tp_plan", None):
            out[mt] = cls
    return out


def proofs():
    """{model_type: test name} of the families tests/py/test_real_models.py proves at T=2 and 4."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
    import realmodel
    import transformers
    out = {}
    for name, fam in realmodel.FAMILIES.items():
        if 2 not in fam["ts"] or 4 not in fam["ts"]:
            continue
        cls = getattr(transformers, fam["cfg_cls"])
        mts = [cls.model_type]
        # a composite proven through its text model proves that text model's family too
        sub = getattr(cls, "sub_configs", {}).get("text_config")
        if sub is not None:
            mts.append(sub.model_type)
        for mt in mts:
            out.setdefault(mt, "test_real_models %s" % name)
    return out


def vllm_registry():
    """(vLLM's version, {architecture: "native" | "Transformers backend"}) from the vLLM venv's model
    registry, or (None, {}) where that venv is not available (setup.sh --vllm wrote why)."""
    venv = os.environ.get("TPFS_VLLM_VENV") or os.path.join(ROOT, "build", "venv-vllm")
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        return None, {}
    code = ("import json, vllm; from vllm.model_executor.models import registry as r; "
            "print(json.dumps([vllm.__version__, sorted(r._VLLM_MODELS), sorted(r._TRANSFORMERS_SUPPORTED_MODELS), "
            "sorted(r._TRANSFORMERS_BACKEND_MODELS)]))")
    p = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("vLLM's model registry could not be read: %s" % p.stderr[-500:])
    version, archs, tb, backend = json.loads(p.stdout.strip().splitlines()[-1])
    out = {a: "native" for a in archs if a not in backend}
    out.update({a: "Transformers backend" for a in tb})
    return version, out


def sglang_registry():
    """(SGLang's version, {architecture: "native" | "Transformers backend"}) from the SGLang venv's model registry
    (every module of sglang.srt.models imported, as SGLang does at its first model load; with tests/py/sglang_site's
    stand-in sgl_kernel, which only lets SGLang import), or (None, {}) where that venv is not available (setup.sh
    --sglang wrote why). An architecture the registry lacks runs through SGLang's Transformers backend where
    transformers has its class and the class says it is backend-compatible (model_loader/utils.py
    resolve_transformers_arch); the names asked for are every model class of that transformers."""
    venv = os.environ.get("TPFS_SGLANG_VENV") or os.path.join(ROOT, "build", "venv-sglang")
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        return None, {}
    code = ("import json, logging, sglang, transformers; logging.disable(logging.WARNING); "
            "from sglang.srt.models.registry import ModelRegistry as R; native = sorted(R.get_supported_archs()); "
            "names = [n for n in dir(transformers) if n.endswith(('ForCausalLM', 'ForConditionalGeneration', 'Model'))]; "
            "tb = []\n"
            "for n in names:\n"
            "    try:\n"
            "        c = getattr(transformers, n)\n"
            "        if n not in native and hasattr(c, 'is_backend_compatible') and c.is_backend_compatible(): tb.append(n)\n"
            "    except Exception: pass\n"
            "print(json.dumps([sglang.__version__, native, sorted(tb)]))")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tests", "py", "sglang_site"), SGLANG_USE_CPU_ENGINE="1",
               SGLANG_NCCL_SO_PATH=os.devnull)
    p = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != 0:
        raise RuntimeError("SGLang's model registry could not be read: %s" % p.stderr[-500:])
    version, native, tb = json.loads(p.stdout.strip().splitlines()[-1])
    out = {a: "Transformers backend" for a in tb}
    out.update({a: "native" for a in native})
    return version, out


def sglang_probed():
    """{model_type: family} of the families tests/py/test_sglang.py proves under --view sglang (its FAMILIES, at
    T=2: SGLang's default loader against sharded_state on the mount)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
    import test_sglang
    import vllm_models
    out = {}
    for fam in test_sglang.FAMILIES:
        cfg = vllm_models.FAMILIES[fam]()
        remote = vllm_models.REMOTE.get(fam)
        text = getattr(cfg, "text_config", None)
        for mt in (remote[0] if remote else cfg.model_type, getattr(text, "model_type", None)):
            if mt:
                out.setdefault(mt, fam)
    return out


def vllm_probed():
    """{model_type: family} of the families tests/py/test_vllm.py proves under --view vllm (its probe)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
    import test_vllm
    import vllm_models
    out = {}
    for fam in test_vllm.FAMILIES:
        cfg = vllm_models.FAMILIES[fam]()
        remote = vllm_models.REMOTE.get(fam)  # made as Llama, retyped after saving (its own configuration class)
        text = getattr(cfg, "text_config", None)
        for mt in (remote[0] if remote else cfg.model_type, getattr(text, "model_type", None)):
            if mt:
                out.setdefault(mt, fam)
    return out


def examined():
    """{family: reason} from docs/ARCHITECTURES.md's table of families examined and not served."""
    out, inside = {}, False
    with open(os.path.join(ROOT, "docs", "ARCHITECTURES.md")) as f:
        for line in f:
            if line.startswith("## "):
                inside = line.startswith("## Families examined and not served")
            elif inside and line.startswith("| ") and not line.startswith(("| family", "| ---")):
                fam, why = [c.strip() for c in line.strip().strip("|").split("|", 1)]
                out[fam] = why
    return out


# Per family, what its configuration must say for the tiny model to build, or to be of a shape its published
# checkpoints have (each built as the model code allows, so that it is classified like the rest), applied to
# every form built: {model_type: function(number of layers) -> overrides}
FILL = {
    # Lfm2MoeConfig.layer_types defaults to None and __post_init__ never derives it (configuration_lfm2_moe.py),
    # while Lfm2MoeDecoderLayer reads config.layer_types[layer_idx]: LFM2's pattern, conv and attention alternating
    "lfm2_moe": lambda n: {"layer_types": ["conv" if i % 2 == 0 else "full_attention" for i in range(n)]},
    # Lfm2MLP rounds the MLP width (2/3 of intermediate_size) up to block_multiple_of, 256 by default: at the
    # small intermediate size (128: width 85, rounded to 256) no rank's width is the source's / T, which the lfm
    # plan refuses by name, while published widths divide (12288 -> 8192, a rank's 6144 -> 4096 at T=2). 96
    # rounded to 8 is of that kind (64; 48 -> 32 at T=2, 24 -> 16 at T=4). Lfm2Config declares neither conv_dim nor
    # block_dim, by which vLLM's Lfm2 sizes the short convolutions and the MLP's input (models/lfm2.py:
    # ShortConv(dim=config.conv_dim), Lfm2MLP(dim=config.block_dim)); LFM2's published config.json holds both, equal
    # to hidden_size (as tests/py/vllm_models.py's lfm2 edit writes them): as published, for --view vllm
    "lfm2": lambda n: {"intermediate_size": 96, "block_multiple_of": 8, "conv_dim": SMALL["hidden_size"],
                       "block_dim": SMALL["hidden_size"]},
    # Glm4MoeLiteConfig says which layers are dense by mlp_layer_types and declares no first_k_dense_replace, which
    # vLLM's Glm4MoeLiteDecoderLayer reads (models/glm4_moe_lite.py); GLM-4.7-Flash's published config.json holds
    # both (first_k_dense_replace 1, the default mlp_layer_types' one dense layer): as published, for --view vllm
    "glm4_moe_lite": lambda n: {"first_k_dense_replace": 1},
    # MiniMaxM2Config declares neither rotary_dim nor scoring_func, which vLLM's MiniMaxM2 reads
    # (models/minimax_m2.py); MiniMax-M2's published config.json holds both (64 of head_dim 128, sigmoid): as
    # published, for --view vllm
    "minimax_m2": lambda n: {"rotary_dim": 64, "scoring_func": "sigmoid"},
    # AfmoeConfig declares neither score_func nor route_norm, which vLLM's AfmoeMoE reads (models/afmoe.py); Arcee
    # Trinity's published config.json holds both (sigmoid, true): as published, for --view vllm
    "afmoe": lambda n: {"score_func": "sigmoid", "route_norm": True},
    # HYV3Config says moe_intermediate_size and mlp_layer_types; vLLM's HYV3 reads expert_hidden_dim,
    # first_k_dense_replace, route_norm and qk_norm (models/hy_v3.py), which the published config.json holds: as
    # published, for --view vllm
    "hy_v3": lambda n: {"expert_hidden_dim": 1536, "first_k_dense_replace": 1, "route_norm": True, "qk_norm": True},
    # MiMoV2FlashConfig says layer_types; vLLM's MiMoV2 reads the published config.json's own keys (models/mimo_v2.py):
    # as published (MiMo-V2-Flash: its first layer full, sliding layers with 8 KV heads of 192, window 128)
    "mimo_v2_flash": lambda n: {"hybrid_layer_pattern": [int(i % 6 != 0) for i in range(n)],
                                "swa_num_attention_heads": 64, "swa_num_key_value_heads": 8, "swa_head_dim": 192,
                                "swa_v_head_dim": 128, "sliding_window_size": 128, "layernorm_epsilon": 1e-5},
    # HunYuanDenseV1Config declares no use_qk_norm, which SGLang's HunYuanDenseV1ForCausalLM reads to build
    # query_layernorm / key_layernorm (srt/models/hunyuan.py); the published config.json holds it (true): as published,
    # for --view sglang
    "hunyuan_v1_dense": lambda n: {"use_qk_norm": True},
    # HunYuanMoEV1Config likewise declares none of use_qk_norm, use_mixed_mlp_moe, num_shared_expert and
    # moe_intermediate_size, which SGLang's HunYuanMoEV1ForCausalLM reads; Hunyuan-A13B's config.json holds them
    # (its experts and shared MLP as wide as intermediate_size, as transformers builds them)
    "hunyuan_v1_moe": lambda n: {"use_qk_norm": True, "use_mixed_mlp_moe": 1, "num_shared_expert": 1,
                                 "moe_intermediate_size": SMALL["intermediate_size"]},
    # Mixtral's and OLMoE's published configs: head_dim hidden_size / heads (SMALL's 16 of 64 / 8 is not; SGLang's
    # Mixtral and OLMoE attention compute it so), OLMoE's KV heads as many as its heads (16 of 16; SGLang's OLMoE
    # k_norm is hidden_size wide), for --view sglang
    "mixtral": lambda n: {"head_dim": 8},
    "olmoe": lambda n: {"num_key_value_heads": 8},
    # Emu3TextConfig's special token ids (151643...) index past the small vocabulary (nn.Embedding refuses such
    # a padding_idx), so only its default sizes built, whose vocabulary (184622) no T=4 divides
    "emu3_text_model": lambda n: {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    # The families below did not build from their default configuration (issue 30, third round: each read in its
    # model code). CohereCompassTextConfig's rope_parameters default to {} (configuration_cohere_compass.py:132-141)
    # while its rotary embedding reads rope_parameters[layer_type] for each layer type (modeling_cohere_compass.py:
    # 79-80): the default layer types are all full_attention; RoPE settings change no tensor
    "cohere_compass_text": lambda n: {"rope_parameters": {"full_attention": {"rope_type": "default",
                                                                              "rope_theta": 10000.0}}},
    # DeepseekOcr2TextConfig.mlp_layer_types defaults to None and is never derived (configuration_deepseek_ocr2.py:
    # 243-249) while the decoder layer indexes it (modeling_deepseek_ocr2.py:1219-1223): the pattern its docstring
    # gives (configuration_deepseek_ocr2.py:175-176), a dense first layer, then MoE
    "deepseek_ocr2_text": lambda n: {"mlp_layer_types": ["dense"] + ["sparse"] * (n - 1)},
    # Inkling2's unpadded_vocab_size (200058, configuration_inkling2.py:90) is not scaled with the small vocabulary,
    # and save's reverse conversion pads the unembedding with vocab_size - unpadded_vocab_size rows
    # (core_model_loading.py:872-874): negative at 256. 250 pads to 256 as 200058 does to 201024. The layers end on a
    # full-attention ("hybrid") one, as the published every-6th pattern does (configuration_inkling2.py:128-133)
    "inkling2_text": lambda n: {"unpadded_vocab_size": 250, "layer_types": ["hybrid_sliding"] * (n - 1) + ["hybrid"]},
    # As inkling2_text; the looped layers 6..18 (configuration_inkling2_loop.py:139-140) lie past the small model's
    # layers, so: blocks of one layer, one before the loop, two looped, one after (the published 24 layers' shape)
    "inkling2_loop_text": lambda n: {
        "unpadded_vocab_size": 250, "layer_types": ["hybrid_sliding" if i % 2 == 0 else "hybrid" for i in range(n)],
        "n_layers_per_attn_res_block": 1, "loop_layer_index_start": n // 4, "loop_layer_index_end": 3 * n // 4},
    # Qwen3OmniMoeTalkerTextConfig declares no shared_expert_intermediate_size (configuration_qwen3_omni_moe.py:
    # 310-392), which its sparse MoE block reads (modeling_qwen3_omni_moe.py:2887-2888): a transformers bug; the
    # published talker text_config sets it (and head_dim): SMALL's sizes of them
    "qwen3_omni_moe_talker_text": lambda n: {"shared_expert_intermediate_size": 32, "head_dim": 16},
    # Qwen4ExpTextConfig leaves the QSA indexer fields None (configuration_qwen4_exp.py:156-160) while every 4th
    # layer is "indexed_attention" (:172-177) and the attention always builds the indexer (modeling_qwen4_exp.py:
    # 857, :699 divides budget by ratio): small values its validate_architecture accepts (:213-231)
    "qwen4_exp_text": lambda n: {"indexer_n_heads": 8, "indexer_kv_heads": 1, "indexer_head_dim": 16,
                                 "indexer_budget": 64, "indexer_compress_ratio": 4},
    # T5Gemma2's towers read config.dropout_rate (modeling_t5gemma2.py:85, 457, 510, 757, 958), which only the
    # composite T5Gemma2Config has (0.0, configuration_t5gemma2.py:344) and copies onto both towers (:354, :359)
    "t5gemma2_text": lambda n: {"dropout_rate": 0.0},
    "t5gemma2_decoder": lambda n: {"dropout_rate": 0.0},
}


def _overrides(cls, small):
    d = cls().to_dict()
    kw = {}
    if small:
        kw = {k: v for k, v in SMALL.items() if k in d}
    if "num_hidden_layers" in d:
        kw["num_hidden_layers"] = min(LAYERS, d["num_hidden_layers"] or LAYERS)
    for sub in ("text_config",):
        if isinstance(d.get(sub), dict) and small:
            t = {k: v for k, v in SMALL.items() if k in d[sub]}
            if "num_hidden_layers" in d[sub]:
                t["num_hidden_layers"] = min(LAYERS, d[sub]["num_hidden_layers"] or LAYERS)
            kw[sub] = dict(d[sub], **t)
            for k in ("layer_types", "mlp_layer_types"):
                kw[sub].pop(k, None)
    fill = FILL.get(cls.model_type)
    if fill:
        kw.update(fill(min(LAYERS, d.get("num_hidden_layers") or LAYERS)))
    return kw


def model_class(cfg):
    from transformers.models.auto import modeling_auto as ma
    order = ["MODEL_FOR_CAUSAL_LM_MAPPING", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING", "MODEL_FOR_MASKED_LM_MAPPING",
             "MODEL_MAPPING"]
    if "vision_config" in getattr(cfg, "sub_configs", {}):  # a vision-language wrapper: the whole model
        order[0], order[1] = order[1], order[0]
    for name in order:
        m = getattr(ma, name)
        with contextlib.suppress(KeyError, ValueError):
            return m[type(cfg)]
    # no auto class maps this configuration (a composite's text tower, a model_type the auto mappings name under
    # another: step3p5's Step3p7TextConfig): the model class of its own modeling module built from it, a causal
    # LM first
    import importlib
    from transformers import PreTrainedModel
    with contextlib.suppress(ImportError):
        mod = importlib.import_module(type(cfg).__module__.replace(".configuration_", ".modeling_"))
        cands = [c for c in vars(mod).values() if isinstance(c, type) and issubclass(c, PreTrainedModel)
                 and getattr(c, "config_class", None) is type(cfg) and "PreTrainedModel" not in c.__name__]
        cands.sort(key=lambda c: not c.__name__.endswith("ForCausalLM"))
        if cands:
            return cands[0]
    raise KeyError("no model class")


def build(mt, cls):
    """A meta-device model of family mt: (config, model, how it was sized)."""
    import torch
    last = None
    for how, kw in (("small", lambda: _overrides(cls, True)), ("default sizes, %d layers" % LAYERS,
                                                               lambda: _overrides(cls, False)),
                    ("default config", lambda: {})):
        try:
            cfg = cls(**kw())
            mcls = model_class(cfg)
            with torch.device("meta"):
                model = mcls(cfg)
            return cfg, model, how
        except Exception as e:  # the next, larger form
            last = e
    raise last


def header_only(model, out):
    """Writes out/model.safetensors (header only, data a hole) with the tensors save_pretrained writes."""
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict
    sd = model.state_dict()
    sd = remove_tied_weights_from_state_dict(sd, model)
    sd = revert_weight_conversion(model, sd)
    ignore = getattr(model, "_keys_to_ignore_on_save", None) or []
    shapes = {k: (DTYPE_NAMES[str(v.dtype).replace("torch.", "")], list(v.shape)) for k, v in sd.items()
              if not any(re.search(p, k) for p in ignore)}
    hdr, off = {}, 0
    for k in sorted(shapes, key=lambda k: (-BITS[shapes[k][0]], k)):
        dt, sh = shapes[k]
        n = math.prod(sh) * BITS[dt] // 8
        hdr[k] = {"dtype": dt, "shape": sh, "data_offsets": [off, off + n]}
        off += n
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + off)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out)
    return len(shapes)


def clean(msg):
    """A message without the temporary folder (stable across runs)."""
    return re.sub(r"/\S*/tpfs-cov-[^/\s]*/", "", msg).strip()


def classify(p):
    """(status, reason) of one `tpfs plan` run."""
    err = p.stderr
    if p.returncode == 0:
        return "served", ""
    lines = [ln for ln in err.splitlines() if ln.startswith("tpfs: ") and not ln.startswith("tpfs: info: ")]
    if p.returncode != 1 or not lines:
        return "error", "exit %d: %s" % (p.returncode, clean(err)[-300:])
    first = lines[0][len("tpfs: "):]
    if first.startswith("error: "):
        first = first[len("error: "):]
    if first.startswith("warning: "):
        first = next((ln[len("tpfs: "):] for ln in lines if not ln.startswith("tpfs: warning")), first)
    if "no built-in plan knows" in first:
        m = re.match(r"(no built-in plan knows [^(:,]*)", first)  # an examined family's reason follows a comma
        note = (" (config.json's architectures point at a plan whose names do not fit)"
                if "config.json's architectures point at plan" in first else "")  # not the examined reason's words
        return "refused", m.group(1).strip() + note
    return "refused", clean(first)


def one(args):
    """The row of one family (runs in a worker process)."""
    mt, tpfs = args
    import transformers  # noqa: F401
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    warnings.simplefilter("ignore")
    row = dict(family=mt, cls=CONFIG_MAPPING[mt].__name__, status="", reason="", plan="", tensors=0, how="", arch="",
               view="", view_reason="", sview="", sview_reason="")
    work = tempfile.mkdtemp(prefix="tpfs-cov-")
    try:
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                cfg, model, row["how"] = build(mt, CONFIG_MAPPING[mt])
                row["tensors"] = header_only(model, work)
                row["arch"] = type(model).__name__
        except Exception as e:
            row["status"], row["reason"] = "not built", "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200]
                                                                    if str(e) else "")
            return row
        res = []
        for T in (2, 4):
            try:
                p = subprocess.run([tpfs, "plan", work, "--tp", str(T)], capture_output=True, text=True, timeout=120)
            except subprocess.TimeoutExpired:
                res.append(("error", "T=%d: tpfs plan did not finish in 120 s" % T))
                continue
            st, why = classify(p)
            if st == "served":
                m = re.search(r"^plan:\s+built-in (\S+)", p.stdout, re.M)
                row["plan"] = m.group(1) if m else "?"
            res.append((st, ("T=%d: " % T + why) if why and st != "refused" else why))
        for engine, key in (("vllm", "view"), ("sglang", "sview")):
            view = []
            for T in (2, 4):
                try:
                    p = subprocess.run([tpfs, "plan", work, "--tp", str(T), "--view", engine], capture_output=True,
                                       text=True, timeout=120)
                    view.append(classify(p))
                except subprocess.TimeoutExpired:
                    view.append(("error", "T=%d: tpfs plan --view %s did not finish in 120 s" % (T, engine)))
            row[key] = ("served" if all(v[0] == "served" for v in view) else
                        next(v for v in view if v[0] != "served")[0])
            # the refusal without its hint and the list of views (src/view.c: "...; the default hf view ... (views:
            # ...)")
            row[key + "_reason"] = re.split(r"; the default hf view| \(views: ",
                                            next((v[1] for v in view if v[0] != "served"), ""))[0]
        if row["sview"] == "served":  # the same checkpoint said to be FP8 with 128x128 block scales (FP8_BLOCK)
            with open(os.path.join(work, "config.json")) as f:
                c = json.load(f)
            c["quantization_config"] = FP8_BLOCK
            with open(os.path.join(work, "config.json"), "w") as f:
                json.dump(c, f)
            p = subprocess.run([tpfs, "plan", work, "--tp", "2", "--view", "sglang"], capture_output=True, text=True,
                               timeout=120)
            row["sfp8"], why = classify(p)
            why = re.sub(r"^built-in sglang view ('[^']*') refuses this checkpoint at T=2: ", r"view \1: ", why)
            row["sfp8_reason"] = re.split(r"; the default hf view| \(views: | \(true; ", why)[0]
        if all(s == "served" for s, _ in res):
            row["status"] = "served"
        elif any(s == "error" for s, _ in res):
            row["status"], row["reason"] = "error", "; ".join(w for s, w in res if s == "error")
        elif res[0][0] == "served":
            row["status"], row["reason"] = "refused", "T=4: " + res[1][1]
        else:
            row["status"], row["reason"] = "refused", res[0][1]
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


# the quantization_config of DeepSeek-V3's, Kimi K2's and Qwen3's published FP8 checkpoints: what --view sglang says
# of each family it serves when its checkpoint says this (the SGLang FP8 line of the summary)
FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
NO_VIEW = re.compile(r"^--view vllm: no vllm view for plan '[^']*' with model_type '[^']*'$")
NO_SVIEW = re.compile(r"^--view sglang: no sglang view for plan '[^']*' with model_type '[^']*'$")
# families vLLM registers for which no view can be made or proven here, with why (views/vllm/README.md, "Not served")
NO_VIEW_WHY = {
    "dots3_note_text": "vLLM 0.32 cannot read a dots3_note_text config.json (\"Transformers does not recognize this "
                       "architecture\"), and its CPU build cannot import vllm.models.dots3_note (CUDA flash attention)",
}


def view_cell(r, probed, engine="vllm"):
    """The --view vllm (or --view sglang) column of a row."""
    key = "view" if engine == "vllm" else "sview"
    if not r[key]:
        return ""
    if r[key] == "served":
        return "served, probed (%s)" % probed[r["family"]] if r["family"] in probed else "served, NOT PROBED"
    if (NO_VIEW if engine == "vllm" else NO_SVIEW).match(r[key + "_reason"]):
        why = NO_VIEW_WHY if engine == "vllm" else {}
        return "refused: no view" + (" (%s)" % why[r["family"]] if r["family"] in why else "")
    return "%s: %s" % (r[key], r[key + "_reason"].replace("--view %s: " % engine, ""))


def engine_summary(engine, flag, version, registry, probed, served, rows, col, no_view):
    """The coverage line of one engine's view (col: "view" for vLLM, "sview" for SGLang): how its registry takes the
    served families, what its view serves and refuses (no_view: the reason of a family no view names), and the
    families it serves whose rank folders are refused."""
    if not version:
        return "%s columns not generated: no %s venv (scripts/setup.sh --%s)" % (engine, engine, flag)
    how = [registry.get(r["arch"], "not registered") for r in served]
    vserved = [r for r in served if r[col] == "served"]
    vrefused = [r for r in served if r[col] == "refused"]
    noview = [r for r in vrefused if no_view.match(r[col + "_reason"])]
    line = ("of the %d served, %s %s registers %d natively, %d through its Transformers backend, %d not at all; "
            "--view %s serves %d (%d proven by the %s probe) and refuses %d by name (%d with no view for the family, "
            "%d for another reason)"
            % (len(served), engine, version, how.count("native"), how.count("Transformers backend"),
               how.count("not registered"), flag, len(vserved), sum(r["family"] in probed for r in vserved), engine,
               len(vrefused), len(noview), len(vrefused) - len(noview)))
    # families whose rank folders are refused but the engine's view serves (it sizes modules from the config)
    only = [r for r in rows if r["status"] != "served" and r[col] == "served"]
    if only:
        line += "; it also serves %d whose rank folders are refused (%s: %d proven by the %s probe)" % (
            len(only), ", ".join(r["family"] for r in only), sum(r["family"] in probed for r in only), engine)
    return line


def fp8_summary(rows):
    """The SGLang FP8 line: what --view sglang says at T=2 of each family it serves, its checkpoint said to be FP8
    with 128x128 block scales (FP8_BLOCK; the header-only checkpoint unchanged otherwise: a refusal by the config
    comes before any tensor is read)."""
    fp8 = [r for r in rows if r.get("sfp8")]
    if not fp8:
        return None
    served = [r["family"] for r in fp8 if r["sfp8"] == "served"]
    refused = [r for r in fp8 if r["sfp8"] == "refused"]
    other = [r["family"] + " (" + r["sfp8"] + ")" for r in fp8 if r["sfp8"] not in ("served", "refused")]
    reasons = sorted({r["sfp8_reason"] for r in refused})
    return ("of the %d families --view sglang serves, their checkpoints in FP8 with 128x128 block scales "
            "(quant_method fp8, as DeepSeek-V3, Kimi K2 and Qwen3 FP8 publish them): %d served%s, %d refused by "
            "name%s%s"
            % (len(fp8), len(served), " (%s)" % ", ".join(served) if served else "", len(refused),
               "".join(" (%s)" % w for w in reasons), "; %d not planned: %s" % (len(other), ", ".join(other))
               if other else ""))


def render(rows, proven, version, vllm_version, registry, probed, sglang_version=None, sregistry=None, sprobed=None):
    served = [r for r in rows if r["status"] == "served"]
    ok = [r for r in served if r["family"] in proven]
    refused = [r for r in rows if r["status"] == "refused"]
    unknown = [r for r in refused if r["reason"].startswith("no built-in plan knows")]
    seen = [r for r in unknown if r.get("examined")]
    errors = [r for r in rows if r["status"] == "error"]
    unbuilt = [r for r in rows if r["status"] == "not built"]
    summary = ("%d families with a TP plan in transformers %s: %d served and proven at T=2 and 4, %d served but not "
               "proven, %d refused (%d as an unknown architecture: %d examined, with the reason found in its model "
               "code, %d unexamined; %d by a tensor), %d errors, %d not built"
               % (len(rows), version, len(ok), len(served) - len(ok), len(refused), len(unknown), len(seen),
                  len(unknown) - len(seen), len(refused) - len(unknown), len(errors), len(unbuilt)))
    vsummary = engine_summary("vLLM", "vllm", vllm_version, registry, probed, served, rows, "view", NO_VIEW)
    ssummary = engine_summary("SGLang", "sglang", sglang_version, sregistry or {}, sprobed or {}, served, rows,
                              "sview", NO_SVIEW)
    fsummary = fp8_summary(rows)
    out = ["# Coverage", "",
           "Generated by `python scripts/coverage.py` (do not edit; `meson test coverage` runs it with `--check`). For",
           "every transformers configuration class that declares a `base_model_tp_plan`, a tiny model of its default",
           "configuration is built on the meta device, its checkpoint written header-only (the names and shapes",
           "`save_pretrained` writes), and `tpfs plan --tp 2` and `--tp 4` run on it. *Served* families are proven by",
           "the numeric test named (tests/py/test_real_models.py: each rank loaded strictly into the local-size",
           "model, the tensor-parallel logits equal to the unsplit model's in float64 within 1e-5 relative, a wrong",
           "split failing). *Refused* families are refused by name, before anything is mounted, for the reason shown;",
           "for an architecture no plan knows, the reason found in its model code where it has been examined",
           "(docs/ARCHITECTURES.md, \"Families examined and not served\").",
           "",
           "*vLLM* says how vLLM's model registry takes the family's architecture (natively, through its Transformers",
           "backend, or not at all); *--view vllm* what `tpfs plan --tp 2` and `--tp 4` with `--view vllm` say: served",
           "(proven by the load-only probe of tests/py/test_vllm.py, for the vllm_models.py family named: vLLM's",
           "default loader and sharded_state on the mount leave bitwise equal weights in vLLM's model, at T=2 and 4)",
           "or refused, with the reason (\"no view\": no view file names the family's model_type).",
           "",
           "*SGLang* says how SGLang's model registry takes the architecture (natively, through its Transformers",
           "backend, or not at all); *--view sglang* what `tpfs plan --tp 2` and `--tp 4` with `--view sglang` say:",
           "served (proven by tests/py/test_sglang.py, for the family named: SGLang's default loader and",
           "sharded_state on the mount at T=2 leave equal key sets and bitwise equal weights after SGLang's post-load",
           "processing) or refused, with the reason. *SGLang FP8*: what `tpfs plan --tp 2 --view sglang` says of each",
           "family it serves, the same checkpoint's config.json saying FP8 with 128x128 block scales.",
           "", "**Summary: %s.**" % summary, "", "**vLLM: %s.**" % vsummary, "", "**SGLang: %s.**" % ssummary, "",
           *(["**SGLang FP8: %s.**" % fsummary, ""] if fsummary else []),
           "| family | config class | result | plan | proven by | reason | vLLM | --view vllm | SGLang | --view sglang |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: ({"served": 0, "error": 1, "refused": 2, "not built": 3}[r["status"]],
                                         r["family"])):
        reason = (r["reason"] + " (" + r["examined"] + ")" if r.get("examined") else r["reason"]).replace("|", "\\|")
        cap = 520 if r.get("examined") else 240
        if len(reason) > cap:
            reason = reason[:cap - 3] + "..."
        reg = (registry.get(r["arch"], "not registered") if vllm_version else "?") if r["arch"] else ""
        sreg = (sregistry.get(r["arch"], "not registered") if sglang_version else "?") if r["arch"] else ""
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
                   % (r["family"], r["cls"], r["status"], r["plan"] or "",
                      proven.get(r["family"], "") if r["status"] == "served" else "", reason, reg,
                      view_cell(r, probed).replace("|", "\\|") if vllm_version else "", sreg,
                      view_cell(r, sprobed, "sglang").replace("|", "\\|") if sglang_version else ""))
    return "\n".join(out) + "\n", summary + "; " + vsummary + "; " + ssummary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tpfs", default=os.environ.get("TPFS_BIN") or os.path.join(ROOT, "build", "src", "tpfs"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "COVERAGE.md"))
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("only", nargs="*")
    a = ap.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    t0 = time.time()
    import transformers
    fams = families()
    proven = proofs()
    names = sorted(a.only or fams)
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, min(a.jobs, 2)), mp_context=ctx) as ex:
        rows = list(ex.map(one, [(mt, a.tpfs) for mt in names]))
    why = examined()
    for r in rows:
        if r["status"] == "refused" and r["reason"].startswith("no built-in plan knows") and r["family"] in why:
            r["examined"] = why[r["family"]]
    vllm_version, registry = vllm_registry()
    probed = vllm_probed()
    sglang_version, sregistry = sglang_registry()
    sprobed = sglang_probed()
    text, summary = render(rows, proven, transformers.__version__, vllm_version, registry, probed, sglang_version,
                           sregistry, sprobed)
    fail = []
    for r in rows:
        if r["status"] == "error":
            fail.append("%s: tpfs plan failed without a clear refusal: %s" % (r["family"], r["reason"]))
        if r["view"] == "served" and r["family"] not in probed:
            fail.append("%s: --view vllm serves it but the vLLM probe does not probe it: add it to tests/py/"
                        "test_vllm.py FAMILIES (and vllm_models.py)" % r["family"])
        if r["sview"] == "served" and r["family"] not in sprobed:
            fail.append("%s: --view sglang serves it but test_sglang does not probe it: add it to tests/py/"
                        "test_sglang.py FAMILIES (and vllm_models.py)" % r["family"])
        if r["sview"] == "error":
            fail.append("%s: tpfs plan --view sglang failed without a clear refusal: %s"
                        % (r["family"], r["sview_reason"]))
        if r.get("sfp8") == "error":
            fail.append("%s: tpfs plan --view sglang on its FP8 form failed without a clear refusal: %s"
                        % (r["family"], r["sfp8_reason"]))
        if r["view"] == "error":
            fail.append("%s: tpfs plan --view vllm failed without a clear refusal: %s" % (r["family"], r["view_reason"]))
        if r["status"] == "served" and r["family"] not in proven:
            fail.append("%s: served (plan %s) but no numeric test proves it: add its family() row to "
                        "tests/py/families.py" % (r["family"], r["plan"]))
    if a.check and not a.only:
        with open(a.out) as f:
            if f.read() != text:
                fail.append("%s is not what this run generates: run python scripts/coverage.py and commit it" % a.out)
    elif not a.check and not a.only:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print("%s (%.0f s)" % (summary, time.time() - t0))
    for f in fail:
        print("FAIL: " + f)
    return 1 if fail and (a.check or a.only) else 0


if __name__ == "__main__":
    sys.exit(main())
