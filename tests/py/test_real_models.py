"""Issue 13: every built-in plan proven against the real model code of transformers.

For every family of realmodel.FAMILIES: a tiny random checkpoint written by transformers'
save_pretrained (several files and an index) is mounted at T = 2 and 4 (and 3 where uneven heads
are allowed); each rank's folder is loaded strictly (no missing, unexpected or mismatched tensor)
into a local-size model of the same class built from that rank's counts (computed by realmodel
from the rules, not by tpfs); one process per rank runs the tensor-parallel forward over
torch.distributed (gloo, CPU) and the logits must equal the unsplit model's to 1e-5 relative.
Then, at T = 2, rank 0's halves of one head-carrying tensor are swapped: the same check must fail.

Workers are spawned once per T and loop over the families (torch's import dominates the cost).
Usage: test_real_models.py [FAMILY...]   (internal: --worker T RANK JOBS OUT)
"""
import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import realmodel as RM

TOL = 1e-5  # the unsplit logits, relative to their largest magnitude; a wrong split must miss it


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max())


def worker(T, r, jobs_path, out_path):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    with open(jobs_path) as f:
        jobs = json.load(f)
    dist.init_process_group("gloo", init_method="file://" + jobs_path + ".rdzv", rank=r, world_size=T,
                            timeout=datetime.timedelta(seconds=300))
    ids = RM.input_ids()
    results = {}
    for job in jobs:
        fam = RM.FAMILIES[job["family"]]
        res = {}
        t0 = time.time()
        try:
            with open(os.path.join(job["src"], "config.json")) as f:
                cfg = json.load(f)
            model = RM.load(fam, os.path.join(job["mnt"], "rank%d" % r), RM.local_config(fam, cfg, T, r))
            RM.tp_patch(fam, model, T, r)
            ok = 1
        except Exception as e:  # reported by rank 0 once every rank knows
            res["error"] = "rank %d: %s: %s" % (r, type(e).__name__, str(e)[:2000])
            ok = 0
        flag = torch.tensor([ok])
        dist.all_reduce(flag)
        if int(flag) == T:
            ref = torch.load(job["ref"])
            with torch.no_grad():
                res["err"] = rel_err(model(input_ids=ids).logits, ref)
                if job["wrong"]:
                    names = [n for n in model.state_dict() if re.search(fam["wrong"], n)]
                    assert len(names) == 1, (fam["wrong"], names)
                    res["wrong_tensor"] = names[0]
                    if r == 0:
                        p = model.state_dict()[names[0]]
                        a, b = p.chunk(2, dim=fam["wrong_dim"])
                        p.copy_(torch.cat([b, a], dim=fam["wrong_dim"]))
                    res["wrong_err"] = rel_err(model(input_ids=ids).logits, ref)
        elif "error" not in res:
            res["error"] = "another rank failed to load"
        res["seconds"] = round(time.time() - t0, 2)
        results[job["family"]] = res
    dist.destroy_process_group()
    with open(out_path + ".%d" % r, "w") as f:
        json.dump(results, f)


def main(only):
    import torch
    import tpfs_test as tt
    tt.require_fuse()
    fams = [f for f in RM.FAMILIES if not only or f in only]
    F = tt.Failures()
    table = {}
    with tempfile.TemporaryDirectory(prefix="tpfs-real-") as tmp:
        t0 = time.time()
        for name in fams:
            fam = RM.FAMILIES[name]
            src = os.path.join(tmp, name)
            cfg = RM.build(name, src)
            model = RM.load(fam, src, cfg)
            with torch.no_grad():
                torch.save(model(input_ids=RM.input_ids()).logits, os.path.join(tmp, name + ".ref.pt"))
        print("built %d tiny models in %.1f s" % (len(fams), time.time() - t0), flush=True)
        for T in (2, 3, 4):
            at_t = [f for f in fams if T in RM.FAMILIES[f]["ts"]]
            if not at_t:
                continue
            t1 = time.time()
            with contextlib.ExitStack() as stack:
                jobs = []
                for name in list(at_t):
                    try:
                        m = stack.enter_context(tt.Mount(os.path.join(tmp, name), T))
                    except AssertionError as e:
                        F.check(False, "%s T=%d: %s" % (name, T, str(e)[:1500]))
                        table[(name, T)] = "REFUSED"
                        at_t.remove(name)
                        continue
                    jobs.append(dict(family=name, src=os.path.join(tmp, name), mnt=m.path,
                                     ref=os.path.join(tmp, name + ".ref.pt"), wrong=T == 2))
                jp = os.path.join(tmp, "jobs%d.json" % T)
                with open(jp, "w") as f:
                    json.dump(jobs, f)
                out = os.path.join(tmp, "out%d" % T)
                procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(T), str(r), jp, out],
                                          stderr=subprocess.PIPE, text=True) for r in range(T)]
                errs = [p.communicate(timeout=900)[1] for p in procs]
                for r, p in enumerate(procs):
                    F.check(p.returncode == 0, "T=%d rank %d worker exited %d: %s" % (T, r, p.returncode, errs[r][-3000:]))
            if procs[0].returncode != 0:
                continue
            with open(out + ".0") as f:
                res = json.load(f)
            for name in at_t:
                x = res.get(name, {"error": "no result"})
                if "error" in x:
                    F.check(False, "%s T=%d: %s" % (name, T, x["error"]))
                    table[(name, T)] = "ERROR"
                    continue
                table[(name, T)] = "%.1e" % x["err"]
                F.check(x["err"] <= TOL, "%s T=%d: logits differ from the unsplit model by %.3g relative (> %g)"
                        % (name, T, x["err"], TOL))
                if "wrong_err" in x:
                    F.check(x["wrong_err"] > TOL,
                            "%s T=%d: swapping rank 0's halves of %s went unnoticed (%.3g)"
                            % (name, T, x["wrong_tensor"], x["wrong_err"]))
                    table[(name, "wrong")] = "%.1e (%s)" % (x["wrong_err"], x["wrong_tensor"])
            print("T=%d: %d families in %.1f s" % (T, len(at_t), time.time() - t1), flush=True)
    print("\nfamily x T -> max relative logit error (wrong split at T=2: its error)")
    for name in fams:
        print("  %-20s %s  wrong: %s" % (name, "  ".join("T=%d %-8s" % (T, table.get((name, T), "-")) for T in (2, 3, 4)),
                                           table.get((name, "wrong"), "-")))
    F.done("real models")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        main(sys.argv[1:])
