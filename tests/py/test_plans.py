"""Plans beyond the families: plans as data, plan-file errors, hostile plan expressions, and the refusals
of what no plan knows.

Without a mount (runs wherever the binary does, /dev/fuse or not), through `tpfs plan`:
- a dt_bias rule sized per head is refused; config/shape disagreements name the tensor, the key
  and both numbers; a vocabulary that does not divide is refused with the way out;
- an architecture no built-in plan knows is refused before mounting (model_type named, the
  built-in plans listed, --plan FILE / --plan generic offered); --plan generic refuses fused
  projections, 3-D experts tensors and per-head vectors by name; --plan NAME forces a built-in;
  --strict refuses unmatched tensors; malformed plans are refused;
- a plan-file error (an expression that fails) is reported as the plan's, naming plan, rule and
  expression, not as a tensor that cannot be split; `has(x) && x > 3` short-circuits;
- hostile expressions (INT64_MIN % -1 and / -1, 10,000 nested ?:, a literal beyond int64) exit 1
  with a message, never a signal.
Through the mount (skipped, with the reason, where FUSE is missing):
- a deliberately wrong plan (KDA o_proj split on rows instead of columns) mounts with plausible
  shapes and is caught by the TP-equivalence check; the dt_bias trap (offset counted in heads
  instead of channels) is caught numerically too;
- `tpfs plan --json` emits a plan file that `--plan` accepts back and that serves identical bytes;
- user plans extend built-ins; hostile expressions refuse `tpfs mount` too;
- vocab padding (vLLM): zero rows past V;
- the seeds' GLM-5.3 KDA geometry: one layer is 275,481,088 bytes; at T = 2 each rank keeps
  138,789,248 bytes, 2,097,408 of them replicated; 64 MLA heads over T = 3 are 22/21/21.
"""
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import tempfile

import numpy as np
from safetensors import safe_open

import fixtures
import reference as R
import tpfs_test as tt
from test_families import load_dir, tp_checks

F = tt.Failures()
rng = np.random.default_rng(1)
work = tempfile.mkdtemp(prefix="tpfs-plans-")


def write_plan(name, obj):
    p = os.path.join(work, name)
    with open(p, "w") as f:
        json.dump(obj, f)
    return p


def tree_hash(path):
    """Every file's bytes by digest; a safetensors file by its tensors and metadata, with
    tpfs.plan reduced to its digest (the plan's name differs between a plan and its resolved copy)."""
    h = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".safetensors"):
            tensors, meta = tt.read_raw(os.path.join(path, fn))
            meta = dict(meta or {})
            if "tpfs.plan" in meta:
                meta["tpfs.plan"] = meta["tpfs.plan"].split(" ")[-1]
            h[fn] = (sorted((k, v[0], v[1], hashlib.sha256(v[2]).hexdigest()) for k, v in tensors.items()),
                     sorted(meta.items()))
            continue
        with open(os.path.join(path, fn), "rb") as f:
            h[fn] = hashlib.sha256(f.read()).hexdigest()
    return h


def local_shapes(src, T, r):
    """{name: local shape} of rank r from `tpfs plan --json` and the source header (no mount)."""
    p = tt.tpfs("plan", src, "--tp", T, "--json")
    F.check(p.returncode == 0, "tpfs plan --json %s at T=%d: %s" % (src, T, p.stderr))
    rules = {x["match"]: x for x in json.loads(p.stdout)["rules"]} if p.returncode == 0 else {}
    h = tt.read_header(os.path.join(src, "model.safetensors"))[1]
    out = {}
    for k, v in h.items():
        sh, rule = list(v["shape"]), rules.get(k, {"split": "replicate"})
        if rule["split"] == "axis":
            segs = [(g["size"], g["unit"]) for g in rule.get("segments", [])] or [(rule["size"], rule["unit"])]
            sh[rule["axis"]] = sum(R.share(n // u, T, r, uneven=rule.get("uneven", False),
                                           groups=rule.get("groups", False))[1] * u for n, u in segs) // rule["div"]
        out[k] = (v["dtype"], sh)
    return out


# ======== without a mount ========

src = os.path.join(work, "kimi")
cfg, full = fixtures.make("kimi_linear", src)
per_head = write_plan("dt_per_head.json", {
    "tpfs_plan": 1, "name": "dt-per-head", "extends": "kda",
    "rules": [{"name": "dt_bias_per_head", "match": "**.layers.{i}.self_attn.dt_bias", "split": "column",
               "size": "linear_attn_config.num_heads"}]})
p = tt.tpfs("plan", src, "--tp", 2, "--plan", per_head)
F.check(p.returncode == 1 and "dt_bias" in p.stderr and "linear_attn_config.num_heads" in p.stderr
        and "32" in p.stderr and "= 4" in p.stderr, "a dt_bias rule sized per head is refused: %s" % p.stderr)

src5 = os.path.join(work, "glm5")
fixtures.make("glm5_next", src5)
pj = tt.tpfs("plan", src5, "--tp", 2, "--json")
F.check(pj.returncode == 0, "plan --json runs: %s" % pj.stderr)
ps = tt.tpfs("plan", src5, "--tp", 2)
F.check(ps.returncode == 0 and "kda_o_proj" in ps.stdout and "dsa_indexer" in ps.stdout and "unmatched tensors (refused): 0" in ps.stdout,
        "tpfs plan shows the rules of a GLM-5.3-like checkpoint")

srcl = os.path.join(work, "llama")
cfgl, fulll = fixtures.make("llama", srcl)

# no silent guesses: an unknown architecture is refused before mounting
cfg_unknown = dict(cfgl, model_type="mystery", architectures=["MysteryForCausalLM"])
srcu = os.path.join(work, "mystery")
fixtures.save(srcu, cfg_unknown, dict(fulll, **{"model.extra.weight": np.ones((4, 4), np.float32)}))
want_unknown = ("tpfs: no built-in plan knows model_type 'mystery' (built-in plans: aria, bailing-hybrid, beam, cohere2-moe, cosmos3-edge, deepseek-v4, deepseek, dots3, "
                "ernie4_5-moe, exaone-moe, flint, generic, glm4v-moe, glm4v, gpt-oss, granitemoe, hunyuan-moe, "
                "hunyuan-vl, hy-v4, jamba, kda, kolibri1, laguna, lfm, llama, llama4, longcat, mamba2, mimo-v2, "
                "minimax-m3, mistral-large4, mixtral, olmo-hybrid, olmoe, phi3, qwen-moe, qwen3-next, "
                "qwen3-vl-moe, sarvam-moe, step3p5; 'tpfs plan --list' shows the model "
                "types each detects, docs/COVERAGE.md the families served and refused); give a plan file with --plan FILE (docs/PLANS.md), "
                "or, after checking what it does with 'tpfs plan SRC --tp N --plan generic', accept the generic name-based "
                "guess with --plan generic\n")
p = tt.tpfs("plan", srcu, "--tp", 2)
F.check(p.returncode == 1 and p.stderr == want_unknown and not p.stdout,
        "an unknown model_type is refused with its name, the built-ins and the way on: %r" % p.stderr)
mnt = tempfile.mkdtemp(prefix="tpfs-plans-mnt-")
p = subprocess.run([tt.TPFS, "mount", srcu, mnt, "--tp", "2", "-f"], capture_output=True, text=True, timeout=120)
F.check(p.returncode == 1 and p.stderr == want_unknown and not tt.is_mounted(mnt),
        "tpfs mount refuses it before mounting: %r" % p.stderr)
os.rmdir(mnt)
# a family whose model code was read and found unservable (docs/ARCHITECTURES.md's table, read here by this test) is
# refused with that reason, by plan and by mount, and not with the list of plans (issue 49): the user need not find
# the docs to learn it was looked at. gpt_neox as a model_type, gemma3n_text as a composite's text_config.model_type
_spec = importlib.util.spec_from_file_location(
    "tpfs_coverage", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "coverage.py"))
_cov = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cov)
examined = _cov.examined()  # the table as scripts/coverage.py reads it (Python, not the C build's embed.py)
F.check(len(examined) > 30 and "gpt_neox" in examined and "gemma3n_text" in examined,
        "docs/ARCHITECTURES.md lists the families examined and not served: %s" % sorted(examined)[:5])
for what, cfg_x in (("model_type 'gpt_neox'", dict(cfgl, model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"])),
                    ("model_type 'mystery' (text_config: 'gemma3n_text')",
                     dict(cfgl, model_type="mystery", architectures=["MysteryForConditionalGeneration"],
                          text_config={"model_type": "gemma3n_text"}))):
    fam = "gpt_neox" if "gpt_neox" in what else "gemma3n_text"
    srcx = os.path.join(work, "examined-" + fam)
    fixtures.save(srcx, cfg_x, fulll)
    p = tt.tpfs("plan", srcx, "--tp", 2)
    first = p.stderr.splitlines()[0] if p.stderr else ""
    F.check(p.returncode == 1 and first.startswith("tpfs: no built-in plan knows %s, a family whose model code tpfs "
                                                   "has read and does not serve" % what)
            and examined[fam][:200] in first and "built-in plans:" not in first,
            "an examined family (%s) is refused with the reason found in its model code: %r" % (fam, p.stderr[:400]))
    mnt = tempfile.mkdtemp(prefix="tpfs-plans-mnt-")
    q = subprocess.run([tt.TPFS, "mount", srcx, mnt, "--tp", "2", "-f"], capture_output=True, text=True, timeout=120)
    F.check(q.returncode == 1 and q.stderr == p.stderr and not tt.is_mounted(mnt),
            "tpfs mount refuses the examined %s with the same reason: %r" % (fam, q.stderr[:300]))
    os.rmdir(mnt)
# no silent guesses, again: a tensor no rule matches is refused by name and shape unless --unmatched replicate
p = tt.tpfs("plan", srcu, "--tp", 2, "--plan", "generic")
F.check(p.returncode == 1 and "tensor 'model.extra.weight' [4, 4]: no rule of plan 'generic' matches it; no rule says "
        "it is whole" in p.stderr and "--unmatched replicate" in p.stderr and p.stderr.count("tpfs: error:") == 1,
        "an unmatched tensor is refused by name and shape (only it: the norms are whole): %s" % p.stderr)
p = tt.tpfs("plan", srcu, "--tp", 2, "--plan", "generic", "--unmatched", "replicate")
F.check(p.returncode == 0 and "built-in generic (--plan)" in p.stdout, "--plan generic accepts the name-based guess: %s" % p.stderr)
F.check("model.extra.weight" in p.stdout.split("unmatched tensors (replicated): 1")[1], "unmatched tensors are listed")
p = tt.tpfs("plan", srcu, "--tp", 2, "--plan", "llama", "--unmatched", "replicate")
F.check(p.returncode == 0 and "built-in llama (--plan)" in p.stdout, "--plan NAME forces a built-in plan")
p = tt.tpfs("plan", srcu, "--tp", 2, "--plan", "llama", "--unmatched", "guess")
F.check(p.returncode == 2 and "--unmatched: give refuse or replicate" in p.stderr, "--unmatched takes refuse or replicate")
mnt = tempfile.mkdtemp(prefix="tpfs-plans-mnt-")
p = subprocess.run([tt.TPFS, "mount", srcu, mnt, "--tp", "2", "--plan", "llama", "-f"], capture_output=True, text=True,
                   timeout=120)
F.check(p.returncode == 1 and "tensor 'model.extra.weight' [4, 4]: no rule of plan 'llama'" in p.stderr
        and not tt.is_mounted(mnt), "tpfs mount refuses an unmatched tensor before mounting: %r" % p.stderr)
os.rmdir(mnt)
# the per-rank count an unmatched tensor would contradict is named (a second vocabulary-sized table)
srcv = os.path.join(work, "vocab-extra")
fixtures.save(srcv, cfgl, dict(fulll, **{"model.extra_embed.weight": np.ones((128, 48), np.float32)}))
p = tt.tpfs("plan", srcv, "--tp", 4)
F.check(p.returncode == 1 and "tensor 'model.extra_embed.weight' [128, 48]: no rule of plan 'llama' matches it; served "
        "whole, its dim 0 (128) equals 'vocab_size' (128), which rank 0's config.json states as 32 at T=4" in p.stderr,
        "an unmatched tensor names the per-rank count it would contradict: %s" % p.stderr)
p = tt.tpfs("plan", srcv, "--tp", 4, "--unmatched", "replicate")
F.check(p.returncode == 0 and "unmatched tensors (replicated): 1" in p.stdout, "--unmatched replicate opts in: %s" % p.stderr)
# a plan picked through architectures alone must fit the names (EXAONE says LlamaForCausalLM, keeps its own names;
# model_type 'exaone' itself is now detected by the llama plan, which names its tensors: an EXAONE-like model_type
# that no plan detects shows the check)
srce = os.path.join(work, "exaone-like")
exa = {k.replace("model.layers.", "transformer.h.").replace("model.embed_tokens", "transformer.wte"): v
       for k, v in fulll.items()}
fixtures.save(srce, dict(cfgl, model_type="exaone_like"), exa)
p = tt.tpfs("plan", srce, "--tp", 2)
F.check(p.returncode == 1 and "no built-in plan knows model_type 'exaone_like': config.json's architectures point at plan "
        "'llama', but the checkpoint's names do not fit it" in p.stderr and "--plan FILE" in p.stderr,
        "a plan picked by architectures whose names do not fit is refused as unknown: %s" % p.stderr)
p = tt.tpfs("plan", srce, "--tp", 2, "--unmatched", "replicate")
F.check(p.returncode == 1 and "no built-in plan knows model_type 'exaone_like'" in p.stderr,
        "... also under --unmatched replicate: %s" % p.stderr)
srcok = os.path.join(work, "arch-fits")
fixtures.save(srcok, dict(cfgl, model_type="llama_like"), fulll)
p = tt.tpfs("plan", srcok, "--tp", 2)
F.check(p.returncode == 0 and "unmatched tensors (refused): 0" in p.stdout,
        "a plan picked by architectures whose names fit is used: %s" % p.stderr)
p = tt.tpfs("plan", srcu, "--tp", 2, "--plan", "llama", "--strict")
F.check(p.returncode == 1 and "model.extra.weight" in p.stderr and "--strict" in p.stderr, "--strict refuses an unmatched tensor")
p = tt.tpfs("plan", srcu, "--tp", 2, "--plan", "nosuch")
F.check(p.returncode == 1 and "no such built-in plan" in p.stderr and "llama" in p.stderr, "unknown --plan NAME lists the built-ins")

# --plan generic refuses, by name, what a name cannot tell (never replicated next to a split partner)
srcf = os.path.join(work, "fused")
fused = dict(fulll)
H, hd, D = cfgl["num_attention_heads"], cfgl["head_dim"], cfgl["hidden_size"]
fused["model.layers.0.self_attn.qkv_proj.weight"] = np.ones((H * hd + 2 * 2 * hd, D), np.float32)
fused["model.layers.0.mlp.experts.gate_up_proj"] = np.ones((2, D, 8), np.float32)
fused["model.layers.0.self_attn.sinks"] = np.ones((H,), np.float32)
fixtures.save(srcf, cfg_unknown, fused)
p = tt.tpfs("plan", srcf, "--tp", 2, "--plan", "generic")
refusals = [l for l in p.stderr.splitlines() if "refused by plan 'generic'" in l]
F.check(p.returncode == 1 and len(refusals) == 3, "three tensors refused under generic: %s" % p.stderr)
F.check("tpfs: error: model-00001-of-00002.safetensors: tensor 'model.layers.0.mlp.experts.gate_up_proj' (rule 'fused_experts'): "
        "refused by plan 'generic': a 3-D experts tensor [E, ...]: which axis is the expert's intermediate size is not in "
        "its name; give a plan that names the axis (--plan FILE)" in p.stderr.splitlines(), "the experts refusal: %s" % p.stderr)
F.check(any(re.fullmatch(r"tpfs: error: model-0000[12]-of-00002.safetensors: tensor 'model.layers.0.self_attn.qkv_proj.weight' "
                         r"\(rule 'fused_projection'\): refused by plan 'generic': a fused projection: .* give a plan that "
                         r"splits it per segment \(--plan FILE\)", l) for l in refusals), "the qkv_proj refusal names it")
F.check(any("tensor 'model.layers.0.self_attn.sinks' (rule 'per_head_vector')" in l for l in refusals), "the sinks refusal names it")

# malformed plan files
bad = write_plan("bad.json", {"tpfs_plan": 1, "name": "bad", "rules": [{"match": "x", "split": "sideways"}]})
p = tt.tpfs("plan", srcl, "--tp", 2, "--plan", bad)
F.check(p.returncode == 1 and "bad.json" in p.stderr and "'split' must be one of replicate, column, row, axis, heads_axis, refuse"
        in p.stderr, "an unknown split kind is refused: %s" % p.stderr)
typo = write_plan("typo.json", {"tpfs_plan": 1, "name": "t", "rules": [{"match": "x", "split": "row", "head": "4"}]})
p = tt.tpfs("plan", srcl, "--tp", 2, "--plan", typo)
F.check(p.returncode == 1 and "unknown field 'head'" in p.stderr, "a misspelt field is refused: %s" % p.stderr)
with open(os.path.join(work, "notjson.json"), "w") as f:
    f.write("{rules: ")
p = tt.tpfs("plan", srcl, "--tp", 2, "--plan", os.path.join(work, "notjson.json"))
F.check(p.returncode == 1 and "not valid JSON" in p.stderr, "a plan that is not JSON is refused")

# a plan-file error is the plan's, not a tensor that cannot be split
missing = write_plan("missing_key.json", {"tpfs_plan": 1, "name": "kda", "extends": "llama", "rules": [
    {"name": "kda_a_log", "match": "**.layers.{i}.self_attn.q_proj", "split": "column", "heads": "linear_attn_config.num_heads"}]})
p = tt.tpfs("plan", srcl, "--tp", 2, "--plan", missing)
F.check(p.returncode == 1 and re.search(r"^tpfs: model-0000[12]-of-00002.safetensors: tensor 'model.layers.0.self_attn.q_proj.(weight|bias)': "
                                        r"plan 'kda', rule 'kda_a_log' \(heads\): expression 'linear_attn_config.num_heads': "
                                        r"key 'linear_attn_config.num_heads' is missing from config.json$", p.stderr, re.M)
        and "cannot be split" not in p.stderr, "a missing key is the plan's error: %r" % p.stderr)
short = write_plan("short.json", {"tpfs_plan": 1, "name": "short", "extends": "llama", "rules": [
    {"name": "never", "match": "**.layers.{i}.self_attn.q_proj", "when": "has(foo) && foo > 3", "split": "replicate"},
    {"name": "odd", "match": "**.layers.{i}.mlp.down_proj", "when": "i < 5 ? i == 1 : foo.bar > 2", "split": "replicate"}]})
p = tt.tpfs("plan", srcl, "--tp", 2, "--plan", short, "--json")
rules = {r["match"]: r for r in json.loads(p.stdout)["rules"]} if p.returncode == 0 else {}
F.check(p.returncode == 0 and rules["model.layers.0.self_attn.q_proj.weight"]["split"] == "axis"
        and rules["model.layers.1.mlp.down_proj.weight"]["split"] == "replicate",
        "&& and ?: short-circuit: the untaken side names a missing key without error: %s" % p.stderr)
taken = write_plan("taken.json", {"tpfs_plan": 1, "name": "taken", "extends": "llama", "rules": [
    {"name": "odd", "match": "**.layers.{i}.mlp.down_proj", "when": "i > 5 ? 1 : foo.bar > 2", "split": "replicate"}]})
p = tt.tpfs("plan", srcl, "--tp", 2, "--plan", taken)
F.check(p.returncode == 1 and "plan 'taken', rule 'odd' (when): expression 'i > 5 ? 1 : foo.bar > 2': key 'foo.bar' is missing"
        in p.stderr, "the taken side still fails, as the plan's error: %s" % p.stderr)

# hostile expressions (issue 11): exit 1 with a message, never a signal
hostile = [("(-9223372036854775807 - 1) % -1", "remainder overflows"),
           ("(-9223372036854775807 - 1) / -1", "division overflows"),
           ("1?" * 10000 + "8" + ":0" * 10000, "nested more than 100 levels deep"),
           ("(" * 10000 + "8" + ")" * 10000, "nested more than 100 levels deep"),
           ("99999999999999999999", "the literal 99999999999999999999 does not fit in a signed 64-bit integer"),
           ("-(-9223372036854775807 - 1)", "negation overflows")]
for k, (expr, want) in enumerate(hostile):
    hp = write_plan("hostile%d.json" % k, {"tpfs_plan": 1, "name": "hostile", "extends": "llama", "rules": [
        {"name": "evil", "match": "**.layers.{i}.self_attn.q_proj", "split": "column", "heads": expr}]})
    p = tt.tpfs("plan", srcl, "--tp", 2, "--plan", hp)
    F.check(p.returncode == 1 and "plan 'hostile', rule 'evil' (heads): expression '" in p.stderr and want in p.stderr
            and len(p.stderr) < 2000, "tpfs plan, hostile heads %.40r: exit %d, %r" % (expr, p.returncode, p.stderr[:400]))

# issue 51: first() evaluates its arguments only up to the first present one. A Llama whose head_dim is given
# and whose hidden size is not a multiple of its heads (48 = 10 heads of 6 would need 4.8) is valid
# (transformers and the engines read head_dim); the llama plan sizes q/k/v/o by first(head_dim, hidden_size /
# num_attention_heads), and so do the views over it. Before: "48 / 10 is not exact", from the plan and every view.
srchd = os.path.join(work, "headdim")
chd = dict(cfgl, num_attention_heads=10, num_key_value_heads=2, head_dim=6, intermediate_size=128)
bhd = fixtures.Builder(7)
bhd.add("model.embed_tokens.weight", chd["vocab_size"], chd["hidden_size"])
for i in range(chd["num_hidden_layers"]):
    fixtures._gqa(bhd, "model.layers.%d." % i, chd)
    fixtures._mlp(bhd, "model.layers.%d." % i, chd["hidden_size"], chd["intermediate_size"])
    fixtures._norms(bhd, "model.layers.%d." % i, chd["hidden_size"])
bhd.add("model.norm.weight", chd["hidden_size"])
bhd.add("lm_head.weight", chd["vocab_size"], chd["hidden_size"])
fixtures.save(srchd, chd, bhd.t)
p = tt.tpfs("plan", srchd, "--tp", 2)
F.check(p.returncode == 0 and re.search(r"model\.layers\.0\.self_attn\.q_proj\.weight +q_proj .*\[60, 48\] +\[30, 48\]", p.stdout),
        "head_dim given, hidden_size / heads not exact: the llama plan cuts q_proj [60, 48] to [30, 48] (%s)"
        % p.stderr.strip()[-300:])
for view in ("vllm", "sglang"):
    p = tt.tpfs("plan", srchd, "--tp", 2, "--view", view)
    F.check(p.returncode == 0 and re.search(r"model\.layers\.0\.self_attn\.qkv_proj\.weight +F32 +\[42, 48\]", p.stdout),
            "head_dim given, hidden_size / heads not exact: --view %s serves qkv_proj [42, 48] (%s)"
            % (view, p.stderr.strip()[-300:]))

# config disagreeing with shapes
srcb = os.path.join(work, "badcfg")
fixtures.save(srcb, dict(cfgl, intermediate_size=100), fulll)
p = tt.tpfs("plan", srcb, "--tp", 2)
F.check(p.returncode == 1 and re.search(r"tensor 'model.layers.0.mlp.(gate|up|down)_proj.weight'", p.stderr)
        and "intermediate_size" in p.stderr and "96" in p.stderr
        and "100" in p.stderr, "config/shape mismatch names tensor, key and both numbers: %s" % p.stderr)
with open(os.path.join(srcb, "config.json"), "w") as f:
    f.write('{"model_type": "llama",')
p = tt.tpfs("plan", srcb, "--tp", 2)
F.check(p.returncode == 1 and "config.json: not valid JSON" in p.stderr, "malformed config.json is refused: %s" % p.stderr)

# a vocabulary that does not divide
srcv = os.path.join(work, "vocab100")
cfgv = dict(cfgl, vocab_size=100)
fullv = dict(fulll)
for k in ("model.embed_tokens.weight", "lm_head.weight"):
    fullv[k] = fulll[k][:100]
fixtures.save(srcv, cfgv, fullv)
p = tt.tpfs("plan", srcv, "--tp", 8)
F.check(p.returncode == 1 and "does not divide over 8 ranks" in p.stderr and "--pad-vocab" in p.stderr,
        "V = 100 over 8 ranks is refused with the way out: %s" % p.stderr)
p = tt.tpfs("plan", srcv, "--tp", 3, "--pad-vocab")
F.check(p.returncode == 1 and "padded to 128" in p.stderr, "padded vocab that does not divide is refused: %s" % p.stderr)

# the seeds' GLM-5.3 KDA geometry, header-only (sparse) file, from the plan alone
geo = os.path.join(work, "glm53")
os.makedirs(geo)
D, Hh, hd, Kc, rank = 4096, 64, 128, 4, 128
Pp = Hh * hd
layer = "model.language_model.layers.0.self_attn."
shapes = {"q_proj.weight": ("BF16", [Pp, D]), "k_proj.weight": ("BF16", [Pp, D]), "v_proj.weight": ("BF16", [Pp, D]),
          "q_conv1d.weight": ("BF16", [Pp, 1, Kc]), "k_conv1d.weight": ("BF16", [Pp, 1, Kc]),
          "v_conv1d.weight": ("BF16", [Pp, 1, Kc]), "f_a_proj.weight": ("BF16", [rank, D]),
          "f_b_proj.weight": ("BF16", [Pp, rank]), "g_a_proj.weight": ("BF16", [rank, D]),
          "g_b_proj.weight": ("BF16", [Pp, rank]), "b_proj.weight": ("BF16", [Hh, D]), "A_log": ("F32", [Hh]),
          "dt_bias": ("F32", [Pp]), "o_norm.weight": ("BF16", [hd]), "o_proj.weight": ("BF16", [D, Pp])}
hdr, off = tt.write_header_only(os.path.join(geo, "model.safetensors"), {layer + k: v for k, v in shapes.items()})
F.check(off == 275481088, "one GLM-5.3-Flash KDA layer is 275,481,088 bytes in BF16 (got %d)" % off)
json.dump({"model_type": "glm5_next", "text_config": {"hidden_size": D, "layer_types": ["linear_attention"],
           "linear_attn_config": {"num_heads": Hh, "head_dim": hd, "short_conv_kernel_size": Kc},
           "num_attention_heads": 64, "vocab_size": 64}}, open(os.path.join(geo, "config.json"), "w"))
for r in range(2):
    ls = local_shapes(geo, 2, r)
    local_b = sum(int(np.prod(sh)) * tt.DTYPE_BITS[dt] // 8 for dt, sh in ls.values())
    repl = sum(int(np.prod(sh)) * tt.DTYPE_BITS[dt] // 8 for k, (dt, sh) in ls.items() if sh == hdr[k]["shape"])
    F.check(local_b == 138789248, "plan: GLM-5.3 KDA at T=2, rank %d keeps 138,789,248 bytes (got %d)" % (r, local_b))
    F.check(repl == 2097408, "plan: of which 2,097,408 replicated (got %d)" % repl)
    F.check(ls[layer + "A_log"][1] == [32] and ls[layer + "dt_bias"][1] == [4096], "plan: A_log per head, dt_bias per channel")
geo_hdr = hdr

# 64 MLA heads over T = 3: 22/21/21, from the plan alone
mla = os.path.join(work, "mla64")
os.makedirs(mla)
dn, dr, dv, Rq, Rkv = 128, 64, 128, 1536, 512
sh = {"model.layers.0.self_attn.q_b_proj.weight": [64 * (dn + dr), Rq],
      "model.layers.0.self_attn.kv_b_proj.weight": [64 * (dn + dv), Rkv],
      "model.layers.0.self_attn.o_proj.weight": [7168, 64 * dv]}
tt.write_header_only(os.path.join(mla, "model.safetensors"), {k: ("BF16", v) for k, v in sh.items()})
json.dump({"model_type": "deepseek_v32", "hidden_size": 7168, "num_attention_heads": 64, "q_lora_rank": Rq,
           "kv_lora_rank": Rkv, "qk_nope_head_dim": dn, "qk_rope_head_dim": dr, "v_head_dim": dv, "vocab_size": 64},
          open(os.path.join(mla, "config.json"), "w"))
for r, heads in enumerate((22, 21, 21)):
    ls = local_shapes(mla, 3, r)
    F.check(ls["model.layers.0.self_attn.q_b_proj.weight"][1][0] == heads * (dn + dr)
            and ls["model.layers.0.self_attn.kv_b_proj.weight"][1][0] == heads * (dn + dv)
            and ls["model.layers.0.self_attn.o_proj.weight"][1][1] == heads * dv,
            "plan: 64 heads over 3 ranks: rank %d keeps %d heads at both strides" % (r, heads))


why = tt.fuse_missing()
if why:
    print("SKIP (the mount part only): " + why)
    F.done("test_plans")
    raise SystemExit(0)

# ======== through the mount ========

# 1. a wrong plan is caught by TP equivalence
wrong = write_plan("wrong.json", {
    "tpfs_plan": 1, "name": "wrong-o-proj", "extends": "kda",
    "rules": [{"name": "o_proj_on_rows", "match": "**.layers.{i}.self_attn.o_proj",
               "when": "in(i + 1, linear_attn_config.kda_layers)", "split": "column",
               "heads": "linear_attn_config.num_heads"}]})
with tt.Mount(src, 2, "--plan", wrong) as m:
    local = [load_dir(m.rank(r)) for r in range(2)]
o = "model.layers.1.self_attn.o_proj.weight"
right = R.expected("kimi_linear", cfg, o, full[o], 2, 0).shape
F.check(local[0][o].size == int(np.prod(right)) and local[0][o].shape != right,
        "the row-split o_proj %s has the byte count of the right one %s" % (local[0][o].shape, right))
# a loader that trusts byte counts takes those bytes at the shape it expects (seed 003's trap)
for r in range(2):
    for i in (0, 1, 2):
        k = "model.layers.%d.self_attn.o_proj.weight" % i
        local[r][k] = local[r][k].reshape(right)
caught = tt.Failures(quiet=True)
tp_checks("kimi_linear", cfg, full, local, 2, caught, rng)
kda_fail = [f for f in caught.items if ": KDA" in f]
F.check(len(kda_fail) == 3, "TP equivalence catches the row-split o_proj in all 3 KDA layers: %s" % kda_fail)
F.check(not [f for f in caught.items if ": KDA" not in f], "only the KDA blocks fail: %s" % caught.items)

# the dt_bias trap: rank 1's slice offset counted in heads instead of channels
with tt.Mount(src, 2) as m:
    good = [load_dir(m.rank(r)) for r in range(2)]
ok = tt.Failures()
tp_checks("kimi_linear", cfg, full, good, 2, ok, rng)
F.check(not ok.items, "the built-in plan passes the same check: %s" % ok.items)
la = cfg["linear_attn_config"]
P, H = la["num_heads"] * la["head_dim"], la["num_heads"]
for i in (0, 1, 2):
    k = "model.layers.%d.self_attn.dt_bias" % i
    good[1][k] = full[k][1 * (H // 2):1 * (H // 2) + P // 2]
trap = tt.Failures(quiet=True)
tp_checks("kimi_linear", cfg, full, good, 2, trap, rng)
F.check(len([f for f in trap.items if ": KDA" in f]) == 3, "TP equivalence catches dt_bias offset in heads: %s" % trap.items)

# 2. plan --json round trip
resolved = write_plan("resolved.json", json.loads(pj.stdout))
with tt.Mount(src5, 2) as a, tt.Mount(src5, 2, "--plan", resolved) as b:
    for r in range(2):
        F.check(tree_hash(a.rank(r)) == tree_hash(b.rank(r)), "rank %d: --plan from --json serves identical bytes" % r)

# 3. a user plan extending a built-in
keep = write_plan("keep_embed.json", {"tpfs_plan": 1, "name": "keep-embed", "extends": "llama",
                                      "rules": [{"name": "keep", "match": "model.embed_tokens", "split": "replicate"}]})
with tt.Mount(srcl, 2, "--plan", keep) as m:
    with safe_open(os.path.join(m.rank(1), "model-00001-of-00002.safetensors"), "np") as f1, \
            safe_open(os.path.join(m.rank(1), "model-00002-of-00002.safetensors"), "np") as f2:
        got = {k: (f1 if k in f1.keys() else f2).get_tensor(k) for k in list(f1.keys()) + list(f2.keys())}
F.check(np.array_equal(got["model.embed_tokens.weight"], fulll["model.embed_tokens.weight"]), "user rule replicates embed_tokens")
F.check(np.array_equal(got["lm_head.weight"], R.expected("llama", cfgl, "lm_head.weight", fulll["lm_head.weight"], 2, 1)),
        "the extended built-in still splits lm_head")

# hostile expressions refuse the mount too, with nothing mounted
for k, (expr, want) in enumerate(hostile):
    mnt = tempfile.mkdtemp(prefix="tpfs-plans-mnt-")
    p = subprocess.run([tt.TPFS, "mount", srcl, mnt, "--tp", "2", "-f", "--plan", os.path.join(work, "hostile%d.json" % k)],
                       capture_output=True, text=True, timeout=120)
    F.check(p.returncode == 1 and want in p.stderr and not tt.is_mounted(mnt),
            "tpfs mount, hostile heads %.40r: exit %d, %r" % (expr, p.returncode, p.stderr[:300]))
    if tt.is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", mnt])
    os.rmdir(mnt)

# 4. vocab padding
with tt.Mount(srcv, 8, "--pad-vocab") as m:
    local = [load_dir(m.rank(r)) for r in range(8)]
for k in ("model.embed_tokens.weight", "lm_head.weight"):
    for r in range(8):
        F.check(np.array_equal(local[r][k], R.vocab(fullv[k], 8, r, pad=64)), "padded %s rank %d" % (k, r))
F.check(not local[7]["lm_head.weight"].any() and local[7]["lm_head.weight"].shape == (16, 48), "rank 7 holds 16 zero rows")
vc = tt.Failures()
tp_checks("llama", cfgv, fullv, local, 8, vc, rng)
F.check(not vc.items, "TP equivalence with padded vocab at T=8: %s" % vc.items)


# 5. the seeds' GLM-5.3 KDA geometry through the mount
with tt.Mount(geo, 2) as m:
    for r in range(2):
        lh = tt.read_header(os.path.join(m.rank(r), "model.safetensors"))[1]
        local_b = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in lh.values())
        repl = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in lh.items() if v["shape"] == geo_hdr[k]["shape"])
        F.check(local_b == 138789248, "GLM-5.3 KDA at T=2, rank %d keeps 138,789,248 bytes (got %d)" % (r, local_b))
        F.check(repl == 2097408, "of which 2,097,408 replicated (got %d)" % repl)
        F.check(lh[layer + "A_log"]["shape"] == [32] and lh[layer + "dt_bias"]["shape"] == [4096],
                "A_log per head [32], dt_bias per channel [4096]")

# 6. 64 MLA heads over T = 3 through the mount
with tt.Mount(mla, 3) as m:
    for r, heads in enumerate((22, 21, 21)):
        lh = tt.read_header(os.path.join(m.rank(r), "model.safetensors"))[1]
        F.check(lh["model.layers.0.self_attn.q_b_proj.weight"]["shape"][0] == heads * (dn + dr)
                and lh["model.layers.0.self_attn.kv_b_proj.weight"]["shape"][0] == heads * (dn + dv)
                and lh["model.layers.0.self_attn.o_proj.weight"]["shape"][1] == heads * dv,
                "64 heads over 3 ranks: rank %d keeps %d heads at both strides" % (r, heads))

F.done("test_plans")
