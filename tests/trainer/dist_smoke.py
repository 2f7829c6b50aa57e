"""Launched by the two-process tests under `accelerate launch` (2 CPU processes; helpers.launch_two_processes):
`dist_smoke.py OUT RUNS`, RUNS a JSON {name: settings}. Each run trains a few rounds in OUT/<name>/run, one after
another in the same processes, and writes each rank's decisions to OUT/<name>/rank<r>.json (and the main process's
round log, read back from output_dir/allocation/rounds.jsonl), so the test can check all ranks acted identically.
"resume_from_checkpoint" is relative to OUT. With "colocate": true, every rank generates with its own vLLM colocate
engine (the vLLM tests' model, from a folder); a vLLM engine holds process-wide state, so that run is alone."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: helpers

from helpers import build_served_model, make_args, tiny_setup  # noqa: E402

from transformers import TrainerCallback  # noqa: E402

from trl_alloc.allocation.allocator import json_default as _json_default, read_round_log  # noqa: E402
from trl_alloc.trainer import AllocGRPOTrainer  # noqa: E402


def param_sum(trainer):
    """Sum of all (full, gathered under ZeRO-3) policy parameters; a collective call under ZeRO-3."""
    params = list(trainer.model_wrapped.parameters())
    if trainer._dist.is_zero3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            return float(sum(p.detach().double().sum() for p in params))
    return float(sum(p.detach().double().sum() for p in params))


class Checksums(TrainerCallback):
    def __init__(self):
        self.trainer, self.sums = None, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.sums.append(param_sum(self.trainer))

    def on_step_end(self, args, state, control, **kwargs):
        self.sums.append(param_sum(self.trainer))


def served_setup(model_dir):
    """The vLLM tests' model (saved to `model_dir`, which TRL's colocate engine loads), its tokenizer, the "a+b="
    pool and the first-digit reward."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build_served_model(model_dir)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]

    def first_digit_reward(completions, answer, **kwargs):
        return [float(c[:1] == a[:1]) for c, a in zip(completions, answer)]

    return (AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir),
            Dataset.from_list(rows), first_digit_reward)


def train(out, settings):
    """One run in folder `out` (see the module docstring); returns its trainer."""
    extra = dict(settings)
    pacing, filling = extra.pop("pacing", "cero"), extra.pop("filling", "sara")
    resume = extra.pop("resume_from_checkpoint", None)
    colocate = extra.pop("colocate", False)
    if colocate:
        model, tok, ds, reward = served_setup(os.path.join(out, f"tiny{os.environ.get('RANK', '0')}"))
        extra.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.1, generation_kwargs=None)
    else:
        model, tok, ds, reward = tiny_setup()
    kw = dict(pacing=pacing, filling=filling, num_rounds=3, rollout_budget=40, per_device_train_batch_size=4,
              gradient_accumulation_steps=2, save_strategy="steps", save_steps=2, max_generation_batches=50)
    args = make_args(os.path.join(out, "run"), **{**kw, **extra})
    trainer = AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    checks = Checksums()
    checks.trainer = trainer
    trainer.add_callback(checks)
    decided, events_here, record_round = [], [], trainer.allocator.record_round

    def recorded(*a, **kw):  # what this rank decided each round (requests, committed groups), and whether the
        entry = record_round(*a, **kw)  # round's events reached it
        line = json.loads(json.dumps(trainer.allocator.last_round_log, default=_json_default))
        events_here.append(line.pop("events", None) is not None)
        decided.append(line)
        return entry

    trainer.allocator.record_round = recorded
    trainer.train(resume_from_checkpoint=resume)
    rank = trainer.accelerator.process_index
    record = {"decided": decided, "events_here": events_here, "counters": trainer.allocator.counters,
              "global_step": trainer.state.global_step, "world": trainer.accelerator.num_processes,
              "param_sums": checks.sums, "rank_rollouts": getattr(trainer, "colocate_rank_rollouts", None)}
    if trainer.accelerator.is_main_process:
        record["allocation_state"] = trainer.allocation_state()
        record["round_log"] = read_round_log(trainer.round_log_path)  # written by the main process only
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f, default=_json_default)
    trainer.accelerator.wait_for_everyone()
    return trainer


def main():
    out, runs = sys.argv[1], json.loads(sys.argv[2])
    trainer = None
    for name, settings in runs.items():
        if settings.get("resume_from_checkpoint"):
            settings = {**settings, "resume_from_checkpoint": os.path.join(out, settings["resume_from_checkpoint"])}
        os.makedirs(os.path.join(out, name), exist_ok=True)
        trainer = train(os.path.join(out, name), settings)
    trainer.accelerator.end_training()  # destroy the process group before exit (else gloo may abort at teardown)


if __name__ == "__main__":
    main()
