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
and the removal keywords "drop" replaced:
  {"remove": NAME}             -> {"drop": {"entry": NAME}} (an inherited entry taken away)
  "FIELD": null (view level)   -> "drop": ["FIELD", ...] (inherited fields taken away)
  "drop_layers": {"prefix": P, "from": K}
                               -> the fragment vllm/extra_layers included: its entry {"drop": "P{n}.*",
                                  "if": "n >= K"} ("with" where P or K is not its default; "extra_layers" in a
                                  vLLM view, "vllm/extra_layers" in another engine's)
  "drop_layers": null          -> {"drop": {"entry": "model.layers.{n}.*"}} (the parent's entry taken away; a
                                  parent whose prefix differs: tpfs refuses it as taking nothing, by name)
An entry with one of them and an "if" already, or with two of them, is combined with &&. A file that needs
none is left as it is; one that does is written back one entry per line. It does not move entries that
other views hold too into fragments: the build says which (plans/embed.py, "copied verbatim")."""
import json
import sys


def migrate_entry(e):
    if isinstance(e, dict) and list(e) == ["remove"]:
        return {"drop": {"entry": e["remove"]}}
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


def migrate_view(v):
    """The view-level rewrites: drop_layers -> the extra_layers fragment, null fields -> "drop"."""
    out = {}
    nulls = [k for k, x in v.items() if x is None]
    dl = v.get("drop_layers")
    item = None
    if isinstance(dl, dict):
        with_ = {k: dl[f] for k, f, d in (("layers", "prefix", "model.layers."), ("count", "from", "num_hidden_layers"))
                 if dl.get(f, d) != d}
        name = "extra_layers" if v.get("engine") == "vllm" else "vllm/extra_layers"
        item = {"fragment": name, "with": with_} if with_ else name
    elif "drop_layers" in v and dl is None:  # null: the parent's extra_layers entry taken away (its default prefix: a parent
        # that gave another is named by tpfs, which refuses a removal that takes nothing)
        nulls.remove("drop_layers")
        v = dict(v, tensors=[{"drop": {"entry": "model.layers.{n}.*"}}] + list(v.get("tensors", [])))
    for k, x in v.items():
        if k == "drop_layers" and (dl is None or isinstance(dl, dict)):
            continue
        if k in nulls:
            if "drop" not in out:
                out["drop"] = list(v.get("drop", [])) + nulls
            continue
        if k == "drop" and nulls:
            continue
        if k == "tensors" and item is not None and "include" not in out and "include" not in v:
            out["include"] = [item]
        if k == "include" and item is not None:
            x = ([x] if isinstance(x, str) else list(x)) + [item]
        out[k] = x
    if item is not None and "include" not in out:
        out["include"] = [item]
    return out


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
        v = migrate_view(v)
        v["tensors"] = [migrate_entry(dict(e)) if isinstance(e, dict) else e for e in v.get("tensors", [])]
        if json.dumps(v, sort_keys=True) == before:
            print("%s: nothing to migrate" % path)
            continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(dump(v))
        print("%s: migrated" % path)


if __name__ == "__main__":
    main()
