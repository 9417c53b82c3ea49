"""No view entry is copied verbatim across view files: plans/embed.py --views refuses, when the views
are compiled in, a "tensors" entry written out in two files (a view or a fragment), naming the entry and both
files; what views share lives in one fragment they include (with "params" where the names differ) or in a view
they extend. Checked here: the repository's views compile; a view repeating one of llama's entries or of a
fragment's (keys in another order), and an attention scale written out by hand in two views, are refused by
name; the same entry under another served name is not; {"drop": {"entry": NAME}} repeated is not (it names an
inherited entry, it makes none), while a drop of source tensors repeated is.
Needs only python3 (no venv)."""
import json
import os
import subprocess
import sys
import tempfile

import plain_check

from plain_check import EMBED, ROOT, VIEWS
from plain_check import check


def embed(extra, work):
    out = os.path.join(work, "views_data.h")
    return subprocess.run([sys.executable, EMBED, "--views", out] + VIEWS + extra, capture_output=True, text=True)


work = tempfile.mkdtemp(prefix="tpfs-view-copies-")
p = embed([], work)
check(p.returncode == 0, "the repository's views compile, no entry copied: %s" % p.stderr[-600:])
with open(os.path.join(ROOT, "views", "vllm", "llama.json")) as f:
    llama_entry = json.load(f)["tensors"][0]
with open(os.path.join(ROOT, "views", "vllm", "fragments", "router.json")) as f:
    router_entry = json.load(f)["tensors"][-1]  # a parameterized entry of four keys, as the fragment writes it
scale = {"name": "model.layers.{i}.self_attn.attn._k_scale", "const": {"dtype": "F32", "value": 1.0},
         "per": "model.layers.{i}.self_attn.o_proj.weight"}
cases = [  # (what, the extra files' tensors lists, refused?, a word the message names)
    ("a view repeating llama's first entry", [[llama_entry]], True, llama_entry.get("name") or llama_entry.get("drop")),
    ("a fragment's entry, keys in another order", [[dict(reversed(list(router_entry.items())))]], True, "router.json"),
    ("an attention scale written out in two views", [[scale], [scale]], True, "_k_scale"),
    ("the same scale under another served name", [[scale], [dict(scale, name="x.{i}._k_scale")]], False, None),
    ("{\"drop\": {\"entry\": NAME}} in two views", [[{"drop": {"entry": "lm_head.weight"}}], [{"drop": {"entry": "lm_head.weight"}}]],
     False, None),
    ("a drop of source tensors in two views", [[{"drop": "x.{n}.*", "if": "n >= 2"}], [{"drop": "x.{n}.*", "if": "n >= 2"}]],
     True, "x.{n}.*"),
]
for i, (what, lists, refused, word) in enumerate(cases):
    extra = []
    for j, ts in enumerate(lists):
        v = {"tpfs_view": 1, "engine": "vllm", "name": "copies%d_%d" % (i, j), "plans": ["mystery%d_%d" % (i, j)],
             "tensors": ts}
        path = os.path.join(work, "copies%d_%d.json" % (i, j))
        with open(path, "w") as f:
            json.dump(v, f)
        extra.append(path)
    p = embed(extra, work)
    if refused:
        check(p.returncode != 0 and "copied verbatim" in p.stderr and "copies%d_0.json" % i in p.stderr and
              word in p.stderr, "%s: refused by name, got %d %r" % (what, p.returncode, p.stderr[-400:]))
    else:
        check(p.returncode == 0, "%s: not a copy, got %d %r" % (what, p.returncode, p.stderr[-400:]))
plain_check.done("test_view_copies")
