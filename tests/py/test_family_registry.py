"""The family registry (tests/py/families.py): one row per family, and the tables that draw from it agree with it.

Checked here, without torch or transformers (plain python3: the registry imports neither):
- a family written twice is refused (row() raises);
- every `fixture` role names a function of fixtures.py and Ts among 1 to 4, and fixtures.py takes its FAMILIES
  from the registry (no list of its own);
- every view a `vllm_nodes` role names is a file of views/vllm/, and each of its families is a row of
  test_vllm.py's FAMILIES with the same view and impersonation (until test_vllm.py draws from the registry too,
  this keeps the two from drifting apart);
- every family scripts/tp_example.py runs (its own copy, for use outside a checkout) is a family() row, so that
  the real-model test proves what the example shows, and test_rank_folders.py's EXPECT names the same families.
"""
import ast
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import families  # noqa: E402

fails = []


def check(ok, msg):
    if not ok:
        fails.append(msg)
        print("FAIL:", msg, flush=True)


def module_ast(path):
    with open(os.path.join(ROOT, path)) as f:
        return ast.parse(f.read())


def dict_literal(tree, name):
    """The first module-level `name = {...}` of tree, as {key: value node} (a `**other` in it left out)."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return {ast.literal_eval(k): v for k, v in zip(node.value.keys, node.value.values) if k is not None}
    return None


check("torch" not in sys.modules and "transformers" not in sys.modules, "importing the registry imports torch")
try:
    families.row("llama")
    check(False, "a second row of llama is accepted")
except ValueError as e:
    check("two rows" in str(e), "a second row is refused by name: %s" % e)
check(set(families.FAMILIES) <= set(families.ROWS), "every family() is a row")

# fixtures.py
fx = module_ast("tests/py/fixtures.py")
funcs = {n.name for n in fx.body if isinstance(n, ast.FunctionDef)}
fixture = families.table("fixture")
check(len(fixture) >= 10, "the fixture role has %d families" % len(fixture))
for fam, ts in fixture.items():
    check(fam in funcs, "fixture %s: fixtures.py has no function %s" % (fam, fam))
    check(ts and set(ts) <= {1, 2, 3, 4}, "fixture %s: Ts %s" % (fam, ts))
check(dict_literal(fx, "FAMILIES") is None, "fixtures.py writes a FAMILIES table of its own")

# test_vllm_nodes.py's role against test_vllm.py's FAMILIES
vllm = dict_literal(module_ast("tests/py/test_vllm.py"), "FAMILIES")
check(vllm, "test_vllm.py has a FAMILIES dict")
nodes = families.table("vllm_nodes")
check(any("pp" in r for r in nodes.values()) and any("ep" in r for r in nodes.values()),
      "the vllm_nodes role has stage and expert cases")
for fam, r in nodes.items():
    uses = ([r["pp"]] if "pp" in r else []) + [(c[0], c[3]) for c in r.get("ep", ())]
    for view, imp in uses:
        check(os.path.isfile(os.path.join(ROOT, "views", "vllm", view + ".json")),
              "%s: no view views/vllm/%s.json" % (fam, view))
    if "pp" in r and vllm is not None:
        row = vllm.get(fam)
        got = tuple(ast.literal_eval(x) for x in row.elts[:2]) if isinstance(row, ast.Tuple) else None
        check(got == tuple(r["pp"]),
              "%s: test_vllm.py's view and impersonation %s, the registry's %s" % (fam, got, r["pp"]))
    for c in r.get("ep", ()):
        check(c[1] in ("linear", "round_robin"), "%s: EP placement %r" % (fam, c[1]))

# scripts/tp_example.py's copy
ex = dict_literal(module_ast("scripts/tp_example.py"), "FAMILIES")
check(ex, "scripts/tp_example.py has a FAMILIES dict")
for fam in ex or ():
    check(fam in families.FAMILIES, "scripts/tp_example.py runs %s, which no family() row proves" % fam)
expect = dict_literal(module_ast("tests/py/test_rank_folders.py"), "EXPECT")
check(expect and ex and set(expect) == set(ex), "test_rank_folders.py's EXPECT and tp_example's FAMILIES differ: %s"
      % sorted(set(expect or ()) ^ set(ex or ())))

if fails:
    sys.exit("%d problems in the family registry" % len(fails))
print("families.py: %d rows (%d of the real-model test), %d fixtures, %d vllm_nodes; tp_example's %d families in it"
      % (len(families.ROWS), len(families.FAMILIES), len(fixture), len(nodes), len(ex)))
