#!/usr/bin/env bash
# scripts/gpu-check.sh [--prepare]: the device check of the CUDA gather, as one short script.
#
#   --prepare   (here, on the build machine) builds tpfs, the CUDA module, test_cuda and
#               gather_bench, and copies the shared libraries they need besides libc into
#               build/gpu-libs, so that the GPU machine needs nothing installed.
#   (no flag)   (on the GPU machine, with build/ carried) runs the CUDA-against-CPU equivalence
#               test, the gather benchmark (CPU against CUDA, 2 B to 64 KiB runs, 1 MiB to 1 GiB
#               spans, with the crossover), and a mount read with --gather cuda compared byte for
#               byte with --gather cpu. Results go to $OUT (or build/gpu-check).
#               Where python3 imports vLLM and at least two GPUs are present, also the vLLM view
#               test at TP=2 on CUDA (tests/py/test_vllm.py, TPFS_VLLM_TOKENS=all): there the families
#               that the CPU backend cannot run (DSA, Kimi Linear, GLM-5.3) are run for tokens too. The lent
#               H200 machine has one GPU and no vLLM (and vLLM's CUDA wheel is far over what a call
#               carries), so this part runs on a user's machine, not there; it has not run yet.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
  bash scripts/setup.sh build
  bash scripts/build.sh build
  test -f build/src/tpfs-cuda.so || { echo "nvcc did not build the CUDA module" >&2; exit 1; }
  mkdir -p build/gpu-libs
  for bin in build/src/tpfs build/tests/test_cuda build/bench/gather_bench; do
    ldd "$bin" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux)[.-]' |
      xargs -r -I{} cp -L {} build/gpu-libs/
  done
  echo "prepared: carry build/ to the GPU machine and run scripts/gpu-check.sh there" >&2
  exit 0
fi
out=${OUT:-build/gpu-check}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/build/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TPFS_CUDA_MODULE="$PWD/build/src/tpfs-cuda.so"
(nvidia-smi || true) > "$out/nvidia-smi.txt" 2>&1
rc=0
build/tests/test_cuda 2>&1 | tee "$out/test_cuda.txt" || rc=$?
timeout 400 build/bench/gather_bench 1024 2>&1 | tee "$out/gather_bench.txt" || rc=$?
# a real mount: a row-parallel tensor served with --gather cuda equals --gather cpu
if [ -e /dev/fuse ] && command -v python3 >/dev/null; then
  python3 - "$out" <<'PY' || rc=$?
import json, os, struct, subprocess, sys, tempfile, time, hashlib
out = sys.argv[1]
d = tempfile.mkdtemp(); src = os.path.join(d, "m"); os.mkdir(src)
rows, cols = 4096, 8192
hdr = json.dumps({"model.layers.0.mlp.down_proj.weight": {"dtype": "F16", "shape": [rows, cols], "data_offsets": [0, rows * cols * 2]}}).encode()
hdr += b" " * ((8 - len(hdr) % 8) % 8)
with open(os.path.join(src, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hdr)) + hdr + os.urandom(rows * cols * 2))
json.dump({"model_type": "llama", "intermediate_size": cols, "vocab_size": 64}, open(os.path.join(src, "config.json"), "w"))
res = {}
for mode in ("cpu", "cuda"):
    mnt = tempfile.mkdtemp()
    p = subprocess.Popen(["build/src/tpfs", "mount", src, mnt, "--tp", "8", "-f", "--gather", mode])
    while not os.path.exists(os.path.join(mnt, "rank7")):
        time.sleep(0.05)
    t0 = time.time()
    res[mode] = [hashlib.sha256(open(os.path.join(mnt, "rank%d" % r, "model.safetensors"), "rb").read()).hexdigest() for r in range(8)]
    dt = time.time() - t0
    print("%s: read 8 ranks in %.2f s" % (mode, dt), open(os.path.join(mnt, ".tpfs-stats")).read(), sep="\n")
    subprocess.run(["fusermount3", "-u", mnt]); p.wait()
ok = res["cpu"] == res["cuda"]
print("mount --gather cuda equals --gather cpu:", ok)
open(os.path.join(out, "mount.txt"), "w").write("equal: %s\n" % ok)
sys.exit(0 if ok else 1)
PY
fi
# the vLLM view on CUDA, where vLLM and two GPUs are there (not on the lent one-GPU machine)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -ge 2 ] && python3 -c 'import vllm' 2>/dev/null; then
  py=$(python3 -c 'import sys; print(sys.prefix)')
  TPFS_BIN="$PWD/build/src/tpfs" TPFS_VENV="$py" TPFS_VLLM_VENV="$py" TPFS_VLLM_TOKENS=all \
    python3 tests/py/test_vllm.py 2>&1 | tee "$out/vllm.txt" || rc=$?
else
  echo "vLLM view on CUDA: not run (GPUs: ${gpus:-0}; vLLM importable: $(python3 -c 'import vllm' 2>/dev/null && echo yes || echo no))" |
    tee "$out/vllm.txt"
fi
exit $rc
