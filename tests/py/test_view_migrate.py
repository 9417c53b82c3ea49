"""scripts/view_migrate.py rewrites a view written in the old view language into today's (the keywords tpfs
now refuses, each naming its replacement): "when" -> "if", "unless" -> "if": "!(...)", "if_missing" ->
"if": "!tensor('...')", "optional" -> "if" over the pieces after the first, "shape" on a cat / from entry
-> "reshape" (a constant's "shape" kept), conditions combined with &&; {"remove": NAME} -> {"drop": {"entry":
NAME}}, a view-level null -> "drop": [FIELD, ...], "drop_layers" -> the extra_layers fragment included (with
"with" where its prefix or key is not the default, "vllm/extra_layers" from another engine), "drop_layers": null ->
{"drop": {"entry": "model.layers.{n}.*"}}; a file that needs
none is left byte for byte. (That the migrated views serve the bytes today's do was checked on main's llama, glm5_next,
kimi_linear and gpt_oss_mxfp4 views, by mounting both: see the commit.) Needs only python3 (no venv)."""
import json
import os
import subprocess
import sys
import tempfile

import plain_check

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "scripts", "view_migrate.py")
from plain_check import check


work = tempfile.mkdtemp(prefix="tpfs-view-migrate-")
old = {"tpfs_view": 1, "engine": "vllm", "name": "m", "plans": ["llama"], "tensors": [
    {"name": "lm_head.weight", "from": "model.embed_tokens.weight", "when": "tie_word_embeddings"},
    {"drop": "lm_head.weight", "unless": "T > 1"},
    {"name": "a", "from": "x", "if_missing": "y", "when": "T == 2"},
    {"name": "L.{i}.qkv", "optional": True, "cat": ["L.{i}.q", "L.{i}.k", "L.{i}.v"]},
    {"name": "A", "from": "a_log", "shape": [1, -1]},
    {"name": "c", "const": {"dtype": "F32", "value": 1.0}, "shape": [1], "per": "x"}]}
path = os.path.join(work, "m.json")
with open(path, "w") as f:
    json.dump(old, f)
p = subprocess.run([sys.executable, TOOL, path], capture_output=True, text=True)
check(p.returncode == 0 and "migrated" in p.stdout, "the tool runs (%s)" % p.stderr[-300:])
new = json.load(open(path))["tensors"]
want = [{"name": "lm_head.weight", "from": "model.embed_tokens.weight", "if": "tie_word_embeddings"},
        {"drop": "lm_head.weight", "if": "!(T > 1)"},
        {"name": "a", "from": "x", "if": "(T == 2) && !tensor('y')"},
        {"name": "L.{i}.qkv", "cat": ["L.{i}.q", "L.{i}.k", "L.{i}.v"], "if": "tensor('L.{i}.k') && tensor('L.{i}.v')"},
        {"name": "A", "from": "a_log", "reshape": [1, -1]},
        {"name": "c", "const": {"dtype": "F32", "value": 1.0}, "shape": [1], "per": "x"}]
for k, (got, w) in enumerate(zip(new, want)):
    check(got == w, "entry %d: %r, want %r" % (k, got, w))
check(len(new) == len(want), "as many entries (%d)" % len(new))
text = open(path).read()
p = subprocess.run([sys.executable, TOOL, path], capture_output=True, text=True)
check("nothing to migrate" in p.stdout and open(path).read() == text, "a migrated file is left as it is")

# the removal keywords "drop" replaced
old2 = {"tpfs_view": 1, "engine": "vllm", "name": "m2", "extends": "deepseek_v3", "ep": None,
        "drop_layers": {"prefix": "model.layers.", "from": "num_hidden_layers"}, "pp": None,
        "include": ["mla"], "tensors": [{"remove": "lm_head.weight"}, {"drop": "x"}]}
old4 = {"tpfs_view": 1, "engine": "vllm", "name": "m4", "extends": "glm4_moe", "drop_layers": None, "tensors": []}
want4 = {"tpfs_view": 1, "engine": "vllm", "name": "m4", "extends": "glm4_moe",
         "tensors": [{"drop": {"entry": "model.layers.{n}.*"}}]}
old3 = {"tpfs_view": 1, "engine": "sglang", "name": "m3", "drop_layers": {"prefix": "model.lm.layers.", "from": "n_layers"},
        "tensors": []}
want2 = {"tpfs_view": 1, "engine": "vllm", "name": "m2", "extends": "deepseek_v3", "drop": ["ep", "pp"],
         "include": ["mla", "extra_layers"], "tensors": [{"drop": {"entry": "lm_head.weight"}}, {"drop": "x"}]}
want3 = {"tpfs_view": 1, "engine": "sglang", "name": "m3",
         "include": [{"fragment": "vllm/extra_layers", "with": {"layers": "model.lm.layers.", "count": "n_layers"}}],
         "tensors": []}
for old_v, want_v in ((old2, want2), (old3, want3), (old4, want4)):
    path = os.path.join(work, old_v["name"] + ".json")
    with open(path, "w") as f:
        json.dump(old_v, f)
    p = subprocess.run([sys.executable, TOOL, path], capture_output=True, text=True)
    got = json.load(open(path))
    check(p.returncode == 0 and got == want_v and list(got) == list(want_v), "%s: %r, want %r (%s)"
          % (old_v["name"], got, want_v, p.stderr[-300:]))
plain_check.done("test_view_migrate")
