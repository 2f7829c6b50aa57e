"""Rollouts from a vLLM engine in this process (`vllm.v1.engine.async_llm.AsyncLLM`): the rollout backend of
`rollout.backends` without an HTTP server. Each rollout is one `AsyncLLM.generate` request (n = 1, tokens
streamed as deltas) run as an asyncio task on the backend's own event-loop thread; abort cancels the task,
which makes vLLM abort the request. The quality head scores in the engine through the same worker extension
as the server (`serving.worker_extension`, via `AsyncLLM.collective_rpc`).

    rollouts = VLLMInProcessRollouts.start(model_dir, temperature=1.0)     # builds and owns the engine
    rids = rollouts.submit(prompt_ids, n=4, max_tokens=64, tag=pid, detect_at=16)
    ...                                                                  # as any rollout backend
    rollouts.close()                                                     # stops what is in flight
    rollouts.shutdown()                                                  # the engine and its loop

vLLM's engine core runs in a child process started with `spawn`: a script that builds one needs the
`if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import TYPE_CHECKING, Any

from .backends import StreamedRollouts

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

    from .quality_head import QualityHead


class VLLMInProcessRollouts(StreamedRollouts):
    """Rollouts from an `AsyncLLM` (given, or built by `start`) whose event loop runs on `loop`'s thread;
    `extra`: more `SamplingParams` fields (e.g. `ignore_eos`)."""

    def __init__(self, llm: AsyncLLM, loop: asyncio.AbstractEventLoop, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int | None = None, request_timeout: float = 600.0,
                 quality_head: QualityHead | None = None, extra: dict | None = None) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.llm, self.loop = llm, loop
        self._params = dict(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k) if top_k else -1,
                            n=1, logprobs=0, output_kind=RequestOutputKind.DELTA, **(extra or {}))
        self._sampling, self.seed, self._tasks = SamplingParams, seed, {}
        super().__init__(request_timeout, quality_head)

    @classmethod
    def start(cls, model: str | os.PathLike, dtype: str | None = None, gpu_memory_utilization: float | None = None,
              max_model_len: int | None = None, enforce_eager: bool | None = None,
              **kwargs: Any) -> VLLMInProcessRollouts:
        """Build an `AsyncLLM` for `model` (a local folder) with trl-alloc's worker extension, on a new event-loop
        thread. Defaults as `trl-alloc-serve`'s on this device (CPU: float32, whole prefills, eager, 0.1 of the RAM;
        GPU: the checkpoint's dtype). Give `dtype` the trainer's compute dtype (`trainer.on_policy`) to sample from the
        policy it trains."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from ..serving.cpu_features import enable_amx
        from ..serving.protocol import EXTENSION_CLS
        from ..serving.server import cuda_available

        on_cpu = not cuda_available()
        enable_amx()  # (the engine core may run here; a process of its own asks again through the vLLM plugin)
        args = AsyncEngineArgs(
            model=str(model), dtype=dtype or ("float32" if on_cpu else "auto"), max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization or (0.1 if on_cpu else 0.9),
            enforce_eager=on_cpu if enforce_eager is None else enforce_eager, worker_extension_cls=EXTENSION_CLS,
            enable_chunked_prefill=False if on_cpu else None, logprobs_mode="processed_logprobs")
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="vllm-inprocess-rollouts", daemon=True).start()

        async def build():
            return AsyncLLM.from_engine_args(args)

        try:
            llm = asyncio.run_coroutine_threadsafe(build(), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            raise
        return cls(llm, loop, **kwargs)

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=self.request_timeout)

    def _rpc(self, method, *args):
        return self._call(self.llm.collective_rpc(method, args=args))[0]

    def _start(self, r, cancel):
        params = self._sampling(max_tokens=r.max_tokens, **self._params,
                                **({} if self.seed is None else {"seed": int(self.seed) + r.rid}))
        # "cmpl-<id>-0": the form the OpenAI server gives its requests, which the worker's scores are keyed by
        request_id = f"cmpl-{self.request_id(r.rid)}-0"

        def launch():
            self._tasks[r.rid] = self.loop.create_task(self._generate(r, cancel, params, request_id))
        self.loop.call_soon_threadsafe(launch)

    async def _generate(self, r, cancel, params, request_id):
        try:
            async for out in self.llm.generate({"prompt_token_ids": r.prompt_ids}, params, request_id=request_id):
                c = out.outputs[0]
                logprobs = [d[t].logprob if d and t in d else None for t, d in zip(c.token_ids, c.logprobs or [])]
                self._extend(r, list(c.token_ids), logprobs, c.finish_reason)
                if cancel.is_set():
                    raise asyncio.CancelledError
        except asyncio.CancelledError:  # aborted: AsyncLLM aborts the request in the engine
            r.finish_reason = "abort"
            self._finish(r)
        except Exception as exc:  # noqa: BLE001 -- delivered to the caller
            self._finish(r, exc)
        else:
            self._finish(r)
        finally:
            self._tasks.pop(r.rid, None)

    def _stop(self, rid):
        def cancel():
            task = self._tasks.get(rid)
            if task is not None:
                task.cancel()
        self.loop.call_soon_threadsafe(cancel)

    def shutdown(self) -> None:
        """Stop the engine this backend built and its event loop."""
        import gc

        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
            gc.collect()  # (AsyncLLM shuts down again when collected: now, not at interpreter exit)
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)


__all__ = ["VLLMInProcessRollouts"]
