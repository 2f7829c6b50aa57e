"""The documentation site builds with `mkdocs build --strict` (mkdocs.yml): a broken link or anchor, a page missing
from the nav, or an API reference entry that no longer resolves fails this test."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("AllocGRPOConfig", "AllocDAPOTrainer", "rollout_max_inflight", "max_staleness", "tau_low"):
        assert name in api, name  # every field with its help text, generated from the declarations
