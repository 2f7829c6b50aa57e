"""Methods from outside the package, as a user writes them (docs/architecture.md#adding-a-method): a module of their
own, named in the config by its import path. Not a test file; `test_registry.py` trains with them."""

from trl_alloc.allocation import UniformPacer


class HalfPacer(UniformPacer):
    """Uniform pacing that admits only `fraction` (its own hyperparameter, from `pacing_kwargs`) of
    `prompts_per_round` prompts each round."""

    config_kwargs = ("fraction",)

    @classmethod
    def from_config(cls, args, context):
        pacer = super().from_config(args, context)
        fraction = args.pacing_kwargs.get("fraction", 0.5)
        pacer.admitted = max(1, int(args.nominal_prompts_per_round * fraction))
        return pacer

    @classmethod
    def _config_kwargs(cls, args):
        return {}  # `fraction` is read in from_config

    def propose(self):
        units = super().propose()
        units[self.ranked_prompts[self.admitted:]] = 0
        self.last_units = units
        return units


class NotAPacer:
    """A class that is not a `Pacer`: naming it is refused."""
