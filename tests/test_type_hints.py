"""Every public function and method of the allocation, rollout, reporting, cli, benchmarks and trainer layers carries
type hints, no module excluded.

Read with `ast` (nothing is imported): a public function or method (its name does not start with "_") must annotate
each parameter (self / cls excepted) and its return; `__init__` of a public class must annotate its parameters (its
return may stay implicit); a property is a method like any other, so its return is annotated too.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trl_alloc"
LAYERS = ("allocation", "rollout", "reporting", "cli", "benchmarks", "trainer")
# Not checked yet (none now; a module added here must say why)
EXCLUDED = frozenset()


def checked_modules():
    return [path for layer in LAYERS for path in sorted((PACKAGE / layer).glob("*.py"))
            if path.relative_to(PACKAGE).as_posix() not in EXCLUDED]


def _unannotated(func, method):
    """What `func` leaves unannotated: its parameters' names, and "return" when the return must be annotated."""
    args = func.args
    positional = args.posonlyargs + args.args
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in func.decorator_list)
    if method and not static and positional:
        positional = positional[1:]  # self / cls
    params = positional + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a is not None]
    missing = [a.arg for a in params if a.annotation is None]
    if func.name != "__init__" and func.returns is None:
        missing.append("return")
    return missing


def _missing_hints(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(PACKAGE).as_posix()
    functions = ast.FunctionDef, ast.AsyncFunctionDef
    found = []
    for node in tree.body:
        if isinstance(node, functions) and not node.name.startswith("_"):
            missing = _unannotated(node, False)
            if missing:
                found.append(f"{where}:{node.lineno} {node.name}: {', '.join(missing)}")
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if not isinstance(item, functions):
                    continue
                public = not item.name.startswith("_")
                init = item.name == "__init__" and not node.name.startswith("_")
                if public or init:
                    missing = _unannotated(item, True)
                    if missing:
                        found.append(f"{where}:{item.lineno} {node.name}.{item.name}: {', '.join(missing)}")
    return found


def test_the_checked_modules_exist():
    assert all((PACKAGE / path).is_file() for path in EXCLUDED), "an excluded module is gone: drop it from EXCLUDED"
    names = {path.relative_to(PACKAGE).as_posix() for path in checked_modules()}
    assert {"allocation/allocator.py", "allocation/sara.py", "rollout/backends.py", "rollout/drivers.py",
            "reporting/hub.py", "cli/train.py", "benchmarks/rollout.py", "trainer/grpo.py",
            "trainer/config.py"} <= names


@pytest.mark.parametrize("path", checked_modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_public_functions_are_annotated(path):
    missing = _missing_hints(path)
    assert not missing, "public functions without type hints (parameters or return):\n" + "\n".join(missing)
