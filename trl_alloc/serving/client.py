"""``AllocVLLMClient``: TRL 1.16's ``VLLMClient`` plus a CPU weight push, bounded timeouts and seeds.

TRL 1.16's ``VLLMClient`` already talks to vLLM's own OpenAI-compatible server (``/health``,
``/v1/models``, ``/v1/completions`` with ``return_token_ids``, ``/reset_prefix_cache``, the
weight-transfer routes), so it is subclassed, not replaced: ``GRPOTrainer``'s
``VLLMGeneration`` can use this class unchanged (``trl_alloc.trainer.trl_compat.patch_trl_vllm_client``).
What changes:

- **weights**: TRL's push (``init_communicator`` / ``update_named_params``) is vLLM's NCCL
  weight-transfer engine, i.e. CUDA only. When the trainer is on CPU (or the server has no
  weight-transfer engine) the client instead sends a safetensors file -- through a directory both
  processes see (``weight_sync="file"``, the default for a local server) or inline in the request
  (``"payload"``) -- to ``trl_alloc.serving.worker_extension.AllocWorkerExtension`` via ``/collective_rpc``.
  On CUDA with an NCCL-enabled server (``trl-alloc-serve`` enables it there) TRL's path is used.
- **timeouts**: no urllib3 retry/backoff (TRL's adapter retries 5 times with 2-32 s backoff, i.e.
  about a minute before a dead server is reported); a connection failure is retried until
  ``connection_timeout`` and then raises :class:`VLLMServerUnreachableError` naming the URL and
  how to start a server. ``request_timeout`` bounds how long an answer may take.
- **generate**: same signature and return value as TRL's (plus ``finish_reasons``); with a seed,
  each prompt gets its own seed (vLLM applies a request's seed to every prompt of the batch, so
  identical seeds would correlate the samples of different prompts); greedy with ``n > 1`` works
  (vLLM refuses it: sent with ``n=1`` and replicated). :meth:`generate_groups` returns per-prompt
  groups.
"""

from __future__ import annotations

import builtins
import contextlib
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import requests
from requests.adapters import HTTPAdapter

with warnings.catch_warnings():
    # TRL 1.16 warns that it was tested with vLLM <= 0.31; 0.32's routes are the ones it uses
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")
    from trl.generation.vllm_client import VLLMClient

from .protocol import EXTENSION_CLS, MODEL_SIGNATURE_FIELDS, model_signature
from .weight_sync import WeightSyncMixin, pushed_checksum  # noqa: F401 (pushed_checksum: public here)

__all__ = ["AllocVLLMClient", "CompletionGroup", "VLLMServerUnreachableError", "VLLMRequestError",
           "pushed_checksum"]

_START_HINT = ("Start one with `trl-alloc-serve --model MODEL_DIR --port PORT` (or "
               "`trl_alloc.serving.start_server(MODEL_DIR)`) and point the client at its URL.")


class VLLMServerUnreachableError(requests.exceptions.ConnectionError, builtins.ConnectionError):
    """No connection to the vLLM server within ``connection_timeout`` (wrong URL, server down)."""


class VLLMRequestError(RuntimeError):
    """The server answered with an error status (message: ``Request failed: <code>, <body>``)."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class CompletionGroup(NamedTuple):
    """The ``n`` completions of one prompt."""

    prompt_ids: list[int]
    completion_ids: list[list[int]]
    finish_reasons: list[str]  # "stop" (EOS / stop token) or "length" (max_tokens), per completion
    logprobs: list | None  # per completion: (len, k) logprobs, when requested


class AllocVLLMClient(WeightSyncMixin, VLLMClient):
    """TRL's ``VLLMClient`` for trl-alloc's server (see the module docstring for the differences).

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000"``; else ``host`` and ``server_port``.
        connection_timeout: seconds to keep retrying a connection before raising
            :class:`VLLMServerUnreachableError` (at construction and on every request).
        request_timeout: seconds an established request may take (generation, weight push);
            None waits forever.
        weight_sync: ``"auto"`` (NCCL when the trainer device is CUDA and the server has a
            weight-transfer engine; else ``"file"`` for a server on this machine, ``"payload"``
            otherwise), ``"nccl"``, ``"file"`` or ``"payload"``.
        sync_dir: where ``"file"`` writes its temporary safetensors (default: the temp dir;
            ``/dev/shm`` avoids the disk). Must be readable by the server.
    """

    def __init__(self, base_url: str | None = None, host: str = "127.0.0.1", server_port: int = 8000,
                 group_port: int = 51216, connection_timeout: float = 30.0,
                 request_timeout: float | None = 3600.0, weight_sync: str = "auto",
                 sync_dir: str | None = None):
        if weight_sync not in ("auto", "nccl", "file", "payload"):
            raise ValueError(f"weight_sync must be auto, nccl, file or payload, got {weight_sync!r}")
        self.connection_timeout = float(connection_timeout or 0.0)
        self.request_timeout = request_timeout
        self.weight_sync = weight_sync
        self.sync_dir = sync_dir
        self.sync_mode: str | None = None  # resolved on first use
        self.last_sync: dict | None = None
        self._pending: dict | None = None  # tensors buffered inside `weight_update()` (CPU paths)
        self._extension_checked = False
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")
            super().__init__(base_url=base_url, host=host, server_port=server_port,
                             group_port=group_port, connection_timeout=self.connection_timeout)

    # ------------------------------------------------------------------ HTTP with bounded timeouts
    def _unreachable(self, url: str, waited: float, exc: BaseException) -> VLLMServerUnreachableError:
        return VLLMServerUnreachableError(
            f"The vLLM server at {self.base_url} can't be reached ({url} failed for {waited:.1f} s, "
            f"connection_timeout={self.connection_timeout:g} s: {type(exc).__name__}). Is it running, and "
            f"is the URL right? {_START_HINT} Raise connection_timeout if it is still starting.")

    def _request(self, method: str, url: str, *, connect_deadline: float | None = None,
                 **kwargs) -> requests.Response:
        if not getattr(self, "_own_adapter", False):
            # drop TRL's urllib3 retries (5 tries, 2-32 s backoff, ~1 min before a dead server is
            # reported): connections are retried here, within connection_timeout
            adapter = HTTPAdapter(max_retries=0, pool_connections=4, pool_maxsize=64)
            self.session.mount("http://", adapter)
            self.session.mount("https://", adapter)
            self._own_adapter = True
        start = time.monotonic()
        deadline = start + self.connection_timeout if connect_deadline is None else connect_deadline
        while True:
            remaining = deadline - time.monotonic()
            connect_timeout = min(max(remaining, 0.5), 5.0)
            try:
                return self.session.request(method, url, timeout=(connect_timeout, self.request_timeout), **kwargs)
            except requests.exceptions.ConnectionError as exc:  # refused, reset, DNS, connect timeout
                if time.monotonic() >= deadline:
                    raise self._unreachable(url, time.monotonic() - start, exc) from exc
                time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))
            except requests.exceptions.Timeout as exc:  # read timeout: the server took too long
                raise TimeoutError(
                    f"The vLLM server at {self.base_url} did not answer {url} within request_timeout="
                    f"{self.request_timeout} s. Raise request_timeout for long generations or weight pushes.") from exc

    @staticmethod
    def _json(response: requests.Response) -> Any:
        if response.status_code != 200:
            raise VLLMRequestError(f"Request failed: {response.status_code}, {response.text[:4000]}",
                                   response.status_code)
        return response.json() if response.content else {}

    def _get(self, url: str, **kwargs) -> dict:
        return self._json(self._request("GET", url, **kwargs))

    def _post(self, url: str, **kwargs) -> dict:
        return self._json(self._request("POST", url, **kwargs))

    def check_server(self, total_timeout: float = 0.0, retry_interval: float = 0.5):
        """Wait up to ``total_timeout`` s for ``GET /health`` to answer 200, else raise."""
        start = time.monotonic()
        deadline = start + float(total_timeout or 0.0)
        url = f"{self.base_url}/health"
        while True:
            response = self._request("GET", url, connect_deadline=deadline)
            if response.status_code == 200:
                if "X-Forwarded-For" in response.headers:
                    self.host = response.headers["X-Forwarded-For"]
                return
            if time.monotonic() >= deadline:
                raise VLLMServerUnreachableError(
                    f"The vLLM server at {self.base_url} answered /health with {response.status_code} for "
                    f"{time.monotonic() - start:.1f} s (connection_timeout={total_timeout:g} s). {_START_HINT}")
            time.sleep(retry_interval)

    def get_server_info(self) -> dict:
        response = self._request("GET", f"{self.base_url}/server_info", params={"config_format": "json"})
        if response.status_code == 404:
            raise RuntimeError(
                f"The vLLM server at {self.base_url} does not expose its development endpoints. Restart it "
                "with `VLLM_SERVER_DEV_MODE=1` in its environment (trl-alloc-serve sets it).")
        return self._json(response)["vllm_config"]

    def close(self) -> None:
        self.close_communicator()
        self.session.close()

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: list[str] | list[list[int]], features: list[dict | None] | None = None,
                 n: int = 1, repetition_penalty: float = 1.0, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: float = 0.0, max_tokens: int = 16, logprobs: int | None = 0,
                 structured_outputs_regex: str | None = None, generation_kwargs: dict | None = None,
                 *, seed: int | None = None, stop_token_ids: list[int] | None = None,
                 max_concurrent_requests: int = 64) -> dict[str, list]:
        """TRL's ``VLLMClient.generate`` (same arguments and keys) plus ``finish_reasons``.

        ``completion_ids`` etc. are flat and prompt-major (the ``n`` completions of prompt 0, then
        of prompt 1, ...). ``seed`` (or ``generation_kwargs["seed"]``) makes the call reproducible:
        prompt ``i`` is sent as its own request with seed ``seed + i * n`` (vLLM then uses
        ``+ j`` for its ``j``-th sample), so no two samples share a seed. ``temperature=0`` is
        greedy; with ``n > 1`` the greedy completion is replicated.
        """
        if features is not None:  # multimodal: TRL's per-prompt /inference/v1/generate path
            return super().generate(prompts, features, n, repetition_penalty, temperature, top_p, top_k, min_p,
                                    max_tokens, logprobs, structured_outputs_regex, generation_kwargs)
        params: dict[str, Any] = {
            "repetition_penalty": repetition_penalty, "temperature": temperature, "top_p": top_p,
            "top_k": top_k, "min_p": min_p, "max_tokens": max_tokens, "logprobs": logprobs,
        }
        if structured_outputs_regex is not None:
            params["structured_outputs"] = {"regex": structured_outputs_regex}
        if stop_token_ids:
            params["stop_token_ids"] = list(stop_token_ids)
        params.update(generation_kwargs or {})
        n = int(params.pop("n", n))
        kw_seed = params.pop("seed", None)
        seed = kw_seed if seed is None else seed
        greedy = params["temperature"] is not None and params["temperature"] <= 0
        n_req = 1 if greedy else n  # vLLM: "n must be 1 when using greedy sampling"
        base = {"model": self.model, "return_token_ids": True, "return_tokens_as_token_ids": True,
                **params, "n": n_req}
        prompts = list(prompts)
        if not prompts:
            return {"prompt_ids": [], "completion_ids": [], "logprobs": None, "logprob_token_ids": None,
                    "finish_reasons": []}
        if seed is None:
            batches = [(prompts, {})]
        else:
            batches = [([p], {"seed": int(seed) + i * n_req}) for i, p in enumerate(prompts)]

        def send(batch):
            batch_prompts, extra = batch
            out = self._post(f"{self.base_url}/v1/completions", json={**base, **extra, "prompt": batch_prompts})
            return sorted(out["choices"], key=lambda c: c["index"])

        if len(batches) == 1:
            choices = send(batches[0])
        else:
            with ThreadPoolExecutor(max_workers=min(max_concurrent_requests, len(batches))) as pool:
                choices = [c for cs in pool.map(send, batches) for c in cs]
        if len(choices) != len(prompts) * n_req:
            raise VLLMRequestError(f"expected {len(prompts) * n_req} choices from {self.base_url}, got {len(choices)}")
        if n_req != n:
            choices = [c for c in choices for _ in range(n)]
        from trl.generation.vllm_client import parse_logprobs

        lp, lp_ids = parse_logprobs([c.get("logprobs") for c in choices])
        return {
            "prompt_ids": [c["prompt_token_ids"] for c in choices[::n]],
            "completion_ids": [c["token_ids"] for c in choices],
            "logprobs": lp,
            "logprob_token_ids": lp_ids,
            "finish_reasons": [c.get("finish_reason") for c in choices],
        }

    def generate_groups(self, prompt_token_ids: list[list[int]], n: int = 1, max_tokens: int = 16,
                        temperature: float = 1.0, seed: int | None = None, top_p: float = 1.0, top_k: int = 0,
                        logprobs: int | None = None, stop_token_ids: list[int] | None = None,
                        **generation_kwargs) -> list[CompletionGroup]:
        """``n`` completions for each prompt, grouped per prompt, with finish reasons.

        ``stop_token_ids`` adds stop tokens to the model's EOS; ``generation_kwargs`` go to the
        request as-is (e.g. ``min_tokens``, ``repetition_penalty``). See :meth:`generate` for seeds.
        """
        out = self.generate([list(map(int, p)) for p in prompt_token_ids], n=n, max_tokens=max_tokens,
                            temperature=temperature, top_p=top_p, top_k=top_k, logprobs=logprobs,
                            generation_kwargs=generation_kwargs or None, seed=seed, stop_token_ids=stop_token_ids)
        groups = []
        for i, prompt_ids in enumerate(out["prompt_ids"]):
            sl = slice(i * n, (i + 1) * n)
            groups.append(CompletionGroup(prompt_ids, out["completion_ids"][sl], out["finish_reasons"][sl],
                                          out["logprobs"][sl] if out["logprobs"] is not None else None))
        return groups

    # ------------------------------------------------------------------ pausing the engine (stream mode)
    @contextlib.contextmanager
    def paused(self, mode: str = "keep"):
        """vLLM's own ``POST /pause?mode=keep`` around a weight push: in-flight requests are frozen with their KV
        cache and go on, on the new weights, after ``POST /resume`` (nothing is regenerated)."""
        self._post(f"{self.base_url}/pause", params={"mode": mode})
        try:
            yield
        finally:
            self._post(f"{self.base_url}/resume")

    # ------------------------------------------------------------------ worker extension RPC
    def collective_rpc(self, method: str, args: Iterable = (), kwargs: dict | None = None,
                       timeout: float | None = None) -> list:
        """Call ``method`` on every vLLM worker via ``POST /collective_rpc``; one result per worker."""
        body: dict[str, Any] = {"method": method, "args": list(args), "kwargs": dict(kwargs or {})}
        if timeout is not None:
            body["timeout"] = timeout
        response = self._request("POST", f"{self.base_url}/collective_rpc", json=body)
        if response.status_code == 404:
            raise RuntimeError(
                f"The vLLM server at {self.base_url} has no /collective_rpc route: restart it with "
                "`VLLM_SERVER_DEV_MODE=1` in its environment (trl-alloc-serve sets it).")
        if response.status_code != 200:
            raise VLLMRequestError(
                f"Request failed: {response.status_code}, {response.text[:2000]} (collective_rpc {method!r} on "
                f"{self.base_url}; trl-alloc's methods need `--worker-extension-cls {EXTENSION_CLS}`, which "
                "trl-alloc-serve passes; see the server log for the worker's traceback)", response.status_code)
        return response.json().get("results", []) if response.content else []

    def check_extension(self) -> None:
        """Raise a clear error if the server was started without trl-alloc's worker extension."""
        if self._extension_checked:
            return
        try:
            self.collective_rpc("weights_checksum")
        except VLLMRequestError as exc:
            raise RuntimeError(
                f"The vLLM server at {self.base_url} cannot take CPU weight pushes: it was not started with "
                f"`--worker-extension-cls {EXTENSION_CLS}` (trl-alloc-serve passes it). Underlying error: {exc}"
            ) from exc
        self._extension_checked = True

    def check_serves(self, config) -> None:
        """Raise a clear error unless the server serves a model of `config`'s architecture (the trainer's)."""
        self.check_extension()
        served, mine = self.collective_rpc("model_signature")[0], model_signature(config)
        diff = [k for k in MODEL_SIGNATURE_FIELDS if served.get(k) != mine.get(k)]
        if diff:
            def show(sig):
                return ", ".join(f"{k}={sig.get(k)}" for k in diff)
            raise ValueError(f"The vLLM server at {self.base_url} serves another model than the trainer trains: the "
                             f"server's has {show(served)}, the trainer's {show(mine)}. Start the server with the "
                             "trainer's model (trl-alloc-serve --model "
                             f"{getattr(config, '_name_or_path', '') or 'DIR'}).")

    def served_dtype(self) -> str:
        """The dtype the served engine computes in (`float32`, `bfloat16`, ...)."""
        self.check_extension()
        return self.collective_rpc("served_dtype")[0]

    def weights_checksum(self) -> dict:
        """The worker extension's report: ``last_push_checksum``, ``num_pushes``, ``head_follows_embedding``."""
        return self.collective_rpc("weights_checksum")[0]
