"""Train with trl-alloc: `accelerate launch scripts/train.py --config configs/tiny_cpu.yaml [--key value ...]`
(or `trl-alloc-train --config ...`, the same).

Arguments are TRL's: the script arguments below, `AllocGRPOConfig` (or `AllocDAPOConfig` with
`--algorithm dapo`) and `ModelConfig` (LoRA through peft with `--use_peft`), from a YAML recipe
and/or the command line. `--model_name_or_path tiny` builds (once, cached) the embedded tiny
model for the built-in task; `smollm2-135m-instruct` (trl_alloc.tasks.models) converts the pip-installed
SmolLM2 once; nothing is downloaded.
"""

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from trl_alloc.cli.launch import finish, keep_stderr_for_the_last_message

if TYPE_CHECKING:  # (no `from __future__ import annotations` here: TrlParser reads ScriptArguments' annotations)
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from trl_alloc.evaluation import TransformersBackend, VLLMEngineBackend, VLLMServerBackend
    from trl_alloc.trainer import AllocGRPOConfig, AllocGRPOTrainer


@dataclass
class ScriptArguments:
    """What to train on and how to report it."""

    algorithm: str = field(default="grpo", metadata={"help": "grpo (AllocGRPOConfig) or dapo (AllocDAPOConfig)."})
    dataset_name: str = field(default="builtin:arithmetic", metadata={
        "help": "Hub dataset name, a local .jsonl/.json/.parquet/.csv file, or builtin:arithmetic / builtin:countdown "
        "(the tiny model's) / builtin:arithmetic-chat (word problems for instruct models)."})
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split used as the prompt pool."})
    dataset_test_split: str | None = field(default="test", metadata={
        "help": "Held-out split for accuracy before/after training (None to skip). A local file has no splits: "
        "see --test_dataset_name and --test_fraction."})
    test_dataset_name: str | None = field(default=None, metadata={
        "help": "A separate held-out set: a local .jsonl/.json/.parquet/.csv file or a Hub dataset."})
    test_fraction: float = field(default=0.1, metadata={
        "help": "Without a test split or --test_dataset_name: hold out this seeded fraction of the training rows "
        "(removed from the pool). 0 skips the evaluation."})
    prompt_column: str = field(default="prompt", metadata={"help": "Column holding the prompt."})
    answer_column: str = field(default="answer", metadata={"help": "Column holding the reference answer."})
    reward: str = field(default="auto", metadata={
        "help": "auto (the built-in task's exact verifier, else math-verify), math, math_number (math whose stated "
        "result must be a number: '90 - 4' scores 0), arithmetic or countdown."})
    num_builtin_prompts: int = field(default=2000, metadata={"help": "Prompts in the built-in training pool."})
    builtin_levels: list[int] | None = field(default=None, metadata={
        "help": "Difficulty levels of the built-in task to use (e.g. 1 2 3); None = all."})
    num_eval_prompts: int = field(default=200, metadata={"help": "Held-out prompts evaluated before/after."})
    eval_samples: int = field(default=4, metadata={"help": "Samples per held-out prompt (0 skips the evaluation)."})
    eval_every: int = field(default=0, metadata={
        "help": "Also evaluate every N rounds: the learning curve (held-out accuracy against responses spent and the "
        "run's seconds, evaluation excluded) goes to allocation/summary.json as `held_out_curve`. 0 = before and "
        "after only. Not in rollout_mode 'stream' (rollouts are in flight between rounds)."})
    eval_every_responses: int = field(default=0, metadata={
        "help": "Also evaluate after the round in which the responses spent pass another multiple of N: the same "
        "points for every method, whatever the size of its rounds (the learning benchmark's schedule). 0 = off; "
        "may be combined with --eval_every."})
    eval_before_from: str | None = field(default=None, metadata={
        "help": "A finished run's output_dir whose held-out evaluation before training this run takes instead of "
        "sampling it again, where the model, held-out rows, sampling settings, verifier, code and machine are the "
        "same (its eval/before/key.json); otherwise this run evaluates and says why. The learning benchmark passes "
        "each seed's first run."})


def pick_config_class(argv: Sequence[str]) -> "type[AllocGRPOConfig]":
    """AllocDAPOConfig when `--algorithm dapo` (or `--algorithm=dapo`) is given on the command line or
    `algorithm: dapo` in the YAML recipe (the command line wins), parsed as TrlParser parses them."""
    import argparse

    from trl_alloc.trainer.config import AllocDAPOConfig, AllocGRPOConfig
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--algorithm")
    known, _ = pre.parse_known_args(argv)
    algorithm = known.algorithm
    if algorithm is None and known.config:
        import yaml
        with open(known.config, encoding="utf-8") as f:
            algorithm = (yaml.safe_load(f) or {}).get("algorithm")
    algorithm = algorithm or "grpo"
    if algorithm not in ("grpo", "dapo"):
        raise ValueError(f"--algorithm must be grpo or dapo, got {algorithm!r}.")
    return AllocDAPOConfig if algorithm == "dapo" else AllocGRPOConfig


def held_out_accuracy(backend: "TransformersBackend | VLLMEngineBackend | VLLMServerBackend",
                      tokenizer: "PreTrainedTokenizerBase", dataset: "Dataset", script_args: ScriptArguments,
                      training_args: "AllocGRPOConfig", reward_fn: Callable[..., list[float]],
                      output_dir: str | None = None) -> float:
    """avg@1 of `eval_samples` samples per held-out prompt from `backend` (`trl_alloc.evaluation`'s), tokenized as the
    trainer does (chat template for conversational prompts, the tokenizer's special tokens); samples go to
    `output_dir`."""
    from trl_alloc.evaluation import answer_spec, answer_type, evaluate, write_outputs
    result = evaluate(backend, tokenizer, dataset, reward_fn, answer_spec(answer_type(reward_fn.__name__)), ks=(1,),
                      num_samples=script_args.eval_samples, temperature=training_args.temperature,
                      max_new_tokens=training_args.max_completion_length, seed=training_args.seed,
                      top_p=training_args.top_p, top_k=training_args.top_k or 0,
                      progress=not training_args.disable_tqdm)  # (minutes on a real model: show the bar)
    if output_dir:
        write_outputs(result, output_dir)
    return result.metrics[1]["avg"]


def engine_backend(trainer: "AllocGRPOTrainer") -> "VLLMEngineBackend | VLLMServerBackend":
    """The held-out evaluation's backend on the run's own vLLM engine: the colocate `LLM` or the server."""
    from trl_alloc.evaluation import VLLMEngineBackend, VLLMServerBackend
    vg = trainer.vllm_generation
    return VLLMEngineBackend(vg.llm) if trainer.args.vllm_mode == "colocate" else VLLMServerBackend(vg.vllm_client)


def check_before_loading(training_args: "AllocGRPOConfig", num_prompts: int) -> None:
    """The budget and round checks that need only the dataset size, before the model loads."""
    from trl_alloc.allocation.factory import resolve_num_rounds
    training_args.check_budget(resolve_num_rounds(training_args, num_prompts))


def resume_argument(value: str | bool | None) -> str | bool | None:
    """`--resume_from_checkpoint True` means the latest checkpoint in output_dir, as in TRL's scripts."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


EXIT_NOTHING_TRAINED, EXIT_REFUSED = 2, 3


class FlagError(ValueError):
    """A command-line value argparse refused (`--max_staleness abc`): its message, and the usage of that flag alone
    (argparse would print the usage of all ~230 flags, then exit before the run could say anything)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        flags = re.findall(r"--[\w-]+", message)
        action = next((parser._option_string_actions[f] for f in flags if f in parser._option_string_actions), None)
        if action is None:
            self.usage = f"usage: {parser.prog} [flags]; `--help` lists them"
        else:
            value = action.metavar or (action.dest.upper() if action.nargs != 0 else "")
            self.usage = f"usage: {parser.prog} ... {action.option_strings[0]} {value}".rstrip()
            if action.help:
                self.usage += "\n  " + (action.help % vars(action) if "%(" in action.help else action.help)


def refuse_flags_clearly(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`parser` raising `FlagError` for a bad flag or value instead of printing its whole usage and exiting."""
    def error(message: str) -> NoReturn:
        raise FlagError(parser, message)
    parser.error = error
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Exit status: 0 trained, 1 failed, 2 nothing was trained (everything saved), 3 the run was refused (bad input or
    settings). The main process's message (what is wrong, then the fix) is the last line on stdout and on stderr, the
    tail that `accelerate launch` quotes (cli/launch.py)."""
    import traceback

    keep_stderr_for_the_last_message()  # first: before any library writes to stderr
    from trl_alloc.trainer.trl_compat import TRLCompatibilityError

    try:
        return _main(argv)
    except FlagError as exc:  # a typo: the flag's usage, then one line naming the flag and the value
        print(exc.usage, flush=True)
        finish(f"[trl-alloc] the run was refused: {exc} (`python scripts/train.py --help` lists every flag)",
               EXIT_REFUSED)
        sys.exit(EXIT_REFUSED)
    except (ValueError, TypeError, FileNotFoundError, ModuleNotFoundError, TRLCompatibilityError) as exc:
        if os.environ.get("RANK", "0") == "0":
            traceback.print_exc()
            finish(f"[trl-alloc] the run was refused: {type(exc).__name__}: {exc}", EXIT_REFUSED)
        else:  # every rank refuses alike: the others leave after the main process has said why
            import time

            time.sleep(2)
        sys.exit(EXIT_REFUSED)
    except Exception as exc:  # (a rank's own failure: each prints its traceback)
        traceback.print_exc()
        finish(f"[trl-alloc] the run failed: {type(exc).__name__}: {exc} (traceback above; a failed round leaves a "
               "rescue checkpoint in output_dir: docs/reliability.md#saving)", 1)
        sys.exit(1)


def _main(argv=None):
    from trl import ModelConfig, TrlParser, get_peft_config

    argv = sys.argv[1:] if argv is None else list(argv)
    config_class = pick_config_class(argv)
    parser = refuse_flags_clearly(TrlParser((ScriptArguments, config_class, ModelConfig)))
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    for name in ("eval_every", "eval_every_responses"):
        if getattr(script_args, name) < 0:
            raise ValueError(f"--{name} must be >= 0 (0: no evaluation between rounds), got "
                             f"{getattr(script_args, name)}.")
        if getattr(script_args, name) and training_args.rollout_mode == "stream":
            raise ValueError(f"--{name} evaluates between rounds, but in rollout_mode 'stream' rollouts are in "
                             "flight then; use --rollout_mode deterministic or events for a learning curve, or "
                             f"--{name} 0.")

    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_alloc.allocation.allocator import trained_groups
    from trl_alloc.evaluation import TransformersBackend
    from trl_alloc.trainer.trl_compat import sync_vllm_weights
    from trl_alloc.reporting.plots import update_summary
    from trl_alloc.tasks.data import load_train_and_test, reward_for_dataset
    from trl_alloc.trainer import AllocDAPOTrainer, AllocGRPOTrainer

    state = PartialState()
    model_path = model_args.model_name_or_path
    if model_path in (None, "tiny"):
        if script_args.dataset_name not in ("builtin:arithmetic", "builtin:countdown"):
            raise ValueError("--model_name_or_path tiny is the embedded model for builtin:arithmetic and "
                             "builtin:countdown; give a real model (e.g. smollm2-135m-instruct) for dataset "
                             + repr(script_args.dataset_name))
        from trl_alloc.tasks.tiny import get_tiny_model_dir
        with state.main_process_first():  # one rank builds, the others wait and read the cache
            model_path = get_tiny_model_dir(task=script_args.dataset_name.split(":", 1)[1],
                                            progress=state.is_main_process)
    else:
        from trl_alloc.tasks.models import resolve_model
        with state.main_process_first():  # a registered name is converted once, by one rank
            model_path = resolve_model(model_path, progress=state.is_main_process)
    data_kw = dict(config=script_args.dataset_config, prompt_column=script_args.prompt_column,
                   answer_column=script_args.answer_column, seed=training_args.seed,
                   levels=tuple(script_args.builtin_levels) if script_args.builtin_levels else None)
    evaluate_held_out = script_args.eval_samples > 0
    splits = load_train_and_test(
        script_args.dataset_name, script_args.dataset_train_split,
        script_args.dataset_test_split if evaluate_held_out else None,
        test_name=script_args.test_dataset_name if evaluate_held_out else None,
        test_fraction=script_args.test_fraction, num_test=script_args.num_eval_prompts,
        num_builtin=script_args.num_builtin_prompts, **data_kw)
    train, test = splits.train, splits.test
    if state.is_main_process:
        print(f"[trl-alloc] prompt pool: {len(train)} rows of {script_args.dataset_name}; held-out: "
              + (f"{len(test)} prompts, {splits.test_source}" if test is not None else splits.test_source))
    check_before_loading(training_args, len(train))
    reward_fn = reward_for_dataset(script_args.dataset_name, script_args.reward)

    dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(__import__("torch"), model_args.dtype)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, revision=model_args.model_revision,
                                                 attn_implementation=model_args.attn_implementation)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    before, through_engine = None, training_args.use_vllm and not (
        training_args.vllm_mode == "colocate" and training_args.vllm_enable_sleep_mode)
    resume = resume_argument(training_args.resume_from_checkpoint)
    from trl_alloc.cli.curve import saved_curve
    from trl_alloc.cli.held_out_before import before_key, take_before, taken_from, write_key
    from transformers.trainer_utils import get_last_checkpoint
    out = training_args.output_dir
    resumed_curve = saved_curve((get_last_checkpoint(out) if os.path.isdir(out) else None) if resume is True
                                else resume or None)
    if resumed_curve is not None and test is not None:  # a resumed run goes on with its curve, not a new "before"
        before = next((p["accuracy"] for p in resumed_curve["points"] if p["when"] == "before"), None)

    def evaluate_held_out(when, backend, dtype=None):
        folder = os.path.join(training_args.output_dir, "eval", when)
        accuracy = None
        if when == "before":  # the key of what its samples depend on, for a later run's --eval_before_from
            key = before_key(model_path, model_args.model_revision, backend.name, dtype, test, {
                "samples": script_args.eval_samples, "temperature": training_args.temperature,
                "top_p": training_args.top_p, "top_k": training_args.top_k or 0,
                "max_new_tokens": training_args.max_completion_length, "seed": training_args.seed},
                reward_fn.__name__)
            if script_args.eval_before_from:
                accuracy, why = take_before(script_args.eval_before_from, folder, key)
                print(f"[trl-alloc] held-out evaluation before training {why}" if accuracy is not None else
                      f"[trl-alloc] --eval_before_from {script_args.eval_before_from}: not taken, {why}; "
                      "evaluating")
        if accuracy is None:
            accuracy = held_out_accuracy(backend, tokenizer, test, script_args, training_args, reward_fn, folder)
            if when == "before":
                write_key(folder, key)
        if when == "before":
            print(f"[trl-alloc] held-out accuracy before training: {accuracy:.4f} ({len(test)} prompts × "
                  f"{script_args.eval_samples} samples, {backend.name})")
        elif when != "after":
            print(f"[trl-alloc] held-out accuracy at {when}: {accuracy:.4f}")
        return accuracy

    if test is not None and before is None and not through_engine and state.is_main_process:
        before = evaluate_held_out("before", TransformersBackend(model, tokenizer),
                                   str(model.dtype).removeprefix("torch."))
    trainer_class = AllocDAPOTrainer if config_class.__name__ == "AllocDAPOConfig" else AllocGRPOTrainer
    trainer = trainer_class(model=model, reward_funcs=reward_fn, args=training_args, train_dataset=train,
                            processing_class=tokenizer, peft_config=get_peft_config(model_args))
    if test is not None and before is None and through_engine:  # the run's own engine samples faster
        sync_vllm_weights(trainer)  # (every rank: collective; nothing was pushed yet)
        if state.is_main_process:
            before = evaluate_held_out("before", engine_backend(trainer), trainer.engine_description()["dtype"])
    curve = None
    if test is not None and (script_args.eval_every > 0 or script_args.eval_every_responses > 0):
        def evaluate_now(when):
            if through_engine:
                sync_vllm_weights(trainer)  # (every rank: collective)
            accuracy = evaluate_held_out(when, engine_backend(trainer) if through_engine else TransformersBackend(
                trainer.accelerator.unwrap_model(trainer.model), tokenizer)) if state.is_main_process else None
            trainer.accelerator.wait_for_everyone()
            return accuracy
        from trl_alloc.cli.curve import HeldOutCurve
        curve = HeldOutCurve(script_args.eval_every, trainer, evaluate_now,
                             every_responses=script_args.eval_every_responses)
        if resumed_curve is not None:
            curve.load_state_dict(resumed_curve)
        else:
            curve.add("before", before, (0.0, 0.0))
        trainer.add_callback(curve)
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(training_args.output_dir)
    if test is not None and through_engine:
        sync_vllm_weights(trainer)  # the last optimizer step's weights, which no round generated with

    if state.is_main_process:
        summary = getattr(trainer, "allocation_summary", None) or trainer.write_allocation_report()
        if test is not None:
            backend = engine_backend(trainer) if through_engine else TransformersBackend(
                trainer.accelerator.unwrap_model(trainer.model), tokenizer)
            after = evaluate_held_out("after", backend)
            if curve is not None:
                curve.add("after", after, curve.ended)
            held_out = {"held_out_accuracy_before": before, "held_out_accuracy_after": after,
                        "held_out_split": splits.test_source, "held_out_prompts": len(test),
                        "held_out_samples": script_args.eval_samples, "held_out_backend": backend.name,
                        "held_out_reward": reward_fn.__name__, "held_out_before_from": taken_from(
                            os.path.join(training_args.output_dir, "eval", "before")),
                        **({"held_out_curve": curve.points} if curve is not None else {})}
            summary.update(held_out)
            update_summary(training_args.output_dir, held_out)
            print(f"[trl-alloc] held-out accuracy after training:  {after:.4f} (before {before:.4f}, "
                  f"{after - before:+.4f})")
        keys = ["rounds", "responses_spent", "responses_remaining", "tokens_spent", "groups", "effective_groups",
                "effective_group_rate", "responses_per_effective_group", "allocator_time_share"]
        print("[trl-alloc] allocation summary: " + json.dumps({k: summary.get(k) for k in keys}, default=float))
    if training_args.push_to_hub:  # the card now carries the held-out figures too
        builtin = script_args.dataset_name.startswith("builtin:")
        trainer.push_to_hub(dataset_name=None if builtin else script_args.dataset_name)
    trainer.accelerator.wait_for_everyone()  # the main process may still be evaluating
    trainer.accelerator.end_training()  # trackers closed, process group destroyed: a clean exit on every rank
    if not any(trained_groups(h) > 0 for h in trainer.allocator.history):
        if state.is_main_process:
            message = ("[trl-alloc] nothing was trained: no round had a group with a non-zero advantage (see the "
                       f"warning above and {os.path.join(training_args.output_dir, 'allocation', 'summary.json')}).")
            finish(message, EXIT_NOTHING_TRAINED)
        sys.exit(EXIT_NOTHING_TRAINED)


if __name__ == "__main__":
    main()
