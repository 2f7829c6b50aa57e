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

import json
import os
import subprocess
import sys
import tempfile

OUTCOME_ENV = "TRL_ALLOC_OUTCOME_FILE"  # where the main process of train.py writes its outcome (cli/train.py)


def write_outcome(status, message):
    """train.py's side (main process): record the run's exit status and last message for `trl-alloc-launch`."""
    path = os.environ.get(OUTCOME_ENV)
    if path and os.environ.get("RANK", "0") == "0":
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"status": int(status), "message": message}, f)


def split_args(argv):
    """(accelerate launch's options, train.py's arguments), split at the first `--`."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return [], list(argv)


def main(argv=None):
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
