"""The front ends reach a view's served files only through the model's accessor.

The file system (src/fs_*.c, fs_int.h) and the command line (src/cli*.c) ask the model for "view rank g's part
file k" with tp_model_view_file (its layout, the part it is cut from, its sources as nodes, the file it is named
after), tp_model_view_parts, tp_model_view_part_nodes and tp_model_ranks (model.h). They never read the fields
the model keeps those in (mv, its tp_mview of model_view.h, and the names those had before: vplan, vs, vnode,
vslot_part, vsrc_node, vstage_np, W), so the view's internals can change without touching a front end. This
test fails, naming file and line, on a front end that reads one; and checks that its pattern catches such a
read (a planted line) and that the accessor is used. Needs only python3.
"""
import glob
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FIELDS = ("mv", "vplan", "vs", "vnode", "vslot_part", "vsrc_node", "vstage_np", "W")
PAT = re.compile(r"(->|\.)(%s)\b(?!\s*\()" % "|".join(FIELDS))
FRONT = sorted(glob.glob(os.path.join(ROOT, "src", "fs_*.c")) + glob.glob(os.path.join(ROOT, "src", "fs_int.h")) +
               glob.glob(os.path.join(ROOT, "src", "cli*.c")))
failed = []


def strip_comments(text):
    """The text with C comments blanked (line numbers kept)."""
    return re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


hits = []
uses = 0
for path in FRONT:
    text = strip_comments(open(path).read())
    uses += text.count("tp_model_view_file(")
    for n, line in enumerate(text.split("\n"), 1):
        if PAT.search(line):
            hits.append("%s:%d: %s" % (os.path.relpath(path, ROOT), n, line.strip()))
if hits:
    failed.append("front ends read the model's view fields (use tp_model_view_file and the other accessors of "
                  "model.h):\n  " + "\n  ".join(hits))
if not FRONT:
    failed.append("no front-end files found under src/")
if uses < 4:
    failed.append("the front ends call tp_model_view_file %d times: expected the accessor in use" % uses)
planted = ["n = fs->m->mv.vplan.nparts;", "s = m->mv.pp_start[1];", "n = fs->m->vplan.nparts;", "x = m->vs[k].size;",
           "w = m->W;", "p = m->vslot_part[0];"]
missed = [p for p in planted if not PAT.search(strip_comments(p))]
if missed:
    failed.append("the pattern misses planted reads: %s" % missed)
if PAT.search(strip_comments("fs.vs_count = 1; /* m->vplan */ tp_model_ranks(m);")):
    failed.append("the pattern flags a line that reads no view field")
for f in failed:
    print("FAIL: " + f)
print("seam: %d front-end files, %d accessor calls, %d failed" % (len(FRONT), uses, len(failed)))
sys.exit(1 if failed else 0)
