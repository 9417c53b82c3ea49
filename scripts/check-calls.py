#!/usr/bin/env python3
"""check-calls.py BUILD_SRC_DIR: fails on any circle of function references between the C files.

Dependencies go one way (docs/DESIGN.md) at the level of functions too, which the include check
(check-includes.py) cannot see: files that share one header (fs_int.h, model.h, cli.h) may call
each other both ways. This reads the object files the build made (BUILD_SRC_DIR/*.p/*.o, meson's
layout) with `nm`: file a refers to file b when a's object has an undefined symbol that b's object
defines (a function, or a global it reads). Every strongly connected set of two or more files is
printed with the symbols on each edge, and the script exits 1; with none it prints a one-line
summary and exits 0. Static functions are no edge (they are not exported). Plain Python 3 and nm.
"""
import collections
import glob
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
    g, why = {}, collections.defaultdict(list)
    for f, us in uses.items():
        g[f] = set()
        for s in sorted(us):
            if s in defs and defs[s] != f:
                g[f].add(defs[s])
                why[f, defs[s]].append(s)
    return g, why


def circles(g):
    """The strongly connected sets of two or more files (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n")[0])
    g, why = graph(sys.argv[1])
    found = circles(g)
    for comp in found:
        print("circle: " + " <-> ".join(comp))
        for a in comp:
            for b in comp:
                if (a, b) in why:
                    print("  %s -> %s: %s" % (a, b, ", ".join(why[a, b])))
    if found:
        return 1
    print("check-calls: %d files, %d references between files, no circle"
          % (len(g), sum(len(v) for v in g.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
