"""Rank folders that stand alone for stock loaders.

For every family with a built-in plan, a tiny random checkpoint saved by transformers is mounted at
T = 2 and 4 (deepseek_v3 also at T = 3: uneven heads and a padded vocabulary), and
- each rank's config.json is the source's text with exactly the counts the split changes replaced
  by the rank's own value (and pad_token_id by its local row, or null on the ranks without it) (the expected values are worked out here from the source config and T,
  by the distribution rules of tp-rules.md, not by tpfs);
- AutoModelForCausalLM.from_pretrained(MNT/rank{r}) loads with no missing, unexpected or
  mismatched key, and the tensor-parallel forward of scripts/tp_example.py over the ranks equals
  the unsplit model's logits to 1e-5 relative (not here: minimax_m2, whose q/k norms span all
  heads and need a variance all-reduce that a stock module cannot be given by a hook);
- every rank file's __metadata__ keeps the source's entries and says tpfs.tp_size, tpfs.tp_rank
  and tpfs.plan (the plan's name and the SHA-256 of the rules `tpfs plan --json` prints);
  stat sizes equal the bytes read;
- MNT/config.json is the source's; --config global serves config.json unchanged;
- a config whose counts disagree with the header shapes is refused before mounting, naming the
  key and both numbers.
The T workers are spawned once per T and load every family in turn.
"""
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time

import tpfs_test as tt

if __name__ == "__main__":
    tt.require_fuse()
try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError as e:
    print("SKIP: this test needs torch and transformers in the venv (%s)" % e)
    sys.exit(tt.SKIP)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import tp_example as ex  # noqa: E402

F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-rankfold-") if __name__ == "__main__" else None

# family -> {config key: how the split shares it}: even, groups (fewer units than ranks: one
# each), uneven (the first units % T ranks one more), vocab (padded to --pad-vocab first)
SHARED = {"num_attention_heads": "even", "num_key_value_heads": "groups", "intermediate_size": "even",
          "vocab_size": "vocab"}
EXPECT = {
    "llama": SHARED,
    "qwen2": SHARED,
    "qwen3": SHARED,
    "qwen2_moe": dict(SHARED, moe_intermediate_size="even", shared_expert_intermediate_size="even"),
    "qwen3_moe": dict(SHARED, moe_intermediate_size="even"),
    "deepseek_v3": dict(SHARED, num_attention_heads="uneven", num_key_value_heads="uneven",
                        moe_intermediate_size="even"),
    "glm4_moe": dict(SHARED, moe_intermediate_size="even"),
    "qwen3_next": dict(SHARED, moe_intermediate_size="even", shared_expert_intermediate_size="even",
                       linear_num_key_heads="even", linear_num_value_heads="even"),
    "mistral": SHARED,
    "deepseek_v2": dict(SHARED, num_attention_heads="uneven", num_key_value_heads="uneven",
                        moe_intermediate_size="even"),
    "deepseek_v32": dict(SHARED, num_attention_heads="uneven", num_key_value_heads="uneven",
                         moe_intermediate_size="even"),
    "glm_moe_dsa": dict(SHARED, num_attention_heads="uneven", num_key_value_heads="uneven",
                        moe_intermediate_size="even"),
    "qwen3_5_moe": dict(SHARED, moe_intermediate_size="even", shared_expert_intermediate_size="even",
                        linear_num_key_heads="even", linear_num_value_heads="even"),
    "phi3": SHARED,
    "mixtral": SHARED,
    "gemma3": SHARED,
    "gpt_oss": SHARED,
    "ernie4_5_moe": dict(SHARED, moe_intermediate_size="even"),
    "llama4": dict(SHARED, intermediate_size_mlp="even"),
    # KDA hybrids: GLM-5.3-like (under text_config) and Kimi Linear; they run where the kda plan
    # knows transformers' keys (linear_num_heads, linear_head_dim: issue 13)
    "glm5_next": dict(SHARED, num_attention_heads="uneven", num_key_value_heads="uneven",
                      moe_intermediate_size="even", linear_num_heads="even"),
    "kimi_linear": dict(SHARED, num_attention_heads="uneven", num_key_value_heads="uneven",
                        moe_intermediate_size="even", linear_num_heads="even"),
}
WAITING_FOR_PLAN = {"glm5_next", "kimi_linear"}


def share(n, how, T, r, pad=0):
    if how == "vocab" and pad:
        n = -(-n // pad) * pad
    if n % T == 0:
        return n // T
    if how == "groups" and n < T:
        return 1
    if how == "uneven":
        return n // T + (r < n % T)
    raise AssertionError("%d does not divide over %d" % (n, T))


# plans whose attention falls back to hidden_size / num_attention_heads for head_dim: a rank's
# config states it (with the unsplit value) where the source leaves it out
ADDS_HEAD_DIM = {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "mixtral", "gemma3", "gpt_oss",
                 "ernie4_5_moe", "llama4"}


def expected_config(src_text, fam, T, r, pad=0):
    """The source config with the split counts replaced, key order kept."""
    cfg = json.loads(src_text)
    if fam in ADDS_HEAD_DIM and cfg.get("head_dim") is None:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    for c in (cfg, cfg.get("text_config")):
        if c and c.get("pad_token_id") is not None and c.get("vocab_size"):
            # a row of the vocabulary: the rank holding it gets its local index, the others null
            per = share(c["vocab_size"], "vocab", T, r, pad)
            p = c["pad_token_id"] - r * per
            c["pad_token_id"] = p if 0 <= p < per and c["pad_token_id"] < c["vocab_size"] else None
        for k, how in EXPECT[fam].items():
            if c and k in c and c[k] is not None:
                c[k] = share(c[k], how, T, r, pad)
    return cfg


def text(cfg):
    return cfg.get("text_config", cfg)


def digest_of(src):
    p = tt.tpfs("plan", src, "--tp", 2, "--json", check=True)
    plan = json.loads(p.stdout)
    canon = json.dumps({"per_rank": plan.get("per_rank", []), "rules": plan["rules"]}, separators=(",", ":"),
                       ensure_ascii=False)
    return plan["name"][:-len("-resolved")], hashlib.sha256(canon.encode()).hexdigest()


def check_folder(fam, src, mnt, T, pad=0, config_global=False):
    src_cfg = open(os.path.join(src, "config.json"), "rb").read()
    F.check(open(os.path.join(mnt, "config.json"), "rb").read() == src_cfg, "%s T=%d: MNT/config.json is the source's"
            % (fam, T))
    name, digest = digest_of(src)
    for r in range(T):
        rdir = os.path.join(mnt, "rank%d" % r)
        got = open(os.path.join(rdir, "config.json"), "rb").read()
        if config_global:
            F.check(got == src_cfg, "%s T=%d r=%d: --config global serves the source's config.json" % (fam, T, r))
        else:
            want = expected_config(src_cfg, fam, T, r, pad)
            gj = json.loads(got)
            F.check(gj == want, "%s T=%d r=%d: rank config %s, want %s" % (
                fam, T, r, {k: text(gj).get(k) for k in EXPECT[fam]}, {k: text(want).get(k) for k in EXPECT[fam]}))
            F.check(list(gj) == list(want), "%s T=%d r=%d: key order kept" % (fam, T, r))
            # only the changed values' lines differ
            lines = re.sub(rb',\n  "head_dim": [0-9]+\n}', b"\n}", got).splitlines() if "head_dim" not in json.loads(
                src_cfg) else got.splitlines()
            changed = [(a, b) for a, b in zip(src_cfg.splitlines(), lines) if a != b]
            F.check(len(src_cfg.splitlines()) == len(lines) and
                    all(a.split(b":")[0] == b.split(b":")[0] for a, b in changed),
                    "%s T=%d r=%d: the other bytes are the source's" % (fam, T, r))
        for fn in sorted(os.listdir(rdir)):
            if not fn.endswith(".safetensors"):
                continue
            path = os.path.join(rdir, fn)
            data = open(path, "rb").read()
            F.check(os.stat(path).st_size == len(data), "%s T=%d r=%d %s: stat size is exact" % (fam, T, r, fn))
            _, meta = tt.read_raw(path)
            _, src_meta = tt.read_raw(os.path.join(src, fn))
            meta = meta or {}
            F.check(all(meta.get(k) == v for k, v in (src_meta or {}).items()) and src_meta,
                    "%s T=%d r=%d %s: the source's metadata %s kept: %s" % (fam, T, r, fn, src_meta, meta))
            F.check(meta.get("tpfs.tp_size") == str(T) and meta.get("tpfs.tp_rank") == str(r) and
                    meta.get("tpfs.plan") == "%s sha256:%s" % (name, digest),
                    "%s T=%d r=%d %s: rank metadata %s (want plan %s sha256:%s)" % (fam, T, r, fn, meta, name, digest))


def run(T, fams, extra=(), pad=0):
    """Mounts each family at T, checks the folders, and runs the TP forward over all of them."""
    with contextlib.ExitStack() as stack:
        jobs = []
        for fam in fams:
            m = stack.enter_context(tt.Mount(srcs[fam], T, *extra))
            check_folder(fam, srcs[fam], m.path, T, pad)
            jobs.append((fam, m.path, vocab[fam], ids))
        results = ex.run_ranks(T, jobs)
    seen = set()
    for fam, r, info, logits in results:
        seen.add((fam, r))
        if isinstance(info, str):
            F.check(False, "%s T=%d r=%d: %s" % (fam, T, r, info))
            continue
        F.check(not any(info.values()), "%s T=%d r=%d: loads strictly: %s" % (fam, T, r, info))
        if r == 0:
            err = float(abs(torch.from_numpy(logits) - ref[fam]).max() / ref[fam].abs().max())
            F.check(err <= 1e-5, "%s T=%d: TP logits equal the unsplit model's (relative error %.2e)" % (fam, T, err))
            print("%s T=%d: relative error %.2e" % (fam, T, err), flush=True)
    F.check(seen == {(f, r) for f in fams for r in range(T)}, "T=%d: every rank reported: %s" % (T, sorted(seen)))


srcs, vocab, ref, ids = {}, {}, {}, []


def main():
    t0 = time.time()
    try:
        ids[:] = [int(x) for x in torch.randint(0, 256, (7,), generator=torch.Generator().manual_seed(3))]
        fams = list(EXPECT)
        for fam in EXPECT:
            srcs[fam] = ex.make_checkpoint(fam, os.path.join(work, fam), seed=len(srcs))
            vocab[fam] = text(json.load(open(os.path.join(srcs[fam], "config.json"))))["vocab_size"]
            p = tt.tpfs("plan", srcs[fam], "--tp", 2)
            if fam in WAITING_FOR_PLAN and p.returncode != 0:  # the only families allowed to wait
                print("%s: not run: its built-in plan does not know transformers' config keys yet "
                      "(%s)" % (fam, p.stderr.strip().splitlines()[-1]), flush=True)
                fams.remove(fam)
                continue
            F.check(p.returncode == 0, "%s: tpfs plan at T=2: %s" % (fam, p.stderr))
            model, _ = ex.load_rank(srcs[fam])
            with torch.no_grad():
                ref[fam] = model(torch.tensor([ids]), use_cache=False).logits[0].float()
            del model
        print("checkpoints and unsplit logits: %.0f s" % (time.time() - t0), flush=True)
        for T in (2, 4):
            run(T, fams)
            print("T=%d: %.0f s" % (T, time.time() - t0), flush=True)
        # uneven heads (8 over 3: 3/3/2) and a padded vocabulary (256 rows padded to 258: 86 a rank)
        run(3, ["deepseek_v3"], ("--pad-vocab=3",), pad=3)

        # --config global: config.json unchanged, the metadata still there
        with tt.Mount(srcs["llama"], 2, "--config", "global") as m:
            check_folder("llama", srcs["llama"], m.path, 2, config_global=True)
        p = tt.tpfs("mount", srcs["llama"], os.path.join(work, "nowhere"), "--tp", 2, "--config", "half")
        F.check(p.returncode == 2 and "--config: local or global" in p.stderr, "--config checks its value: %s" % p.stderr)

        # a config whose counts disagree with the header shapes is refused before mounting
        bad = os.path.join(work, "bad")
        shutil.copytree(srcs["llama"], bad)
        cfg = json.load(open(os.path.join(bad, "config.json")))
        cfg["intermediate_size"] = 128  # the checkpoint's MLP has 96
        json.dump(cfg, open(os.path.join(bad, "config.json"), "w"), indent=2)
        mnt = tempfile.mkdtemp(prefix="tpfs-mnt-")
        p = tt.tpfs("mount", bad, mnt, "--tp", 2)
        F.check(p.returncode != 0 and "intermediate_size" in p.stderr and "128" in p.stderr and "96" in p.stderr,
                "counts that disagree with the shapes are refused, naming the key and both numbers: %s" % p.stderr)
        F.check(not tt.is_mounted(mnt), "nothing is mounted after the refusal")
        os.rmdir(mnt)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    F.done("test_rank_folders")


if __name__ == "__main__":  # the rank processes are spawned: they import this file without running it
    main()
