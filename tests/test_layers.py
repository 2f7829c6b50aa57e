"""The package's layers (docs/architecture.md), read from the import statements: which layer may import
which, and no import cycle between modules at import time."""

import ast

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


def imported(name, top_level_only=False):
    """The trl_alloc modules that module `name` imports (only those run at import time, if asked)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = set()
    for node in nodes:
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


def test_no_import_cycle_at_import_time():
    graph = {name: imported(name, top_level_only=True) for name in MODULES}
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
