"""Two nodes from slow storage (issue 32): one vLLM run across two nodes, each node pulling its weights
from the shared checkpoint on slow storage, with tpfs serving only its ranks against vLLM's default loader
reading the whole checkpoint on every node. Side by side in one run, each repetition of every row in turn.

The nodes are mount namespaces of this machine (unshare -m), as in tests/py/test_vllm_nodes.py: vLLM's
`serve` (tests/py/vllm_serve.py) on node 0, `serve --headless` on node 1, --nnodes 2 over loopback, one
core each. The storage is io_bench.py's (an ext4 image, read through a loop device with direct I/O,
limited by a cgroup's read rate, the page cache dropped before every start), made per node: one image,
two read-only loop devices over it, node r mounting its own at the same path in its namespace. So each
node has its own page cache and its own link to the store (the limit holds per device), as separate
machines have, and each device's sector count is exactly the bytes its node fetched.

Rows, for TP=2 (node r runs TP rank r) and PP=2 x TP=1 (node r runs stage r):
  default loader   `--load-format auto` on STORE/src: every node's worker reads every source file
                   (safetensors_weights_iterator) and slices in its weight loaders;
  default + cat    the contender of issue 46: the default loader while `cat STORE/src/*.safetensors`
                   reads the whole checkpoint into the node's page cache in the background from the
                   moment the node starts (what a user could do by hand);
  tpfs             `tpfs mount STORE/src MNT --view vllm --ranks r` on each node (its defaults: push-ahead
                   fills the page cache of the node's rank files while vLLM starts), `--load-format
                   sharded_state` on MNT: each node reads the source runs of its ranks only;
  local dump       the ceiling: `--load-format sharded_state` on a pre-sharded dump of the same split (made
                   once through tpfs into --work, on this machine's disk, not the store), read into the
                   node's page cache before vLLM starts: what vLLM's load costs with no storage and no
                   FUSE at all (each node's one core copying its weights);
  page-touch min.  the source pages a node's ranks touch (`tpfs plan --view vllm --io --ranks r`).
Per node: bytes fetched from storage, vLLM's "Loading weights took" (its worker's log), and the seconds
from start to a served /health on node 0 (the whole start), with its ratio to the default loader's and
to the contender's. Greedy tokens of every start must agree per split.

Needs root and the vLLM venv (scripts/setup.sh --vllm). The checkpoint is random (MAKE below:
Llama-2-7B's widths over 4 layers, about 1.9 GB bf16), generated once in --work.

python bench/vllm_nodes.py [--reps N] [--rate MBPS] [--splits tp2,pp2] [--work DIR] [--tpfs PATH] [--out FILE]
"""
import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
import io_bench as IO  # noqa: E402
import test_vllm_nodes as nodes  # noqa: E402 -- its vllm serve options and process checks
import tpfs_test  # noqa: E402
import vllm_bench  # noqa: E402

# Llama-2-7B's widths (hidden 4096, MLP 11008, 32 heads; 8 KV heads, as its larger kin have) over 4 layers, bf16,
# about 1.9 GB in 5 files: rows wide enough that a rank's half of a row-parallel row is whole pages, as in the
# models served (a narrower model's half rows share pages, which every node then fetches)
MAKE = r'''
import sys, torch, transformers as tf
torch.manual_seed(0)
cfg = tf.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=4, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=512,
                     tie_word_embeddings=False, initializer_range=0.02)
m = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
m.save_pretrained(sys.argv[1], max_shard_size="400MB")
'''

# one node: its store mounted at $STORE in its own namespace, tpfs over it where $TPFS_ARGS says, vLLM
NODE = r'''
mount -o ro,noload "$DEV" "$STORE" || exit 1
model="$STORE/src"
if [ -n "$CAT" ]; then
  cat "$STORE"/src/*.safetensors > /dev/null &
fi
if [ -n "$DUMP" ]; then
  cat "$DUMP"/*.safetensors > /dev/null
  model="$DUMP"
fi
if [ -n "$TPFS_ARGS" ]; then
  "$TPFS" mount "$STORE/src" "$MNT" $TPFS_ARGS -f 2> "$OUT.tpfs.log" &
  tpid=$!
  for i in $(seq 300); do [ -e "$MNT/config.json" ] && break; sleep 0.1; done
  model="$MNT"
fi
"$PY" "$SERVE" "$model" "$@" > "$OUT.vllm.log" 2>&1 &
echo $! > "$OUT.pid"
wait $!
if [ -n "$TPFS_ARGS" ]; then
  cp "$MNT/.tpfs-stats" "$OUT.stats"
  cat /proc/$tpid/stat > "$OUT.cpu"
  fusermount3 -u "$MNT" || fusermount3 -u -z "$MNT"
  wait $tpid
fi
umount "$STORE"
'''


def start(py, tpfs, work, store, devs, split, mode):
    """One two-node start of SPLIT with MODE ("default", "cat", "tpfs" or "dump"); returns {"bytes": [per node], "load":
    [per node s], "health": s, "tokens", "stats": [per node source bytes or None]}. Raises on a failure,
    with the logs' place."""
    port, http = nodes.free_port(), nodes.free_port()
    mnt = os.path.join(work, "mnt")  # the same path on both nodes (each namespace mounts its own)
    os.makedirs(mnt, exist_ok=True)
    IO.drop_caches()
    before = [IO.sectors_of(d) for d in devs]
    procs, outs = [], []
    t0 = time.time()
    for r in range(2):
        out = os.path.join(work, "%s-%s-node%d" % (split, mode, r))
        outs.append(out)
        for suffix in (".vllm.log", ".stats", ".pid", ".cpu"):
            with contextlib.suppress(OSError):
                os.unlink(out + suffix)
        pp = split == "pp2"
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=str(r), VLLM_CPU_KVCACHE_SPACE="1", VLLM_HOST_IP="127.0.0.1",
                   GLOO_SOCKET_IFNAME="lo", OUT=out, DEV=devs[r], STORE=store, MNT=mnt, PY=py, TPFS=tpfs,
                   SERVE=os.path.join(ROOT, "tests", "py", "vllm_serve.py"), CAT="1" if mode == "cat" else "",
                   DUMP=os.path.join(work, "dump-" + split) if mode == "dump" else "",
                   TPFS_ARGS="--tp %d --pp %d --view vllm --ranks %d" % (1 if pp else 2, 2 if pp else 1, r)
                   if mode == "tpfs" else "")
        cmd = ["unshare", "-m", "--propagation", "private", "bash", "-c", NODE, "node"] + \
            nodes.serve_args(split, port, http, 2, r) + ["--load-format", "sharded_state" if mode in ("tpfs", "dump") else "auto"]
        with open(out + ".out", "w") as lf:
            procs.append(subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True))
    url = "http://127.0.0.1:%d" % http
    res = {}
    err = None
    try:
        deadline = time.time() + 900
        while True:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a node ended before vLLM served")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=5) as h:
                    if h.status == 200:
                        break
            if time.time() > deadline:
                raise RuntimeError("vLLM did not serve within 900 s")
            time.sleep(0.5)
        res["health"] = time.time() - t0
        res["tokens"] = str(tpfs_test.vllm_complete(url, [1, 5, 9, 600, 999])[0])
    except Exception as e:  # noqa: BLE001 -- reported after the nodes are ended
        err = "%s %s: %s (logs %s-*)" % (split, mode, e, os.path.join(work, split + "-" + mode))
    finally:
        for r, p in enumerate(procs):  # SIGTERM to vLLM on each node; node 1's headless worker needs its own
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                os.kill(int(open(outs[r] + ".pid").read()), signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for p in procs:  # every process of each node's session ends
            end = time.time() + 60
            while time.time() < end and nodes.group_alive(p.pid):
                time.sleep(0.5)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    if err:
        raise RuntimeError(err)
    res["bytes"] = [(IO.sectors_of(d) - s0) * 512 for d, s0 in zip(devs, before)]
    res["load"], res["stats"] = [], []
    for out in outs:
        log = open(out + ".vllm.log").read()
        loads = [float(x) for x in re.findall(r"Loading weights took ([0-9.]+) s", log)]
        if not loads:
            raise RuntimeError("no 'Loading weights took' in %s.vllm.log" % out)
        res["load"].append(max(loads))
        src = None
        with contextlib.suppress(OSError):
            src = sum(int(f[2]) for f in (line.split() for line in open(out + ".stats"))
                      if len(f) == 6 and f[0].isdigit())
        res["stats"].append(src)
        cpu = None  # the daemon's user + system seconds (/proc/PID/stat fields 14, 15)
        with contextlib.suppress(OSError, IndexError, ValueError):
            f = open(out + ".cpu").read().rsplit(")", 1)[1].split()
            cpu = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        res.setdefault("cpu", []).append(cpu)
    return res


def page_touch(tpfs, src, split, r):
    pp = split == "pp2"
    out = IO.sh(tpfs, "plan", src, "--tp", 1 if pp else 2, "--view", "vllm", *(["--pp", 2] if pp else []), "--io",
                "--ranks", r)
    for line in out.splitlines():
        w = line.split()
        if w and w[0] == "served":
            return int(w[3]), int(w[2]), int(w[1])  # page-touch minimum, source runs, rank (part) files
    raise RuntimeError("no served line in tpfs plan --io")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--rate", type=float, default=200.0, help="each node's storage read limit, MB/s")
    ap.add_argument("--splits", default="tp2,pp2")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "vllm-nodes-bench"))
    ap.add_argument("--tpfs", default=os.path.join(ROOT, "build", "src", "tpfs"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (loop devices, mount namespaces, cgroup, drop_caches)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # so that the storage is taken down
    py = vllm_bench.vllm_python()
    tpfs = os.path.abspath(a.tpfs)
    splits = a.splits.split(",")
    os.makedirs(a.work, exist_ok=True)
    gen = os.path.join(a.work, "llama-7b-4l")
    if not os.path.exists(os.path.join(gen, ".complete")):
        shutil.rmtree(gen, ignore_errors=True)
        print("generating the Llama-shaped checkpoint in %s ..." % gen, flush=True)
        subprocess.run([py, "-c", MAKE, gen], check=True)
        open(os.path.join(gen, ".complete"), "w").close()
    size = sum(os.path.getsize(p) for p in IO.st_files(gen))
    tmp = tempfile.mkdtemp(dir=a.work)
    store = IO.SlowStore(tmp, int(size * 1.3) + (256 << 20), a.rate)  # written through its own loop device
    devs, pts = [], {}
    modes = ("default", "cat", "tpfs", "dump")
    for s in splits:  # the ceiling's pre-sharded dumps, made through tpfs from the generated checkpoint
        dump = os.path.join(a.work, "dump-" + s)
        if not os.path.exists(os.path.join(dump, ".complete")):
            shutil.rmtree(dump, ignore_errors=True)
            mnt = tempfile.mkdtemp(dir=a.work)
            pp = s == "pp2"
            IO.sh(tpfs, "mount", gen, mnt, "--tp", 1 if pp else 2, "--pp", 2 if pp else 1, "--view", "vllm",
                  "--push", "off")
            try:
                shutil.copytree(mnt, dump, ignore=shutil.ignore_patterns(".tpfs-stats"))
            finally:
                IO.sh("umount", mnt)
                os.rmdir(mnt)
            open(os.path.join(dump, ".complete"), "w").close()
    res = {(s, m): [] for s in splits for m in modes}
    try:
        shutil.copytree(gen, os.path.join(store.mnt, "src"), ignore=shutil.ignore_patterns(".complete"))
        subprocess.run(["sync"])
        IO.sh("umount", store.mnt)
        for _ in range(2):  # each node's link to the same store
            devs.append(IO.sh("losetup", "--direct-io=on", "-r", "-f", "--show", store.img))
        IO.sh("mount", "-o", "ro,noload", devs[0], store.mnt)  # for the plan's page-touch figures only
        for s in splits:
            for r in range(2):
                pts[(s, r)] = page_touch(tpfs, os.path.join(store.mnt, "src"), s, r)
        IO.sh("umount", store.mnt)
        store.limit_devices(devs)
        for rep in range(a.reps):
            for s in splits:
                for m in modes:
                    x = start(py, tpfs, a.work, store.mnt, devs, s, m)
                    res[(s, m)].append(x)
                    print("rep %d %s %-7s: fetched %s MB, weights loaded in %s s, served after %.1f s, tokens %r" % (
                        rep + 1, s, m, " | ".join("%.1f" % (b / IO.MB) for b in x["bytes"]),
                        " | ".join("%.2f" % t for t in x["load"]), x["health"], x["tokens"]), flush=True)
    finally:
        store.unlimit()
        with contextlib.suppress(subprocess.CalledProcessError):
            if os.path.ismount(store.mnt):
                IO.sh("umount", store.mnt)
        for d in devs:
            with contextlib.suppress(subprocess.CalledProcessError):
                IO.sh("losetup", "-d", d)
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    lines = ["Two nodes (mount namespaces, one core each), each reading the shared checkpoint through its own link "
             "(loop device, direct I/O, %s, page cache dropped before each start); checkpoint %.2f GB bf16 "
             "with Llama-2-7B's widths (4 layers, 8 KV heads); medians of %d starts." % (
                 "reads limited to %.0f MB/s per node" % a.rate if store.limited else store.note, size / 1e9, a.reps),
             "",
             "| split | loader | node | fetched from storage | x page-touch minimum | Loading weights took | "
             "x default loader | served after (node 0) | whole start x default, x default + cat |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    ok = True
    for s in splits:
        d, c, t, u = res[(s, "default")], res[(s, "cat")], res[(s, "tpfs")], res[(s, "dump")]
        toks = {x["tokens"] for x in d + c + t + u}
        ok &= len(toks) == 1
        hd, hc = (statistics.median(x["health"] for x in rows) for rows in (d, c))
        for m, rows in (("default", d), ("cat", c), ("tpfs", t), ("dump", u)):
            hl = statistics.median(x["health"] for x in rows)
            for r in range(2):
                f = statistics.median(x["bytes"][r] for x in rows)
                ld = statistics.median(x["load"][r] for x in rows)
                ld0 = statistics.median(x["load"][r] for x in d)
                label = {"default": "vLLM's default loader on STORE/src",
                         "cat": "the default loader, `cat` of every file in the background from the start",
                         "dump": "the ceiling: sharded_state on a pre-sharded dump on local disk, cached",
                         "tpfs": "sharded_state on `tpfs mount --view vllm --ranks %d`" % r}[m]
                lines.append("| %s | %s | %d | %.1f MB | %.2fx | %.2f s | %.2fx | %s | %s |" % (
                    "TP=2" if s == "tp2" else "PP=2", label, r, f / IO.MB, f / pts[(s, r)][0], ld, ld / ld0,
                    "%.1f s" % hl if r == 0 else "", "%.2fx, %.2fx" % (hl / hd, hl / hc) if r == 0 else ""))
        lines.append("| %s | page-touch minimum (`tpfs plan --io --ranks r`) | 0 / 1 | %.1f / %.1f MB | 1.00x | | | | |" % (
            "TP=2" if s == "tp2" else "PP=2", pts[(s, 0)][0] / IO.MB, pts[(s, 1)][0] / IO.MB))
        lines.append("")
        lines.append("%s: greedy tokens of every start %s. tpfs's stats: each node's source bytes %s; each "
                     "node's tpfs daemon used %s CPU seconds, %s s per GB of its rank files (median, node 0 / 1)." % (
                         s, "identical" if len(toks) == 1 else "DIFFERENT: %r" % sorted(toks),
                         " / ".join(str(x["stats"]) for x in t),
                         " / ".join(str([c if c is None else round(c, 2) for c in x["cpu"]]) for x in t),
                         " / ".join("%.2f" % (statistics.median(x["cpu"][r] or 0 for x in t) / (pts[(s, r)][2] / 1e9))
                                    for r in range(2))))
        lines.append("")
    lines.append("Command: `python bench/vllm_nodes.py --reps %d --rate %g` (root; the machine: 2 cores, no GPU)."
                 % (a.reps, a.rate))
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
