"""The README's promises that a test can hold: its quick start is examples/quickstart.py, which runs and trains;
its links point at files that exist; it stays short (at most 120 lines)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_the_quick_start_is_the_example_file():
    block = re.search(r"```python\n(.*?)```", readme(), re.S).group(1)
    with open(os.path.join(ROOT, "examples", "quickstart.py"), encoding="utf-8") as f:
        assert block in f.read()


def test_the_readme_is_short_and_its_links_exist():
    text = readme()
    assert len(text.splitlines()) <= 120
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, target)), target


@pytest.mark.slow
def test_the_quick_start_runs(tmp_path):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'budget_responses'" in done.stdout  # the allocation summary printed
    assert (tmp_path / "outputs" / "quickstart" / "allocation" / "summary.json").is_file()
