"""Byte identity of the engine views across a change of the view language or of the view files: the
SHA-256 of every file `tpfs mount SRC MNT --tp T --view ENGINE` serves, for every family of the vLLM
probe (tests/py/test_vllm.py FAMILIES, at T=2 and 4) and of the SGLang test (tests/py/test_sglang.py
FAMILIES, at T=2), over the tiny checkpoints tests/py/vllm_models.py makes. bench/digests.py covers
the fixture families (rank folders and --view vllm); this covers every built-in view the probes
prove. A refused mount is listed with its last stderr line.

    BUILD/venv-vllm/bin/python bench/view_digests.py OUT [--tpfs PATH] [--work DIR]

Run it with the binary before a change and after (the views are built into the binary), then `diff`
the two lists: empty means every engine view serves the same bytes. --work keeps the checkpoints
between runs (made once: seeded).
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))
sys.path.insert(0, HERE)
import digests  # noqa: E402 -- its tree of digests and its mount


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tpfs", default=os.path.join(HERE, "..", "build", "src", "tpfs"))
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    os.environ["TPFS_BIN"] = os.path.abspath(a.tpfs)
    import tpfs_test as tt
    import vllm_models
    import test_vllm
    import test_sglang
    work = a.work or tempfile.mkdtemp(prefix="tpfs-vdg-")
    cases = [("vllm", fam, T, None) for fam in test_vllm.FAMILIES for T in (2, 4)]
    cases += [("sglang", fam, 2, cfg) for fam, (_, cfg) in test_sglang.FAMILIES.items()]
    lines = []
    for engine, fam, T, cfg in cases:
        src = os.path.join(work, "%s-src%d" % (engine, T), fam)
        if not os.path.exists(os.path.join(src, "config.json")):
            vllm_models.make(fam, src, tp=T, config=cfg)
        tag = "%s %s T=%d" % (engine, fam, T)
        lines += digests.mount_lines(tt, src, T, ["--view", engine], tag, err_line=-1)
        print(tag, flush=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("%d lines to %s" % (len(lines), a.out))


if __name__ == "__main__":
    main()
