#!/usr/bin/env python3
"""check-includes.py [SRC_DIR]: fails on any cycle in the include graph of the C sources.

Dependencies go one way (docs/DESIGN.md): a module never includes, directly or through others,
a header of a module that includes its own. A module is a file name without its extension,
relative to SRC_DIR (default: src/ next to this script): foo.c, foo.h and foo.cu are one module
"foo", sub/bar.c and sub/bar.h are "sub/bar". Every `#include "..."` of every .c, .h and .cu
file under SRC_DIR is an edge from the including module to the included one; a name is looked
for beside the including file first, then in SRC_DIR (the include path the build gives); names
found in neither (generated headers such as plans_data.h, system headers) are no edge.
Prints every cycle found, as "a -> b -> a" with the file and line of each include, and exits 1;
prints a one-line summary and exits 0 when there is none. Plain Python 3, no imports outside the
standard library.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
EXTS = (".c", ".h", ".cu")


def module_of(root, path):
    rel = os.path.relpath(path, root)
    return os.path.splitext(rel)[0].replace(os.sep, "/")


def graph(root):
    """{module: {included module: (file, line)}} over every source file under root."""
    files = []
    for d, dirs, names in os.walk(root):
        dirs.sort()
        files += [os.path.join(d, n) for n in sorted(names) if n.endswith(EXTS)]
    g = {module_of(root, f): {} for f in files}
    for f in files:
        me = module_of(root, f)
        with open(f, encoding="utf-8", errors="replace") as fh:
            for ln, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                name = m.group(1)
                for cand in (os.path.join(os.path.dirname(f), name), os.path.join(root, name)):
                    if os.path.isfile(cand):
                        to = module_of(root, os.path.normpath(cand))
                        if to != me:
                            g[me].setdefault(to, (os.path.relpath(f, root), ln))
                        break
    return g


def cycles(g):
    """The strongly connected components of more than one module (Tarjan), with the distinct
    shortest cycles through each of their modules: [(component, [a, b, ..., a]), ...]."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                strong(w)
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
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            strong(v)
    out = []
    for comp in comps:
        inside, seen = set(comp), set()
        for start in comp:  # the shortest cycle through each module of the component
            path = shortest_cycle(g, inside, start)
            i = path.index(min(path[:-1]))
            key = tuple(path[i:-1] + path[:i])
            if key not in seen:
                seen.add(key)
                out.append((comp, path))
    return out


def shortest_cycle(g, inside, start):
    """start -> ... -> start, breadth-first among the modules of inside."""
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g[v]):
                if w == start:
                    path = [start]
                    while v != start:
                        path.insert(1, v)
                        v = prev[v]
                    return path + [start]
                if w in inside and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start, start]  # not reached: start lies on a cycle of its component


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    root = os.path.normpath(root)
    if not os.path.isdir(root):
        print(f"check-includes: {root}: not a folder", file=sys.stderr)
        return 2
    g = graph(root)
    found = cycles(g)
    for comp, path in found:
        print(f"include cycle: {' -> '.join(path)} (in a knot of {len(comp)} modules: {', '.join(comp)})")
        for a, b in zip(path, path[1:]):
            f, ln = g[a][b]
            print(f"  {f}:{ln}: {a} includes {b}")
    if found:
        print(f"check-includes: {len(found)} include cycle(s) among the files of {root}: dependencies must go one way",
              file=sys.stderr)
        return 1
    nedge = sum(len(v) for v in g.values())
    print(f"check-includes: {len(g)} modules, {nedge} include edges, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
