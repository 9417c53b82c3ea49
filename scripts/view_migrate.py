#!/usr/bin/env python3
"""Rewrites view files written in the view language before issue 47 into today's (docs/PLANS.md, "Engine
views"), in place: view_migrate.py FILE.json...

tpfs refuses each keyword issue 47 replaced, naming its replacement; this makes those replacements:
  "when": EXPR                 -> "if": EXPR
  "unless": EXPR               -> "if": "!(EXPR)"
  "if_missing": NAME           -> "if": "!tensor('NAME')"
  "optional": true             -> "if": "tensor('P2') && tensor('P3') ..." (the pieces after the first: what
                                  optional skipped a match for lacking)
  "shape" on a cat / from entry -> "reshape" (a const's "shape" stays)
An entry with one of them and an "if" already, or with two of them, is combined with &&. A file that needs
none is left as it is; one that does is written back one entry per line. It does not move entries that
other views hold too into fragments: the build says which (plans/embed.py, "copied verbatim")."""
import json
import sys


def migrate_entry(e):
    conds = []
    if "if" in e:
        conds.append("(%s)" % e.pop("if"))
    if "when" in e:
        conds.append("(%s)" % e.pop("when"))
    if "unless" in e:
        conds.append("!(%s)" % e.pop("unless"))
    if "if_missing" in e:
        conds.append("!tensor('%s')" % e.pop("if_missing"))
    if e.pop("optional", False):
        pieces = e.get("cat", [])[1:]
        conds += ["tensor('%s')" % p for p in pieces]
    if "shape" in e and "const" not in e:
        e["reshape"] = e.pop("shape")
    if conds:
        c = " && ".join(conds)
        e["if"] = c[1:-1] if len(conds) == 1 and c.startswith("(") and c.endswith(")") else c
    return e


def dump(v):
    out = ["{"]
    keys = list(v)
    for n, k in enumerate(keys):
        x, comma = v[k], "," if n < len(keys) - 1 else ""
        if k in ("tensors", "refuse") and isinstance(x, list) and x:
            out.append('  "%s": [' % k)
            out += ["    " + json.dumps(e, ensure_ascii=False) + ("," if m < len(x) - 1 else "")
                    for m, e in enumerate(x)]
            out.append("  ]" + comma)
        else:
            out.append('  "%s": %s%s' % (k, json.dumps(x, ensure_ascii=False), comma))
    return "\n".join(out) + "\n}\n"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            v = json.load(f)
        before = json.dumps(v, sort_keys=True)
        v["tensors"] = [migrate_entry(dict(e)) if isinstance(e, dict) else e for e in v.get("tensors", [])]
        if json.dumps(v, sort_keys=True) == before:
            print("%s: nothing to migrate" % path)
            continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(dump(v))
        print("%s: migrated" % path)


if __name__ == "__main__":
    main()
