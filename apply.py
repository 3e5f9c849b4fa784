#!/usr/bin/env python3
"""vllm-overlay: build a vLLM wheel with this repository's patch series applied.

Run ``python3 apply.py --help``. The first call bootstraps the tool's own
environment (.tool-venv); nothing needs installing by hand. See README.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overlay.bootstrap import ensure_tool_env  # noqa: E402

if __name__ == "__main__":
    ensure_tool_env(sys.argv[1:])
    from overlay.cli import main

    sys.exit(main(sys.argv[1:]))
