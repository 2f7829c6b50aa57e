"""A run's "before" held-out evaluation taken from another run instead of sampled again (`--eval_before_from`).

The learning benchmark's methods at one seed start from one model and evaluate it on one held-out set with one
sampling seed, so their "before" evaluations draw the same samples (docs/benchmarks.md: the "before" column agrees
across methods at every seed). Each evaluation writes what determines its samples as `eval/before/key.json`; a run
whose key is equal takes that folder and its accuracy, and any difference makes it evaluate, saying which.

The evaluation is not sampled, so its random draws are not taken from the engine either: where the engine samples
unseeded requests from one generator (vLLM on a CPU, `trl_alloc.evaluation.backends.VLLMEngineBackend`), the run's
training rollouts then draw other numbers than the same run's would after sampling it. Same distribution, other
draws; the seed's pool, held-out set and model, what pairs the methods, are the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any

KEY_FILE, TAKEN_FILE = "key.json", "taken_from.txt"


def before_key(model: str, revision: str | None, backend: str, dtype: str, held_out: Any, settings: dict[str, Any],
               reward: str) -> dict[str, Any]:
    """What a "before" evaluation's samples depend on: the model and its dtype, the sampling backend, the held-out
    rows (their SHA-256), the sampling settings and seed, the verifier, the code and the machine (floats differ
    between CPUs, `trl_alloc.benchmarks.learning.machine`)."""
    from trl_alloc import __version__
    from trl_alloc.benchmarks.learning import code_commit, machine

    rows = json.dumps(held_out.to_list(), sort_keys=True, default=str)
    return {"model": os.path.abspath(model) if os.path.isdir(model) else model, "revision": revision,
            "backend": backend, "dtype": dtype, "held_out_sha256": hashlib.sha256(rows.encode()).hexdigest(),
            **settings, "reward": reward, "code": code_commit() or f"trl_alloc {__version__}", "machine": machine()}


def write_key(folder: str, key: dict[str, Any]) -> None:
    """`key` beside a "before" evaluation this run sampled (where an earlier run in this folder had taken one, its
    note goes)."""
    if os.path.isfile(os.path.join(folder, TAKEN_FILE)):
        os.remove(os.path.join(folder, TAKEN_FILE))
    with open(os.path.join(folder, KEY_FILE), "w", encoding="utf-8") as f:
        json.dump(key, f, indent=1)


def take_before(source_run: str, folder: str, key: dict[str, Any]) -> tuple[float | None, str]:
    """(accuracy, why): `source_run`'s "before" accuracy, its evaluation folder copied to `folder`, where its key
    equals `key`; else (None, why not). Code with uncommitted changes is never matched."""
    source = os.path.join(source_run, "eval", "before")
    if not os.path.isfile(os.path.join(source, KEY_FILE)):
        return None, f"{source} has no {KEY_FILE} (a run at this version writes one with its evaluation)"
    if str(key["code"]).endswith("-dirty"):
        return None, "the code has uncommitted changes, so two runs' code cannot be told equal"
    with open(os.path.join(source, KEY_FILE), encoding="utf-8") as f:
        theirs = json.load(f)
    differ = sorted(k for k in key.keys() | theirs.keys() if key.get(k) != theirs.get(k))
    if differ:
        return None, "it differs in " + ", ".join(f"{k} ({theirs.get(k)!r} there, {key.get(k)!r} here)"
                                                  for k in differ)
    with open(os.path.join(source, "eval_results.json"), encoding="utf-8") as f:
        accuracy = json.load(f)["metrics"]["1"]["avg"]
    if os.path.abspath(source) != os.path.abspath(folder):
        shutil.copytree(source, folder, dirs_exist_ok=True)
        with open(os.path.join(folder, TAKEN_FILE), "w", encoding="utf-8") as f:
            f.write(os.path.abspath(source_run) + "\n")
    return accuracy, f"taken from {source}"


def taken_from(folder: str) -> str | None:
    """The run whose "before" evaluation `folder` (a run's `eval/before`) holds, or None where the run sampled it."""
    path = os.path.join(folder, TAKEN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip()
