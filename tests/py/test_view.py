"""The engine view's bytes: `--view vllm` serves vLLM's own per-rank files, byte for byte what the rules say.

The expected files are built here from reference.py's per-rank slices (written from the TP rules,
not from the C plan) and from vLLM's names as this test states them (q, k and v as qkv_proj, gate
and up as gate_up_proj, four attention scale scalars per layer, the vocabulary padded to 64, with
tied embeddings the one key lm_head.weight): every rank's part files must hold exactly that key
set, those shapes, dtypes and bytes. The engine itself loading them is tests/py/test_vllm.py.

Also: a view whose pieces lie in two source files (one reply reads both, and a change to either
fails it), the MNT layout (the source's other files, no rank folders, no safetensors or index files),
`--ranks`, `tpfs plan --view vllm`, a wrong view file (k and v swapped) caught by the same check,
and the refusals (a plan with no vLLM view, a quantized checkpoint, --ep, --pad-vocab other than 64).
"""
import glob
import json
import os
import re
import shutil
import struct
import tempfile
import time

import numpy as np
from safetensors.numpy import load_file, save_file

import fixtures
import reference
import tpfs_test as tt

tt.Mount.pin = ("--push", "off")  # this test measures the source pages each read fetches: no push-ahead

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-view-")
ALLOW = [r"^tpfs: error: .*: the source changed since it was mounted"]


def vllm_expected(config, full, T, r, swap_kv=False):
    """{name: array} that vLLM's model on rank r holds, from the full tensors (the rules' slices)."""
    ex = lambda n: reference.expected("llama", config, n, full[n], T, r, pad=64)
    out, used = {}, set()
    layers = sorted({int(n.split(".")[2]) for n in full if n.startswith("model.layers.")})
    for i in layers:
        p = "model.layers.%d." % i
        for kind in ("weight", "bias"):
            q, k, v = (p + "self_attn.%s_proj.%s" % (x, kind) for x in "qkv")
            if q in full:
                parts = [q, v, k] if swap_kv else [q, k, v]
                out[p + "self_attn.qkv_proj." + kind] = np.concatenate([ex(n) for n in parts])
                used |= {q, k, v}
        g, u = p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"
        out[p + "mlp.gate_up_proj.weight"] = np.concatenate([ex(g), ex(u)])
        used |= {g, u}
        for s in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
            out[p + "self_attn.attn." + s] = np.array(1.0, np.float32)
    if "lm_head.weight" not in full:  # tied: vLLM's one key for the shared table
        out["lm_head.weight"] = ex("model.embed_tokens.weight")
        used.add("model.embed_tokens.weight")
    for n in full:
        if n not in used:
            out[n] = ex(n)
    return out


def served(mnt, r):
    got = {}
    for f in sorted(glob.glob(os.path.join(mnt, "model-rank-%d-part-*.safetensors" % r))):
        got.update(load_file(f))
    return got


def compare(name, got, want):
    F.check(sorted(got) == sorted(want), "%s: key set (%d served, %d expected; extra %s, missing %s)" % (
        name, len(got), len(want), sorted(set(got) - set(want))[:3], sorted(set(want) - set(got))[:3]))
    bad = [k for k in want if k in got and (got[k].shape != want[k].shape or got[k].dtype != want[k].dtype or
                                            not np.array_equal(got[k], want[k]))]
    F.check(not bad, "%s: %d tensors differ from the rules' slices: %s" % (name, len(bad), bad[:4]))
    return not bad


def load_dir(d):
    full = {}
    for f in glob.glob(os.path.join(d, "*.safetensors")):
        full.update(load_file(f))
    return full


def check_statfs(what, mnt):
    """statfs counts what the mount shows (the view's part files, not the rank folders it does not show)."""
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(mnt) for f in fs if f != ".tpfs-stats"]
    sv = os.statvfs(mnt)
    F.check(sv.f_blocks == sum(sizes) // 4096 + 1 and sv.f_files == len(sizes) + 2,
            "%s: statfs gives %d blocks and %d files for %d files of %d bytes shown"
            % (what, sv.f_blocks, sv.f_files, len(sizes), sum(sizes)))


# 1. llama (KV heads 2: replicated groups at T=4; q/k/v biases), at T=2 and 4
src = os.path.join(work, "llama")
config, _ = fixtures.make("llama", src)
full = load_dir(src)
for T in (2, 4):
    with tt.Mount(src, T, "--view", "vllm") as m:
        names = sorted(os.listdir(m.path))
        F.check(not [n for n in names if n.startswith("rank")] and "config.json" in names and
                "tokenizer_config.json" in names and not [n for n in names if n.startswith("model-0")] and
                "model.safetensors.index.json" not in names,
                "T=%d: MNT holds the part files and the source's other files only: %s" % (T, names))
        F.check(open(os.path.join(m.path, "config.json"), "rb").read() == open(os.path.join(src, "config.json"), "rb").read(),
                "T=%d: config.json is the source's (vLLM divides by T itself)" % T)
        for r in range(T):
            compare("llama T=%d rank %d" % (T, r), served(m.path, r), vllm_expected(config, full, T, r))
        check_statfs("T=%d" % T, m.path)

# 1b. no q/k/v biases: the optional qkv_proj.bias entry matches nothing and makes nothing
nb = os.path.join(work, "nobias")
nbt = {k: v for k, v in full.items() if not k.endswith("_proj.bias")}
fixtures.save(nb, config, nbt)
with tt.Mount(nb, 2, "--view", "vllm") as m:
    for r in range(2):
        compare("llama without biases, rank %d" % r, served(m.path, r), vllm_expected(config, nbt, 2, r))

# 2. tied embeddings, and pieces from two source files: layer 0's k and v in another file than q
tied = os.path.join(work, "tied")
tfull = {k: v for k, v in full.items() if k != "lm_head.weight"}
tcfg = dict(config, tie_word_embeddings=True)
os.makedirs(tied)
other = {k: v for k, v in tfull.items() if k.startswith("model.layers.0.self_attn.") and (".k_proj." in k or ".v_proj." in k)}
rest = {k: v for k, v in tfull.items() if k not in other}
save_file(rest, os.path.join(tied, "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
save_file(other, os.path.join(tied, "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
wm = {k: "model-00001-of-00002.safetensors" for k in rest}
wm.update({k: "model-00002-of-00002.safetensors" for k in other})
json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(tied, "model.safetensors.index.json"), "w"))
json.dump(tcfg, open(os.path.join(tied, "config.json"), "w"))
with tt.Mount(tied, 2, "--view", "vllm", allow_stderr=ALLOW) as m:
    for r in range(2):
        got = served(m.path, r)
        compare("tied, two sources, rank %d" % r, got, vllm_expected(tcfg, tfull, 2, r))
        F.check("model.embed_tokens.weight" not in got, "tied: no model.embed_tokens.weight key (vLLM keeps lm_head.weight)")
    part0 = os.path.join(m.path, "model-rank-1-part-0.safetensors")
    snap = open(part0, "rb").read()
    # a change to the file that holds only k and v fails the part whose qkv reads it
    with open(os.path.join(tied, "model-00002-of-00002.safetensors"), "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\x01" * 8)
    time.sleep(0.3)
    F.check(tt.read_state(part0, snap) == "eio", "a change to the second source fails the part that reads it")

# 2b. Gemma 3's view: the tie is Gemma3TextConfig's default, so a config.json without the key is tied
# (the view's "defaults"), and one that says false is not
g3 = os.path.join(work, "gemma3")
gcfg = {k: v for k, v in config.items() if k != "tie_word_embeddings"}
gcfg.update(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"])
fixtures.save(g3, gcfg, tfull)
with tt.Mount(g3, 2, "--view", "vllm") as m:
    for r in range(2):
        got = served(m.path, r)
        compare("gemma3 with no tie_word_embeddings key, rank %d" % r, got, vllm_expected(gcfg, tfull, 2, r))
g3u = os.path.join(work, "gemma3-untied")
fixtures.save(g3u, dict(gcfg, tie_word_embeddings=False), full)
with tt.Mount(g3u, 2, "--view", "vllm") as m:
    got = served(m.path, 0)
    F.check("model.embed_tokens.weight" in got and "lm_head.weight" in got,
            "gemma3 with tie_word_embeddings false: both tables served (%s)" % sorted(k for k in got if "layers" not in k))

# 2c. DeepSeek-V3 (MLA, MoE, an MTP layer): the mount equals the independent reference
# (vllm_view_ref.py, vLLM's own cuts), byte for byte, with the F32 router bias widened and the MTP
# layer (layers.{num_hidden_layers}, which vLLM's model does not build) not served
import vllm_view_ref
dsv = os.path.join(work, "dsv3")
dcfg, _ = fixtures.make("deepseek_v3", dsv)
nl = dcfg["num_hidden_layers"]
F.check(any(k.startswith("model.layers.%d." % nl) for k in load_dir(dsv)), "the deepseek fixture has an MTP layer")
vref = os.path.join(work, "dsv3-ref")
vllm_view_ref.write(dsv, vllm_view_ref.load_view(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                              "views", "vllm", "deepseek_v3.json")), 2, vref)
with tt.Mount(dsv, 2, "--view", "vllm") as m:
    for r in range(2):
        got, want = served(m.path, r), served(vref, r)
        F.check(not [k for k in got if k.startswith("model.layers.%d." % nl)], "deepseek rank %d: no MTP tensor served" % r)
        F.check(got.get("model.layers.1.mlp.experts.gate.e_score_correction_bias", np.zeros(1, np.float64)).dtype
                == np.float32, "deepseek rank %d: the router's correction bias is served as F32" % r)
        compare("deepseek_v3 rank %d against vllm_view_ref" % r, got, want)

# 3. --ranks: a node serving rank 1 only
with tt.Mount(src, 2, "--view", "vllm", "--ranks", "1") as m:
    names = sorted(n for n in os.listdir(m.path) if n.startswith("model-rank"))
    F.check(names == ["model-rank-1-part-0.safetensors", "model-rank-1-part-1.safetensors"], "--ranks 1 serves %s" % names)
    compare("--ranks 1", served(m.path, 1), vllm_expected(config, full, 2, 1))
    check_statfs("--ranks 1", m.path)

# 4. tpfs plan --view vllm lists each key and its pieces
p = tt.tpfs("plan", src, "--tp", "2", "--view", "vllm")
F.check(p.returncode == 0 and "model.layers.0.self_attn.qkv_proj.weight" in p.stdout and
        "model.layers.0.self_attn.q_proj.weight + model.layers.0.self_attn.k_proj.weight + "
        "model.layers.0.self_attn.v_proj.weight" in p.stdout and "model-rank-0-part-0.safetensors" in p.stdout,
        "tpfs plan --view vllm shows keys and pieces (%d): %s" % (p.returncode, (p.stdout + p.stderr)[-300:]))

# 4b. tpfs plan --io --view vllm reports the part files and what they read: each rank's source bytes
# are its slices of the source tensors (the rules' slices, counted here from reference.py), and all
# ranks together read every source byte once (the replicated tensors too, counted once)
for T in (2, 4):
    p = tt.tpfs("plan", src, "--tp", str(T), "--io", "--view", "vllm")
    rows = {l.split()[0]: l.split() for l in p.stdout.splitlines() if l[:1].isdigit() or l.startswith("served  ")}
    for r in range(T):
        want_runs = sum(reference.expected("llama", config, n, full[n], T, r, pad=64).nbytes for n in full)
        F.check(p.returncode == 0 and "part_files" in p.stdout and str(r) in rows and int(rows[str(r)][2]) == want_runs,
                "tpfs plan --io --view vllm at T=%d: rank %d reads %s source bytes, its slices are %d bytes"
                % (T, r, rows.get(str(r), ["?"] * 3)[2], want_runs))
    F.check("served" in rows and int(rows["served"][2]) == sum(x.nbytes for x in full.values()),
            "tpfs plan --io --view vllm at T=%d: all ranks read every source byte once (%s of %d)"
            % (T, rows.get("served", ["?"] * 3)[2], sum(x.nbytes for x in full.values())))
    with tt.Mount(src, T, "--view", "vllm") as m:
        sizes = [sum(os.path.getsize(f) for f in glob.glob(os.path.join(m.path, "model-rank-%d-part-*" % r)))
                 for r in range(T)]
    F.check(all(int(rows[str(r)][1]) == sizes[r] for r in range(T) if str(r) in rows),
            "tpfs plan --io --view vllm at T=%d: part_files are the sizes the mount shows (%s)" % (T, sizes))

# 5. a wrong view (k and v swapped in qkv_proj) is caught by the same check
# (llama's qkv_proj comes from fragments/qkv.json: an entry of the same served name in the file replaces it)
view = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "views", "vllm", "llama.json")))
view["tensors"].append({"name": "model.layers.{i}.self_attn.qkv_proj.weight",
                        "cat": ["model.layers.{i}.self_attn.%s_proj.weight" % x for x in "qvk"]})
wrong = os.path.join(work, "wrong-view.json")
json.dump(view, open(wrong, "w"))
quiet = tt.Failures(quiet=True)
with tt.Mount(src, 2, "--view", wrong) as m:
    got = served(m.path, 0)
    ok = all(np.array_equal(got[k], v) for k, v in vllm_expected(config, full, 2, 0).items() if k in got)
    F.check(not ok, "the wrong view (k and v swapped) fails the comparison with the rules")
    F.check(np.array_equal(got["model.layers.0.self_attn.qkv_proj.weight"],
                           vllm_expected(config, full, 2, 0, swap_kv=True)["model.layers.0.self_attn.qkv_proj.weight"]),
            "the wrong view serves exactly the swapped order")

# 7. one read path (issue 31): a view's reads fetch ahead as a rank file's do, and --reply iov
# points a view's replies into the sources. A Llama with 1024-wide layers (about 60 MB) on the
# disk of this test's folder: its cached pages are dropped, 4 KiB of rank 0's first part file are
# read with the kernel's readahead on it off, and the source pages the daemon asks for (those of
# the part's next 8 MiB) must turn up in the page cache, where that read itself needs one page.
big = os.path.join(work, "big")
bc = dict(config, hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, head_dim=64, intermediate_size=2048,
          vocab_size=1024, num_hidden_layers=2)
bb = fixtures.Builder(31)
bb.add("model.embed_tokens.weight", bc["vocab_size"], bc["hidden_size"])
for i in range(bc["num_hidden_layers"]):
    fixtures._gqa(bb, "model.layers.%d." % i, bc, bias=True, o_bias=True)
    fixtures._mlp(bb, "model.layers.%d." % i, bc["hidden_size"], bc["intermediate_size"])
    fixtures._norms(bb, "model.layers.%d." % i, bc["hidden_size"])
bb.add("model.norm.weight", bc["hidden_size"])
bb.add("lm_head.weight", bc["vocab_size"], bc["hidden_size"])
fixtures.save(big, bc, bb.t)
srcs = [os.path.join(big, f) for f in os.listdir(big) if f.endswith(".safetensors")]
with tt.Mount(big, 2, "--view", "vllm") as m:
    part = sorted(glob.glob(os.path.join(m.path, "model-rank-0-part-*.safetensors")))[0]
    for f in os.listdir(big):
        tt.drop_cache(os.path.join(big, f))
    before = sum(tt.resident(f) for f in srcs)
    fd = os.open(part, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # the kernel's readahead on the part file off
    os.pread(fd, 4096, 0)
    os.close(fd)
    after = before
    for _ in range(50):  # MADV_WILLNEED starts the reads and returns: wait for them
        after = sum(tt.resident(f) for f in srcs)
        if after - before >= 4 << 20:
            break
        time.sleep(0.1)
    F.check(before < 1 << 20 and after - before >= 4 << 20,
            "a view's read fetches the source pages of the part's next bytes (resident %d KiB before, %d KiB after "
            "a 4 KiB read)" % (before >> 10, after >> 10))
bfull = load_dir(big)
with tt.Mount(big, 2, "--view", "vllm", "--reply", "iov") as m:
    for r in range(2):
        compare("--reply iov, rank %d" % r, served(m.path, r), vllm_expected(bc, bfull, 2, r))
    rows = {l.split()[0]: l.split() for l in open(os.path.join(m.path, ".tpfs-stats")).read().splitlines()
            if l[:1].isdigit()}
    reads, copied = int(rows["0"][3]), int(rows["0"][4])
    F.check(reads > 0 and copied < reads, "--reply iov: rank 0's view reads are iovec replies (%d reads, %d copied)"
            % (reads, copied))
with tt.Mount(big, 2, "--view", "vllm") as m:
    for r in range(2):
        served(m.path, r)
    rows = {l.split()[0]: l.split() for l in open(os.path.join(m.path, ".tpfs-stats")).read().splitlines()
            if l[:1].isdigit()}
    F.check(int(rows["0"][4]) > int(rows["0"][3]) // 2,
            "without --reply iov most view reads are copied (%s reads, %s copied)" % (rows["0"][3], rows["0"][4]))

# 7b. a transposed part's prefetch (issue 28's read path): gpt-oss's gate_up_proj [E, H, 2I] is cut by
# columns, 2I/T of each row, and served transposed; at T=4 with rows of four pages, whole pages of the other
# ranks' columns lie between rank 0's. Rank 0's view, read from a cold page cache, must leave every page of
# its own columns cached and none of the pages that hold only other ranks' columns (the prefetch fetches
# the cut's rows, not whole matrices: before the fix it fetched all of them), and no more of the source
# than rank 0's rank folder (the hf view, the same cuts served as cut) fetches.
gpt = os.path.join(work, "gpt-oss")
gE, gH, gI = 2, 64, 4096  # a gate_up row 16 KiB: rank 0 the first 4 KiB, whole pages of other columns after it
fixtures.gpt_oss_layer(gpt, gE, gH, gI, heads=8, kv=4, hd=64, vocab=256)
gsrc = os.path.join(gpt, "model.safetensors")
with open(gsrc, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    ghdr, gbase = json.loads(f.read(n)), 8 + n
page = os.sysconf("SC_PAGE_SIZE")
gu0 = gbase + ghdr["model.layers.0.mlp.experts.gate_up_proj"]["data_offsets"][0]
mine, others = set(), set()
for row in range(gE * gH):
    start, share = gu0 + row * 2 * gI * 2, 2 * gI // 4 * 2
    mine.update(range(start // page, (start + share - 1) // page + 1))
    first, last = -(-(start + share) // page), (start + 2 * gI * 2) // page  # pages wholly in other columns
    others.update(range(first, last))
fetched = {}
for how, extra in (("hf", ()), ("vllm", ("--view", "vllm"))):
    with tt.Mount(gpt, 4, *extra) as m:
        files = ([os.path.join(m.path, f) for f in sorted(os.listdir(m.path)) if f.startswith("model-rank-0-")]
                 if extra else [os.path.join(m.path, "rank0", "model.safetensors")])
        tt.drop_cache(gsrc)
        for f in files:
            with open(f, "rb") as fh:
                while fh.read(1 << 20):
                    pass
        cached = tt.resident_pages(gsrc)
    fetched[how] = sum(cached) * page
    if how == "vllm":
        F.check(others and all(cached[p] for p in mine) and not any(cached[p] for p in others),
                "gpt-oss at T=4, --view vllm: rank 0's read fetched its %d pages of gate_up_proj's columns and "
                "none of the %d pages of other ranks' columns (%d of them cached)"
                % (len(mine), len(others), sum(cached[p] for p in others)))
F.check(fetched["vllm"] <= fetched["hf"],
        "gpt-oss at T=4: rank 0's vLLM view fetched no more source than its rank folder (%d KiB, %d KiB)"
        % (fetched["vllm"] >> 10, fetched["hf"] >> 10))

# 5b. one condition language (issues 31, 47): "if" is a plan expression over config.json and T (an
# entry dropping model.norm.weight at T=4 only), and one that reads a key neither config.json nor the
# view's defaults has is refused with the view, the entry and the key
cond = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "views", "vllm", "llama.json")))
cond["tensors"].append({"drop": "model.norm.weight", "if": "T == 4 && !tie_word_embeddings && hidden_size > 1"})
cview = os.path.join(work, "cond-view.json")
json.dump(cond, open(cview, "w"))
for T in (2, 4):
    with tt.Mount(src, T, "--view", cview) as m:
        got = served(m.path, 0)
    F.check(("model.norm.weight" in got) == (T == 2),
            "an \"if\" expression over T and config.json drops model.norm.weight at T=4 only (T=%d: %s)"
            % (T, "served" if "model.norm.weight" in got else "dropped"))
typo = json.loads(json.dumps(cond))
typo["tensors"][-1]["if"] = "tie_word_embedding"
json.dump(typo, open(cview, "w"))
p = tt.tpfs("plan", src, "--tp", "2", "--view", cview)
F.check(p.returncode == 1 and "'tie_word_embedding'" in p.stderr and "no default" in p.stderr and
        "(model.norm.weight) \"if\"" in p.stderr and cview in p.stderr,
        "a condition on a key config.json lacks (a typo) is refused, naming the view, the entry and the key (%s)"
        % p.stderr.strip()[-300:])
typo["tensors"][-1]["if"] = "has(tie_word_embedding) && tie_word_embedding"
json.dump(typo, open(cview, "w"))
p = tt.tpfs("plan", src, "--tp", "2", "--view", cview)
F.check(p.returncode == 0, "has() guards a key config.json may lack (%s)" % p.stderr.strip()[-200:])
typo["tensors"][-1]["if"] = "T >"
json.dump(typo, open(cview, "w"))
p = tt.tpfs("plan", src, "--tp", "2", "--view", cview)
F.check(p.returncode == 1 and "\"if\": expression 'T >'" in p.stderr,
        "a condition that does not parse is refused when the view is read (%s)" % p.stderr.strip()[-200:])

# the condition keywords "if" replaced: refused when the view is read, naming the replacement (a view in the
# old language is not served with another meaning)
for old, new in (("when", '"if": EXPR'), ("unless", '"if": "!(EXPR)"'), ("if_missing", '"if": "!tensor(\'NAME\')"'),
                 ("optional", '"if": "tensor(\'PIECE\') && ..."')):
    typo = json.loads(json.dumps(cond))
    del typo["tensors"][-1]["if"]
    typo["tensors"][-1][old] = True if old == "optional" else "tie_word_embeddings"
    json.dump(typo, open(cview, "w"))
    p = tt.tpfs("plan", src, "--tp", "2", "--view", cview)
    F.check(p.returncode == 1 and "'%s' is no longer a view keyword: write %s" % (old, new) in p.stderr,
            "the old keyword %r is refused naming %s (%s)" % (old, new, p.stderr.strip()[-200:]))

# 5c. a refusal names the config values its condition read, each as it is (issue 51: a boolean was
# printed "tie_word_embeddings=?"): a boolean, a string, a list
rv = json.loads(json.dumps(cond))
rv["tensors"] = rv["tensors"][:-1]
rv["refuse"] = [{"if": "!tie_word_embeddings && model_type == 'llama' && len(architectures) == 1", "reason": "r"}]
json.dump(rv, open(cview, "w"))
p = tt.tpfs("plan", src, "--tp", "2", "--view", cview)
F.check(p.returncode == 1 and "(!tie_word_embeddings && model_type == 'llama' && len(architectures) == 1; "
        "tie_word_embeddings=false, model_type='llama', architectures=['LlamaForCausalLM'])" in p.stderr,
        "a refusal prints the values its condition read: a boolean as false, a string, a list (%s)"
        % p.stderr.strip()[-300:])

# 6. refusals
kl = os.path.join(work, "kimi_linear")  # experts of 16 rows: vLLM pads a rank's shard to 256, the view would not
kcfg, _ = fixtures.make("kimi_linear", kl)
p = tt.tpfs("plan", kl, "--tp", "2", "--view", "vllm")
F.check(p.returncode == 1 and "refuses this checkpoint at T=2" in p.stderr and "pads each rank's expert shard"
        in p.stderr and "moe_intermediate_size=%d" % kcfg["moe_intermediate_size"] in p.stderr,
        "kimi_linear with moe_intermediate_size / T < 256 is refused under --view vllm (%s)" % p.stderr.strip()[:400])
dsa = os.path.join(work, "glm_moe_dsa")  # DSA in FP8: vLLM dequantizes the indexer's wk while loading
acfg, _ = fixtures.make("glm_moe_dsa", dsa)
acfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
json.dump(acfg, open(os.path.join(dsa, "config.json"), "w"))
p = tt.tpfs("plan", dsa, "--tp", "2", "--view", "vllm")
F.check(p.returncode == 1 and "deepseek_v32_fp8" in p.stderr and "_try_load_fp8_indexer_wk" in p.stderr,
        "DeepSeek-V3.2 / GLM-5 in FP8 is refused with the indexer's reason (%s)" % p.stderr.strip()[-400:])
ds = os.path.join(work, "qwen3_5")  # plan qwen3-next, whose views (qwen3_next, qwen3_5, qwen3_5_moe) do not list qwen3_5 (the VL wrapper)
fixtures.make("qwen3_5", ds)
os.mkdir(os.path.join(work, "m6"))
p = tt.tpfs("mount", ds, os.path.join(work, "m6"), "--tp", "2", "--view", "vllm")
F.check(p.returncode == 1 and "no vllm view for plan" in p.stderr and "hf view" in p.stderr,
        "a plan with no vLLM view is refused by name (%s)" % p.stderr.strip()[:300])
q = os.path.join(work, "quant")
shutil.copytree(src, q)


def ct(acts, typ, group=None, kv=False):
    """A compressed-tensors quantization_config as llm-compressor writes one scheme (group_0 on Linear)."""
    w = {"num_bits": 8, "type": typ, "symmetric": True, "strategy": "group" if group else "channel",
         "group_size": group, "dynamic": False}
    a = dict(acts, num_bits=8, type=typ, symmetric=True) if acts else None
    return {"quant_method": "compressed-tensors", "format": "%s-quantized" % typ, "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": a}},
            "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True} if kv else None}


# quantized checkpoints: only a view listing the quant_method serves one (test_vllm proves llama_fp8), each
# refusing the forms it does not make; another method, or none named, is refused by name
for qcfg, want in (({"quant_method": "fp8"}, "only FP8 with 128x128 block scales"),
                   ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"},
                    "static activation scales"),
                   ({"quant_method": "awq", "bits": 4}, "with model_type 'llama' quantized by quant_method 'awq'"),
                   # compressed-tensors (llama_ct.json): the W8A8 forms vLLM holds as the view makes them only
                   (ct({"strategy": "token", "dynamic": False}, "int"), "a static INT8 input scale is one [1] slot"),
                   (ct({"strategy": "token", "dynamic": True}, "int", group=128), "only symmetric 8-bit weights"),
                   (ct(None, "float"), "weight-only schemes (W8A16)"),
                   (ct({"strategy": "token", "dynamic": True}, "float", kv=True), "a quantized KV cache"),
                   (dict(ct({"strategy": "token", "dynamic": True}, "float"), format="pack-quantized"),
                    "only the float-quantized and int-quantized formats"),
                   # ModelOpt (llama_nvfp4.json): NVFP4 in groups of 16 only
                   ({"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4", "group_size": 16, "ignore": ["lm_head"]},
                    "only ModelOpt's NVFP4"),
                   ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32, "ignore": ["lm_head"]},
                    "only NVFP4 groups of 16"),
                   ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4"}}, "the legacy ModelOpt form"),
                   ({"bits": 4}, "has no quant_method string")):
    json.dump(dict(config, quantization_config=qcfg), open(os.path.join(q, "config.json"), "w"))
    p = tt.tpfs("plan", q, "--tp", "2", "--view", "vllm")
    F.check(p.returncode == 1 and want in p.stderr,
            "quantization_config %s is refused under --view vllm: %r (%s)" % (qcfg, want, p.stderr.strip()[-300:]))
p = tt.tpfs("plan", src, "--tp", "2", "--view", "vllm", "--ep")
F.check(p.returncode == 1 and "--ep" in p.stderr, "--view with --ep is refused (%s)" % p.stderr.strip()[:200])
p = tt.tpfs("plan", src, "--tp", "2", "--view", "vllm", "--pad-vocab=128")
F.check(p.returncode == 1 and "pads the vocabulary to a multiple of 64" in p.stderr, "--pad-vocab other than the view's is refused")
p = tt.tpfs("plan", src, "--tp", "2", "--view", "trtllm")
F.check(p.returncode == 1 and re.search(r"no view for that engine \(it has: (vllm,sglang|sglang,vllm)\)", p.stderr), "an engine without views is refused (%s)" % p.stderr.strip()[:200])

shutil.rmtree(work, ignore_errors=True)
F.done("view")
