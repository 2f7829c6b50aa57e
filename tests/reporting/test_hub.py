"""Hub pushes of a tiny run: exact folder contents, the rendered card, no token anywhere.
Only the network upload is replaced (by a stand-in that copies into a local 'hub' folder)."""

import fnmatch
import json
import os
import shutil
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from helpers import make_args, tiny_setup
from trl_alloc.trainer import AllocGRPOTrainer

TOKEN = "hf_SECRETSECRETSECRET123"


class LocalHub:
    """Stands in for `HfApi` in transformers' Trainer: create_repo and upload_folder write to disk."""

    def __init__(self, root):
        self.root, self.uploads = root, []

    def create_repo(self, repo_id, token=None, private=None, exist_ok=False):
        os.makedirs(os.path.join(self.root, repo_id), exist_ok=True)
        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, repo_id, folder_path, path_in_repo=None, ignore_patterns=(), run_as_future=False,
                      **kwargs):
        dest = os.path.join(self.root, repo_id, path_in_repo or "")
        for dirpath, _, files in os.walk(folder_path):
            for name in files:
                rel = os.path.relpath(os.path.join(dirpath, name), folder_path)
                if any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel.split(os.sep)[0], p)
                       for p in ignore_patterns or ()):
                    continue
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                shutil.copy(os.path.join(dirpath, name), os.path.join(dest, rel))
        self.uploads.append((repo_id, path_in_repo, kwargs.get("commit_message")))
        if run_as_future:
            done = Future()
            done.set_result(None)
            done.is_done = done.done
            return done
        return SimpleNamespace(commit_url="local")


@pytest.fixture
def hub(tmp_path, monkeypatch):
    stand_in = LocalHub(str(tmp_path / "hub"))
    monkeypatch.setattr("transformers.trainer.hf_api", lambda: stand_in)
    return stand_in


def test_push_carries_policy_allocator_state_args_plots_and_card(tmp_path, hub, capsys):
    model, tok, ds, reward = tiny_setup()
    out = tmp_path / "run"
    args = make_args(str(out), pacing="cero", filling="sara", num_rounds=3, push_to_hub=True,
                     hub_model_id="someone/tiny-cero", hub_strategy="checkpoint", hub_token=TOKEN,
                     save_strategy="steps", save_steps=2, report_to=["tensorboard"], logging_steps=1)
    trainer = AllocGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    trainer.train()
    trainer.push_to_hub()
    repo = tmp_path / "hub" / "someone" / "tiny-cero"
    files = {str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file()}
    root = {f for f in files if "/" not in f}
    expected_root = {"README.md", "config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json", "allocation_state.json", "training_args.json",
                     "training_args.bin", "chat_template.jinja"}
    assert expected_root - {"chat_template.jinja"} <= root <= expected_root
    assert {"allocation/summary.json", "allocation/spend.png", "allocation/effective_group_rate.png",
            "allocation/exposure.png"} <= files
    checkpoint = {f.split("/", 1)[1] for f in files if f.startswith("last-checkpoint/")}
    assert {"model.safetensors", "allocation_state.json", "optimizer.pt", "trainer_state.json"} <= checkpoint
    assert not any(f.startswith("checkpoint-") or f.startswith("_") for f in files)

    state = json.loads((repo / "allocation_state.json").read_text())
    summary = json.loads((repo / "allocation" / "summary.json").read_text())
    assert state["pacing"] == "cero" and state["counters"]["rounds"] == 3
    assert summary["responses_spent"] == state["counters"]["responses"] > 0
    card = (repo / "README.md").read_text()
    for needle in ("pacing **cero**", "filling **sara**", "pruning **none**", "trl-alloc",
                   f"| responses spent | {summary['responses_spent']} |",
                   f"| effective groups (mixed rewards) | {summary['effective_groups']} |",
                   "CERO: Where and When to Allocate Rollouts", "Sequential Adaptive Rollout Allocation",
                   "Prune as You Generate", "TRL: Transformers Reinforcement Learning", "DeepSeekMath",
                   "| `tau_low` | 0.45 |", "Framework versions"):
        assert needle in card, needle
    assert "%.3f" % summary["effective_group_rate"] in card
    # tokens never appear in what is pushed, in the card, or in the logs
    for path in repo.rglob("*"):
        if path.is_file() and path.suffix in (".md", ".json", ".txt", ".jinja"):
            assert TOKEN not in path.read_text(errors="ignore"), path
    assert json.loads((repo / "training_args.json").read_text())["hub_token"] == "<HUB_TOKEN>"
    logs = capsys.readouterr()
    assert TOKEN not in logs.out + logs.err
    # every logged allocation metric reached the tensorboard back-end
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    runs = [d for d, _, fs in os.walk(out / "runs") if any(f.startswith("events") for f in fs)]
    acc = EventAccumulator(runs[0])
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    for metric in ("alloc/responses_spent", "alloc/responses_remaining", "alloc/groups_committed",
                   "alloc/groups_abandoned", "alloc/egr", "alloc/pacing_gap", "alloc/time_share", "reward"):
        assert f"train/{metric}" in scalars, metric
    assert len(hub.uploads) >= 3     # checkpoint pushes (root + last-checkpoint) and the final push


def test_card_says_which_held_out_split_was_used(tmp_path):
    from helpers import make_args

    from trl_alloc.reporting.hub import render_model_card

    evaluation = {"held_out_accuracy_before": 0.2, "held_out_accuracy_after": 0.25,
                  "held_out_split": "10 rows held out of data.jsonl (10%, seed 0); the pool is the other 90",
                  "held_out_prompts": 10, "held_out_samples": 4}
    card = str(render_model_card(make_args(str(tmp_path)), {"rounds": 2}, "run", evaluation=evaluation))
    assert "| held_out_split | 10 rows held out of data.jsonl (10%, seed 0); the pool is the other 90 |" in card
    assert "| `success_threshold` | 0.5 |" in card


def test_a_card_written_before_the_runs_report_still_has_its_figures(tmp_path):
    """A checkpoint push's card (no `allocation/summary.json` yet) takes its figures from the allocator's history."""
    model, tok, ds, reward = tiny_setup(seed=0)
    trainer = AllocGRPOTrainer(model=model, reward_funcs=reward, processing_class=tok, train_dataset=ds,
                               args=make_args(str(tmp_path), num_rounds=2))
    trainer.train()
    os.remove(os.path.join(tmp_path, "allocation", "summary.json"))
    trainer.create_model_card()
    card = open(os.path.join(tmp_path, "README.md"), encoding="utf-8").read()
    assert os.path.isfile(os.path.join(tmp_path, "allocation", "summary.json"))
    responses = trainer.allocator.counters["responses"]
    assert f"| responses spent | {responses} |" in card and responses > 0
