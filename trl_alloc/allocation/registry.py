"""One registry of method names per stage (as verl's `core_algos` registers its estimators): each pacing, filling
and pruning name maps to its class, and each class carries its name.

A method is one class that registers itself with `@register(stage, name)` and builds itself from the config
(`from_config(args, context)`, see `base.Pacer` / `base.Filler`); it also answers the config's questions about its
budget (the unit it spends in, the most a round may spend). Nothing outside a method's class branches on its name:
config validation, `allocation.factory`, `allocation.simulate`, `scripts/plan.py` and the benchmark scripts all ask
this registry.

Third-party methods need no edit of this package: a name with a dot (`my_package.my_module.MyPacer`, as slime names
its rollout functions) imports that module and uses that class (docs/architecture.md#adding-a-method).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

STAGES = ("pacing", "filling", "pruning")
_METHODS = {stage: {} for stage in STAGES}
_METHODS["pruning"]["none"] = None  # every rollout runs to the end; no pruner is built
_loaded = False


def register(stage: str, name: str) -> Callable[[type], type]:
    """Class decorator: `name` (a config value of `stage`) builds this class."""
    if stage not in _METHODS:
        raise ValueError(f"unknown stage {stage!r}; choose one of {STAGES}.")

    def add(cls):
        known = _METHODS[stage].get(name)
        if known is not None and known is not cls:
            raise ValueError(f"{stage} {name!r} is registered twice ({known.__name__}, {cls.__name__}).")
        _METHODS[stage][name] = cls
        cls.method_name = name
        return cls
    return add


def method_names(stage: str) -> tuple[str, ...]:
    """The registered names of `stage`, in registration order."""
    _load()
    return tuple(_METHODS[stage])


def method_class(stage: str, name: str) -> type | None:
    """The class registered as `name` for `stage` (a dotted path is imported first); an unknown name is an error that
    lists the registered ones."""
    _load()
    if stage not in _METHODS:
        raise ValueError(f"unknown stage {stage!r}; choose one of {STAGES}.")
    if not isinstance(name, str):
        raise TypeError(f"`{stage}` must be a method name (a string), got {name!r}.")
    if name not in _METHODS[stage] and "." in name:
        _import_method(stage, name)
    if name not in _METHODS[stage]:
        own = (", or name your own class by its import path (my_module.MyClass, docs/architecture.md#adding-a-method)"
               if stage != "pruning" else "")
        raise ValueError(f"unknown `{stage}={name!r}`; choose one of {', '.join(_METHODS[stage])}{own}.")
    return _METHODS[stage][name]


def registered_hyperparameters() -> dict[str, list]:
    """{method label: the hyperparameters it declares first}, over every registered class in registration order
    (the config's fields and docstring are built from them). A name declared by two classes must be one
    declaration (a shared `Hyperparameter`, e.g. `beta.PRIOR_ALPHA`)."""
    _load()
    seen, groups = {}, {}
    for stage in STAGES:
        for name, cls in _METHODS[stage].items():
            if "." in name:  # a method named by its import path takes its own from `<stage>_kwargs`
                continue
            for h in getattr(cls, "hyperparameters", ()):
                if h.name in seen:
                    if seen[h.name] != h:
                        raise ValueError(f"hyperparameter {h.name!r} is declared twice, differently ({seen[h.name]} "
                                         f"and {h}); share one declaration.")
                    continue
                seen[h.name] = h
                groups.setdefault(f"{stage}={name!r}", []).append(h)
    return groups


def _import_method(stage, path):
    """Register the class at import path `path` (`package.module.Class`) as the `stage` method named `path`."""
    from .base import Filler, Pacer

    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{stage} {path!r}: cannot import module {module_name!r} ({err}); make it importable "
                         "(installed, or on PYTHONPATH) or use a registered name.") from None
    cls = getattr(module, attr, None)
    base = {"pacing": Pacer, "filling": Filler}.get(stage)
    if not isinstance(cls, type) or (base is not None and not issubclass(cls, base)):
        kind = f"a subclass of trl_alloc.allocation.{base.__name__}" if base else "a class"
        raise ValueError(f"{stage} {path!r}: {module_name!r} has no {attr!r} that is {kind}.")
    _METHODS[stage][path] = cls
    if "method_name" not in vars(cls):  # (not registered itself: a subclass would inherit its base's name)
        cls.method_name = path


def _load():
    """Import every module of this package once, so that each method's class has registered itself (numpy only):
    a new method is a new file, and no list here names it."""
    global _loaded
    if _loaded:
        return
    package = importlib.import_module(__package__)
    for info in pkgutil.iter_modules(package.__path__):  # (a module that asks for the methods while it is imported,
        importlib.import_module(f"{__package__}.{info.name}")  # `config`, comes back here and imports the rest)
    _loaded = True


__all__ = ["STAGES", "register", "method_names", "method_class", "registered_hyperparameters"]
