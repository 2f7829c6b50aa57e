"""vLLM worker extension: CPU-friendly weight pushes for a trl-alloc vLLM server.

Load it into the server with ``--worker-extension-cls trl_alloc.serving.worker_extension.AllocWorkerExtension``
(``trl-alloc-serve`` does) and call its methods through vLLM's ``POST /collective_rpc`` (the server
needs ``VLLM_SERVER_DEV_MODE=1``)::

    {"method": "load_weights_from_dir", "args": ["/tmp/weights"]}
    {"method": "load_weights_from_payload", "args": ["<base64 of safetensors bytes>"]}
    {"method": "weights_checksum"}

Why this exists: vLLM's own weight push (``/init_weight_transfer_engine`` + ``/update_weights``,
what TRL's ``VLLMClient`` uses) needs NCCL, hence CUDA. On CPU the trainer saves its weights as
safetensors (to a directory both processes see, or inline in the request) and the worker reloads
them in place with vLLM's ``reload_weights`` (layerwise: every layer is re-processed, so vLLM-CPU's
packed/oneDNN GEMM weights are rebuilt).

Tied embeddings: with ``tie_word_embeddings`` vLLM makes ``lm_head.weight`` *the same Parameter* as
``embed_tokens.weight`` and skips the ``lm_head.weight`` name on load. On CPU the head does not
multiply with that Parameter, though: it multiplies with a copy packed at load time
(``lm_head.cpu_linear``). A reload writes the new embedding but, as no weight is addressed to the
head, never re-packs it: generation would keep using the *old* output head. After every reload this
extension re-runs the (unquantized) weight processing of every module whose weight is shared with
another module, which re-packs the head. On CUDA that processing is a no-op.

Keep this module importable without vLLM (it shares `protocol.py` with the client): nothing is
imported from vLLM at module level, and the class holds methods only (vLLM mixes it into its worker
class and refuses attributes that clash with the worker's).
"""

from __future__ import annotations

import base64
import os

from .protocol import model_signature, state_checksum

__all__ = ["AllocWorkerExtension"]

class AllocWorkerExtension:
    """Methods mixed into the vLLM worker (``self`` is the worker: ``self.model_runner`` etc.)."""

    # ------------------------------------------------------------------ weight pushes
    def load_weights_from_dir(self, path: str) -> dict:
        """Reload every weight in place from the ``*.safetensors`` files of directory ``path``.

        Send whole layers (all of q/k/v, all of gate/up, ...): vLLM fuses them, and a fused layer
        that gets only part of its weights in one call is not reloaded correctly. Returns
        ``{"checksum", "num_tensors", "repacked", "seconds"}``.
        """
        from safetensors.torch import load_file

        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors file in {path!r}")
        weights = {}
        for f in files:
            weights.update(load_file(os.path.join(path, f), device="cpu"))
        return self._alloc_reload(weights)

    def load_weights_from_payload(self, payload: str) -> dict:
        """Reload every weight in place from base64-encoded ``safetensors.torch.save`` bytes."""
        from safetensors.torch import load

        return self._alloc_reload(load(base64.b64decode(payload)))

    def model_signature(self) -> dict:
        """The served model's architecture fields (`serving.protocol.MODEL_SIGNATURE_FIELDS`)."""
        return model_signature(self.model_runner.model_config.hf_config)

    def weights_checksum(self) -> dict:
        """``state_checksum`` of the last push (or None) and a probe of the tied output head."""
        import torch

        model = self.model_runner.get_model()
        info = {
            "last_push_checksum": getattr(self, "_alloc_last_checksum", None),
            "num_pushes": getattr(self, "_alloc_num_pushes", 0),
            "head_follows_embedding": None,
        }
        embed = _find_attr(model, "embed_tokens")
        head = getattr(model, "lm_head", None)
        cpu_linear = getattr(head, "cpu_linear", None)
        if embed is not None and head is not None and getattr(head, "weight", None) is not None:
            w = embed.weight.detach()
            probe = torch.randn(3, w.shape[1], dtype=w.dtype, generator=torch.Generator().manual_seed(0))
            # the logits the head computes for `probe` vs probe @ embedding^T
            with torch.no_grad():
                if cpu_linear is not None:
                    got = cpu_linear(probe, head.weight, getattr(head, "bias", None))
                else:
                    got = torch.nn.functional.linear(probe.to(head.weight.device), head.weight)
                want = probe.to(w.device) @ w.t()
                n = min(got.shape[-1], want.shape[-1])
                tol = 1e-3 if w.dtype == torch.float32 else 5e-2
                info["head_follows_embedding"] = bool(
                    torch.allclose(got[..., :n].float().cpu(), want[..., :n].float().cpu(), atol=tol, rtol=tol))
        return info

    # ------------------------------------------------------------------ internals
    def _alloc_reload(self, weights: dict) -> dict:
        import time

        t0 = time.perf_counter()
        checksum = state_checksum(weights.items())
        # vLLM's Worker.reload_weights: in-place, layerwise, under the current vllm config
        self.reload_weights(weights_iterator=iter(list(weights.items())), is_checkpoint_format=True)
        repacked = _reprocess_shared_weights(self.model_runner.get_model())
        self._alloc_last_checksum = checksum
        self._alloc_num_pushes = getattr(self, "_alloc_num_pushes", 0) + 1
        return {"checksum": checksum, "num_tensors": len(weights), "repacked": repacked,
                "seconds": round(time.perf_counter() - t0, 4)}


def _find_attr(model, name: str):
    for mod_name, mod in model.named_modules():
        if mod_name.endswith(name):
            return mod
    return None


def _reprocess_shared_weights(model) -> list[str]:
    """Re-run unquantized weight processing for modules whose ``weight`` Parameter is shared.

    A reload only re-processes modules that were *addressed* by a weight name; a tied ``lm_head``
    never is, so its processed form (vLLM-CPU: the packed GEMM weight) would stay stale.
    """
    owners: dict[int, list[tuple[str, object]]] = {}
    for name, mod in model.named_modules():
        w = mod.__dict__.get("_parameters", {}).get("weight")
        if w is not None and getattr(mod, "quant_method", None) is not None:
            owners.setdefault(id(w), []).append((name, mod))
    done = []
    for mods in owners.values():
        if len(mods) < 2:
            continue
        for name, mod in mods:
            qm = mod.quant_method
            if type(qm).__name__.startswith("Unquantized"):  # quantized processing is not idempotent
                qm.process_weights_after_loading(mod)
                done.append(name)
    return done
