"""The engine model makes the trainer's decisions. One seed through AllocGRPOTrainer's stream (its rollout backend
replaced by the engine model's simulated engine, rewards read from the completions) and through `simulate_engine`,
the path of scripts/plan.py: both write the same round log, round by round the same committed groups and the same
order of submissions, ends and aborts."""

import argparse

import pytest

from helpers import make_args, tiny_setup
from trl_alloc.allocation.allocator import read_round_log
from trl_alloc.rollout.engine_model import SimulatedRollouts, SimulatedTask, simulate_engine
from trl_alloc.trainer import AllocGRPOTrainer

ROUNDS, K, BATCH = 5, 8, 32
PLAN = dict(prompts=16, rounds=ROUNDS, budget=ROUNDS * BATCH, unit_size=4, units_per_group=2, capacity=8,
            tau_low=0.45, history_decay=1.0, drift=1.5, engine_seqs=12, step_ms=25.0, length_median=2.0,
            length_sigma=0.6, max_tokens=3, rollout_max_inflight=12, train_ms_per_token=0.0, sync_s=0.0,
            max_staleness=1, colocate=False)


class SuccessInTokens(SimulatedRollouts):
    """The engine model's engine, writing each ended rollout's success into its tokens ("1..." or "0...": the tiny
    tokenizer's digits), so the trainer's own reward step finds what the engine model reads from `info`."""

    def _step(self, limit_s):
        out = super()._step(limit_s)
        for r in out or ():
            if r.finish_reason in ("stop", "length"):
                r.token_ids = [3 if r.info["success"] else 2] * len(r.token_ids)
        return out


def starts_with_one(completions, **kwargs):
    return [float(c.startswith("1")) for c in completions]


def trainer_round_log(tmp_path, method, args):
    model, tok, ds, _ = tiny_setup(n_prompts=args.prompts)
    pacing, _, filling = method.partition("+")
    config = make_args(str(tmp_path / "trainer"), pacing=pacing, filling=filling or "full", num_generations=K,
                       per_device_train_batch_size=BATCH, num_rounds=ROUNDS, rollout_budget=args.budget,
                       unit_size=args.unit_size, max_units=args.units_per_group, round_capacity=args.capacity,
                       tau_low=args.tau_low, history_decay=args.history_decay,
                       max_completion_length=args.max_tokens, rollout_mode="stream",
                       rollout_max_inflight=args.rollout_max_inflight,
                       max_staleness=args.max_staleness, seed=args.seed)
    trainer = AllocGRPOTrainer(model=model, reward_funcs=starts_with_one, args=config, train_dataset=ds,
                               processing_class=tok)
    task = SimulatedTask(args)
    engine = SuccessInTokens(task.outcome, args.engine_seqs, (args.step_ms / 1e3, 0.0), seed=args.seed)
    trainer._rollout_backend = lambda: engine
    finish_round = trainer.allocator.finish_round

    def finish_and_learn():  # the engine model's pool learns from each closed round's groups, as simulate_engine's
        rnd = trainer.allocator.current_round
        summary = finish_round()
        task.learn(rnd)
        return summary

    trainer.allocator.finish_round = finish_and_learn
    trainer.train()
    return read_round_log(trainer.round_log_path)


@pytest.mark.parametrize("method", ["cero+sara", "uniform+dynamic_sampling"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_engine_model_and_the_trainer_make_the_same_decisions(tmp_path, method, seed):
    args = argparse.Namespace(**PLAN, seed=seed)
    modelled = tmp_path / "engine_model.jsonl"
    simulate_engine(method, "stream", args, ROUNDS, round_log_path=str(modelled))
    engine_model, trainer = read_round_log(str(modelled)), trainer_round_log(tmp_path, method, args)
    assert ROUNDS - 1 <= len(engine_model) == len(trainer) <= ROUNDS  # (DAPO may spend the budget a round early)
    for ours, theirs in zip(engine_model, trainer):
        assert ours["groups"] == theirs["groups"], ours["round"]
        assert ours["events"] == theirs["events"], ours["round"]
    events = [e for line in trainer for e in line["events"]]
    assert {"submit", "done"} <= {kind for kind, _, _ in events}
    assert sum(len(line["groups"]) for line in trainer) > ROUNDS  # (groups committed, not empty rounds)


def test_without_a_window_both_run_the_trainers_default(tmp_path):
    """No `rollout_max_inflight`: the engine model's window is the trainer's default (the generation batch, a
    round's responses), not the engine's capacity, so the planner runs what trains."""
    args = argparse.Namespace(**{**PLAN, "rollout_max_inflight": None}, seed=0)
    modelled = tmp_path / "engine_model.jsonl"
    simulate_engine("cero+sara", "stream", args, ROUNDS, round_log_path=str(modelled))
    engine_model, trainer = read_round_log(str(modelled)), trainer_round_log(tmp_path, "cero+sara", args)
    assert len(engine_model) == len(trainer) >= ROUNDS - 1
    assert [line["events"] for line in engine_model] == [line["events"] for line in trainer]
    live, most = set(), 0  # rollouts in flight, from the events in order (a rollout ends once: done, abort, prune)
    for kind, _, rid in (e for line in trainer for e in line["events"]):
        if kind == "submit":
            live.add(rid)
            most = max(most, len(live))
        else:
            live.discard(rid)
    assert PLAN["rollout_max_inflight"] < most <= BATCH  # the window is the batch (32), not the 12 set above
