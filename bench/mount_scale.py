"""Plan and mount time and peak memory for a checkpoint with many small tensors (issue 11's
"Resources" target: a 200k-tensor file at T=128 mounts in < 2 s under 512 MiB).

Writes a Llama-like checkpoint (one safetensors file, tiny dimensions divisible by 128 so every
rule splits at T=128; the data part is a sparse hole, nothing reads it) with about N tensors, then
times `tpfs plan SRC --tp T` and `tpfs mount SRC MNT --tp T -f` (until the rank folders answer)
for each T and prints wall seconds and peak RSS (VmHWM of the process).

    python mount_scale.py TPFS_BINARY WORK_DIR [--tensors N] [--tp 1,8,128]
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time


def make(path, ntensors):
    D = 128  # hidden = heads = kv heads = intermediate = 128, head_dim 1
    per_layer = 9
    layers = max(1, (ntensors - 4) // per_layer)
    cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=D, num_attention_heads=D,
               num_key_value_heads=D, head_dim=1, intermediate_size=D, vocab_size=D, num_hidden_layers=layers,
               tie_word_embeddings=False, rms_norm_eps=1e-6, torch_dtype="float16")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    names = [("model.embed_tokens.weight", (D, D))]
    for i in range(layers):
        p = "model.layers.%d." % i
        names += [(p + n, (D, D)) for n in ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                            "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")]
        names += [(p + "input_layernorm.weight", (D,)), (p + "post_attention_layernorm.weight", (D,))]
    names += [("model.norm.weight", (D,)), ("lm_head.weight", (D, D))]
    hdr, off = {}, 0
    for n, shp in names:
        nb = 2
        for s in shp:
            nb *= s
        hdr[n] = {"dtype": "F16", "shape": list(shp), "data_offsets": [off, off + nb]}
        off += nb
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    fn = os.path.join(path, "model.safetensors")
    with open(fn, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + off)
    return len(names)


def hwm(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_plan(tpfs, src, T):
    t0 = time.monotonic()
    p = subprocess.Popen(["/usr/bin/time", "-f", "%M", tpfs, "plan", src, "--tp", str(T)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate()
    dt = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit("plan failed: " + err[-2000:])
    return dt, int(err.strip().splitlines()[-1]) * 1024


def run_mount(tpfs, src, T, base):
    mnt = tempfile.mkdtemp(prefix="mnt", dir=base)
    t0 = time.monotonic()
    p = subprocess.Popen([tpfs, "mount", src, mnt, "--tp", str(T), "-f"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    peak, dt = 0, None
    try:
        while True:
            peak = max(peak, hwm(p.pid))
            if p.poll() is not None:
                sys.exit("mount exited: " + p.stderr.read()[-2000:])
            if os.path.ismount(mnt) and os.path.exists(os.path.join(mnt, "rank%d" % (T - 1), "model.safetensors")):
                dt = time.monotonic() - t0
                break
            time.sleep(0.01)
        peak = max(peak, hwm(p.pid))
    finally:
        subprocess.call(["fusermount3", "-u", "-z", mnt], stderr=subprocess.DEVNULL)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
        os.rmdir(mnt)
    return dt, peak


def main():
    a = sys.argv[1:]
    if len(a) < 2:
        sys.exit(__doc__)
    tpfs, work = os.path.abspath(a[0]), a[1]
    n, tps = 200000, [1, 8, 128]
    if "--tensors" in a:
        n = int(a[a.index("--tensors") + 1])
    if "--tp" in a:
        tps = [int(x) for x in a[a.index("--tp") + 1].split(",")]
    src = os.path.join(work, "src%d" % n)
    got = make(src, n)
    print("%d tensors, header %d KiB" % (got, os.path.getsize(os.path.join(src, "model.safetensors")) and
                                          (os.stat(os.path.join(src, "model.safetensors")).st_blocks // 2)))
    print("%6s %10s %12s %10s %12s" % ("T", "plan s", "plan MiB", "mount s", "mount MiB"))
    for T in tps:
        ps, pm = run_plan(tpfs, src, T)
        ms, mm = run_mount(tpfs, src, T, work)
        print("%6d %10.2f %12.1f %10.2f %12.1f" % (T, ps, pm / 2**20, ms, mm / 2**20), flush=True)


if __name__ == "__main__":
    main()
