"""Rollouts from the vLLM engine TRL's colocate mode already holds (`trainer.vllm_generation.llm`, a `vllm.LLM`):
the rollout backend of `rollout.backends` on one GPU, with no second copy of the model. The engine is driven step by
step in the calling thread -- `llm_engine.add_request`, `step()`, `abort_request` -- so nothing runs while the
trainer trains, and rollouts still in flight when a round closes simply wait, with their KV cache, for the next
`step()` (on the weights loaded meanwhile: stream mode's carry-over).

    rollouts = VLLMColocateRollouts(trainer.vllm_generation.llm, temperature=1.0)
    rids = rollouts.submit(prompt_ids, n=4, max_tokens=64, tag=pid, detect_at=16)
    batch = rollouts.next_completed()          # steps the engine until at least one rollout ends
    rollouts.abort(rids)                       # aborted in the engine at once
    rollouts.close()                           # aborts what is in flight; the LLM stays TRL's

The quality head scores in the engine through trl-alloc's worker extension, added to the engine's worker class as
vLLM adds a `worker_extension_cls` (`extend_worker`), and called through `LLM.collective_rpc`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .backends import Rollout, StreamedRollouts

if TYPE_CHECKING:
    from vllm import LLM

    from .quality_head import QualityHead


def engine_worker(llm: LLM) -> Any:
    """The in-process worker of a colocate `LLM` (TRL builds it with `distributed_executor_backend=
    "external_launcher"`: one worker, in this process)."""
    executor = llm.llm_engine.model_executor
    worker = getattr(executor, "driver_worker", None)
    worker = getattr(worker, "worker", worker)
    if worker is None:
        raise RuntimeError("the colocate vLLM engine has no in-process worker (llm.llm_engine.model_executor."
                           "driver_worker); trl-alloc's colocate rollouts need TRL's colocate mode "
                           "(distributed_executor_backend='external_launcher').")
    return worker


def extend_worker(llm: LLM) -> LLM:
    """Give the colocate engine's worker trl-alloc's worker extension (`serving.worker_extension`): its class gains
    the extension as a base, which is what vLLM does for `--worker-extension-cls` when it builds a worker."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from ..serving.protocol import EXTENSION_CLS

    extension = resolve_obj_by_qualname(EXTENSION_CLS)
    cls = type(engine_worker(llm))
    if extension not in cls.__mro__:
        cls.__bases__ = cls.__bases__ + (extension,)
    return llm


class VLLMColocateRollouts(StreamedRollouts):
    """Rollouts of a colocate `LLM` (module docstring); `extra`: more `SamplingParams` fields."""

    def __init__(self, llm: LLM, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 extra: dict | None = None, quality_head: QualityHead | None = None) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.llm, self.seed, self._sampling = llm, seed, SamplingParams
        self._params = dict(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k) if top_k else -1,
                            n=1, logprobs=0, output_kind=RequestOutputKind.DELTA, **(extra or {}))
        self._by_request, self.steps = {}, 0  # engine request id -> rollout; engine steps taken
        if quality_head is not None:
            extend_worker(llm)
        super().__init__(request_timeout=None, quality_head=quality_head)

    def _rpc(self, method, *args):
        return self.llm.collective_rpc(method, args=args)[0]

    def _start(self, r, cancel):
        params = self._sampling(max_tokens=r.max_tokens, **self._params,
                                **({} if self.seed is None else {"seed": int(self.seed) + r.rid}))
        request_id = self._engine_id(r.rid)
        self._by_request[request_id] = r
        self.llm.llm_engine.add_request(request_id, {"prompt_token_ids": r.prompt_ids}, params)

    def step(self) -> None:
        """One engine step; its new tokens go to their rollouts (ended ones are delivered)."""
        self.steps += 1
        for out in self.llm.llm_engine.step():
            r = self._by_request.get(out.request_id)
            if r is None:  # not ours (nothing else should run on the engine meanwhile)
                continue
            c = out.outputs[0]
            logprobs = [d[t].logprob if d and t in d else None for t, d in zip(c.token_ids, c.logprobs or [])]
            self._extend(r, list(c.token_ids), logprobs, c.finish_reason)
            if out.finished:
                self._by_request.pop(out.request_id, None)
                self._finish(r)

    def next_completed(self, timeout: float | None = None) -> list[Rollout]:
        """Steps the engine until a rollout ends (or reaches its detection point); `timeout` is not needed: the
        engine runs in this thread."""
        while self._done.empty() and self.in_flight:
            self.step()
        return super().next_completed(timeout=None)

    def advance(self, steps: int) -> list[Rollout]:
        """At most `steps` engine steps, stopping once a rollout has ended; returns the ended ones (maybe none)."""
        for _ in range(int(steps)):
            if not self.in_flight or not self._done.empty():
                break
            self.step()
        out = []
        while not self._done.empty():
            out.append(self._done.get_nowait())
        return out

    def _engine_id(self, rid):
        return f"cmpl-{self.request_id(rid)}-0"  # the form the worker's scores are keyed by (as the server's)

    def _stop(self, rid):
        request_id = self._engine_id(rid)
        r = self._by_request.pop(request_id, None)
        if r is None:
            return
        self.llm.llm_engine.abort_request([request_id])
        r.finish_reason = "abort"
        self._finish(r)


# ---------------------------------------------------------------------- several ranks, one vLLM engine each
STOP = "stop"


class LocalRankRollouts:
    """One rank's part of the multi-process colocate rollout backend (`RankedRollouts` is the main process's side),
    on every rank: it owns this rank's colocate engine (through `VLLMColocateRollouts`), its rollouts known by the
    ids the main process gave them. `apply(cmd)` runs one exchange's part on this rank: start the rollouts
    assigned to it, abort the named ones, step the engine (at most `steps` times, stopping once one of its
    rollouts has ended), count the tokens of the ones in flight, close; returns ("ok", ended rollouts, {rid:
    tokens so far} when counted) or ("error", message, {})."""

    def __init__(self, local: VLLMColocateRollouts, rank: int, steps: int = 4) -> None:
        self.local, self.rank, self.steps, self.ids = local, int(rank), int(steps), {}  # local rid -> global rid
        self.started = 0  # rollouts started on this rank's engine

    def apply(self, cmd: dict) -> tuple[str, list[Rollout] | str]:
        try:
            out = []
            for rids, prompt_ids, max_tokens, tag in cmd.get("submit", {}).get(self.rank, ()):
                self.ids.update(zip(self.local.submit(prompt_ids, n=len(rids), max_tokens=max_tokens, tag=tag), rids))
                self.started += len(rids)
            doomed = set(cmd.get("abort", {}).get(self.rank, ()))
            if doomed:
                out += self.local.abort([lid for lid, rid in self.ids.items() if rid in doomed])
            out += self.local.advance(self.steps if cmd.get("step") else 0)
            counts = {}
            if cmd.get("count"):
                counts = {self.ids[lid]: n for lid, n in self.local.generated_tokens().items() if lid in self.ids}
            if cmd.get("close"):
                self.local.close()
            for r in out:
                r.rid = self.ids.pop(r.rid)
            return "ok", out, counts
        except Exception as exc:  # noqa: BLE001 -- reported to the main process, which raises it on every rank
            return "error", f"rank {self.rank}: {type(exc).__name__}: {exc}", {}

    def follow(self, broadcast: Callable[[Any], Any], all_gather: Callable[[Any], list]) -> None:
        """A rank other than the main process: apply each command the main process broadcasts until it says stop."""
        while (cmd := broadcast(None)) != STOP:
            all_gather(self.apply(cmd))


class RankedRollouts:
    """The main process's rollout backend over every rank's colocate engine (multi-process colocate mode): each
    submission (one prompt's cohort) goes to the rank with the fewest rollouts in flight, ended rollouts are
    gathered from every rank at each exchange, and decisions stay here. `broadcast(obj)` and `all_gather(obj)`
    are the process group's collectives; every other rank runs `LocalRankRollouts.follow` while the main process may
    exchange, and `release()` ends that."""

    def __init__(self, host: LocalRankRollouts, world_size: int, broadcast: Callable[[Any], Any],
                 all_gather: Callable[[Any], list]) -> None:
        self.host, self.world = host, int(world_size)
        self._broadcast, self._all_gather = broadcast, all_gather
        self._next_id, self._rank_of, self._pending = 0, {}, {}  # global rid -> rank; rank -> submissions
        self._ended, self._counts = [], {}  # what an exchange for counts brought back: ended rollouts (handed
        # back by the next `next_completed`), {rid: tokens so far}
        self.scored = 0
        self.scoring_s = self.hook_s = 0.0

    @property
    def in_flight(self) -> int:
        return len(self._rank_of)

    def submit(self, prompt_ids: Sequence[int], n: int = 1, max_tokens: int = 16, tag: Any = None) -> list[int]:
        load = [0] * self.world
        for rank in self._rank_of.values():
            load[rank] += 1
        rank = min(range(self.world), key=lambda i: (load[i], i))
        rids = list(range(self._next_id, self._next_id + int(n)))
        self._next_id += int(n)
        self._rank_of.update(dict.fromkeys(rids, rank))
        self._pending.setdefault(rank, []).append((rids, list(map(int, prompt_ids)), int(max_tokens), tag))
        return rids

    def _exchange(self, **cmd):
        cmd["submit"], self._pending = self._pending, {}
        self._broadcast(cmd)
        results = self._all_gather(self.host.apply(cmd))
        errors = [value for status, value, _ in results if status == "error"]
        if errors:
            raise RuntimeError(f"a colocate rank's rollout backend failed: {errors[0]}")
        out = [r for _, ended, _ in results for r in ended]
        for r in out:
            self._rank_of.pop(r.rid, None)
        self._counts = {rid: n for _, _, counts in results for rid, n in counts.items()}
        return out

    def generated_tokens(self) -> dict[int, int]:
        """{rollout id: tokens so far} of the rollouts in flight, from every rank (the engines step only in
        exchanges, so the counts stay exact until the next one)."""
        self._ended += self._exchange(count=True)
        return self._counts

    def next_completed(self, timeout: float | None = None) -> list[Rollout]:
        """Exchanges (each rank steps its engine) until a rollout has ended on some rank."""
        if self._ended:
            out, self._ended = self._ended, []
            return out
        while self.in_flight:
            out = self._exchange(step=True)
            if out:
                return out
        return []

    def abort(self, rids: Iterable[int]) -> list[Rollout]:
        by_rank = {}
        for rid in rids:
            if rid in self._rank_of:
                by_rank.setdefault(self._rank_of[rid], []).append(rid)
        return self._exchange(abort=by_rank) if by_rank or self._pending else []

    def close(self) -> None:
        self._exchange(close=True)
        self._rank_of.clear()
        self._ended = []

    def release(self) -> None:
        """The main process is done exchanging for now: the other ranks stop following."""
        self._broadcast(STOP)


__all__ = ["VLLMColocateRollouts", "LocalRankRollouts", "RankedRollouts", "engine_worker", "extend_worker"]
