"""`trl-alloc-launch`: `accelerate launch` of `scripts/train.py` whose last lines and exit status stay ours.

Under a bare `accelerate launch`, a refused run's message (what is wrong, then the fix) is followed by accelerate's
own `CalledProcessError` traceback (one process) or torchrun's `ChildFailedError` report (several), and the exit
status is 1 for any failure (docs/reliability.md). This launcher runs the same `accelerate launch`, then repeats the
main process's outcome as the last lines and exits with train.py's status: 0 trained, 2 nothing was trained, 3
refused.

    trl-alloc-launch --num_processes 2 --config_file deepspeed_zero3.yaml -- --config configs/demo.yaml
    trl-alloc-launch -- --config configs/demo.yaml         # accelerate's default config

Options before `--` are `accelerate launch`'s; those after it are train.py's (without `--`, all are train.py's).
"""

from __future__ import annotations

import faulthandler
import io
import json
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import NoReturn, TextIO

OUTCOME_ENV = "TRL_ALLOC_OUTCOME_FILE"  # where the main process of train.py writes its outcome (cli/train.py)
_quoted: list[TextIO] = []  # the stderr pipe `accelerate launch` quotes, kept for train.py's last message


def under_accelerates_pipe() -> bool:
    """One process under `accelerate launch`: its simple launcher pipes train.py's stderr and, on failure, raises
    `CalledProcessError` from `RuntimeError(<the stderr tail>)`. (Several processes run under torchrun, which
    quotes nothing.)"""
    return ("ACCELERATE_USE_CPU" in os.environ and "TORCHELASTIC_RUN_ID" not in os.environ
            and stat.S_ISFIFO(os.fstat(2).st_mode))


def keep_stderr_for_the_last_message() -> None:
    """Under accelerate's pipe (`under_accelerates_pipe`), make the stderr tail it quotes ours: everything else
    written to stderr (library warnings, progress bars, tracebacks) goes to stdout from here on, and the pipe keeps
    only `finish`'s message and, for a native crash (SIGILL, SIGSEGV), Python's stack (`faulthandler`)."""
    if _quoted or not under_accelerates_pipe():
        return
    sys.stderr.flush()
    _quoted.append(os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace"))
    os.dup2(1, 2)
    faulthandler.enable(file=_quoted[0])


def _same_file(a: TextIO, b: TextIO) -> bool:
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # (a captured stream has no file)
        return False


def finish(message: str, status: int | None = None) -> None:
    """train.py's last message (main process): the last line on stdout and on stderr (the tail `accelerate launch`
    quotes), and, with an exit status, the outcome `trl-alloc-launch` repeats."""
    if os.environ.get("RANK", "0") != "0":
        return
    print(f"\n{message}", flush=True)
    stderr = _quoted[0] if _quoted else sys.stderr
    if _quoted or not _same_file(sys.stdout, stderr):  # (both on one terminal: said once)
        print(message if _quoted else f"\n{message}", file=stderr, flush=True)  # (quoted: "RuntimeError: <it>")
    path = os.environ.get(OUTCOME_ENV)
    if path and status is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"status": int(status), "message": message}, f)


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(accelerate launch's options, train.py's arguments), split at the first `--`."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return [], list(argv)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    launch_args, train_args = split_args(sys.argv[1:] if argv is None else list(argv))
    if any(not a.startswith("-") for a in launch_args[:1]):
        sys.exit(f"trl-alloc-launch: {launch_args[0]!r} is not an `accelerate launch` option; put train.py's "
                 "arguments after `--` (trl-alloc-launch [accelerate options] -- [train.py arguments]).")
    with tempfile.TemporaryDirectory(prefix="trl-alloc-launch-") as tmp:
        outcome_path = os.path.join(tmp, "outcome.json")
        env = {**os.environ, OUTCOME_ENV: outcome_path}
        cmd = [sys.executable, "-m", "accelerate.commands.launch", *launch_args, "-m", "trl_alloc.cli.train",
               *train_args]
        returncode = subprocess.run(cmd, env=env).returncode
        outcome = None
        if os.path.isfile(outcome_path):
            with open(outcome_path, encoding="utf-8") as f:
                outcome = json.load(f)
    if outcome is None:  # trained (0), or a failure train.py did not get to report (accelerate's status)
        sys.exit(returncode)
    print(f"\n{outcome['message']}", file=sys.stderr, flush=True)
    sys.exit(outcome["status"])


if __name__ == "__main__":
    main()
