"""Memory errors: a mount-read-unmount cycle under valgrind shows no invalid accesses and no leaks
(definite or indirect), with reads through read() and mmap on every rank."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from safetensors import safe_open

import fixtures
import reference as R
import tpfs_test as tt

tt.require_fuse()
if not shutil.which("valgrind"):
    print("valgrind is missing: scripts/setup.sh installs it")
    sys.exit(1)
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-vg-")
src = os.path.join(work, "m")
cfg, full = fixtures.make("deepseek_v3", src)
mnt = os.path.join(work, "mnt")
os.mkdir(mnt)
log = os.path.join(work, "vg.log")
proc = subprocess.Popen(["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect",
                         "--show-leak-kinds=definite,indirect", "--error-exitcode=99", "--log-file=" + log,
                         tt.TPFS, "mount", src, mnt, "--tp", "3", "-f"], stderr=subprocess.DEVNULL)
try:
    tt.wait_for(lambda: tt.is_mounted(mnt) or proc.poll() is not None, timeout=120, what="the mount under valgrind")
    for r in range(3):
        for fn in sorted(os.listdir(src)):
            p = os.path.join(mnt, "rank%d" % r, fn)
            data = open(p, "rb").read()
            F.check(len(data) == os.path.getsize(p), "rank %d %s read whole" % (r, fn))
            if fn.endswith(".safetensors"):
                with safe_open(p, "np") as f:
                    for k in f.keys():
                        F.check(np.array_equal(f.get_tensor(k), R.expected("deepseek_v3", cfg, k, full[k], 3, r)),
                                "rank %d %s" % (r, k))
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    rc = proc.wait(timeout=120)
finally:
    if tt.is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", mnt])
    if proc.poll() is None:
        proc.kill()
        proc.wait()
text = open(log).read()
# the log holds every process valgrind followed (the daemon and its readiness helper): each must be clean
errors = [int(x) for x in re.findall(r"ERROR SUMMARY: (\d+) errors", text)]
lost = [int(x.replace(",", "")) for x in re.findall(r"(?:definitely|indirectly) lost: ([\d,]+) bytes", text)]
F.check(rc == 0, "valgrind exit status %s" % rc)
F.check(len(errors) >= 1 and not any(errors), "valgrind: 0 errors in every process: %s" % errors)
F.check(not any(lost), "valgrind: nothing definitely or indirectly lost in any process: %s" % lost)
print("\n".join(l for l in text.splitlines() if re.search(r"ERROR SUMMARY|definitely lost|indirectly lost|in use at exit", l)))
if F.items:
    print(text[-4000:])
shutil.rmtree(work)
F.done("test_valgrind")
