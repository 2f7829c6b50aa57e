#!/usr/bin/env python
"""Start trl-alloc's vLLM server (same as the ``trl-alloc-serve`` entry point).

    python scripts/serve.py --model MODEL_DIR --port 8000

See ``trl_alloc/serving/cli.py`` for the options; unknown arguments go to vLLM unchanged.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from trl_alloc.serving.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
