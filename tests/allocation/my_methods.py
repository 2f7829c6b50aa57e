"""Methods from outside the package, as a user writes them (docs/architecture.md#adding-a-method): a module of their
own, named in the config by its import path. Not a test file; `test_registry.py` trains with them."""

from trl_alloc.allocation import UniformPacer
from trl_alloc.allocation.hyperparameters import Hyperparameter, within


class HalfPacer(UniformPacer):
    """Uniform pacing that admits only `fraction` (its own hyperparameter, declared below and given in
    `pacing_kwargs`) of `prompts_per_round` prompts each round."""

    hyperparameters = (Hyperparameter("fraction", float, 0.5, "Share of prompts_per_round admitted each round.",
                                      within(0, 1, low_open=True)),)

    def __init__(self, *args, fraction=0.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.admitted = max(1, int(self.prompts_per_round * fraction))

    def propose(self):
        units = super().propose()
        units[self.ranked_prompts[self.admitted:]] = 0
        self.last_units = units
        return units


class SeedPacer(UniformPacer):
    """Declares a hyperparameter named like a config field of its own (`seed`): refused."""

    hyperparameters = (Hyperparameter("seed", int, 0, "A clash."),)


class NotAPacer:
    """A class that is not a `Pacer`: naming it is refused."""
