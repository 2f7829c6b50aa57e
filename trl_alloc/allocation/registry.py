"""One registry of method names (as verl's `core_algos` registers its estimators): each pacing, filling and
pruning name maps to its class, and each class carries its name and its family.

Classes register themselves with `@register(stage, name)`. A pacer whose class has `cero_family = True`
spends the budget in CERO units of `unit_size` responses over a round capacity (CERO, arXiv 2610.09679). Config
validation, `allocation.factory`, `scripts/plan.py` and the benchmark scripts all read this registry.
"""

STAGES = ("pacing", "filling", "pruning")
_METHODS = {stage: {} for stage in STAGES}
_METHODS["pruning"]["none"] = None  # every rollout runs to the end; no pruner is built


def register(stage, name):
    """Class decorator: `name` (a config value of `stage`) builds this class."""
    if stage not in _METHODS:
        raise ValueError(f"unknown stage {stage!r}; choose one of {STAGES}.")

    def add(cls):
        if name in _METHODS[stage]:
            raise ValueError(f"{stage} {name!r} is registered twice ({_METHODS[stage][name].__name__}, {cls.__name__}).")
        _METHODS[stage][name] = cls
        cls.method_name = name
        return cls
    return add


def method_names(stage):
    """The registered names of `stage`, in registration order."""
    _load()
    return tuple(_METHODS[stage])


def method_class(stage, name):
    """The class registered as `name` for `stage`; an unknown name lists the valid ones."""
    _load()
    if name not in _METHODS[stage]:
        raise ValueError(f"unknown {stage} {name!r}; choose one of {', '.join(_METHODS[stage])}.")
    return _METHODS[stage][name]


def cero_family():
    """The pacing names whose class is marked `cero_family` (budget in units, round capacity)."""
    return tuple(n for n, cls in _loaded("pacing").items() if getattr(cls, "cero_family", False))


def _loaded(stage):
    _load()
    return _METHODS[stage]


def _load():
    """Import the modules that register the methods (numpy only)."""
    from . import arrol, baselines, cero, sara  # noqa: F401 (importing registers their classes)
