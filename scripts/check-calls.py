#!/usr/bin/env python3
"""check-calls.py BUILD_SRC_DIR: fails on any circle of function references between the C files.

Dependencies go one way (docs/DESIGN.md) at the level of functions too, which the include check
(check-includes.py) cannot see: files that share one header (fs_int.h, model.h, cli.h) may call
each other both ways. This reads the object files the build made (BUILD_SRC_DIR/*.p/*.o, meson's
layout) with `nm`: file a refers to file b when a's object has an undefined symbol that b's object
defines (a function, or a global it reads). Every strongly connected set of two or more files is
printed (the shortest circle through each of its files, check-includes.py's finder) with the
symbols on each edge, and the script exits 1; with none it prints a one-line
summary and exits 0. Static functions are no edge (they are not exported). Plain Python 3 and nm.
"""
import collections
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


def _cycles():
    """check-includes.py's cycle finder (Tarjan's components, the shortest cycle through each file)."""
    spec = importlib.util.spec_from_file_location("check_includes",
                                                  os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                               "check-includes.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.cycles


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n")[0])
    g, why = graph(sys.argv[1])
    found = _cycles()(g)
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
