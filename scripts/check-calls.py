#!/usr/bin/env python3
"""check-calls.py BUILD_SRC_DIR [SRC_DIR]: fails on any circle of function references between the C files.

Dependencies go one way (docs/DESIGN.md) at the level of functions too, which the include check
(check-includes.py) cannot see: files that share one header (fs_int.h, model.h, cli.h) may call
each other both ways. This reads the object files the build made (BUILD_SRC_DIR/*.p/*.o, meson's
layout) with `nm`: file a refers to file b when a's object has an undefined symbol that b's object
defines (a function, or a global it reads). Every strongly connected set of two or more files is
printed (the shortest circle through each of its files, check-includes.py's finder) with the
symbols on each edge, and the script exits 1; with none it prints a one-line
summary and exits 0. Static functions are no edge (they are not exported). Plain Python 3 and nm.

With SRC_DIR, include edges join the call edges in one graph of modules (foo.c, foo.h: "foo"), as a
reader sees the code: a file that includes a header and uses a name the header itself defines (a type, a
struct, an enum constant, a macro, an inline function; not its include guard, not the prototype of a
function some .c defines: the call edges place those) depends on that header's module. A circle that
neither graph holds alone is then caught: a.c calls b.c's function while b.c uses a.h's types, however
the calls are declared (a declarations header that includes neither hides it from the include check).
"""
import collections
import re
import glob
import importlib.util
import os
import subprocess
import sys


def graph(objdir):
    """({file: {file it refers to}}, {(a, b): [symbols]}) over the objects under objdir."""
    defs, uses = {}, collections.defaultdict(set)
    objs = sorted(glob.glob(os.path.join(objdir, "*.p", "*.o")))
    if not objs:
        sys.exit("check-calls: no object files under %s/*.p/ (build first)" % objdir)
    for o in objs:
        f = os.path.basename(o)[:-len(".o")]
        out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBR":
                defs[parts[2]] = f
            elif len(parts) == 2 and parts[0] == "U":
                uses[f].add(parts[1])
    g, why = {f: set() for f in set(defs.values()) | set(uses)}, collections.defaultdict(list)
    for f, us in uses.items():
        for s in sorted(us):
            if s in defs and defs[s] != f:
                g[f].add(defs[s])
                why[f, defs[s]].append(s)
    return g, why


def _includes():
    """check-includes.py as a module: its graph() and its cycle finder cycles() (Tarjan's components, the
    shortest cycle through each file)."""
    spec = importlib.util.spec_from_file_location("check_includes",
                                                  os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                               "check-includes.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


IDENT = re.compile(r"[A-Za-z_]\w*")


def _code(path):
    """The text of a C file with its comments and string literals blanked."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"', " ", text, flags=re.S)


def header_names(path):
    """The names header path itself defines: macros (not its include guard), typedefs, struct / union /
    enum tags, enum constants, static inline functions."""
    text = _code(path)
    guard = re.search(r"^\s*#\s*ifndef\s+(\w+)", text, re.M)
    names = set(re.findall(r"^\s*#\s*define\s+(\w+)", text, re.M))
    names.discard(guard.group(1) if guard else None)
    names |= set(re.findall(r"\b(?:struct|union|enum)\s+(\w+)\s*\{", text))
    names |= set(re.findall(r"^\}\s*(\w+)\s*;", text, re.M))                 # } name; closing a typedef
    names |= set(re.findall(r"^typedef\b[^;{]*?\b(\w+)\s*;", text, re.M))     # typedef T name;
    names |= set(re.findall(r"^typedef\b[^;{]*\(\s*\*\s*(\w+)\s*\)", text, re.M))  # typedef R (*name)(...)
    names |= set(re.findall(r"^static\s+inline\b[^;{(]*?\b(\w+)\s*\(", text, re.M))
    for body in re.findall(r"\benum\b[^{;]*\{([^}]*)\}", text):
        names |= set(re.findall(r"^\s*([A-Za-z_]\w*)\s*(?:=|,|$)", body, re.M))
    return names


def with_includes(g, why, src):
    """The call graph g (files "foo.c") and src's include edges that carry a name (header_names) joined
    on modules ("foo"): call edges with their symbols, include edges as "FILE uses NAME (FILE:LINE)"."""
    ci = _includes()
    mg, mwhy = collections.defaultdict(set), collections.defaultdict(list)
    mod = lambda f: os.path.splitext(f)[0]
    for a, bs in g.items():
        mg[mod(a)]
        for b in bs:
            if mod(a) != mod(b):
                mg[mod(a)].add(mod(b))
                mwhy[mod(a), mod(b)] += why[a, b]
    files = []
    for d, dirs, names in os.walk(src):
        dirs.sort()
        files += [os.path.join(d, n) for n in sorted(names) if n.endswith(ci.EXTS)]
    defined = {}
    for f in files:
        me = ci.module_of(src, f)
        used = None
        with open(f, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().split("\n")
        for ln, line in enumerate(lines, 1):
            m = ci.INCLUDE.match(line)
            if not m or not m.group(1).endswith(".h"):
                continue
            for cand in (os.path.join(os.path.dirname(f), m.group(1)), os.path.join(src, m.group(1))):
                if os.path.isfile(cand):
                    cand = os.path.normpath(cand)
                    to = ci.module_of(src, cand)
                    if to != me:
                        if cand not in defined:
                            defined[cand] = header_names(cand)
                        if used is None:
                            used = set(IDENT.findall(_code(f)))
                        hit = sorted(defined[cand] & used)
                        if hit:
                            mg[me].add(to)
                            mwhy[me, to].append("%s uses %s (%s:%d)" % (os.path.relpath(f, src), ", ".join(hit[:6]),
                                                                          os.path.relpath(f, src), ln))
                    break
    for v in list(mg.values()):
        for w in v:
            mg[w]
    return dict(mg), mwhy


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.split("\n")[0])
    g, why = graph(sys.argv[1])
    if len(sys.argv) == 3:
        g, why = with_includes(g, why, os.path.normpath(sys.argv[2]))
    found = _includes().cycles(g)
    for comp, path in found:
        print("circle: %s (in a knot of %d files: %s)" % (" -> ".join(path), len(comp), ", ".join(comp)))
        for a, b in zip(path, path[1:]):
            print("  %s -> %s: %s" % (a, b, ", ".join(why[a, b])))
    if found:
        return 1
    print("check-calls: %d files, %d references between files, no circle"
          % (len(g), sum(len(v) for v in g.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
