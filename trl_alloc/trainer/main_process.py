"""The trainer's distributed contract in one object: allocator code runs on the main process only, and its result
(or its error) is handed to every rank, so all ranks act on identical decisions (trainer/grpo.py's docstring).

    main = MainProcess(accelerator)
    admitted = main.allocate(allocator.start_round, True)   # timed: the round's allocator seconds
    batch = main.call(driver.poll)                           # not timed (it waits on the rollout backend)

Colocate on several processes, the other ranks step their engines meanwhile as the main process asks
(`ranks`: `rollout.colocate.RankedRollouts` on the main process, this rank's `LocalRankRollouts` elsewhere).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import broadcast_object_list


class MainProcess:
    """Every allocator call of a run: made on the main process, its result broadcast to every rank."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.ranks: Any = None  # colocate on several processes: the ranked rollout backend, or this rank's part
        self.allocator_s = 0.0  # seconds in `allocate` calls since `take_seconds` (main process)

    @property
    def is_main(self) -> bool:
        return bool(self.accelerator.is_main_process)

    def broadcast(self, obj: Any) -> Any:
        """The main process's `obj` on every rank."""
        if self.accelerator.num_processes == 1:
            return obj
        box = [obj]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        out = [None] * self.accelerator.num_processes
        torch.distributed.all_gather_object(out, obj)
        return out

    def call(self, fn: Callable[[], Any]) -> Any:
        """`fn()` on the main process; its result, or its error, on every rank."""
        out, error = None, None
        if self.is_main:
            try:
                out = ("ok", fn())
            except Exception as exc:  # raised on every rank below, so no rank hangs in a collective
                out, error = ("error", f"{type(exc).__name__}: {exc}"), exc
            finally:
                if self.ranks is not None:
                    self.ranks.release()
        elif self.ranks is not None:
            self.ranks.follow(self.broadcast, self.all_gather)
        status, value = self.broadcast(out)
        if status == "error":
            if error is not None:
                raise error
            raise RuntimeError(f"the allocator failed on the main process: {value}")
        return value

    def allocate(self, method: Callable[..., Any], *args: Any) -> Any:
        """`call(method(*args))`, its seconds added to the round's allocator seconds (`alloc/time_s`)."""
        def timed() -> Any:
            t0 = time.perf_counter()
            try:
                return method(*args)
            finally:
                self.allocator_s += time.perf_counter() - t0
        return self.call(timed)

    def take_seconds(self) -> float:
        """The allocator seconds since the last call (a round's), and the count starts again."""
        seconds, self.allocator_s = self.allocator_s, 0.0
        return seconds


__all__ = ["MainProcess"]
