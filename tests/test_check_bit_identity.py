"""scripts/check_bit_identity.py: what it compares (the runs themselves take minutes: run the script)."""

import importlib.util
import json

from helpers import ROOT

spec = importlib.util.spec_from_file_location("check_bit_identity", ROOT / "scripts" / "check_bit_identity.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def write_run(folder, weights, lines):
    (folder / "allocation").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "allocation" / "rounds.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_seconds_do_not_count_and_everything_else_does(tmp_path):
    line = {"round": 0, "groups": [3, 1], "allocator_s": 0.01, "events": [["submit", 3, 0]],
            "nested": {"round_s": 2.0, "time_share": 0.1, "peak_memory_gb": 1.0, "kept": 1}}
    write_run(tmp_path / "a", b"w", [line])
    write_run(tmp_path / "b", b"w", [{**line, "allocator_s": 9.9, "nested": {**line["nested"], "round_s": 7.0}}])
    write_run(tmp_path / "c", b"w", [{**line, "groups": [1, 3]}])
    write_run(tmp_path / "d", b"v", [line])
    a, b, c, d = (check.digest(str(tmp_path / x)) for x in "abcd")
    assert a == b  # only seconds differ
    assert a["rounds"] != c["rounds"] and a["weights"] == c["weights"]  # another decision
    assert a["weights"] != d["weights"] and a["rounds"] == d["rounds"]  # other weights
    assert check.without_seconds(line)["nested"] == {"kept": 1}


def test_a_plans_virtual_seconds_count_and_its_wall_clock_does_not():
    plan = {"rows": [{"engine_s": 12.5, "train_s": 3.0, "alloc_ms": [0.2], "scheduler_ms_per_round": 0.1, "egr": 0.4}]}
    assert check.without_seconds(plan, check.PLAN_CLOCK, False) == {"rows": [{"engine_s": 12.5, "train_s": 3.0,
                                                                              "egr": 0.4}]}
