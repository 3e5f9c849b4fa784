"""vllm-overlay: an ordered patch series over a pinned upstream vLLM, built into a wheel."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
__version__ = (ROOT / "VERSION").read_text().strip()
