"""``trl-alloc-serve``: run vLLM's OpenAI-compatible server the way trl-alloc's client expects.

    trl-alloc-serve --model MODEL_DIR [--port 8000] [--host 127.0.0.1] [-- extra vLLM args]

Adds ``--worker-extension-cls trl_alloc.serving.worker_extension.AllocWorkerExtension`` (CPU weight
pushes), ``VLLM_SERVER_DEV_MODE=1`` (``/collective_rpc``, ``/reset_prefix_cache``, weight-transfer
routes) and the device's defaults (CPU: float32, eager, 10% of RAM for the KV cache; CUDA: NCCL
weight transfer, 90% of GPU memory). Listens on 127.0.0.1 unless ``--host`` says otherwise: the
dev-mode routes let any caller run worker methods, so do not expose them beyond trusted hosts.
Unknown arguments are passed to vLLM as-is. Stops the whole server (all its processes) on
Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys

from .server import VLLMServerStartError, start_server


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trl-alloc-serve", description=__doc__.split("\n\n")[0],
        epilog="Arguments not listed here are passed to vLLM's server unchanged.")
    p.add_argument("--model", required=True, help="model directory (or Hub id)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default: %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="which defaults to use (auto: cuda if torch sees a GPU)")
    p.add_argument("--dtype", default=None, help="default: float32 on CPU, auto on CUDA")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="fraction of GPU memory (on CPU: of RAM, for the KV cache); default 0.9 CUDA, 0.1 CPU")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on for CPU, off for CUDA")
    p.add_argument("--weight-transfer", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM's NCCL weight-transfer engine (default: on for CUDA only)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for /health")
    p.add_argument("--log-file", default="-", help="server log file ('-': this terminal; default)")
    return p


def main(argv: list[str] | None = None) -> int:
    args, extra = make_parser().parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    try:
        server = start_server(
            args.model, port=args.port or None, host=args.host, extra_args=extra, timeout=args.startup_timeout,
            log_path=args.log_file, device=None if args.device == "auto" else args.device, dtype=args.dtype,
            gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
            tensor_parallel_size=args.tensor_parallel_size, enforce_eager=args.enforce_eager,
            weight_transfer=args.weight_transfer)
    except VLLMServerStartError as exc:
        print(f"trl-alloc-serve: {exc}", file=sys.stderr)
        return 1

    def _stop(signum, frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT):  # (SIGINT too: a shell starts `cmd &` with it ignored)
        signal.signal(sig, _stop)
    print(f"trl-alloc-serve: ready at {server.url} after {server.startup_seconds:.1f} s "
          f"(pid {server.pid}; Ctrl-C stops it)", flush=True)
    try:
        return server.proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
