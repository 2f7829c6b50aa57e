"""The package's layers (docs/architecture.md), read from the import statements: which layer may import
which, and no import cycle between modules, at import time or through the imports inside functions."""

import ast

import pytest

from helpers import ROOT

PACKAGE = ROOT / "trl_alloc"
# layer -> the other trl_alloc layers it may import
ALLOWED = {
    "allocation": set(),
    "serving": set(),
    "tasks": {"allocation"},
    "rollout": {"allocation", "serving"},
    "evaluation": {"allocation", "tasks", "rollout", "serving"},
    "trainer": {"allocation", "tasks", "rollout", "serving", "reporting"},
    "reporting": {"allocation"},
    "benchmarks": {"allocation", "tasks", "evaluation", "trainer", "rollout", "serving"},
    "cli": {"allocation", "tasks", "evaluation", "trainer", "reporting", "rollout", "serving", "benchmarks"},
}


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(name, top_level_only=False, runtime=False):
    """The trl_alloc modules that module `name` imports (only those run at import time, if asked; with `runtime`,
    every import that can run, those inside functions included, not those under `if TYPE_CHECKING:`)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    typing_only = {id(n) for node in ast.walk(tree) if runtime and isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    out = set()
    for node in (n for n in nodes if id(n) not in typing_only):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out |= {target} | {f"{target}.{a.name}" for a in node.names}  # `from . import x` imports module x
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    # a module's own package (its __init__) is imported first anyway: not an edge
    return {m for m in out if m in MODULES and m != name and not name.startswith(m + ".")}


def layer(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def test_layers_import_only_the_layers_they_may():
    bad = [f"{name} imports {target}" for name in MODULES if layer(name)
           for target in imported(name) if layer(target) not in (None, layer(name), *ALLOWED[layer(name)])]
    assert not bad, bad


@pytest.mark.parametrize("when", ["at import time", "at run time"])
def test_no_import_cycle(when):
    """No two modules import each other, not even lazily from inside a function (a lazy import hid the one cycle
    there was: allocation.base <-> allocation.event_rounds)."""
    graph = {name: (imported(name, top_level_only=True) if when == "at import time" else imported(name, runtime=True))
             for name in MODULES}
    done, path = set(), []

    def visit(m):
        assert m not in path, "import cycle: " + " -> ".join(path[path.index(m):] + [m])
        if m in done:
            return
        path.append(m)
        for n in graph[m]:
            visit(n)
        path.pop()
        done.add(m)

    for m in graph:
        visit(m)


def _private_trainer_accesses(path):
    """`trainer._x` / `t._x` / `self.trainer._x` attribute accesses and `getattr(trainer, "_x")` calls in a file."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id in ("trainer", "t")) or (
                    isinstance(owner, ast.Attribute) and owner.attr == "trainer"):
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr")
              and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in ("trainer", "t")
              and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_")):
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}(…, {node.args[1].value!r})")
    return hits


def test_only_the_trainer_layer_touches_a_trainers_private_parts():
    """Private TRL / transformers / trainer attributes are read in `trainer/` only (`trainer/trl_compat.py` holds
    TRL's, with its check); the rollout layer gets what it needs as arguments (`rollout.pruning.GenerationHost`)."""
    hits = [h for name, path in MODULES.items() if layer(name) not in ("trainer", None)
            for h in _private_trainer_accesses(path)]
    assert not hits, hits
