"""The CPU weight push of `AllocVLLMClient` (a mixin over TRL's `VLLMClient`): TRL's NCCL path on CUDA,
else a safetensors file (a directory both processes see) or an inline payload, loaded by the worker
extension through `/collective_rpc`; the checksum both sides compute proves the push arrived intact."""

from __future__ import annotations

import base64
import ipaddress
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

from .protocol import WEIGHTS_FILE, state_checksum


class WeightSyncMixin:
    """`init_communicator` / `update_named_params` / `update_weights` with a CPU path (module docstring)."""

    def _server_is_local(self) -> bool:
        host = self.host or ""
        if host in ("localhost", "0.0.0.0", ""):
            return True
        try:
            addr = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return False
        if addr.is_loopback:
            return True
        try:
            return str(addr) in {socket.gethostbyname(socket.gethostname())}
        except OSError:
            return False

    def _resolve_sync_mode(self, device: Any = "cpu") -> str:
        if self.weight_sync != "auto":
            return self.weight_sync
        import torch

        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if dev.type == "cuda":
            try:
                if self.get_server_info().get("weight_transfer_config") is not None:
                    return "nccl"
            except RuntimeError:
                pass
        return "file" if self._server_is_local() else "payload"

    def init_communicator(self, device: Any = 0):
        """NCCL (TRL's ``init_communicator``) when resolved to ``"nccl"``; else check the extension."""
        self.sync_mode = self._resolve_sync_mode(device)
        if self.sync_mode == "nccl":
            return super().init_communicator(device)
        self.check_extension()

    def _start_weight_update(self):
        if self._nccl():
            return super()._start_weight_update()
        self._pending = {}

    def _finish_weight_update(self):
        if self._nccl():
            return super()._finish_weight_update()
        pending, self._pending = self._pending, None
        if pending:
            self._push(pending)

    def _nccl(self) -> bool:
        return self.communicator is not None or self.sync_mode == "nccl"

    def update_named_params(self, metadata: list[tuple[str, str, list[int]]],
                            named_params: Iterator[tuple[str, Any]]):
        """TRL's NCCL stream, or (CPU paths) one safetensors push of all ``named_params``.

        Each tensor is copied to CPU as it arrives (a ZeRO-3/FSDP gathered parameter is released
        once the iterator moves on). Inside ``weight_update()`` tensors are buffered and pushed once
        on exit.
        """
        if self._nccl():
            return super().update_named_params(metadata, named_params)
        tensors = _collect(named_params)
        if self._pending is not None:
            self._pending.update(tensors)
        else:
            self._push(tensors)

    def _push(self, tensors: dict) -> dict:
        if self.sync_mode is None:
            self.sync_mode = self._resolve_sync_mode("cpu")
        if self.sync_mode == "nccl":
            raise RuntimeError("weight_sync='nccl' needs init_communicator(device='cuda:N') before pushing weights")
        self.check_extension()
        t0 = time.perf_counter()
        if self.sync_mode == "file":
            from safetensors.torch import save_file

            tmp = tempfile.mkdtemp(prefix="trl-alloc-weights-", dir=self.sync_dir)
            try:
                os.chmod(tmp, 0o755)
                save_file(tensors, os.path.join(tmp, WEIGHTS_FILE))
                t_ser = time.perf_counter()
                results = self.collective_rpc("load_weights_from_dir", [tmp])
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            from safetensors.torch import save

            payload = base64.b64encode(save(tensors)).decode("ascii")
            t_ser = time.perf_counter()
            results = self.collective_rpc("load_weights_from_payload", [payload])
        t1 = time.perf_counter()
        checksums = {r["checksum"] for r in results}
        if len(checksums) != 1:
            raise RuntimeError(f"workers of {self.base_url} disagree on the pushed weights: {results}")
        self.last_sync = {
            "mode": self.sync_mode, "num_tensors": len(tensors),
            "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "serialize_s": t_ser - t0, "rpc_s": t1 - t_ser, "total_s": t1 - t0,
            "server_reload_s": max(r["seconds"] for r in results),
            "checksum": checksums.pop(), "repacked": results[0].get("repacked"),
        }
        return self.last_sync

    def update_weights(self, model_or_tensors: Any, reset_prefix_cache: bool = True) -> dict | None:
        """Push a model's parameters (or a ``{name: tensor}`` / ``[(name, tensor)]``) to the server.

        Names must be the checkpoint's (``model.layers.0...``): use it for plain
        ``transformers`` models; the trainer's PEFT/ZeRO/FSDP naming goes through TRL's
        ``VLLMGeneration.sync_weights``, which calls :meth:`update_named_params`. Tied output
        heads need nothing: the worker extension re-packs them. Resets the prefix cache.
        Returns timing info (CPU paths) or None (NCCL).
        """
        items = _named_items(model_or_tensors)
        metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in items]
        self.update_named_params(metadata, iter(items))
        if reset_prefix_cache:
            self.reset_prefix_cache()
        return None if self._nccl() else self.last_sync


def _collect(named_params: Iterable[tuple[str, Any]]) -> dict:
    out = {}
    for name, t in named_params:
        t = t.detach()
        out[name] = (t.to("cpu") if t.device.type != "cpu" else t.clone()).contiguous()
    return out


def pushed_checksum(model_or_tensors: Any) -> str:
    """What :meth:`AllocVLLMClient.update_weights` would report as ``checksum`` for this input."""
    return state_checksum(_named_items(model_or_tensors))


def _named_items(model_or_tensors: Any) -> list:
    """(name, tensor) pairs of a model, a state dict or an iterable of pairs."""
    if hasattr(model_or_tensors, "named_parameters"):
        return [(n, p.data) for n, p in model_or_tensors.named_parameters()]
    if isinstance(model_or_tensors, dict):
        return list(model_or_tensors.items())
    return list(model_or_tensors)
