"""Whether the values vLLM 0.32 computes from a checkpoint while loading could be served bit-exactly by tpfs
(issue 49): a view serves bytes, so a parameter the engine computes is servable only if tpfs can compute the
same bits. Three such parameters, each checked on this CPU with torch (the vLLM venv's):

1. MambaMixer2's A = -exp(A_log.float()) (nemotron_h, falcon_h1): torch.exp over all 65,536 BF16 values
   widened to F32, and a random sample of F32 patterns, against the correctly rounded exp (float64 exp,
   rounded) and against this libc's expf (what a C daemon would call), under every ATEN_CPU_CAPABILITY given.
2. Sarvam's router bias minus its mean (sarvam_mla, sarvam_moe): t - t.mean() over random F32 and BF16
   vectors of 64 to 512 experts, digested, under each capability (equal digests: the same bytes), and how
   often a left-to-right F32 sum / n equals t.mean().
3. LongCat-Flash's MLA LoRA norms times sqrt(hidden / rank): bf16_tensor * python_float against
   round_bf16(f32(x) * f32(s)) for all 65,536 BF16 values and several scales, vector and scalar paths.

    BUILD/venv-vllm/bin/python bench/loader_math.py [CAPABILITY ...]   (default: default avx2 avx512)

Each capability runs in a child process (ATEN_CPU_CAPABILITY is read once, at import). A few seconds each.
views/vllm/README.md quotes the results (the first two: refused; the third: reproducible, NaN aside).
"""
import ctypes
import hashlib
import json
import os
import subprocess
import sys


def child():
    import numpy as np
    import torch
    out = {"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
    # 1. exp
    xb = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)
    fin = np.isfinite(xb)
    t = torch.exp(torch.from_numpy(xb)).numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        cr = np.exp(xb.astype(np.float64)).astype(np.float32)
    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    g = np.array([libm.expf(float(v)) for v in xb], dtype=np.float32)
    ok = fin & np.isfinite(cr)
    out["exp_bf16_vs_correct"] = int(((t.view(np.uint32) != cr.view(np.uint32)) & ok).sum())
    out["exp_bf16_vs_libm_expf"] = int(((t.view(np.uint32) != g.view(np.uint32)) & ok).sum())
    out["exp_bf16_finite"] = int(ok.sum())
    out["exp_bf16_digest"] = hashlib.sha256(t.tobytes()).hexdigest()[:16]
    rng = np.random.default_rng(0)
    xs = rng.integers(0, 1 << 32, size=1 << 24, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ts = torch.exp(torch.from_numpy(xs)).numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        cs = np.exp(xs.astype(np.float64)).astype(np.float32)
    oks = np.isfinite(xs) & np.isfinite(cs)
    out["exp_f32_sample"] = int(oks.sum())
    out["exp_f32_sample_vs_correct"] = int(((ts.view(np.uint32) != cs.view(np.uint32)) & oks).sum())
    # 2. mean
    gen = torch.Generator().manual_seed(0)
    h, hb, eq, n_all = hashlib.sha256(), hashlib.sha256(), 0, 0
    for n in (64, 72, 96, 128, 160, 256, 384, 512):
        for _ in range(100):
            v = torch.randn(n, generator=gen) * 0.05 + 1.0
            m = v.mean()
            h.update((v - m).numpy().tobytes())
            vb = v.to(torch.bfloat16)
            hb.update((vb - vb.mean()).view(torch.int16).numpy().tobytes())
            acc = np.float32(0)
            for e in v.numpy():
                acc = np.float32(acc + e)
            eq += bool(np.float32(acc / np.float32(n)) == m.item())
            n_all += 1
    out["mean_f32_digest"], out["mean_bf16_digest"] = h.hexdigest()[:16], hb.hexdigest()[:16]
    out["mean_sequential_equal"] = "%d of %d" % (eq, n_all)
    # 3. scale
    x16 = np.arange(65536, dtype=np.uint32)
    tb = torch.from_numpy(x16.astype(np.uint16).view(np.int16)).view(torch.bfloat16)
    bad = 0
    for hidden, rank in ((6144, 1536), (6144, 512), (7168, 1536), (128, 96), (128, 512), (4096, 384), (5120, 1280)):
        s = (hidden / rank) ** 0.5
        got = (tb * s).view(torch.int16).numpy().view(np.uint16)
        one = np.array([(tb[i:i + 1] * s).view(torch.int16).item() for i in range(0, 65536, 97)],
                       dtype=np.int16).view(np.uint16)
        with np.errstate(over="ignore", invalid="ignore"):
            p = (xb * np.float32(s)).astype(np.float32)
        u = p.view(np.uint32).astype(np.uint64)
        want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        keep = ~np.isnan(p)
        bad += int(((got != want) & keep).sum()) + int(((one != want[::97]) & keep[::97]).sum())
    out["scale_bf16_differ_non_nan"] = bad
    print(json.dumps(out))


def main():
    if os.environ.get("LOADER_MATH_CHILD"):
        return child()
    caps = sys.argv[1:] or ["default", "avx2", "avx512"]
    for c in caps:
        env = dict(os.environ, ATEN_CPU_CAPABILITY=c, LOADER_MATH_CHILD="1")
        r = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True, text=True)
        print(r.stdout.strip() or r.stderr.strip()[-400:])


if __name__ == "__main__":
    main()
