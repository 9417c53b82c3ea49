"""README.md is a landing page whose quick starts work as written.

Checked here:
- README.md is under 200 lines and no line of it is longer than 500 characters;
- every repository path it names (docs/..., scripts/..., tests/..., views/..., bench/...) exists;
- each quick start is marked `<!-- quickstart NAME: FILE[ and FILE] ... -->` right above its code block, and each
  FILE exists;
- the rank-folder quick start runs as written: its lines go to bash with `model/` a generated Llama-like
  checkpoint, `/mnt/tp` a fresh folder and `tpfs` this build; after the mount line, rank0/ and rank1/ hold the
  checkpoint's files (config.json giving the rank's head count); the plan line prints lm_head's rule; after
  the umount line nothing is mounted there;
- the other quick starts are run by the tests their marker names (an engine start each, which this test does not
  repeat): every option (`--...`) of the block's lines appears in those tests' text (or, for an engine's
  Python entry, as the keyword of the same server argument: `load_format=`), so that a flag renamed in README
  or in the test fails here.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile

import fixtures
import tpfs_test as tt

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
F = tt.Failures()
text = open(os.path.join(ROOT, "README.md")).read()
lines = text.split("\n")

F.check(len(lines) < 200, "README.md is under 200 lines (%d)" % len(lines))
long = [i + 1 for i, l in enumerate(lines) if len(l) > 500]
F.check(not long, "no README line over 500 characters (lines %s)" % long)

paths = sorted(set(re.findall(r"\b((?:docs|scripts|tests|views|bench|plans)/[A-Za-z0-9_./-]*[A-Za-z0-9_])", text)))
missing = [p for p in paths if not os.path.exists(os.path.join(ROOT, p))]
F.check(paths and not missing, "every path README names exists (%d named; missing %s)" % (len(paths), missing))

# the quick starts: a marker, then a fenced block
blocks = {}
for m in re.finditer(r"<!-- quickstart ([a-z-]+): (.*?) -->\n```sh\n(.*?)```", text, re.S):
    name, note, body = m.group(1), m.group(2), m.group(3)
    files = re.findall(r"tests/py/[a-z_]+\.py|test_[a-z_]+\.py", note)
    files = [f if f.startswith("tests/") else "tests/py/" + f for f in files]
    blocks[name] = (files, [l.split("#")[0].strip() for l in body.splitlines() if l.split("#")[0].strip()])
F.check(set(blocks) >= {"rank-folders", "vllm", "sglang", "nodes"},
        "README has the four quick starts, each marked (found %s)" % sorted(blocks))
for name, (files, cmds) in blocks.items():
    F.check(files and all(os.path.exists(os.path.join(ROOT, f)) for f in files),
            "quick start %s names the tests that run it (%s)" % (name, files))
    if name == "rank-folders":
        continue
    corpus = "".join(open(os.path.join(ROOT, f)).read() for f in files if os.path.exists(os.path.join(ROOT, f)))
    opts = sorted(set(o for c in cmds for o in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", c)))
    # an engine's Python entry takes the same server arguments as keywords (SGLang's Engine(model_path=...,
    # load_format=...) is its ServerArgs, as launch_server's --model-path and --load-format are)
    absent = [o for o in opts if o not in corpus and not re.search(r"\b%s\s*=" % o[2:].replace("-", "_"), corpus)]
    F.check(opts and not absent, "quick start %s: its options %s are used by %s (absent: %s)" % (name, opts, files, absent))

# the rank-folder quick start, as written
tt.require_fuse()
work = tempfile.mkdtemp(prefix="tpfs-readme-")
try:
    src, mnt = os.path.join(work, "model"), os.path.join(work, "mnt-tp")
    fixtures.make("llama", src)
    cfg = json.load(open(os.path.join(src, "config.json")))
    os.makedirs(mnt)
    bindir = os.path.join(work, "bin")
    os.makedirs(bindir)
    os.symlink(os.path.abspath(tt.TPFS), os.path.join(bindir, "tpfs"))
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    cmds = blocks.get("rank-folders", ([], []))[1]
    F.check([c.split()[:2] for c in cmds] == [["tpfs", "mount"], ["tpfs", "plan"], ["tpfs", "umount"]],
            "the rank-folder quick start is mount, plan, umount: %s" % cmds)
    for c in cmds:
        line = c.replace("/mnt/tp", mnt)
        p = subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        F.check(p.returncode == 0, "%s: exit 0 (%d: %s)" % (c, p.returncode, p.stderr.strip()[:300]))
        if c.startswith("tpfs mount"):
            for r in range(2):
                names = sorted(os.listdir(os.path.join(mnt, "rank%d" % r))) if os.path.isdir(os.path.join(mnt, "rank%d" % r)) else []
                F.check(names == sorted(os.listdir(src)), "rank%d/ holds every file of model/ (%s)" % (r, names))
                if names:
                    rc = json.load(open(os.path.join(mnt, "rank%d" % r, "config.json")))
                    F.check(rc["num_attention_heads"] == cfg["num_attention_heads"] // 2,
                            "rank%d's config.json gives the rank's heads (%s)" % (r, rc["num_attention_heads"]))
        elif c.startswith("tpfs plan"):
            F.check("lm_head" in p.stdout, "the plan prints lm_head's rule")
        elif c.startswith("tpfs umount"):
            F.check(not tt.is_mounted(mnt), "nothing is mounted at the mount point after umount")
finally:
    if tt.is_mounted(os.path.join(work, "mnt-tp")):
        subprocess.run(["fusermount3", "-u", "-z", os.path.join(work, "mnt-tp")])
    shutil.rmtree(work, ignore_errors=True)
F.done("README quick starts")
