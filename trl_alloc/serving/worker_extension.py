"""vLLM worker extension: CPU-friendly weight pushes for a trl-alloc vLLM server.

Load it into the server with ``--worker-extension-cls trl_alloc.serving.worker_extension.AllocWorkerExtension``
(``trl-alloc-serve`` does) and call its methods through vLLM's ``POST /collective_rpc`` (the server
needs ``VLLM_SERVER_DEV_MODE=1``)::

    {"method": "load_weights_from_dir", "args": ["/tmp/weights"]}
    {"method": "load_weights_from_payload", "args": ["<base64 of safetensors bytes>"]}
    llm.collective_rpc("load_weights_from_tensors", args=(weights,))   # colocate: rollout/colocate.py
    {"method": "weights_checksum"}
    {"method": "load_quality_head", "args": ["<base64 of the head's safetensors>", 24]}
    {"method": "quality_scores", "args": [["alloc-...-7"]]}

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

ARROL's quality head in the engine (arXiv 2603.24840): ``load_quality_head`` installs the head's weights (a few
hundred KB, sent with each weight sync) and a forward hook on the served model. vLLM's model forward
returns the final norm's output for every scheduled token; at the step where a request's input token is
the ``detect_length``-th completion token (position ``prompt_len + detect_length − 1``), the hook scores
that hidden state, the same one the trainer's ``rollout.quality_head.last_hidden_states`` takes from
prompt + partial, and keeps (logit, hidden state) by request id until ``quality_scores`` collects it.
Only requests whose id starts with ``REQUEST_PREFIX`` (the trainer's streamed rollouts) are scored.

Keep this module importable without vLLM (it shares `protocol.py` with the client): nothing is
imported from vLLM at module level, and the class holds methods only (vLLM mixes it into its worker
class and refuses attributes that clash with the worker's).
"""

from __future__ import annotations

import base64
import os

from .protocol import model_signature, state_checksum

__all__ = ["AllocWorkerExtension", "REQUEST_PREFIX"]

REQUEST_PREFIX = "alloc-"  # request ids the quality head scores (vLLM makes them "cmpl-<id>-0-<random>")
_MAX_KEPT_SCORES = 4096  # scores never collected (a client gone away) are dropped beyond this many

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

    def load_weights_from_tensors(self, weights: dict) -> dict:
        """Reload every weight in place from ``{name: tensor}`` (an engine in the trainer's process: colocate)."""
        return self._alloc_reload(weights)

    def served_dtype(self) -> str:
        """The dtype the engine computes in (`float32`, `bfloat16`, ...), as the trainer names its own."""
        return str(self.model_runner.model_config.dtype).removeprefix("torch.")

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

    def cpu_features(self) -> dict:
        """What this worker's process runs on: AMX permission (`serving.cpu_features`), the attention kernels vLLM
        chose (`"amx"`, `"vec"`, ...; none on CUDA) and the engine's dtype."""
        from .cpu_features import amx_state, xtiledata_permitted

        model = self.model_runner.get_model()
        return {"amx": amx_state(), "xtiledata_permitted": xtiledata_permitted(),
                "attention_isa": sorted({m.isa for m in model.modules() if isinstance(getattr(m, "isa", None), str)}),
                "dtype": str(self.model_runner.model_config.dtype).removeprefix("torch.")}

    # ------------------------------------------------------------------ ARROL's head in the engine
    def load_quality_head(self, payload: str, detect_length: int) -> dict:
        """Install the head (base64 safetensors of `QualityHead.state_dict()`) and the detection length;
        the first call hooks the model. Returns ``{"checksum", "hidden_size", "detect_length"}``."""
        import torch
        from safetensors.torch import load

        state = {k: v.to(torch.float32) for k, v in load(base64.b64decode(payload)).items()}
        layers = sorted({k.rsplit(".", 1)[0] for k in state})
        if len(layers) != 2 or any(f"{m}.{p}" not in state for m in layers for p in ("weight", "bias")):
            raise ValueError(f"a quality head has two linear layers (weight, bias each); got {sorted(state)}")
        hidden = self.model_runner.model_config.hf_config.get_text_config().hidden_size
        first = state[f"{layers[0]}.weight"]
        if first.shape[1] != hidden:
            raise ValueError(f"the quality head reads hidden states of size {first.shape[1]}, the served model's "
                             f"are {hidden}: it was built for another model.")
        self._alloc_head = [(state[f"{m}.weight"], state[f"{m}.bias"]) for m in layers]
        self._alloc_detect_length = int(detect_length)
        if getattr(self, "_alloc_head_hook", None) is None:
            self._alloc_scores = {}
            self._alloc_head_hook = self.model_runner.get_model().register_forward_hook(
                self._alloc_score_hook, with_kwargs=True)
        return {"checksum": state_checksum(state.items()), "hidden_size": hidden,
                "detect_length": self._alloc_detect_length, **self.quality_head_stats()}

    def quality_head_stats(self) -> dict:
        """Rollouts scored in the engine so far and the seconds the hook spent on them (cumulative)."""
        return {"scored": getattr(self, "_alloc_scored", 0), "hook_s": getattr(self, "_alloc_hook_s", 0.0)}

    def quality_scores(self, request_ids: list) -> dict:
        """{request id: [logit, hidden state]} for those of `request_ids` scored at the detection point
        (ids as the client sent them); collected scores are forgotten."""
        if getattr(self, "_alloc_hook_error", None):
            raise RuntimeError(f"scoring at the detection point failed in the worker: {self._alloc_hook_error}")
        kept, wanted, out = getattr(self, "_alloc_scores", {}), set(request_ids), {}
        for key in [k for k in kept if _client_request_id(k) in wanted]:
            logit, hidden = kept.pop(key)
            out[_client_request_id(key)] = [logit, hidden.tolist()]
        return out

    def _alloc_score_hook(self, module, args, kwargs, output):
        """Score the rows at their request's detection point (module docstring). It never raises into the
        engine: an error is kept and reported by `quality_scores`."""
        import time

        t0 = time.perf_counter()
        try:
            self._alloc_score_rows(output[0] if isinstance(output, tuple) else output, kwargs.get("positions"))
        except Exception as exc:  # noqa: BLE001 -- the engine must go on; the client gets the error
            self._alloc_hook_error = f"{type(exc).__name__}: {exc}"
        self._alloc_hook_s = getattr(self, "_alloc_hook_s", 0.0) + time.perf_counter() - t0

    def _alloc_score_rows(self, hidden, positions):
        import numpy as np
        import torch

        runner = self.model_runner
        batch, prefix = runner.input_batch, f"cmpl-{REQUEST_PREFIX}"
        n = batch.num_reqs
        ours = [i for i, r in enumerate(batch.req_ids[:n]) if isinstance(r, str) and r.startswith(prefix)]
        if not ours or positions is None or positions.dim() != 1:
            return
        starts = runner.query_start_loc.np[:n + 1]
        first = positions[torch.as_tensor(starts[ours], device=positions.device)].cpu().numpy()
        target = batch.num_prompt_tokens[ours] + self._alloc_detect_length - 1
        rows = starts[ours] + target - first  # the detection point's row, if it is in this step
        hit = (rows >= starts[ours]) & (rows < starts[np.asarray(ours) + 1])
        if not hit.any():
            return
        keys = [batch.req_ids[i] for i, h in zip(ours, hit) if h]
        with torch.no_grad():
            h = hidden[torch.as_tensor(rows[hit], device=hidden.device)].to(torch.float32).cpu()
            (w1, b1), (w2, b2) = self._alloc_head
            logits = torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(h, w1, b1)),
                                                w2, b2).squeeze(-1)
        kept = self._alloc_scores
        for key, logit, vec in zip(keys, logits.tolist(), h):
            kept[key] = (logit, vec)
        while len(kept) > _MAX_KEPT_SCORES:
            kept.pop(next(iter(kept)))
        self._alloc_scored = getattr(self, "_alloc_scored", 0) + len(keys)

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


def _client_request_id(engine_id: str) -> str:
    """vLLM's engine request id "cmpl-<client id>-<prompt index>-<random>" -> the client's id."""
    return engine_id[len("cmpl-"):].rsplit("-", 2)[0]


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
