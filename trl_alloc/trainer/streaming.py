"""The event-driven round (`rollout_mode="events"`): the main process runs the filler's event round over a
rollout engine (`rollout.streaming.RoundDriver`) and every rank scores each batch of ended rollouts.

    driver (main process only)                         every rank
    poll(): start what the filler asks, wait  ──►  the ended rollouts, broadcast
                                                   rows = scored across ranks (TRL's reward step)
    observe(rows): decide, abort the surplus  ◄──  the rows

The engine: vLLM server mode streams one request per rollout (`rollout.events.VLLMServerRollouts`, after
the usual weight push). ARROL prunes inside that stream: the quality head's weights go to the server with
the weights, the worker scores each rollout at `detect_length` tokens, and the main process decides a
cohort (one submission's rollouts) at a time; pruned rollouts are aborted in the engine, survivors go on in
the same request (`rollout.streaming`). Otherwise the rollouts pending at each poll are generated together by TRL's
generation step across the ranks (`BatchedRollouts` without a generate function), so ZeRO-3 works and a run
is reproducible. The order of events goes to the round log.
"""

from ..rollout.events import BatchedRollouts, VLLMServerRollouts
from ..rollout.streaming import RoundDriver
from .trl_compat import sync_vllm_weights, tokenize_prompts, vllm_server_url


def _plain(rollouts):
    return [{"rid": r.rid, "pid": int(r.tag), "prompt_ids": r.prompt_ids, "token_ids": r.token_ids,
             "logprobs": r.logprobs, "finish_reason": r.finish_reason} for r in rollouts]


class EventRoundMixin:
    """`_run_event_round`: one round in events mode (module docstring)."""

    def _check_event_mode(self):
        args = self.args
        if args.rollout_mode != "events":
            return
        if self.use_vllm and args.vllm_mode != "server":
            raise ValueError("rollout_mode='events' streams rollouts from a vLLM server; with vllm_mode="
                             f"{args.vllm_mode!r} use rollout_mode='deterministic' (or vllm_mode='server').")

    @property
    def rollout_window(self):
        """Most rollouts in flight at once: `rollout_max_inflight`, else the generation batch."""
        return self.args.rollout_max_inflight or self.args.generation_batch_size

    def _rollout_engine(self):
        args = self.args
        if not self.use_vllm:
            return BatchedRollouts()
        extra = {k: v for k, v in (("min_p", args.min_p), ("repetition_penalty", args.repetition_penalty)) if v}
        head = self.pruner.head if self.pruner is not None else None
        return VLLMServerRollouts(vllm_server_url(self), temperature=args.temperature, top_p=args.top_p,
                                  top_k=args.top_k or 0, max_inflight=self.rollout_window,
                                  request_timeout=args.vllm_server_timeout, extra=extra, quality_head=head)

    def _run_event_round(self):
        """The round's rows and its log (the order of events, seconds waited on the engine), on every rank."""
        if self.use_vllm:
            sync_vllm_weights(self)
        driver, cache = None, {}

        def prompt_ids_of(pid):
            if pid not in cache:
                cache[pid] = list(map(int, tokenize_prompts(self, [self.train_dataset[int(pid)]["prompt"]])[0]))
            return cache[pid]

        if self.accelerator.is_main_process:
            in_stream = self.use_vllm and self.pruner is not None

            def prune(snapshots):  # ARROL at the detection point, on the engine's scores
                return self.pruner.decide_snapshots(snapshots, self.engine.current_round)

            driver = RoundDriver(self.engine, self._rollout_engine(), prompt_ids_of,
                                 self.args.max_completion_length, self.rollout_window,
                                 timeout=self.args.vllm_server_timeout if self.use_vllm else None,
                                 detect_at=self.pruner.detect_length if in_stream else None,
                                 on_detect=prune if in_stream else None)
        rows = []
        try:
            while (batch := self._main_call(lambda: None if (b := driver.poll()) is None else _plain(b))) is not None:
                if batch[0]["finish_reason"] is None:  # not generated yet: one batched call across ranks
                    new = self._generate_and_score_request([r["pid"] for r in batch], [1] * len(batch))
                else:
                    new = self._score_rollouts(batch)
                rows.extend(new)
                self._allocator(lambda: driver.observe(new))
        finally:
            if driver is not None:
                driver.rollouts.close()
                if driver.detect_at:
                    self.pruner.add_time(scoring_s=driver.rollouts.scoring_s + driver.rollouts.hook_s)
        events = self._main_call(lambda: {"events": driver.events, "waited_s": driver.waited_s})
        return rows, events
