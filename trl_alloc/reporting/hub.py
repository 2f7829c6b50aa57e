"""Hub pushes: the model card rendered from `model_cards/` and the files a pushed run carries
(policy or LoRA adapter, quality-head adapter, allocator state, training arguments as JSON)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from importlib import resources
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from huggingface_hub import ModelCard, ModelCardData

from .. import __version__

if TYPE_CHECKING:
    from transformers import TrainingArguments

# Files of a run folder that a checkpoint push copies to the repo root next to TRL's modeling files.
RUN_FILES = ("allocation_state.json", "training_args.json")
SETTING_KEYS = ("pacing", "filling", "pruning", "rollout_budget", "num_rounds", "num_generations", "unit_size",
                "max_units", "round_capacity", "saturation", "forgetting", "prior_alpha", "prior_beta",
                "init_price", "probe", "tau_low", "commit_min", "history_decay", "max_generation_batches",
                "detect_length", "keep_ratio", "target_ratio", "pruning_min_auc", "quality_head_init",
                "learning_rate", "loss_type", "beta", "epsilon",
                "epsilon_high", "max_completion_length", "temperature", "seed", "success_reward_funcs",
                "success_threshold", "rollout_mode", "rollout_mode_reason", "max_staleness")


def _template_path():
    return str(resources.files("trl_alloc.model_cards").joinpath("trl_alloc_card.md"))


def render_model_card(args: Any, summary: dict[str, Any] | None, model_name: str, base_model: str | None = None,
                      dataset_name: str | None = None, hub_model_id: str | None = None, tags: Iterable[str] = (),
                      trainer_name: str = "GRPO", trainer_citation: str | None = "",
                      evaluation: dict[str, Any] | None = None, quality_head: str | None = None) -> ModelCard:
    """The run's model card (a `huggingface_hub.ModelCard`). Only non-secret settings are rendered."""
    settings = {k: getattr(args, k) for k in SETTING_KEYS if getattr(args, k, None) is not None}
    card_data = ModelCardData(base_model=base_model, datasets=dataset_name, library_name="transformers",
                              model_name=model_name, tags=["trl", "trl-alloc", *tags])
    allocation = {"budget_responses": None, "responses_spent": None, "responses_remaining": None,
                  "tokens_spent": None, "rounds": None, "groups": None, "effective_groups": None,
                  "effective_group_rate": None, "responses_per_effective_group": None, "max_abs_pacing_gap": None,
                  "allocator_time_share": None, "plots": []}
    allocation.update(summary or {})
    methods = {k: getattr(args, k, "none") for k in ("pacing", "filling", "pruning")}
    return ModelCard.from_template(
        card_data, template_path=_template_path(), model_name=model_name, base_model=base_model,
        dataset_name=dataset_name, hub_model_id=hub_model_id, trainer_name=trainer_name,
        trainer_citation=trainer_citation or "", methods=methods, allocation=allocation, settings=settings,
        evaluation=evaluation or {}, quality_head=quality_head, trl_alloc_version=__version__,
        trl_version=version("trl"), transformers_version=version("transformers"), pytorch_version=version("torch"),
        datasets_version=version("datasets"), peft_version=version("peft"))


def write_training_args(args: TrainingArguments, folder: str | os.PathLike) -> None:
    """`training_args.json`: the full arguments, with every token redacted (transformers' `to_dict`)."""
    data = args.to_dict()
    for key in list(data):
        if "token" in key.lower() and data[key] not in (None, False) and not isinstance(data[key], (bool, int, float)):
            data[key] = f"<{key.upper()}>"
    with open(os.path.join(folder, "training_args.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, default=str)


class HubMixin:
    """Trainer overrides: our card instead of TRL's, and run files copied on checkpoint pushes."""

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None, **kwargs: Any) -> None:
        if not self.is_world_process_zero():
            return
        from trl.trainer.utils import get_config_model_id

        base = get_config_model_id(self.model.config)
        base = base if base and not os.path.isdir(base) else None
        summary_path = os.path.join(self.args.output_dir, "allocation", "summary.json")
        summary = {}
        if os.path.isfile(summary_path):
            with open(summary_path, encoding="utf-8") as f:
                summary = {k: v for k, v in json.load(f).items() if k != "per_round"}
        elif getattr(self, "allocator", None) is not None and self.allocator.history:  # a card before the run's report
            summary = self.write_allocation_report()
        evaluation = {k: v for k, v in summary.items() if k.startswith("held_out_") or k.startswith("eval_")}
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        head = "quality_head" if os.path.isdir(os.path.join(self.args.output_dir, "quality_head")) else None
        card = render_model_card(
            self.args, summary, model_name or os.path.basename(os.path.normpath(self.args.output_dir)),
            base_model=base, dataset_name=dataset_name, hub_model_id=self.hub_model_id,
            tags=[*tags, *self._tag_names], trainer_name=self._name,
            trainer_citation=self._paper.get("citation", ""), evaluation=evaluation, quality_head=head)
        card.save(os.path.join(self.args.output_dir, "README.md"))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            write_training_args(self.args, output_dir or self.args.output_dir)

    def _push_from_checkpoint(self, checkpoint_folder):
        """Copy the allocator state, training arguments and head adapter to the repo root, render the card,
        then TRL/transformers' checkpoint push (whose upload is the only network step)."""
        if self.is_world_process_zero() and self.args.hub_strategy != "end":
            out = self.args.output_dir
            for name in RUN_FILES:
                if os.path.isfile(os.path.join(checkpoint_folder, name)):
                    shutil.copy(os.path.join(checkpoint_folder, name), os.path.join(out, name))
            head = os.path.join(checkpoint_folder, "quality_head")
            if os.path.isdir(head):
                shutil.copytree(head, os.path.join(out, "quality_head"), dirs_exist_ok=True)
            self.create_model_card()
        super()._push_from_checkpoint(checkpoint_folder)
