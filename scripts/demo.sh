#!/usr/bin/env bash
# scripts/demo.sh: the main job on a built-in example.
#
# Installs what is needed, builds tpfs, generates a small GLM-5.3-like checkpoint (KDA and DSA
# layers, MoE, a vision tower; random weights, real tensor names and config keys), shows the plan,
# mounts it as 2 ranks, loads rank 1 with the stock safetensors loader (which mmaps), prints the
# local shapes next to the full ones, and unmounts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
bash scripts/build.sh build
py=build/venv/bin/python
tpfs=build/src/tpfs
work=$(mktemp -d)
cleanup() {
  if grep -qs " $work/mnt " /proc/self/mountinfo; then "$tpfs" umount "$work/mnt" || fusermount3 -u -z "$work/mnt"; fi
  rm -rf "$work"
}
trap cleanup EXIT

$py tests/py/fixtures.py glm5_next "$work/model"
echo
echo "\$ tpfs plan model --tp 2   (rank 0, first lines and totals)"
"$tpfs" plan "$work/model" --tp 2 | sed -n '1,12p;/^rank /,$p'
mkdir "$work/mnt"
echo
echo "\$ tpfs mount model mnt --tp 2"
"$tpfs" mount "$work/model" "$work/mnt" --tp 2
echo "\$ ls mnt mnt/rank1"
ls -a "$work/mnt"
ls "$work/mnt/rank1"
echo
echo "loading mnt/rank1 with safetensors.safe_open (mmap):"
$py - "$work/model" "$work/mnt/rank1" <<'PY'
import os, sys
from safetensors import safe_open
src, rank = sys.argv[1], sys.argv[2]
shown = 0
for fn in sorted(os.listdir(rank)):
    if not fn.endswith(".safetensors"):
        continue
    with safe_open(os.path.join(rank, fn), "np") as f, safe_open(os.path.join(src, fn), "np") as g:
        for k in f.keys():
            local, full = f.get_tensor(k), g.get_slice(k).get_shape()
            if "layers.0.self_attn" in k or "layers.3.self_attn.indexer.wk" in k or "embed_tokens" in k:
                print("  %-58s full %-14s -> rank 1 %s" % (k, list(full), list(local.shape)))
                shown += 1
print("  (%d of the tensors shown; every rank file loaded)" % shown)
PY
echo
"$tpfs" stats "$work/mnt"
"$tpfs" umount "$work/mnt"
echo "unmounted."
