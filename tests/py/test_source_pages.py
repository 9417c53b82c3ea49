"""Source pages: what tpfs reads from the source, and what its stats say it read.

1. Mounting, `tpfs plan` and `tpfs check` read each safetensors header and nothing past it: a
   checkpoint whose header spans about 80 pages (thousands of tensors) and whose data is 13 MB, its
   page cache dropped, leaves only the header's pages cached after each (before the fix the kernel's
   readahead past the header left hundreds of pages of tensor data cached: other ranks' bytes).
2. The stats file reports what storage delivered next to what tpfs used: read cold, the default
   (exact) mount reports fetched bytes about equal to the source bytes it used; `--source-io
   readahead`, serving one rank of two, reports more fetched than used (the kernel's readahead brings
   the other rank's rows too), which also proves that mode still gets readahead on the source after
   the header was read without it.

Page-cache counting needs a disk-backed folder (tmpfs keeps every page cached): the test works in
TMPDIR's folder when it is one, else skips.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import save_file

import tpfs_test as tt

tt.Mount.pin = ("--push", "off")  # this test measures the source pages reads touch: no push-ahead

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-srcpages-")
if subprocess.run(["stat", "-f", "-c", "%T", work], capture_output=True, text=True).stdout.strip() == "tmpfs":
    shutil.rmtree(work)
    print("SKIP: %s is on tmpfs, where the page cache cannot be dropped (set TMPDIR to a disk folder)" % work)
    sys.exit(tt.SKIP)
PAGE = os.sysconf("SC_PAGE_SIZE")


def llama(out, layers, D, H, hd, I, V, seed=0):
    """A Llama checkpoint in one file (model.safetensors), F32, separate lm_head."""
    os.makedirs(out)
    rng = np.random.default_rng(seed)
    t = {}

    def add(name, *shape):
        t[name] = rng.standard_normal(shape, dtype=np.float32)

    add("model.embed_tokens.weight", V, D)
    for i in range(layers):
        p = "model.layers.%d." % i
        add(p + "self_attn.q_proj.weight", H * hd, D)
        add(p + "self_attn.k_proj.weight", H * hd, D)
        add(p + "self_attn.v_proj.weight", H * hd, D)
        add(p + "self_attn.o_proj.weight", D, H * hd)
        add(p + "mlp.gate_proj.weight", I, D)
        add(p + "mlp.up_proj.weight", I, D)
        add(p + "mlp.down_proj.weight", D, I)
        add(p + "input_layernorm.weight", D)
        add(p + "post_attention_layernorm.weight", D)
    add("model.norm.weight", D)
    add("lm_head.weight", V, D)
    save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=D, num_attention_heads=H,
               num_key_value_heads=H, head_dim=hd, intermediate_size=I, vocab_size=V, num_hidden_layers=layers,
               tie_word_embeddings=False, rms_norm_eps=1e-6)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    return os.path.join(out, "model.safetensors")


def read_ahead_kb(path):
    """The readahead window of path's device (KiB), or None where /sys does not say."""
    d = os.stat(path).st_dev
    for f in ("/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(d), os.minor(d)),
              "/sys/dev/block/%d:%d/queue/read_ahead_kb" % (os.major(d), os.minor(d))):
        try:
            return int(open(f).read())
        except (OSError, ValueError):
            pass
    return None


def header_pages(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    return math.ceil((8 + n) / PAGE)


def cached_past(path, hp):
    """(pages cached past the header's first hp pages, pages cached in all)."""
    pages = tt.resident_pages(path)
    return sum(pages[hp:]), sum(pages)


# ---- 1. mount, plan and check read the headers only ----
big = os.path.join(work, "big")
bigf = llama(big, 320, 32, 4, 8, 64, 256)
hp = header_pages(bigf)
F.check(hp >= 60 and os.path.getsize(bigf) > 8 << 20,
        "the checkpoint has a long header (%d pages) and several MB of data (%d)" % (hp, os.path.getsize(bigf)))
for what, cmd in (("tpfs plan", ["plan", big, "--tp", "2"]), ("tpfs plan --io", ["plan", big, "--tp", "2", "--io"]),
                  ("tpfs check", ["check", big])):
    tt.drop_cache(bigf)
    F.check(sum(tt.resident_pages(bigf)) == 0, "%s: the source's cache is dropped before" % what)
    p = tt.tpfs(*cmd)
    F.check(p.returncode == 0, "%s runs (%d: %s)" % (what, p.returncode, p.stderr.strip()[-300:]))
    past, total = cached_past(bigf, hp)
    F.check(past == 0, "%s: only the header's %d pages are cached (%d cached, %d past the header)"
            % (what, hp, total, past))
for extra in ([], ["--source-io", "readahead"], ["--view", "vllm"]):
    what = "tpfs mount %s" % " ".join(extra)
    tt.drop_cache(bigf)
    with tt.Mount(big, 2, *extra) as m:
        past, total = cached_past(bigf, hp)
        F.check(past == 0, "%s: only the header's %d pages are cached after mounting (%d cached, %d past the header)"
                % (what, hp, total, past))


# ---- 2. the stats say what storage delivered next to what tpfs used ----
def stats(m):
    """{key: value} of the stats file's "key: value" lines, and {rank: source_bytes}."""
    text = open(os.path.join(m.path, ".tpfs-stats")).read()
    keys = {l.split(":", 1)[0]: l.split(":", 1)[1].strip() for l in text.splitlines() if ": " in l and l[:1].isalpha()}
    ranks = {int(f[0]): int(f[2]) for f in (l.split() for l in text.splitlines()) if len(f) == 6 and f[0].isdigit()}
    return keys, ranks, text


def read_ranks(m, ranks):
    for r in ranks:
        for fn in sorted(os.listdir(m.rank(r))):
            if fn.endswith(".safetensors"):
                with open(os.path.join(m.rank(r), fn), "rb") as f:
                    while f.read(1 << 20):
                        pass


def figures(m):
    keys, ranks, text = stats(m)
    used, fetched = keys.get("source_used", "").split(" ")[0], keys.get("source_fetched", "").split(" ")[0]
    F.check(used.isdigit() and fetched.isdigit(), "the stats give source_used and source_fetched:\n%s" % text)
    used, fetched = int(used or -1) if used.isdigit() else -1, int(fetched) if fetched.isdigit() else -1
    F.check(used == sum(ranks.values()), "source_used %d is the ranks' source_bytes summed (%s)" % (used, ranks))
    return used, fetched


mid = os.path.join(work, "mid")
midf = llama(mid, 4, 256, 8, 32, 1024, 4096, seed=1)
io = tt.tpfs("plan", mid, "--tp", "2", "--io", "--ranks", "0", check=True).stdout
row = next(l.split() for l in io.splitlines() if l.startswith("0 "))
runs0, touch0 = int(row[2]), int(row[3])
data = os.path.getsize(midf) - 8 - int.from_bytes(open(midf, "rb").read(8), "little")

tt.drop_cache(midf)
with tt.Mount(mid, 2) as m:  # exact (the default), every rank: every data page once
    read_ranks(m, [0, 1])
    used, fetched = figures(m)
    F.check(abs(fetched - used) <= used * 0.02,
            "exact, both ranks, cold: fetched %d about equal to used %d (data %d)" % (fetched, used, data))
tt.drop_cache(midf)
with tt.Mount(mid, 2, "--ranks", "0") as m:  # exact, one rank: its page-touch minimum
    read_ranks(m, [0])
    used, fetched = figures(m)
    F.check(used == runs0, "exact, rank 0: used %d is the plan's source runs %d" % (used, runs0))
    F.check(touch0 * 0.98 <= fetched <= touch0 + (64 << 10),
            "exact, rank 0, cold: fetched %d is the plan's page-touch minimum %d (used %d)" % (fetched, touch0, used))
tt.drop_cache(midf)
with tt.Mount(mid, 2, "--ranks", "0", "--source-io", "readahead") as m:
    read_ranks(m, [0])
    used, fetched = figures(m)
    F.check(fetched >= used, "readahead, rank 0, cold: fetched %d >= used %d" % (fetched, used))
    # the kernel's readahead on the source (not turned off by the header's read) brings other rows too,
    # where the source's device reads ahead at all
    ra = read_ahead_kb(midf)
    F.check(ra == 0 or fetched > touch0 + (64 << 10),
            "readahead, rank 0, cold: fetched %d past the page-touch minimum %d (the device reads ahead %s KiB)"
            % (fetched, touch0, ra))
print("rank 0 of 2: used %d, page-touch minimum %d, readahead fetched %d of %d data bytes (device readahead %s KiB)"
      % (used, touch0, fetched, data, ra))

shutil.rmtree(work)
F.done("test_source_pages")
