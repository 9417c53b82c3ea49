"""Quantized checkpoints, split with their scales.

For each fixture (DeepSeek-V3-style FP8 with 128x128 blocks, ModelOpt NVFP4 dense, compressed-
tensors NVFP4 MoE) and each T: either every rank file is served and, for every quantized module,
dequantizing the rank-local weight with the rank-local scales (an FP8 byte or FP4 nibble taken as its
value) equals the same slice of the full dequantized weight; or the mount is refused before anything
is mounted, naming the tensor, the cut, the block size and the T that would work. The official
parser (safe_open) validates every served file.
"""
import os
import re
import tempfile

import numpy as np
from safetensors import safe_open

import fixtures
import reference as R
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-quant-")


def load_raw_dir(path):
    out = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(path, fn), framework="np") as f:  # the official parser accepts it
                keys = set(f.keys())
            t, _ = tt.read_raw(os.path.join(path, fn))
            F.check(keys == set(t), "%s: safe_open sees the same tensors" % fn)
            out.update(t)
    return out


def u8(t):
    dt, shape, b = t
    return np.frombuffer(b, np.uint8).reshape(shape)


def f32(t):
    return np.frombuffer(t[2], np.float32).reshape(t[1])


def deq_fp8_block(w, s, block=128):
    q = u8(w).astype(np.float64)
    sc = f32(s)
    n, k = q.shape
    return q * sc[np.arange(n)[:, None] // block, np.arange(k)[None, :] // block]


def deq_nvfp4(w, s, g=16):
    p = np.frombuffer(w[2], np.uint8).reshape(w[1][0], -1)  # U8 [n, k/2], or F4 [n, k] (two per byte)
    nib = np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[0], -1).astype(np.float64)
    sc = u8(s).astype(np.float64)
    return nib * sc[:, np.arange(nib.shape[1]) // g]


def deq_fp8_tensor(w, s):
    return u8(w).astype(np.float64) * f32(s).reshape(())


def modules(tensors):
    """(module, weight name, scale name, dequantizer) of every quantized linear."""
    out = []
    for k in tensors:
        m = re.match(r"(.*)\.weight_scale_inv$", k)
        if m:
            out.append((m.group(1), m.group(1) + ".weight", k, deq_fp8_block))
        m = re.match(r"(.*)\.weight_scale$", k)
        if m and tensors[k][0] == "F32" and tensors[m.group(1) + ".weight"][0] == "F8_E4M3":
            out.append((m.group(1), m.group(1) + ".weight", k, deq_fp8_tensor))
        if m and tensors[k][0] == "F8_E4M3":
            w = m.group(1) + (".weight_packed" if m.group(1) + ".weight_packed" in tensors else ".weight")
            out.append((m.group(1), w, k, deq_nvfp4))
    return out


plans = {"deepseek_fp8": {1: None, 2: None, 4: ("weight_scale_inv", "128", "T = 1, 2")},
         "llama_nvfp4": {1: None, 2: None, 4: ("down_proj.weight_scale", "16", "T = 1, 2")},
         "qwen3_moe_nvfp4": {1: None, 2: None, 4: None, 8: ("experts", "16", "expert parallelism")},
         "llama_fp8_f4": {1: None, 2: None, 4: None, 8: ("heads", "8 ranks", None)}}
summary = []
for family, fn in fixtures.QUANTIZED.items():
    src = os.path.join(work, family)
    cfg, full = fn()
    fixtures.save_raw(src, cfg, full)
    mods = modules(full)
    F.check(len(mods) >= 8, "%s: %d quantized modules" % (family, len(mods)))
    for T, refusal in plans[family].items():
        mnt = tempfile.mkdtemp(prefix="tpfs-qm-")
        if refusal:
            p = tt.tpfs("mount", src, mnt, "--tp", T, "-f")
            what, size, works = refusal
            F.check(p.returncode == 1 and what in p.stderr and size in p.stderr and (works is None or works in p.stderr),
                    "%s T=%d refused naming %s, %s, %s: %s" % (family, T, what, size, works, p.stderr.strip()))
            F.check(not tt.is_mounted(mnt), "%s T=%d: nothing mounted" % (family, T))
            pl = tt.tpfs("plan", src, "--tp", T)
            nref = len([l for l in pl.stderr.splitlines() if l.startswith("tpfs: error:")])
            F.check(pl.returncode == 1 and nref >= 1 and "REFUSED" in pl.stdout,
                    "%s T=%d: tpfs plan reports every refused tensor (%d)" % (family, T, nref))
            summary.append("%s T=%d: refused (%d tensors), e.g. %s" % (family, T, nref, p.stderr.strip()[:200]))
            os.rmdir(mnt)
            continue
        with tt.Mount(src, T, mnt=mnt) as m:
            local = [load_raw_dir(m.rank(r)) for r in range(T)]
        os.rmdir(mnt)
        nmod = 0
        for mod, wn, sn, deq in mods:
            full_deq = deq(full[wn], full[sn])
            for r in range(T):
                want = R.expected(family.split("_")[0], cfg, mod + ".weight", full_deq, T, r)
                got = deq(local[r][wn], local[r][sn])
                F.check(got.shape == want.shape and np.array_equal(got, want),
                        "%s T=%d r=%d %s: local dequantized weight %s equals the slice %s" % (family, T, r, mod, got.shape, want.shape))
            nmod += 1
        for r in range(T):
            for k, (dt, shape, b) in full.items():
                if re.search(r"\.(weight_scale_2|input_scale|weight_global_scale|input_global_scale)$", k) or (
                        k.endswith(".weight_scale") and dt == "F32"):
                    F.check(local[r][k][2] == b, "%s T=%d r=%d %s: per-tensor scale replicated" % (family, T, r, k))
        summary.append("%s T=%d: served, %d quantized modules dequantize to the right slices on every rank" % (family, T, nmod))

print("\n".join(summary))
F.done("test_quant")
