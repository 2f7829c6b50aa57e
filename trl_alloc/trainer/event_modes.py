"""The event-driven round (`rollout_mode="events"`): the main process runs the filler's event round over a
rollout backend (`rollout.drivers.RoundDriver`) and every rank scores each batch of ended rollouts.

    driver (main process only)                         every rank
    poll(): start what the filler asks, wait  ──►  the ended rollouts, broadcast
                                                   rows = scored across ranks (TRL's reward step)
    observe(rows): decide, abort the surplus  ◄──  the rows

The rollout backend: vLLM server mode streams one request per rollout (`rollout.backends.VLLMServerRollouts`, after
the usual weight push). ARROL prunes inside that stream: the quality head's weights go to the server with
the weights, the worker scores each rollout at `detect_length` tokens, and the main process decides a
cohort (one submission's rollouts) at a time; pruned rollouts are aborted in the engine, survivors go on in
the same request (`rollout.drivers`). Otherwise the rollouts pending at each poll are generated together by TRL's
generation step across the ranks (`BatchedRollouts` without a generate function), so ZeRO-3 works and a run
is reproducible. The order of events stays on the main process, which writes it to the round log
(`output_dir/allocation/rounds.jsonl`, one line per round); it is not broadcast.

`rollout_mode="stream"` keeps one `rollout.drivers.StreamDriver` across rounds: a round closes once it has
its groups or has started its budget; its open groups (and their rollouts in flight) go on into the next
round, which is opened and starts submitting *before* this round's rows are returned to TRL's optimizer step,
so a vLLM server generates while the trainer trains. Each weight push pauses the server with vLLM's
`/pause?mode=keep` and resumes it (in-flight rollouts continue on the new weights). Every rank keeps the scored
rows of open groups until they commit; each trained row carries its `staleness`, and TRL's vLLM
importance-sampling correction (old log-probs of the policy being trained vs vLLM's sampling log-probs) is
what corrects the stale tokens. A checkpoint holds the allocator's state at the last close; the rollouts then
in flight are named in it and dropped if the run resumes from there (spent, never trained).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..allocation.rounds import ClosedRound, Rounds
from ..rollout.colocate import RankedRollouts, LocalRankRollouts, VLLMColocateRollouts
from ..rollout.backends import BatchedRollouts, VLLMServerRollouts
from ..rollout.drivers import RoundDriver, StreamDriver, drive_round
from .round_state import CollectedRound
from .trl_compat import (colocate_llm, sleep_colocate_engine, sync_vllm_weights, tokenize_prompts, vllm_server_url,
                         wake_colocate_engine)


def _plain(rollouts: list[Any]) -> list[dict[str, Any]]:
    return [{"rid": r.rid, "pid": int(r.tag), "prompt_ids": r.prompt_ids, "token_ids": r.token_ids,
             "logprobs": r.logprobs, "finish_reason": r.finish_reason} for r in rollouts]


class EventRoundMixin:
    """`_event_round`: one round in events mode (module docstring)."""

    def _rollout_mode_notice(self) -> None:
        args = self.args
        if args.rollout_mode_reason and self.accelerator.is_main_process:
            print(f"[trl-alloc] rollout_mode='auto' chose {args.rollout_mode!r}: {args.rollout_mode_reason} "
                  "(trainer/rollout_mode.py; set --rollout_mode to choose).")
        if args.rollout_mode == "stream" and not self.use_vllm and self.accelerator.is_main_process:
            print("[trl-alloc] rollout_mode='stream' without a vLLM server: generation cannot overlap training, and "
                  "rows carried across a round get no importance-sampling correction (no sampling log-probs); "
                  "measured on the demo it learned less (docs/benchmarks.md). Use it with --use_vllm --vllm_mode "
                  "server, or rollout_mode='deterministic'.")

    @property
    def colocate(self) -> bool:
        """Generation through the `vllm.LLM` TRL's colocate mode holds (`rollout.colocate`)."""
        return self.use_vllm and self.args.vllm_mode == "colocate"

    @property
    def rollout_window(self) -> int:
        """Most rollouts in flight at once: `rollout_max_inflight`, else the generation batch."""
        return self.args.rollout_window

    @property
    def colocate_ranks(self) -> bool:
        """Colocate on several processes: every rank steps its own engine, the main process decides
        (`rollout.colocate.RankedRollouts`; the other ranks follow it inside each `on_main.call`)."""
        return self.colocate and self.accelerator.num_processes > 1

    def _rollout_backend(self) -> Any:
        """The rollout backend (main process; with `colocate_ranks`, every rank: the main process gets the ranked
        rollout backend, `RankedRollouts`, the others their own part of it, `LocalRankRollouts`; kept in
        `on_main.ranks`)."""
        args = self.args
        if not self.use_vllm:
            return BatchedRollouts()
        extra = {k: v for k, v in (("min_p", args.min_p), ("repetition_penalty", args.repetition_penalty)) if v}
        head = self.pruner.head if self.pruner is not None else None
        if self.colocate:
            local = VLLMColocateRollouts(colocate_llm(self), temperature=args.temperature, top_p=args.top_p,
                                         top_k=args.top_k or 0, extra=extra, quality_head=head)
            if not self.colocate_ranks:
                return local
            host = LocalRankRollouts(local, self.accelerator.process_index)
            main = self.accelerator.is_main_process
            self.on_main.ranks = RankedRollouts(host, self.accelerator.num_processes, self.on_main.broadcast,
                                                self.on_main.all_gather) if main else host
            return self.on_main.ranks if main else None
        return VLLMServerRollouts(vllm_server_url(self), temperature=args.temperature, top_p=args.top_p,
                                  top_k=args.top_k or 0, max_inflight=self.rollout_window,
                                  request_timeout=args.vllm_server_timeout, extra=extra, quality_head=head)

    def _prompt_ids_of(self, pid: int) -> list[int]:
        cache = self.__dict__.setdefault("_prompt_ids_cache", {})
        if pid not in cache:
            cache[pid] = list(map(int, tokenize_prompts(self, [self.train_dataset[int(pid)]["prompt"]])[0]))
        return cache[pid]

    def _poll_round(self, driver: RoundDriver | StreamDriver | None) -> list[dict[str, Any]]:
        """`rollout.drivers.drive_round` on every rank: `driver` (main process) polled and deciding there, each
        batch scored across the ranks. Returns the rows."""
        main = self.on_main
        return drive_round(lambda: main.call(lambda: None if (b := driver.poll()) is None else _plain(b)),
                           self._score_polled, lambda new: main.allocate(lambda: driver.observe(new)))

    def _score_polled(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every rank: the polled rollouts' rows (not generated yet: one batched generation call across the ranks)."""
        if batch[0]["finish_reason"] is None:
            new = self._generate_and_score_request([r["pid"] for r in batch], [1] * len(batch))
        else:
            new = self._score_rollouts(batch)
        for row, r in zip(new, batch):
            row["rid"] = r["rid"]
        return new

    def _event_round(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The open events round driven to its end on every rank (the round runner's `drive`): the weights pushed,
        the engine awake; its rows (all trained) and its log (seconds waited on the rollout backend; on the main
        process also the order of events, for the round log, not broadcast)."""
        if self.use_vllm:
            sync_vllm_weights(self)
        with self._colocate_awake():
            return self._poll_event_round()

    @contextlib.contextmanager
    def _colocate_awake(self) -> Iterator[None]:
        """Colocate with sleep mode: the weights (level 2 discards them: pushed again unless this round's push just
        did) and the KV cache are woken for the round, and everything sleeps after it, as TRL's generation step
        does."""
        if not (self.colocate and self.args.vllm_enable_sleep_mode):
            yield
            return
        wake_colocate_engine(self)  # (every rank: the push is a collective under ZeRO-3)
        try:
            yield
        finally:
            sleep_colocate_engine(self)

    def _in_stream_pruning(self) -> dict[str, Any]:
        """With vLLM and a pruner: ARROL at the detection point, on the engine's scores (the driver's arguments)."""
        if not (self.use_vllm and self.pruner is not None):
            return {}

        def prune(snapshots: list[Any]) -> list[int]:
            return self.pruner.decide_snapshots(snapshots, self.allocator.current_round)
        return {"detect_at": self.pruner.detect_length, "on_detect": prune}

    def _close_rollouts(self, rollouts: Any) -> None:
        """Stop what still runs (with `colocate_ranks`: on every rank's engine)."""
        try:
            if self.colocate_ranks:
                self.on_main.call(lambda: rollouts.close())
            elif rollouts is not None:
                rollouts.close()
        finally:
            host = getattr(self.on_main.ranks, "host", self.on_main.ranks)
            if host is not None:  # rollouts this rank's engine ran, in all
                self.colocate_rank_rollouts = getattr(self, "colocate_rank_rollouts", 0) + host.started
            self.on_main.ranks = None

    def _poll_event_round(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        driver, prompt_ids_of = None, self._prompt_ids_of
        main = self.accelerator.is_main_process
        rollouts = self._rollout_backend() if main or self.colocate_ranks else None

        if main:
            driver = RoundDriver(self.allocator, rollouts, prompt_ids_of,
                                 self.args.max_completion_length, self.rollout_window,
                                 timeout=self.args.vllm_server_timeout if self.use_vllm else None,
                                 **self._in_stream_pruning())
        try:
            rows = self._poll_round(driver)
        finally:
            self._close_rollouts(rollouts)
            if driver is not None and driver.detect_at:
                self.pruner.add_time(scoring_s=driver.rollouts.scoring_s + driver.rollouts.hook_s)
        log = self.on_main.call(lambda: {"waited_s": driver.waited_s})
        if driver is not None:  # the main process: its events go to the round log only
            log = {**log, "events": driver.events}
        return rows, log


class StreamRoundMixin:
    """`_stream_runner`: the rounds of `rollout_mode="stream"` (module docstring); state on every rank."""

    _stream = None          # the StreamDriver (main process)
    _stream_state = None    # the allocator's state at the last close: what a checkpoint holds

    def _stream_driver(self) -> StreamDriver | None:
        main = self.accelerator.is_main_process
        if self._stream is None and self.on_main.ranks is None and (main or self.colocate_ranks):
            rollouts = self._rollout_backend()
            if main:
                self._stream = StreamDriver(rollouts, self._prompt_ids_of, self.args.max_completion_length,
                                            self.rollout_window,
                                            self.args.vllm_server_timeout if self.use_vllm else None,
                                            max_staleness=self.args.max_staleness, **self._in_stream_pruning(),
                                            on_observe=self.pruner and self.pruner.record)
        return self._stream

    def _stream_runner(self, rounds: int, record: Callable[[ClosedRound], Any]) -> Rounds:
        """This session's `rounds` stream rounds (`allocation.rounds.Rounds.stream`) over one `StreamDriver`: each
        round polled on every rank, closed, recorded by `record`; the weights pushed after each round that trained,
        and first if the run resumed (the engine then holds other weights than the checkpoint's)."""
        driver = self._stream_driver()
        self._stream_rows: dict[int, dict[str, Any]] = {}  # every rank: the scored rows of open groups, by rollout

        def poll() -> list[dict[str, Any]]:
            rows = self._poll_round(driver)
            self._stream_rows.update({row["rid"]: row for row in rows if not row.get("aborted")})
            return rows
        return Rounds.stream(self.allocator, driver, rounds, self.colocate, push=self._push_weights, drive=poll,
                             step=self.on_main.allocate, record=record, push_first=self.state.global_step > 0)

    def _push_weights(self, bump: Callable[[], None]) -> None:
        """After an optimizer step, every rank: the new weights to the engine (a server paused with `mode=keep`), then
        `bump()`: one policy version on, while still paused (`allocation.rounds.StreamRounds.after_train`)."""
        main = self.accelerator.is_main_process
        server = self.use_vllm and not self.colocate  # (a colocate engine only steps when polled: nothing to pause)
        with self.vllm_generation.vllm_client.paused() if server and main else contextlib.nullcontext():
            if self.use_vllm:
                sync_vllm_weights(self)
            if self.use_vllm and self.pruner is not None and main:  # the head trained at the close scores from now on
                self._stream.rollouts.load_head(self.pruner.head)
            # still paused: each rollout in flight has exactly the tokens the old weights generated (the push took
            # longer than the last of them took to arrive); its later tokens are the new version's
            bump()

    def _collect_stream_round(self, rnd: ClosedRound) -> CollectedRound:
        """A closed stream round on every rank: the rows that ended in it, the rows to train (with their staleness),
        the allocator's summary, the prompts admitted and the log."""
        driver, rows, summary, held_rows = self._stream, rnd.result, rnd.summary, self._stream_rows
        events = []

        def close() -> tuple[list[tuple[int, int]], list[int], dict[str, Any]]:
            # main process: what to train, what to hold (the round's own events stay here, not broadcast)
            events[:] = driver.take_events()
            return ([(row["rid"], row["staleness"]) for row in driver.trained],
                    sorted(row["rid"] for rs in driver.held.values() for row in rs),
                    {"waited_s": driver.waited_s, "carried": driver.carried,
                     "stale_aborted": driver.stale_aborted, "version": driver.version,
                     "in_flight": len(driver.live) + len(driver.replay),
                     "token_staleness": {int(k): v for k, v in sorted(driver.token_staleness.items())}})

        trained, held, log = self.on_main.call(close)
        if driver is not None:  # the main process: the events go to the round log only
            log = {**log, "events": events}
        trained_rows = [dict(held_rows[rid], staleness=s) for rid, s in trained]
        self._stream_rows = {rid: held_rows[rid] for rid in held}
        return CollectedRound(rows=rows, trained=trained_rows, summary=summary, admitted=rnd.admitted,
                              log=log, responses=summary["stats"]["responses"],
                              log_fields={"token_staleness": log["token_staleness"]})

    def _after_stream_round(self, summary: dict[str, Any], entry: dict[str, Any], log: dict[str, Any]) -> None:
        """The round's stream figures (`entry`) and the close's state for checkpoints; after the last round, the
        stream ends (what still runs is aborted)."""
        staleness = [r["staleness"] for r in self.round_state.loss_rows]
        entry.update(carried=log["carried"], stale_aborted=log["stale_aborted"], in_flight=log["in_flight"],
                     staleness_max=max(staleness, default=0),
                     staleness_mean=round(sum(staleness) / len(staleness), 6) if staleness else 0.0)
        tokens = sum(log["token_staleness"].values())
        entry["stale_token_share"] = round(1 - log["token_staleness"].get(0, 0) / tokens, 6) if tokens else 0.0
        self._stream_state = self.allocator.snapshot() if self.accelerator.is_main_process else None
        if not self.more_rounds:
            self._end_stream()

    def _end_stream(self) -> None:
        if self._stream is not None or self.on_main.ranks is not None:  # spent by the rounds that started them
            def end() -> None:
                self.stream_dropped = len(self._stream.finish())
            if self.colocate_ranks:
                self.on_main.call(end)
            elif self._stream is not None:
                end()
            self._close_rollouts(self._stream and self._stream.rollouts)
            self._stream = None
        self._stream_rows = {}

    def stream_note(self) -> dict[str, Any] | None:
        """What became of the stream's rollouts at a checkpoint (None outside stream mode)."""
        if self._stream is None:
            return None
        d = self._stream
        return {"in_flight": len(d.live) + len(d.replay), "open_groups": len(d.carry),
                "held_rows": sum(len(r) for r in d.held.values()),
                "fate": "spent (counted in the budget) and not trained if the run resumes from this checkpoint: "
                "rollouts in flight and open groups are not saved"}
