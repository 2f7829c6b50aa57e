"""Checkpoint files of the allocator: written atomically, read with errors that name the file.

A checkpoint folder is written under a temporary name and renamed into place once whole, so the
newest `checkpoint-N` is always complete; a save that fails (a full disk) removes its partial
folder and says which checkpoint is intact.
"""

import errno
import glob
import hashlib
import json
import os
import re
import shutil

ALLOCATION_STATE_NAME = "allocation_state.json"
STATE_VERSION = 2
# Fields that fix a run's plan: resuming with any of them changed would pace another run.
PLAN_FIELDS = ("pacing", "filling", "pruning", "num_prompts", "num_rounds", "rollout_budget", "allocation_seed",
               "dataset_fingerprint")


def dataset_fingerprint(prompts):
    """A short hash of the prompt pool, in order (another seed's built-in pool has another hash)."""
    digest = hashlib.sha256()
    for p in prompts:
        digest.update((p if isinstance(p, str) else json.dumps(p, sort_keys=True)).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def write_json_atomic(path, data, default=None):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, default=default)
    os.replace(path + ".tmp", path)


def _step(path):
    m = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(os.path.normpath(path)))
    return int(m.group(1)) if m else None


def earlier_checkpoint(checkpoint):
    """The newest `checkpoint-N` next to `checkpoint` with a smaller N, or None."""
    parent, step = os.path.dirname(os.path.abspath(os.path.normpath(checkpoint))), _step(checkpoint)
    found = [(s, p) for p in glob.glob(os.path.join(parent, "checkpoint-*"))
             if (s := _step(p)) is not None and (step is None or s < step)]
    return max(found)[1] if found else None


def _suggest_previous(checkpoint):
    older = earlier_checkpoint(checkpoint)
    return (f" Resume from the previous checkpoint instead: --resume_from_checkpoint {older}" if older
            else " No earlier checkpoint is there; start the run again.")


def read_allocation_state(checkpoint, required=("pacer", "filler", "counters")):
    """The allocator state of `checkpoint`, or a ValueError naming the damaged file."""
    path = os.path.join(checkpoint, ALLOCATION_STATE_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{checkpoint} has no {ALLOCATION_STATE_NAME}; it was not written by trl-alloc, so "
                                "the allocator cannot resume from it." + _suggest_previous(checkpoint))
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is damaged (empty or truncated: {exc})." + _suggest_previous(checkpoint)) from None
    missing = [k for k in required if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{path} is damaged: it has no {missing[0]!r} entry." + _suggest_previous(checkpoint))
    return state


def check_same_plan(state, current, path):
    """Refuse a checkpoint whose run plan differs from this run's, naming the field."""
    for key in PLAN_FIELDS:
        if key not in state:  # written by an older trl-alloc: only what it recorded is checked
            continue
        if state[key] != current[key]:
            raise ValueError(f"{path} was written by a run with {key}={state[key]!r}, but this run has "
                             f"{key}={current[key]!r}; resuming would pace another run. Resume with the checkpoint's "
                             f"settings (and dataset), or start a new run in another output_dir.")


def is_disk_full(exc, folder):
    """Whether a failed save ran out of disk (torch and safetensors word it differently)."""
    text = str(exc)
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left" in text:
        return True
    return ("iostream error" in text or "file write failed" in text) and shutil.disk_usage(folder).free < 2**26


def disk_full_error(exc, folder, intact):
    where = os.path.dirname(os.path.abspath(folder))
    free = shutil.disk_usage(where).free if os.path.isdir(where) else 0
    keep = (f"The newest complete checkpoint is {intact}; resume from it once there is room."
            if intact else "No earlier checkpoint is there.")
    return OSError(errno.ENOSPC, f"no space left on the device of {where} while saving {os.path.basename(folder)} "
                                 f"({free / 2**20:.0f} MiB free): the partial folder was removed. Free space or "
                                 f"point --output_dir at a larger disk. {keep}")
