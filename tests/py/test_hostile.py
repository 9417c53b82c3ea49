"""Hostile checkpoints, through `tpfs mount`, each with the exact expected error.

A needed file (listed by the index or at the top level) that breaks a rule refuses the mount with
a message naming the file, the tensor and the rule, and leaves nothing mounted; the same file where
no rule needs it is served unchanged with a warning (and refused under --strict). Named limits
(tensors per file, entries per folder, folder depth, name length, dimensions) refuse clearly.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile

import numpy as np

import fixtures
import tpfs_test as tt

tt.require_fuse()
F = tt.Failures()
work = tempfile.mkdtemp(prefix="tpfs-hostile-")
base = os.path.join(work, "base")
fixtures.make("llama", base)
TARGET = "model-00001-of-00002.safetensors"
tried = 0


def fresh(name):
    d = os.path.join(work, name)
    shutil.copytree(base, d, symlinks=True)
    return d


def header_file(path, header, data=b"", raw_len=None):
    """Writes a file with the given header text (str or bytes) and data."""
    hb = header.encode() if isinstance(header, str) else header
    n = len(hb) if raw_len is None else raw_len
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + hb + data)


def expect_refusal(name, src, want, *extra, runner=()):
    global tried
    tried += 1
    mnt = tempfile.mkdtemp(prefix="tpfs-hm-")
    p = subprocess.run(list(runner) + [tt.TPFS, "mount", src, mnt, "--tp", "2", "-f"] + list(extra),
                       capture_output=True, text=True, timeout=120)
    F.check(p.returncode == 1 and want in p.stderr, "%s: exit %d, stderr %r, want %r" % (name, p.returncode, p.stderr.strip()[:400], want))
    F.check(not tt.is_mounted(mnt), "%s: nothing mounted" % name)
    if tt.is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", mnt])
    os.rmdir(mnt)


def bad_target(name, header, data=b"", want="", raw_len=None):
    src = fresh(name)
    header_file(os.path.join(src, TARGET), header, data, raw_len)
    expect_refusal(name, src, TARGET + ": " + want)
    return src


T = TARGET
# the prefix and the header text
src = fresh("short")
open(os.path.join(src, T), "wb").write(b"\x01\x02\x03\x04\x05")
expect_refusal("shorter than 8 bytes", src, T + ": file is 5 bytes, shorter than the 8-byte header length")
bad_target("past the end", "{}", want="header length 1000 runs past the end of the 10-byte file", raw_len=1000)
bad_target("over the limit", "{}", want="header length 100000001 exceeds the limit of 100000000 bytes", raw_len=100000001)
bad_target("not JSON", '{"a": {"dtype": ', want="header is not valid JSON")
bad_target("not an object", "[1, 2, 3]", want="header does not start with '{'")
bad_target("not starting with {", '  {"a":1}', want="header does not start with '{'")
bad_target("trailing garbage", '{} x', want="header has bytes other than whitespace after the JSON object (header byte 3)")
bad_target("invalid UTF-8", b'{"\xff":{}}', want="header: invalid UTF-8 at header byte 2")
# entries
E = '{"a":{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}}'
bad_target("unknown dtype", E % ("F13", "[2]", 0, 8), b"\0" * 8, "tensor 'a': unknown dtype 'F13'")
bad_target("negative shape", E % ("F32", "[-2]", 0, 8), b"\0" * 8, "header: negative number at header byte 29")
bad_target("fractional shape", E % ("F32", "[2.5]", 0, 8), b"\0" * 8, "header: fractional number at header byte 30")
bad_target("exponent shape", E % ("F32", "[2e0]", 0, 8), b"\0" * 8, "header: number in exponent form at header byte 30")
bad_target("overflowing shape", E % ("F32", "[99999999999999999999]", 0, 8), b"\0" * 8,
           "tensor 'a': shape[0] is not a non-negative integer below 2^53")
bad_target("overflowing element count", E % ("F32", "[4294967296,4294967296,4294967296]", 0, 8), b"\0" * 8,
           "tensor 'a': element count overflows 64 bits")
bad_target("reversed offsets", E % ("F32", "[2]", 8, 0), b"\0" * 8, "tensor 'a': data_offsets [8, 0] end before begin")
two = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[%d,%d]}}'
bad_target("overlapping offsets", two % (4, 12), b"\0" * 12, "tensor 'b': data_offsets [4, 12] overlap the previous tensor")
bad_target("hole in offsets", two % (12, 20), b"\0" * 20, "tensor 'b': data_offsets [12, 20] leave a hole before it")
bad_target("offsets past the end", E % ("F32", "[2]", 0, 8), b"\0" * 4,
           "file is 66 bytes but the header describes 70 (8 + 54 header + 8 data): truncated")
bad_target("byte count != shape", E % ("F32", "[2]", 0, 4), b"\0" * 4, "tensor 'a': data_offsets [0, 4] hold 4 bytes but shape and dtype F32 need 8")
bad_target("duplicate names", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
           b"\0\0", "tensor 'a': duplicate key in header")
bad_target("non-string metadata", '{"__metadata__":{"format":1}}', want="__metadata__ value of 'format' is not a string")
bad_target("odd F4", E % ("F4", "[3]", 0, 2), b"\0\0", "tensor 'a': 3 elements of F4 are 12 bits, not a whole number of bytes")
# named limits
bad_target("name too long", E.replace('"a"', '"' + "n" * 5000 + '"') % ("U8", "[1]", 0, 1), b"\0",
           "a key of 5000 bytes exceeds the tpfs limit of 4096 bytes")
bad_target("too many dims", E % ("U8", "[1,1,1,1,1,1,1,1,1]", 0, 1), b"\0", "tensor 'a': 9 dimensions, more than the tpfs limit of 8")
big = "{" + ",".join('"t%d":0' % i for i in range(1000002)) + "}"
bad_target("too many tensors", big, want="more than 1000000 tensors, the tpfs limit per file")
src = fresh("too many entries")
os.mkdir(os.path.join(src, "many"))
for i in range(100001):
    os.close(os.open(os.path.join(src, "many", "f%06d" % i), os.O_CREAT | os.O_WRONLY, 0o644))
expect_refusal("entries per folder", src, "many: more than 100000 entries in one folder, the tpfs limit")
shutil.rmtree(src)
src = fresh("too deep")
d = src
for i in range(66):
    d = os.path.join(d, "d")
os.makedirs(d)
expect_refusal("folder depth", src, "folders nested deeper than 64, the tpfs limit")

# config and plan files
src = fresh("bad config")
open(os.path.join(src, "config.json"), "w").write('{"model_type": "llama", "hidden_size": ')
expect_refusal("malformed config.json", src, "config.json: not valid JSON (near byte")
src = fresh("config list")
open(os.path.join(src, "config.json"), "w").write('["llama"]')
expect_refusal("config.json not an object", src, "config.json: not a JSON object")
src = fresh("config duplicate key")
text = open(os.path.join(src, "config.json")).read().rstrip().rstrip("}")
open(os.path.join(src, "config.json"), "w").write(text + ', "num_attention_heads": 2}')
expect_refusal("config.json naming a key twice (Python keeps the last, cJSON the first)", src,
               'config.json: key "num_attention_heads" appears twice in one object')
src = fresh("config with a byte-order mark")
text = open(os.path.join(src, "config.json"), "rb").read()
open(os.path.join(src, "config.json"), "wb").write(b"\xef\xbb\xbf" + text)
expect_refusal("config.json starting with a UTF-8 BOM (Python's json refuses it)", src,
               "config.json: starts with a UTF-8 byte-order mark")
src = fresh("config disagrees")
cfg = json.load(open(os.path.join(src, "config.json")))
cfg["num_attention_heads"] = 6
json.dump(cfg, open(os.path.join(src, "config.json"), "w"))
expect_refusal("config disagrees with shapes", src,
               "(rule 'o_proj'): axis 1 of 'model.layers.0.self_attn.o_proj.weight' holds 48 features but "
               "'num_attention_heads * first(head_dim, hidden_size / num_attention_heads)' = 36 (num_attention_heads=6")
planf = os.path.join(work, "bad-plan.json")
open(planf, "w").write('{"tpfs_plan": 1, "name": "x", "rules": [')
expect_refusal("malformed plan file", base, planf + ": not valid JSON", "--plan", planf)
open(planf, "w").write('{"tpfs_plan": 1, "name": "x", "rules": [{"match": "**.q_proj", "split": "column", "heads": "nosuchkey"}, {"match": "**", "split": "replicate"}]}')
expect_refusal("plan naming a missing key", base, "expression 'nosuchkey': key 'nosuchkey' is missing from config.json", "--plan", planf)
open(planf, "w").write('{"tpfs_plan": 1, "name": "x", "rules": [{"match": "**.q_proj", "split": "column", "heads": "(3 +"}, {"match": "**", "split": "replicate"}]}')
expect_refusal("plan with a broken expression", base, "expression '(3 +'", "--plan", planf)

# a view constant the dtype cannot hold (issue 50): served as +-inf before, exit 0; refused when the view
# is read, naming the view file, the entry and the dtype's largest finite value. 1e400 is what Python's json
# reads as infinity (and cJSON too); a value that rounds down to the largest finite value is served.
viewf = os.path.join(work, "const-view.json")
for dt, value, want in (("F32", "1e39", "rounds to +infinity in F32, whose largest finite value is 3.4028234663852886e38"),
                        ("F32", "1e400", "the constant inf rounds to +infinity in F32"),
                        ("F32", "-1e400", "the constant -inf rounds to -infinity in F32"),
                        ("BF16", "-1e39", "rounds to -infinity in BF16, whose largest finite value is 3.3895313892515355e38"),
                        ("BF16", "3.4e38", "rounds to +infinity in BF16"),
                        ("BF16", "3.39e38", None), ("F32", "3.4028235e38", None)):
    open(viewf, "w").write('{"tpfs_view": 1, "engine": "vllm", "name": "c", "extends": "llama", "tensors": ['
                           '{"name": "model.layers.{i}.self_attn.attn.x_scale", "const": {"dtype": "%s", "value": %s}, '
                           '"per": "model.layers.{i}.self_attn.o_proj.weight"}]}' % (dt, value))
    tried += 1
    p = tt.tpfs("plan", base, "--tp", 2, "--view", viewf)
    if want is None:
        F.check(p.returncode == 0 and re.search(r"model\.layers\.0\.self_attn\.attn\.x_scale +%s +\[\] " % dt, p.stdout),
                "a %s constant %s that rounds to a finite value is served (%s)" % (dt, value, p.stderr.strip()[-300:]))
    else:
        F.check(p.returncode == 1 and viewf + ": tensors[" in p.stderr and
                "(model.layers.{i}.self_attn.attn.x_scale): the constant" in p.stderr and want in p.stderr,
                "a %s constant %s: tpfs plan refuses it: exit %d, %r" % (dt, value, p.returncode, p.stderr.strip()[-400:]))
open(viewf, "w").write('{"tpfs_view": 1, "engine": "vllm", "name": "c", "extends": "llama", "tensors": ['
                       '{"name": "model.layers.{i}.self_attn.attn.x_scale", "const": {"dtype": "F32", "value": 1e39}, '
                       '"per": "model.layers.{i}.self_attn.o_proj.weight"}]}')
expect_refusal("a view constant past F32's range", base, "rounds to +infinity in F32", "--view", viewf)

# an unreadable needed file (as root, drop the capabilities that bypass file modes)
if shutil.which("setpriv") and os.geteuid() == 0:
    src = fresh("unreadable")
    os.chmod(os.path.join(src, T), 0)
    expect_refusal("unreadable file", src, T + ": cannot open: Permission denied",
                   runner=["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                           "--bounding-set=-dac_override,-dac_read_search"])
elif os.geteuid() != 0:
    src = fresh("unreadable")
    os.chmod(os.path.join(src, T), 0)
    expect_refusal("unreadable file", src, T + ": cannot open: Permission denied")
else:
    print("note: setpriv missing, the unreadable-file case needs it when running as root")

# what no rule needs is served unchanged, with a warning; --strict refuses it
src = fresh("unneeded")
os.mkdir(os.path.join(src, "extra"))
broken = os.path.join(src, "extra", "broken.safetensors")
header_file(broken, E % ("F13", "[2]", 0, 8), b"\0" * 8)
os.mkdir(os.path.join(src, "x.safetensors"))                 # a folder named like a tensor file
open(os.path.join(src, "x.safetensors", "note.txt"), "w").write("hi")
os.symlink("loop", os.path.join(src, "loop"))                 # a link to itself
os.symlink("..", os.path.join(src, "extra", "up"))           # a link back to an ancestor
os.symlink("missing-target", os.path.join(src, "dangling"))
names = ["t%06d" % i for i in range(200000)]                  # a 200,000-tensor file
hdr = {n: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i, n in enumerate(names)}
header_file(os.path.join(src, "extra", "many.safetensors"), json.dumps(hdr), bytes(range(256)) * 781 + bytes(range(64)))
tried += 6
allow = [r"^tpfs: warning: extra/broken.safetensors: tensor 'a': unknown dtype 'F13' \(not listed by an index",
         r"^tpfs: warning: loop: skipped: symbolic link loop",
         r"^tpfs: warning: extra/up: skipped: symbolic link loop",
         r"^tpfs: warning: dangling: skipped: dangling symbolic link"]
# the 200,000 tensors t000000 ... match no rule of the plan: served whole only on request
p = tt.tpfs("plan", src, "--tp", 2)
F.check(p.returncode == 1 and "tensor 't000000' [1]: no rule of plan 'llama' matches it" in p.stderr,
        "a tensor no rule matches is refused by default: %s" % p.stderr[-400:])
with tt.Mount(src, 2, "--unmatched", "replicate", allow_stderr=allow) as m:
    r1 = m.rank(1)
    F.check(open(os.path.join(r1, "extra", "broken.safetensors"), "rb").read() == open(broken, "rb").read(),
            "an invalid file no rule needs is served unchanged")
    F.check(os.path.isdir(os.path.join(r1, "x.safetensors")) and
            open(os.path.join(r1, "x.safetensors", "note.txt")).read() == "hi", "a folder named x.safetensors is a folder")
    F.check(not os.path.lexists(os.path.join(r1, "loop")) and not os.path.lexists(os.path.join(r1, "extra", "up")),
            "link loops are left out")
    from safetensors import safe_open
    with safe_open(os.path.join(r1, "extra", "many.safetensors"), "np") as f:
        keys = list(f.keys())
        F.check(len(keys) == 200000 and int(f.get_tensor("t199999")[0]) == 199999 % 256,
                "the 200,000-tensor file is served (%d tensors)" % len(keys))
expect_refusal("--strict and an invalid unneeded file", src, "extra/broken.safetensors: tensor 'a': unknown dtype 'F13'", "--strict",
               "--unmatched", "replicate")

print("hostile inputs tried: %d" % tried)
shutil.rmtree(work)
F.done("test_hostile")
