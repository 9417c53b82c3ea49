"""Two built-in views that match the same checkpoints are refused when the views are compiled in.

tpfs chooses the first built-in view, in file-name order, whose engine, plans, model_types and quant_methods
match a checkpoint (view.c); a second view that matches the same (engine, plan, model_type, quant_method) would
never be chosen, silently. plans/embed.py --views refuses such a pair by name, which fails the build. Checked
here: the repository's views compile; a view that extends llama and claims one of its model types is refused,
naming both files; the same view under another quant_method, or for model types of its own, is not; a view that
inherits its parent's model types through "extends" (and a parent that claims every model type) is refused too.
Needs only python3 (no venv)."""
import json
import os
import subprocess
import sys
import tempfile

import plain_check

from plain_check import EMBED, VIEWS
from plain_check import check


def embed(extra, work):
    out = os.path.join(work, "views_data.h")
    return subprocess.run([sys.executable, EMBED, "--views", out] + VIEWS + extra, capture_output=True, text=True)


work = tempfile.mkdtemp(prefix="tpfs-view-clash-")
p = embed([], work)
check(p.returncode == 0 and os.path.getsize(os.path.join(work, "views_data.h")) > 0,
      "the repository's views compile: %s" % p.stderr[-300:])
cases = [  # (what, the extra view, refused?)
    ("a view extending llama that claims qwen3", {"extends": "llama", "model_types": ["qwen3", "mystery"]}, True),
    ("the same for model types of its own", {"extends": "llama", "model_types": ["mystery"]}, False),
    ("the same quantized by a method no llama view takes", {"extends": "llama", "model_types": ["qwen3"],
                                                             "quant_methods": ["mystery_quant"]}, False),
    ("a quantized view claiming llama_fp8's form", {"extends": "llama", "model_types": ["llama"],
                                                     "quant_methods": ["fp8"]}, True),
    ("a view inheriting llama's model types through extends", {"extends": "llama"}, True),
    # "drop": ["model_types"] takes the parent's away (merge_over): the view then matches every model type
    ("a view of the llama plan for every model type", {"extends": "llama", "drop": ["model_types"]}, True),
]
for i, (what, fields, refused) in enumerate(cases):
    v = dict({"tpfs_view": 1, "engine": "vllm", "name": "clash%d" % i, "tensors": []}, **fields)
    path = os.path.join(work, "clash%d.json" % i)
    with open(path, "w") as f:
        json.dump(v, f)
    p = embed([path], work)
    if refused:
        check(p.returncode != 0 and "clash%d.json" % i in p.stderr and "llama" in p.stderr and
              "match the same checkpoints" in p.stderr, "%s: refused by name, got %d %r" % (what, p.returncode, p.stderr))
    else:
        check(p.returncode == 0, "%s: not a clash, got %d %r" % (what, p.returncode, p.stderr))
plain_check.done("test_view_clash")
