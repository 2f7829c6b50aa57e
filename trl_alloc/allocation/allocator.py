"""The allocator: one run's pacer, filler and pruning decisions, with the counters, history
and exposure they produce, as one object with a versioned state (numpy only, testable without TRL).

One round, as the trainer drives it (docs/architecture.md; each call but `record_round` runs on the
main process only, and its result is shared with every rank):

    admitted = allocator.start_round()              # pacer.propose(); filler.start_round(...)
    while (req := allocator.next_request()):        # (prompt ids, responses per prompt)
        rows = generate and score req            # the trainer's part
        allocator.observe(rows, req)                # filler decides; pruner learns
    # (the loop is `Allocator.drive_requests`, which the trainer's deterministic rounds and `allocation.simulate`
    # both run through the round runner, `allocation.rounds.Rounds`; `Allocator.run_round` runs one such round)
    # or, event-driven (start_round(events=True); rollout.drivers.RoundDriver runs this part):
    #   allocator.submissions(room) -> [(pid, n)] to start; allocator.observe_rollouts(rows) -> prompts to abort
    summary = allocator.finish_round()              # pacer.update(successes, failures)
    allocator.record_round(summary, rows, ...)      # every rank: counters, history, exposure; the round log line

The round log (`round_log_path`, set by the trainer on the main process only: `output_dir/allocation/rounds.jsonl`)
gets one JSON line per round, appended as the round is recorded: its index, requests, committed groups and, for
an event-driven round, its order of events. Only the last line stays in memory (`last_round_log`); an allocator
without a path (simulators, tests) writes nothing. `read_round_log` reads the file back.

A row is a dict with at least `pid`, `success` (1/0, NaN = unscored), `pruned` and `completion_ids`.
The pruner, when there is one, is the rollout layer's object (duck-typed: `record`, `end_round`,
`state_dict`, `load_state_dict`, `totals`); its decisions are `allocation.arrol`'s.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .factory import build_stages, round_kwargs

if TYPE_CHECKING:
    from .base import Filler, Pacer
    from .event_rounds import BatchedEventRound, Round

STATE_VERSION = 2
# Fields that fix a run's plan: resuming with any of them changed would pace another run.
PLAN_FIELDS = ("pacing", "filling", "pruning", "num_prompts", "num_rounds", "rollout_budget", "allocation_seed",
               "dataset_fingerprint")
COUNTERS = ("rounds", "responses", "tokens", "empty_rounds", "rounds_without_signal", "unscored")
ROUND_LOG_NAME = "rounds.jsonl"
T = TypeVar("T")


def call_in_place(method: Callable[..., Any], *args: Any) -> Any:
    """An allocator call made where it is (the default `step` of a round; the trainer's runs on its main process)."""
    return method(*args)


def round_log_file(output_dir: str) -> str:
    """Where a run's round log goes: `output_dir/allocation/rounds.jsonl`."""
    return os.path.join(output_dir, "allocation", ROUND_LOG_NAME)


def read_round_log(path: str) -> list[dict]:
    """The round log at `path` as a list of dicts, one per round, in order ([] when there is no file)."""
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def truncate_round_log(path: str, rounds: int) -> None:
    """Keep the round log's lines of rounds before `rounds` (what a checkpoint had recorded), so a resumed run
    appends no round twice; a line torn by a crash is dropped. Nothing to do without a file."""
    if not os.path.isfile(path):
        return
    keep = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("round"), int) and entry["round"] < rounds:
                keep.append(line if line.endswith("\n") else line + "\n")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(keep)
    os.replace(path + ".tmp", path)


def json_default(obj: Any) -> int | float | bool | list:
    """`json.dump(..., default=json_default)` for numpy scalars and arrays (anything else is an error)."""
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"a {type(obj).__name__} is not JSON-serialisable.")


def migrate_state(state: dict, where: str = "allocation state") -> dict:
    """An allocation state of any version this code reads, as the current version; a newer one is refused."""
    version = state.get("version", 1)
    if not isinstance(version, int) or version > STATE_VERSION:
        raise ValueError(f"{where} has state version {version!r}, newer than this trl-alloc reads ({STATE_VERSION}); "
                         "upgrade trl-alloc to resume from it.")
    if version == 1:  # before whole-run history and plan checks: only what it recorded is checked
        state = {**state, "version": 2, "pruning": state.get("pruning", "none"), "history": [], "exposure": None}
    return state


def check_same_plan(state: dict, current: dict, where: str) -> None:
    """Refuse a state whose run plan differs from this run's, naming the field."""
    for key in PLAN_FIELDS:
        if key not in state:  # written by an older trl-alloc: only what it recorded is checked
            continue
        if state[key] != current[key]:
            raise ValueError(f"{where} was written by a run with {key}={state[key]!r}, but this run has "
                             f"{key}={current[key]!r}; resuming would pace another run. Resume with the checkpoint's "
                             f"settings (and dataset), or start a new run in another output_dir.")


@dataclass
class SynchronousRound:
    """One synchronous round, as `Allocator.run_round` ran it."""

    admitted: int                                    # prompts the pacer admitted
    rows: list[dict]                                 # every row generated, in request order
    requests: list[tuple[list[int], list[int]]]      # (prompt ids, responses per prompt), one per generation call
    summary: dict                                    # `finish_round`'s


class Allocator:
    """Pacer + filler (+ pruner) of one run.

    join(pacer, units) -> the keyword arguments of `filler.start_round` (`pipeline.round_arguments`);
    `plan` is a dict of `PLAN_FIELDS` (or a function returning it, evaluated when first needed).
    `round_log_path`: the file each recorded round appends its line to (module docstring; None: no file).
    `from_config` builds all of it from an `AllocGRPOConfig`'s fields.
    """

    def __init__(self, pacer: Pacer, filler: Filler, join: Callable[..., dict], plan: dict | Callable[[], dict],
                 pruner: Any = None, round_log_path: str | None = None) -> None:
        self.pacer, self.filler, self.join = pacer, filler, join
        self.pruner = pruner
        self._plan = plan
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.history = []  # per round: the figures of `output_dir/allocation/summary.json`
        self.exposure = np.zeros(pacer.num_prompts, np.int64)  # responses per prompt over the run
        self.round_log_path = round_log_path
        self.last_round_log = None  # the last round's log line (requests and groups identical on every rank)
        self._round_log_synced = False  # the file holds no round past the counters (checked at the first write)
        self.budget_exhausted = False
        self.signal_streak = 0  # rounds in a row without a mixed group
        self._round = None
        self.closed_round = None  # the last round `finish_round` closed

    @classmethod
    def from_config(cls, args: Any, num_prompts: int, num_rounds: int, plan: dict | Callable[[], dict],
                    pruner: Any = None, round_log_path: str | None = None,
                    reference: list | None = None) -> Allocator:
        """The allocator an `AllocGRPOConfig` (or any object with its fields) names, through the registry.
        `reference`: a CERO run's allocation log, for a pacer that replays one (`random_matched`, the planner's)."""
        pacer, filler = build_stages(args, num_prompts, num_rounds, reference=reference)
        return cls(pacer, filler, functools.partial(round_kwargs, args, filler), plan, pruner,
                   round_log_path=round_log_path)

    @property
    def plan(self) -> dict:
        if callable(self._plan):
            self._plan = self._plan()
        return self._plan

    # ------------------------------------------------------------------ one round (main process)
    def start_round(self, events: bool = False, carry: dict[int, dict] | None = None,
                    wait_for_groups: bool = False) -> int:
        """The pacer's proposal opens the filler's round (fed one rollout at a time with `events`, see
        `event_rounds`; with `carry`, the stream's next round, resuming an earlier round's open groups; it waits
        for its groups when so told or when it may spend all that is left); returns the number of prompts admitted."""
        units = self.pacer.propose()
        if carry is not None:
            self._round = self.filler.start_event_round(**self.join(self.pacer, units, carry=carry,
                                                                    wait_for_groups=wait_for_groups))
        else:
            kwargs = self.join(self.pacer, units)
            self._round = (self.filler.start_event_round if events else self.filler.start_round)(**kwargs)
        return int((units > 0).sum())

    def next_request(self) -> tuple[list[int], list[int]] | None:
        """The round's next generation request as (prompt ids, responses per prompt), or None when it is done."""
        if self._round.done:
            return None
        ids, counts = self._round.requests()
        return (ids.tolist(), counts.tolist()) if len(ids) else None

    def observe(self, rows: Sequence[dict], request: tuple[Sequence[int], Sequence[int]]) -> None:
        """The request's rows (in request order) go to the filler, which commits, abandons or continues."""
        counts = request[1]
        success = np.array([r["success"] for r in rows], dtype=float)  # 0/1, NaN = unscored
        pruned = np.array([r.get("pruned", False) for r in rows], dtype=bool)
        splits = np.cumsum(counts)[:-1]
        self._round.observe(np.split(success, splits), pruned=np.split(pruned, splits))
        if self.pruner is not None:
            self.pruner.record(rows)

    def one_round(self, drive: Callable[[], T], events: bool = False,
                  step: Callable[..., Any] = call_in_place) -> tuple[int, T, dict]:
        """One round, in the one copy that opens and closes a whole round: opened (`start_round`), driven by
        `drive()`, closed (`finish_round`). Returns the prompts admitted, what `drive` returned and the round's
        summary. Each allocator call goes through `step(method, *args)` (the trainer's: on its main process, the
        result shared with every rank). The round runner (`allocation.rounds.Rounds.driven`) and `run_round` run it;
        a stream's rounds open and close apart (`allocation.rounds.StreamRounds`)."""
        admitted = step(self.start_round, events)
        driven = drive()
        summary = step(self.finish_round)
        return admitted, driven, summary

    def drive_requests(self, generate: Callable[[list[int], list[int]], list[dict]],
                       step: Callable[..., Any] = call_in_place) -> tuple[list[dict], list[tuple[list, list]]]:
        """The open synchronous round, driven to its end: each filler request's rows come from `generate(prompt ids,
        counts)` and are observed. Returns every row and the requests. `step(method, *args)` makes each allocator
        call (the trainer: on the main process, its result shared with every rank; the simulator: timed)."""
        rows, requests = [], []
        while (request := step(self.next_request)) is not None:
            requests.append(request)
            new = generate(*request)
            rows.extend(new)
            step(self.observe, new, request)
        return rows, requests

    def run_round(self, generate: Callable[[list[int], list[int]], list[dict]],
                  step: Callable[..., Any] = call_in_place) -> SynchronousRound:
        """One synchronous round, the loop of the module docstring: opened, `drive_requests`, closed. (The trainer's
        deterministic mode and `allocation.simulate` run the same through `allocation.rounds.Rounds.driven`.)"""
        admitted, (rows, requests), summary = self.one_round(lambda: self.drive_requests(generate, step), False, step)
        return SynchronousRound(admitted, rows, requests, summary)

    def more_rounds(self, closed: int, rounds: int, min_responses: int = 1) -> bool:
        """The stop rule, in one copy: another round follows `closed` closed rounds while fewer than `rounds` are
        closed and the budget is not spent, at least `min_responses` responses of it left (the planner: one group).
        The round runner (`allocation.rounds`) stops every run by it. (`budget_exhausted` is the last
        recorded round's, the same on every rank; the pacer is advanced on the main process only.)"""
        finished = self.budget_exhausted or self.pacer.finished
        return closed < rounds and not finished and self.pacer.remaining_responses >= min_responses

    # ------------------------------------------------------------------ one event-driven round (main process)
    @property
    def current_round(self) -> Round | BatchedEventRound | None:
        """The filler's open round (None between rounds)."""
        return self._round

    @property
    def round_done(self) -> bool:
        return self._round.done

    def submissions(self, room: int) -> list[tuple[int, int]]:
        """Event mode: the rollouts to start now, as [(prompt id, n)], at most `room` in all."""
        return self._round.submissions(room)

    def observe_rollouts(self, rows: Sequence[dict]) -> list[int]:
        """Event mode: rows of ended rollouts (any order; `aborted` rows carry no reward). Returns the prompt
        ids whose in-flight rollouts are no longer wanted (every prompt in flight once the round is done)."""
        cancelled = self._round.observe_rollouts(rows)
        if self.pruner is not None:
            self.pruner.record([r for r in rows if not r.get("aborted")])
        return cancelled

    def finish_round(self) -> dict:
        """Close the round: the pacer learns each prompt's successes and failures; returns the round's summary (the
        closed round stays readable as `closed_round` until the next one closes)."""
        rnd, self._round = self._round, None
        self.closed_round = rnd
        carried = {"prepaid": rnd.prepaid_counts(self.pacer.num_prompts)} if getattr(rnd, "carries", False) else {}
        self.pacer.update(*rnd.outcomes(self.pacer.num_prompts), **carried)
        out = {"groups": [int(g) for g in rnd.groups], "stats": rnd.stats(),
               "finished": bool(self.pacer.finished), "remaining": int(self.pacer.remaining_responses)}
        if (gap := self.pacer.pacing_gap()) is not None:
            out["pacing_gap"] = float(gap)
        if self.pruner is not None:
            out["pruning"] = self.pruner.end_round()
        return out

    # ------------------------------------------------------------------ bookkeeping (every rank)
    def record_round(self, summary: dict, rows: Sequence[dict], admitted: int,
                     requests: list[tuple[list[int], list[int]]], loss_responses: int, allocator_s: float,
                     round_s: float, events: list[tuple[str, int, int]] | None = None,
                     responses: int | None = None, log_fields: dict | None = None) -> dict:
        """Counters, exposure and the round's history entry, from the broadcast summary; returns the entry.
        The round's log line goes to `last_round_log` and, with a `round_log_path`, to the file. `events`: an
        event-driven round's order of events, for that line (the main process's only: it is not broadcast).
        `responses` (stream mode): what the round started, when its rows (what ended) are not all it spent.
        `log_fields`: more fields for the log line (stream mode: `token_staleness`, trained tokens by staleness)."""
        stats = summary["stats"]
        c, tokens = self.counters, sum(len(r["completion_ids"]) for r in rows)
        responses = len(rows) if responses is None else int(responses)
        c["rounds"] += 1
        c["responses"] += responses
        c["tokens"] += tokens
        c["unscored"] += int(stats.get("unscored", 0))
        c["empty_rounds"] += int(loss_responses == 0)
        if stats["effective_groups"] > 0:
            self.signal_streak = 0
        else:
            c["rounds_without_signal"] += 1
            self.signal_streak += 1
        self.budget_exhausted = summary["finished"]
        np.add.at(self.exposure, [r["pid"] for r in rows], 1)
        self.last_round_log = {"round": c["rounds"] - 1, "requests": requests, "groups": summary["groups"],
                               **({} if events is None else {"events": events}), **(log_fields or {})}
        self._write_round_log(self.last_round_log)
        entry = {"round": c["rounds"], "responses": responses, "tokens": tokens,
                 "admitted": admitted, "groups": len({r["pid"] for r in rows}), "committed": stats["groups"],
                 "effective_groups": stats["effective_groups"], "abandoned": stats["abandoned"],
                 "pruned": stats.get("pruned", 0), "aborted": stats.get("aborted", 0),
                 "unscored": int(stats.get("unscored", 0)),
                 "generation_calls": stats["generation_calls"], "loss_responses": loss_responses,
                 "allocator_s": round(allocator_s, 6), "round_s": round(round_s, 6)}
        self.history.append(entry)
        return entry

    def _write_round_log(self, line):
        """Append the round's line to `round_log_path` (flushed at once). The first write after the allocator was
        built or restored first drops the file's lines past the counters (a resumed run, or an earlier run's file)."""
        path = self.round_log_path
        if path is None:
            return
        if not self._round_log_synced:
            truncate_round_log(path, line["round"])
            self._round_log_synced = True
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, default=json_default) + "\n")
            f.flush()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """JSON-serialisable state (what checkpoints hold), with the whole run's history and exposure."""
        return {"version": STATE_VERSION, **self.plan,
                "pacer": self.pacer.state_dict(), "filler": self.filler.state_dict(),
                "pruner": None if self.pruner is None else self.pruner.state_dict(),
                "counters": dict(self.counters), "budget_exhausted": self.budget_exhausted,
                "history": self.history, "exposure": self.exposure.tolist()}

    def load_state_dict(self, state: dict, where: str = "allocation state", check_plan: bool = True) -> None:
        """Restore a `state_dict`; an older version is migrated, a newer one or another plan is refused."""
        state = migrate_state(state, where)
        if check_plan:
            check_same_plan(state, self.plan, where)
        self.pacer.load_state_dict(state["pacer"])
        self.filler.load_state_dict(state["filler"])
        if self.pruner is not None:
            self.pruner.load_state_dict(state["pruner"])
        self.counters.update(state["counters"])
        self.budget_exhausted = bool(state.get("budget_exhausted", False))
        self.history = [dict(h) for h in state.get("history", [])]
        if state.get("exposure") is not None:
            self.exposure = np.asarray(state["exposure"], np.int64)
        self._round = None
        self.last_round_log = None
        # the round log keeps the rounds this state had recorded (a resumed run appends none twice); at once, so a
        # round rolled back (the rescue checkpoint) leaves no line behind
        self._round_log_synced = self.round_log_path is not None
        if self._round_log_synced:
            truncate_round_log(self.round_log_path, self.counters["rounds"])

    def snapshot(self) -> dict:
        """A deep copy of the state (a failed round is rolled back to it)."""
        return json.loads(json.dumps(self.state_dict(), default=json_default))

    # ------------------------------------------------------------------ end-of-run report
    def report(self) -> dict:
        """The run's figures beyond the per-round history (`output_dir/allocation/summary.json`)."""
        h = self.history
        out = {"methods": {"pacing": self.plan["pacing"], "filling": self.plan["filling"],
                           "pruning": self.plan["pruning"]},
               "budget": self.counters["responses"] + int(self.pacer.remaining_responses),
               "empty_rounds": self.counters["empty_rounds"],
               "rounds_without_signal": self.counters["rounds_without_signal"],
               "responses_unscored": self.counters["unscored"],
               "trained": any(trained_groups(x) > 0 for x in h),
               "allocator_time_share": sum(x["allocator_s"] for x in h) / max(sum(x["round_s"] for x in h), 1e-9)}
        if self.pruner is not None:
            out["pruning"] = self.pruner.report()
        return out


def trained_groups(entry: dict) -> int:
    """A round's committed groups whose advantages were not all zero (a group the allocator counts as mixed by the
    success signal can still have a constant training reward, e.g. with the verifier's reward weight at 0)."""
    return entry["effective_groups"] - entry.get("flat_groups", 0)


__all__ = ["Allocator", "SynchronousRound", "call_in_place", "trained_groups", "STATE_VERSION", "PLAN_FIELDS",
           "check_same_plan", "migrate_state", "json_default", "ROUND_LOG_NAME", "round_log_file", "read_round_log",
           "truncate_round_log"]
