"""Checkpoints of an AllocGRPOTrainer: the allocator's state next to TRL's, written atomically,
read with errors that name the file.

A checkpoint folder is written under a temporary name and renamed into place once whole, so the
newest `checkpoint-N` is always complete; a save that fails (a full disk) removes its partial
folder and says which checkpoint is intact. A round that fails rolls the allocator back to the round's
start and saves what is trained (the rescue checkpoint).
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from typing import Any

from ..allocation.allocator import json_default

ALLOCATION_STATE_NAME = "allocation_state.json"


def dataset_fingerprint(prompts: Iterable[str | list[dict[str, Any]]]) -> str:
    """A short hash of the prompt pool, in order (another seed's built-in pool has another hash)."""
    digest = hashlib.sha256()
    for p in prompts:
        digest.update((p if isinstance(p, str) else json.dumps(p, sort_keys=True)).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def write_json_atomic(path: str, data: Any, default: Callable[[Any], Any] | None = None) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, default=default)
    os.replace(path + ".tmp", path)


def _step(path: str) -> int | None:
    m = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(os.path.normpath(path)))
    return int(m.group(1)) if m else None


def earlier_checkpoint(checkpoint: str) -> str | None:
    """The newest `checkpoint-N` next to `checkpoint` with a smaller N, or None."""
    parent, step = os.path.dirname(os.path.abspath(os.path.normpath(checkpoint))), _step(checkpoint)
    found = [(s, p) for p in glob.glob(os.path.join(parent, "checkpoint-*"))
             if (s := _step(p)) is not None and (step is None or s < step)]
    return max(found)[1] if found else None


def _suggest_previous(checkpoint: str) -> str:
    older = earlier_checkpoint(checkpoint)
    return (f" Resume from the previous checkpoint instead: --resume_from_checkpoint {older}" if older
            else " No earlier checkpoint is there; start the run again.")


def read_allocation_state(checkpoint: str,
                          required: Iterable[str] = ("pacer", "filler", "counters")) -> dict[str, Any]:
    """The allocator state of `checkpoint`, or a ValueError naming the damaged file."""
    path = os.path.join(checkpoint, ALLOCATION_STATE_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{checkpoint} has no {ALLOCATION_STATE_NAME}; it was not written by trl-alloc, so "
                                "the allocator cannot resume from it." + _suggest_previous(checkpoint))
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is damaged (empty or truncated: {exc})." + _suggest_previous(checkpoint)) from None
    missing = [k for k in required if not isinstance(state, dict) or not isinstance(state.get(k), dict)]
    if missing:
        raise ValueError(f"{path} is damaged: it has no {missing[0]!r} entry (or it is not an object)."
                         + _suggest_previous(checkpoint))
    return state


def is_disk_full(exc: BaseException | None, folder: str) -> bool:
    """Whether a failed save ran out of disk (torch and safetensors word it differently)."""
    seen = set()
    while exc is not None and id(exc) not in seen:  # torch words it in a chained exception ("iostream error")
        seen.add(id(exc))
        text = str(exc)
        if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left" in text:
            return True
        if ("iostream error" in text or "file write failed" in text) and shutil.disk_usage(folder).free < 2**26:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(exc: BaseException, folder: str, intact: str | None) -> OSError:
    where = os.path.dirname(os.path.abspath(folder))
    free = shutil.disk_usage(where).free if os.path.isdir(where) else 0
    keep = (f"The newest complete checkpoint is {intact}; resume from it once there is room."
            if intact else "No earlier checkpoint is there.")
    return OSError(errno.ENOSPC, f"no space left on the device of {where} while saving {os.path.basename(folder)} "
                                 f"({free / 2**20:.0f} MiB free): the partial folder was removed. Free space or "
                                 f"point --output_dir at a larger disk. {keep}")


class CheckpointMixin:
    """The allocator's state in every checkpoint and final save; atomic checkpoint folders; resume."""

    def run_plan(self) -> dict[str, Any]:
        """What fixes this run's plan; a checkpoint of another plan is refused (`allocation.allocator.PLAN_FIELDS`)."""
        a = self.args
        return {"pacing": a.pacing, "filling": a.filling, "pruning": a.pruning, "num_prompts": len(self.train_dataset),
                "num_rounds": self.num_rounds, "rollout_budget": int(a.budget_for(self.num_rounds)),
                "allocation_seed": a.seed if a.allocation_seed is None else a.allocation_seed,
                "dataset_fingerprint": dataset_fingerprint(self.train_dataset["prompt"])}

    def allocation_state(self) -> dict[str, Any]:
        """The allocator's state as plain JSON-serialisable data (what checkpoints hold), with the run's
        per-round history, so the report after a resume covers the whole run. Stream mode: the state at the
        last close (the next round is already open), with what became of the rollouts then in flight."""
        note = self.stream_note()
        if note is None:
            return self.allocator.state_dict()
        return {**self._stream_state, "stream": note}

    def load_allocation_state(self, state: dict[str, Any], path: str = ALLOCATION_STATE_NAME,
                              check: bool = True) -> None:
        self._end_stream()
        self._rounds = None  # the next round starts a fresh round runner, from the loaded counters
        self.allocator.load_state_dict(state, where=path, check_plan=check)
        note = state.get("stream")
        if note and note.get("in_flight") and self.accelerator.is_main_process:
            print(f"[trl-alloc] {path}: {note['in_flight']} rollouts were in flight and {note['open_groups']} groups "
                  f"open at this checkpoint; they were spent (counted in the budget) and are not trained.")

    def _allocator_snapshot(self) -> dict[str, Any] | None:
        """The allocator's state at the start of a round (a failed round is rolled back to it before the
        rescue checkpoint; without checkpoints there is nothing to roll back for)."""
        if not self.accelerator.is_main_process or self.args.save_strategy == "no":
            return None
        return self.allocation_state() if self.stream_note() is not None else self.allocator.snapshot()

    def _rescue_checkpoint(self, start_state: dict[str, Any] | None = None) -> None:
        """A round failed (e.g. dynamic sampling hit its cap): roll the allocator back to the round's
        start, save what is trained so far, then re-raise (the failed round is not in the log)."""
        if start_state is not None:
            self.load_allocation_state(start_state, check=False)
        if self.args.save_strategy == "no" or self.state.global_step == 0:
            return
        folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        if not os.path.isfile(os.path.join(folder, ALLOCATION_STATE_NAME)):
            self._save_checkpoint(self.model, trial=None)
            if self.accelerator.is_main_process:
                print(f"[trl-alloc] the round failed; the policy trained so far is saved in {folder}")

    def write_allocation_report(self) -> dict[str, Any]:
        """`output_dir/allocation/summary.json` and PNG plots of the run's allocation; returns the summary."""
        from ..reporting.plots import write_allocation_report

        extra = self.allocator.report()
        budget = extra.pop("budget")
        extra["engine"] = self.engine_description()
        calibration = self.pruner.calibration_curve() if self.pruner is not None else None
        return write_allocation_report(self.args.output_dir, self.allocator.history, self.allocator.exposure, budget,
                                       extra, calibration=calibration)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """TRL's save, plus `allocation_state.json` next to the weights (checkpoints and final saves)."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            output_dir = output_dir or self.args.output_dir
            os.makedirs(output_dir, exist_ok=True)
            write_json_atomic(os.path.join(output_dir, ALLOCATION_STATE_NAME), self.allocation_state(),
                              default=json_default)
            if self.pruner is not None:  # the quality head as its own adapter folder, `quality_head/`
                self.pruner.save(output_dir)

    def _get_output_dir(self, trial: Any) -> str:
        return getattr(self, "_staging_dir", None) or super()._get_output_dir(trial)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """TRL's checkpoint, written under `.partial-checkpoint-N/` and renamed into place once whole, so
        the newest `checkpoint-N` is always complete; a full disk gets a clear error."""
        run_dir = super()._get_output_dir(trial)
        final = os.path.join(run_dir, f"checkpoint-{self.state.global_step}")
        staging = os.path.join(run_dir, f".partial-checkpoint-{self.state.global_step}")
        main = self.args.should_save
        push, self.args.push_to_hub = self.args.push_to_hub, False  # pushed below, from the final folder
        self._staging_dir = staging
        try:
            super()._save_checkpoint(model, trial)
            self.accelerator.wait_for_everyone()
            if main:
                if os.path.isdir(final):  # an older save of the same step (a rescue, or a resumed run)
                    shutil.rmtree(final)
                os.replace(os.path.join(staging, os.path.basename(final)), final)
                shutil.rmtree(staging, ignore_errors=True)
        except Exception as exc:
            if main:
                shutil.rmtree(staging, ignore_errors=True)
            if is_disk_full(exc, run_dir):
                raise disk_full_error(exc, final, earlier_checkpoint(final)) from exc
            raise
        finally:
            self._staging_dir = None
            self.args.push_to_hub = push
        self.accelerator.wait_for_everyone()
        if main:
            from transformers.trainer_utils import rotate_checkpoints
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint)
        if push:
            self._push_from_checkpoint(final)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        if self.pruner is not None and self.args.should_save:  # the head's optimizer, next to the policy's
            self.pruner.save_optimizer(output_dir)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> Any:
        weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")
        if not (self.is_deepspeed_enabled or self.is_fsdp_enabled) and not any(
                os.path.isfile(os.path.join(resume_from_checkpoint, name)) for name in weights):
            raise FileNotFoundError(f"{resume_from_checkpoint} has no model weights (model.safetensors or "
                                    "adapter_model.safetensors)." + _suggest_previous(resume_from_checkpoint))
        return super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is not None and not (self.is_deepspeed_enabled or self.is_fsdp_enabled) and not any(
                os.path.isfile(os.path.join(checkpoint, name)) for name in ("optimizer.pt", "optimizer.bin")):
            raise FileNotFoundError(f"{checkpoint} has no optimizer.pt: resuming would restart Adam's moments from "
                                    "zero while the weights and the allocator go on." + _suggest_previous(checkpoint))
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        self.load_allocation_state(read_allocation_state(checkpoint), os.path.join(checkpoint, ALLOCATION_STATE_NAME))
        if self.pruner is not None:
            self.pruner.load(checkpoint)
