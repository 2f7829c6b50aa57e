"""ARROL online rollout pruning in the trainer (arXiv 2603.24840): two-phase generation, the pruning decision,
and the quality head's online training.

Every generation request runs in two phases:

1. every rollout generates up to ``detect_length`` tokens (the backend's own generation call with
   ``max_new_tokens`` / vLLM ``max_tokens`` lowered to ``detect_length``);
2. the rollouts that reached ``detect_length`` unfinished are *eligible*: each is scored once by the
   quality head on the policy's last-layer hidden state at its last token (a forward pass of
   prompt + partial in the trainer), the logits are calibrated (``ScoreCalibrator``), survival
   probabilities are computed per prompt-group (``survival_probabilities``) and survivors sampled;
   only survivors continue, by a second generation call whose prompt is prompt + partial (vLLM:
   the prefix cache reuses the prefix's KV blocks) with the remaining ``max_completion_length −
   detect_length`` tokens. Rollouts that finished before ``detect_length`` are never pruned.

Pruned rollouts are spent budget: they count as responses (and their ``detect_length`` tokens as
tokens) for the pacer and filler, with no reward, and never reach the reward functions' results,
the log-probabilities or the loss. ``pruning="random"`` keeps each eligible rollout with
probability ``keep_ratio`` (the paper's control, no head). Both prune only after
``cold_start_rounds`` rounds.

**In the engine.** With `rollout_mode="events"` and vLLM, none of this runs: the worker extension scores
each streamed rollout at the detection point, pruned rollouts are aborted in the engine and survivors go
on in the same request (`rollout.drivers`, `serving.worker_extension`, docs/arrol.md);
`decide_snapshots` takes those scores. Here (deterministic mode, and the transformers backend) the
trainer scores: it holds the same weights, so one forward of prompt + partial gives the same hidden state.

Distributed contract (as in `trainer/generation.py`): each rank generates and forwards its own rows; the
hidden states are gathered, and the main process scores, calibrates, samples survivors and trains
the head; its decision is broadcast. Forwards and generation calls stay collective-safe (every rank
runs the same number, with throwaway rows where it has none).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from accelerate.utils import gather_object

from ..allocation.arrol import accuracy, binary_auc
from ..allocation.base import RunContext
from ..allocation.registry import method_class

if TYPE_CHECKING:
    from ..allocation.event_rounds import EventRound
    from .backends import Rollout

HEAD_DIR = "quality_head"
HEAD_OPTIMIZER_NAME = "quality_head_optimizer.pt"


class RolloutPruner:
    """The pruning stage's state and decisions (main process): quality head + its optimizer (ARROL),
    score calibrator, survivor RNG, rounds seen (cold start) and the round's running figures."""

    def __init__(self, args: Any, hidden_size: int | None = None, base_model: str | None = None,
                 seed: int = 0) -> None:
        self.mode = args.pruning
        policy = method_class("pruning", self.mode)  # the decision itself is numpy (allocation.arrol)
        if policy is None:
            raise ValueError(f"pruning={self.mode!r} prunes nothing: build no RolloutPruner for it.")
        self.detect_length = int(args.detect_length)
        self.prune_undecided = bool(args.prune_undecided)
        self.max_completion_length = int(args.max_completion_length)
        self.policy = policy.from_config(args, RunContext(num_prompts=0, num_rounds=0, budget=0, seed=seed))
        self.totals = {"eligible": 0, "pruned": 0, "tokens_saved": 0.0}
        self.head = self.optimizer = None
        self._gate_said = None  # the gate's last state told the user (None: nothing said yet)
        self.notices = []  # lines for the user (the trainer prints them on the main process)
        if self.policy.uses_head:
            from .quality_head import QualityHead

            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed))
                self.head = QualityHead(hidden_size, args.head_hidden_size, self.detect_length, base_model)
            if getattr(args, "quality_head_init", None):
                self.load_head(args.quality_head_init)
            self.optimizer = torch.optim.Adam(self.head.parameters(), lr=args.head_learning_rate)
        self._reset_round()

    def _reset_round(self):
        self._round = {"eligible": 0, "pruned": 0, "finished_early": 0, "generation_s": 0.0, "scoring_s": 0.0,
                       "survivor_labels": [], "lengths": {}, "cut": []}
        self._train = []  # (features, logits, labels) of completed eligible rollouts this round
        self._heldout = []  # (logit, label, group) of this round's completed held-out rollouts: the gate's only
        self._scored = {}  # eligible rollouts not yet recorded: key -> (features, logit, held-out group or None)

    @property
    def active(self) -> bool:
        """Past the cold start, and the gate open: pruning decisions are made (else every rollout survives)."""
        return self.policy.active

    # ------------------------------------------------------------------ decisions (main process)
    @torch.no_grad()
    def decide(self, groups: Sequence[int], keys: Iterable[Hashable], features: Sequence | None = None,
               logits: Sequence[float] | None = None, decidable: Sequence[bool] | None = None) -> list:
        """Which eligible rollouts to prune: `keys` name them (a request's row indices, or rollout ids in the
        stream), `groups` their prompt-group. The head scores `features` (hidden states, trainer-side), or
        `logits` are its scores already (computed in the engine; `features` then only train it). Survival
        probabilities are computed per group over all of them; only `decidable` ones (default all) can be
        pruned -- in the stream, a rollout that ended before its cohort was complete is kept. Returns the
        keys to prune, sorted; `record` counts the ones that were (in the stream, a rollout that ends before
        its abort takes effect is kept, complete)."""
        keys = list(keys)
        given = logits is not None
        logits = np.asarray(logits, np.float64) if given else np.full(len(keys), np.nan)
        feats = None
        if self.head is not None and keys and features is not None:
            feats = torch.as_tensor(np.asarray(features), dtype=torch.float32)
            if not given:
                self.head.eval()
                logits = self.head(feats).double().numpy()
        held = self.policy.hold_out(groups)
        for j, key in enumerate(keys):  # a held-out rollout keeps its group's key: this round's group
            group = f"{self.policy.rounds}:{groups[j]}" if held[j] else None
            self._scored[key] = (None if feats is None else feats[j], float(logits[j]), group)
        self._round["eligible"] += len(keys)
        cut = np.zeros(len(keys), bool)
        cut[~held] = self.policy.prune(np.asarray(groups, np.int64)[~held],
                                       logits[~held] if self.head is not None else None)
        if decidable is not None:
            cut &= np.asarray(decidable, bool)
        return sorted(k for k, c in zip(keys, cut) if c)

    def decide_snapshots(self, snapshots: Sequence[Rollout], event_round: EventRound) -> list[int]:
        """In-stream pruning (`rollout.drivers.RoundDriver`'s `on_detect`): the snapshots of complete cohorts,
        scored in the engine (`info["score"]`, `info["hidden"]`), -> rollout ids to prune. A cohort (one
        submission's rollouts) is the group the survival probabilities are normalised over. With
        `prune_undecided=False` only prompts `event_round.mixed` says are mixed can be cut."""
        scored = self.head is not None
        prunable = None if self.prune_undecided else event_round.mixed
        return self.decide([s.info["cohort"] for s in snapshots], [s.rid for s in snapshots],
                           [s.info["hidden"] for s in snapshots] if scored else None,
                           [s.info["score"] for s in snapshots] if scored else None,
                           decidable=[not s.info["ended"] and (prunable is None or prunable(s.tag))
                                      for s in snapshots])

    def record(self, rows: Sequence[dict]) -> None:
        """After rewards: queue (features, logit, label) of completed eligible rollouts for the head and the
        calibrator. `rows`: the trainer's rows; each is keyed by its `rid` (stream) or its index."""
        for i, row in enumerate(rows):
            key = row.get("rid", i)
            scored = self._scored.pop(key, None)
            if row.get("pruned"):  # (counted here: in the stream, one named too late ends unpruned)
                if scored is not None:
                    self._round["pruned"] += 1
                    self._round["cut"].append(row["pid"])
                continue
            if row.get("aborted"):
                continue
            self._round["lengths"].setdefault(row["pid"], []).append(len(row["completion_ids"]))
            if scored is None:
                self._round["finished_early"] += 1
            elif np.isfinite(row["success"]):  # the trainer's success signal (0/1), NaN = unscored
                label = int(row["success"])
                self._round["survivor_labels"].append(label)
                if scored[2] is not None:
                    self._heldout.append((scored[1], label, scored[2]))
                elif scored[0] is not None:
                    self._train.append((scored[0], scored[1], label))
        if "rid" not in (rows[0] if rows else {}):
            self._scored.clear()  # a request's row indices are its own

    def _tokens_saved(self):
        """Tokens pruning did not generate: per pruned rollout, the mean final length of its group's completed
        rollouts this round (else of all of them) minus the detect_length it did generate."""
        lengths = self._round["lengths"]
        every = [n for v in lengths.values() for n in v]
        saved = 0.0
        for pid in self._round["cut"]:
            ref = lengths.get(pid) or every
            saved += max(float(np.mean(ref)) - self.detect_length, 0.0) if ref else 0.0
        return saved

    def add_time(self, generation_s: float = 0.0, scoring_s: float = 0.0) -> None:
        self._round["generation_s"] += generation_s
        self._round["scoring_s"] += scoring_s

    def end_round(self) -> dict[str, float]:
        """Close the round: head metrics on the round's completed rollouts (before training on them),
        calibrator update, one Adam step of the head on binary cross-entropy; returns the metrics."""
        r = self._round
        r["tokens_saved"] = self._tokens_saved()
        out = {"pruning/active": float(self.active), "pruning/eligible": float(r["eligible"]),
               "pruning/pruned": float(r["pruned"]), "pruning/finished_early": float(r["finished_early"]),
               "pruning/keep_ratio": (r["eligible"] - r["pruned"]) / r["eligible"] if r["eligible"] else 1.0,
               "pruning/tokens_saved": r["tokens_saved"], "pruning/generation_s": r["generation_s"],
               "pruning/scoring_s": r["scoring_s"],
               "pruning/target_ratio": float(self.policy.survival["target_ratio"])}
        if r["survivor_labels"]:
            out["pruning/survivor_positive_ratio"] = float(np.mean(r["survivor_labels"]))
        self.totals["eligible"] += r["eligible"]
        self.totals["pruned"] += r["pruned"]
        self.totals["tokens_saved"] += r["tokens_saved"]
        out["pruning/pruned_total"] = float(self.totals["pruned"])
        out["pruning/tokens_saved_total"] = float(self.totals["tokens_saved"])
        if self._train:
            feats = torch.stack([t[0] for t in self._train])
            logits = np.array([t[1] for t in self._train])
            labels = np.array([t[2] for t in self._train])
            out["arrol/head_accuracy"] = accuracy(logits, labels)
            auc = binary_auc(logits, labels)
            if np.isfinite(auc):
                out["arrol/head_auc"] = auc
            out["arrol/head_samples"] = float(labels.size)
            out["arrol/head_loss"] = self.train_head(feats, torch.as_tensor(labels, dtype=torch.float32))
        if self._train or self._heldout:
            rows = [(t[1], t[2], None) for t in self._train] + self._heldout
            self.policy.observe([r[0] for r in rows], [r[1] for r in rows], [r[2] is not None for r in rows],
                                [r[2] for r in rows])
        if self.policy.gate.enabled:
            gate = self.policy.gate.figures()
            for key, name in (("auc", "arrol/auc_heldout"), ("pooled_auc", "arrol/auc_heldout_pooled")):
                if np.isfinite(gate[key]):
                    out[name] = gate[key]
            out["arrol/heldout_samples"] = float(gate["rollouts"])
            out["arrol/heldout_mixed_groups"] = float(gate["mixed_groups"])
            out["arrol/gate_open"] = float(gate["open"])
        self.policy.end_round()
        self._say_gate()
        self._reset_round()
        return out

    def _say_gate(self):
        """Once past the cold start, and again whenever the gate changes: why pruning is on or off."""
        gate = self.policy.gate
        if not gate.enabled or self.policy.rounds < self.policy.cold_start_rounds or gate.is_open == self._gate_said:
            return
        if gate.is_open:
            self.notices.append(f"ARROL pruning is on: {gate.reason()}.")
        else:
            self.notices.append(f"ARROL pruning is off, rollouts run to the end: {gate.reason()}. Pruning at chance "
                                "would cut rollouts at random (docs/arrol.md, 'The gate'); set pruning_min_auc=0 to "
                                "prune regardless.")
        self._gate_said = gate.is_open

    def take_notices(self) -> list[str]:
        out, self.notices = self.notices, []
        return out

    def report(self) -> dict:
        """The run's pruning figures (`allocation/summary.json`, the model card): totals, and the gate's state."""
        out = dict(self.totals)
        if self.policy.gate.enabled:
            gate = self.policy.gate.figures()
            out["gate"] = {"open": gate["open"], "auc_heldout": None if not np.isfinite(gate["auc"]) else gate["auc"],
                           "heldout": gate["rollouts"], "mixed_groups": gate["mixed_groups"],
                           "min_auc": self.policy.gate.min_auc, "reason": self.policy.gate.reason()}
        return out

    def train_head(self, features: torch.Tensor, labels: torch.Tensor) -> float:
        """One Adam step of binary cross-entropy on detached features; returns the loss before the step."""
        self.head.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self.head(features.detach()), labels)
        loss.backward()
        self.optimizer.step()
        self.head.eval()
        return float(loss.detach())

    def calibration_curve(self) -> dict[str, list[float]] | None:
        """Per score bin with data: the calibrated q at the bin centre and the observed positive rate."""
        calibrator = self.policy.calibrator
        if self.head is None or not len(calibrator):
            return None
        B = calibrator.num_bins
        n1, n = np.zeros(B), np.zeros(B)
        for b, y in calibrator._buffer:
            n[b] += 1
            n1[b] += y
        centres = (np.arange(B) + 0.5) / B
        q = calibrator.calibrate(np.log(centres / (1 - centres)))
        seen = n > 0
        return {"predicted": q[seen].tolist(), "observed": (n1[seen] / n[seen]).tolist()}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """JSON-serialisable state (the head's weights and optimizer are saved as files, see `save`)."""
        return {"mode": self.mode, **self.policy.state_dict(), "totals": dict(self.totals)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("mode") != self.mode:
            raise ValueError(f"the checkpoint's pruning state is for {state.get('mode')!r}, this run prunes with "
                             f"{self.mode!r}; resume with the same `pruning`.")
        self.policy.load_state_dict(state)
        self.totals.update(state.get("totals", {}))
        self._reset_round()

    def load_head(self, folder: str | os.PathLike) -> None:
        """Start from a saved head: a probe pass's (`scripts/arrol_study.py --save_head`) or a run's head."""
        from .quality_head import QualityHead

        given = QualityHead.from_pretrained(str(folder))
        if (given.hidden_size, given.head_hidden_size) != (self.head.hidden_size, self.head.head_hidden_size):
            raise ValueError(f"the quality head in {folder} takes hidden states of size {given.hidden_size} with "
                             f"{given.head_hidden_size} hidden units; this policy's head needs "
                             f"{self.head.hidden_size} and head_hidden_size={self.head.head_hidden_size}. Train the "
                             "head on this policy, or set head_hidden_size to the saved one.")
        if given.detect_length not in (None, self.detect_length):
            self.notices.append(f"the quality head from {folder} was trained at detect_length {given.detect_length}; "
                                f"this run scores at {self.detect_length}.")
        self.head.load_state_dict(given.state_dict())

    def save(self, output_dir: str | os.PathLike) -> None:
        """The head as its own adapter folder: `output_dir/quality_head/` (config.json, model.safetensors)."""
        if self.head is not None:
            self.head.save_pretrained(os.path.join(output_dir, HEAD_DIR))

    def save_optimizer(self, output_dir: str | os.PathLike) -> None:
        if self.optimizer is not None:
            torch.save(self.optimizer.state_dict(), os.path.join(output_dir, HEAD_OPTIMIZER_NAME))

    def load(self, checkpoint: str | os.PathLike) -> None:
        """Restore the head's weights (and optimizer, when the checkpoint has it) from a checkpoint folder."""
        if self.head is None:
            return
        folder = os.path.join(checkpoint, HEAD_DIR)
        weights = os.path.join(folder, "model.safetensors")
        if not os.path.isfile(weights):
            raise FileNotFoundError(f"{checkpoint} has no {HEAD_DIR}/model.safetensors: it was saved without "
                                    "pruning='arrol', so the quality head cannot resume from it.")
        from safetensors.torch import load_file

        self.head.load_state_dict(load_file(weights))
        opt = os.path.join(checkpoint, HEAD_OPTIMIZER_NAME)
        if os.path.isfile(opt):
            self.optimizer.load_state_dict(torch.load(opt, map_location="cpu", weights_only=True))


def build_pruner(args: Any, model_config: Any) -> RolloutPruner | None:
    """The pruning stage `args.pruning` names (None for 'none'), for a policy with `model_config` (its hidden size
    sizes the quality head)."""
    if method_class("pruning", args.pruning) is None:
        return None
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    name = getattr(model_config, "name_or_path", None) or None
    seed = args.seed if args.allocation_seed is None else args.allocation_seed
    return RolloutPruner(args, hidden_size=getattr(text, "hidden_size", None), base_model=name, seed=seed)


# ---------------------------------------------------------------------- generation (every rank)
@dataclass
class GenerationHost:
    """What two-phase generation takes from whoever drives it (the trainer builds one in
    `trainer/trl_compat.py`, `generation_host`): the generation backend and a cap on its length, the policy
    whose hidden states the quality head reads, and the distributed set-up."""

    generate: Callable  # prompt ids -> (completion ids, sampling log-probs or None), one completion per prompt
    limit_new_tokens: Callable  # n -> a context manager inside which `generate` stops at n new tokens
    model: torch.nn.Module
    pad_token_id: int
    eos_token_ids: Collection[int]
    device: torch.device
    batch_size: int  # rows per forward pass of the head's features
    gradient_checkpointing_kwargs: dict | None
    collective: bool  # every rank makes the same number of generation calls and forwards
    num_processes: int
    is_main: bool
    main_call: Callable  # fn -> fn() run on the main process, its result (or error) on every rank


def _generate(host, prompts, n_tokens):
    with host.limit_new_tokens(n_tokens):
        completion_ids, logps = host.generate(prompts)
    completion_ids = [list(map(int, c)) for c in completion_ids]
    if logps is not None:
        logps = [[float("nan") if x is None else float(x) for x in lp] for lp in logps]
    return completion_ids, logps


def generate_with_pruning(host: GenerationHost, pruner: RolloutPruner, prompt_ids: list, n_real: int,
                          flat_pids: list[int], offset: int, shares: list[tuple[int, int]]) -> tuple:
    """Two-phase generation of this rank's rows (module docstring). Called on every rank.

    prompt_ids: this rank's tokenized prompts (its `n_real` rows, then throwaway padding rows when
    generation is collective; empty when this rank generates nothing); flat_pids: the whole
    request's prompt id per row; offset: index of this rank's first row in the request; shares:
    (start, stop) row ranges of every rank; `host`: the generation backend and the set-up (`GenerationHost`).
    Returns (completion_ids, sampling_logps or None, pruned) for the `n_real` rows.
    """
    L, is_main, collective = pruner.detect_length, host.is_main, host.collective
    t0 = time.perf_counter()
    first, logps1 = _generate(host, prompt_ids, L) if prompt_ids else ([], None)
    gen_s = time.perf_counter() - t0

    eos = set(host.eos_token_ids)
    eligible = [i for i in range(n_real) if len(first[i]) >= L and first[i][-1] not in eos]
    t1 = time.perf_counter()
    feats = None
    if pruner.policy.uses_head:
        seqs = [list(prompt_ids[i]) + first[i] for i in eligible]
        bs = max(1, int(host.batch_size))
        n_batches = -(-len(seqs) // bs)
        if collective:
            n_batches = max(gather_object([n_batches]))
        from .quality_head import last_hidden_states

        feats = last_hidden_states(host.model, seqs, host.pad_token_id, bs, host.device, n_batches,
                                   host.gradient_checkpointing_kwargs)
        feats = list(feats.numpy())
    local = [(offset + i, None if feats is None else feats[j]) for j, i in enumerate(eligible)]
    everything = gather_object(local) if host.num_processes > 1 else local
    rows = [i for i, _ in everything]
    features = None if feats is None else [f for _, f in everything]
    pruned = set(host.main_call(lambda: pruner.decide(np.asarray(flat_pids)[rows], rows, features)))
    score_s = time.perf_counter() - t1

    # phase 2: survivors continue from prompt + partial
    survivors = [i for i in eligible if offset + i not in pruned]
    alive = set(rows) - pruned
    most = max(sum(start <= i < stop for i in alive) for start, stop in shares) if collective else len(survivors)
    second, logps2 = [], None
    t2 = time.perf_counter()
    if most:
        cont = [list(prompt_ids[i]) + first[i] for i in survivors]
        cont += [list(prompt_ids[0]) + first[0]] * (most - len(cont))  # throwaway rows (collective only)
        second, logps2 = _generate(host, cont, pruner.max_completion_length - L)
    gen_s += time.perf_counter() - t2
    if is_main:
        pruner.add_time(generation_s=gen_s, scoring_s=score_s)

    completions, logps, cut = [], [] if logps1 is not None else None, []
    where = {i: j for j, i in enumerate(survivors)}
    for i in range(n_real):
        c, lp = list(first[i]), list(logps1[i]) if logps1 is not None else None
        if i in where:
            c += second[where[i]]
            if lp is not None:
                lp += logps2[where[i]]
        completions.append(c)
        if logps is not None:
            logps.append(lp)
        cut.append(offset + i in pruned)
    return completions, logps, cut
