"""Which of our modules a tree gets: the families of contract.toml whose runner it has.

Our modules serve different upstream runners (Model Runner V1 up to vLLM
0.33.0, Model Runner V2 from 0.34.0 on), and one src/ serves every supported
release. ``contract.toml`` groups them in ``[families]`` (overlay/contract.py);
every command that lays src/ into a tree (check, build, apply, rebase, bisect)
first fits the series to that tree's upstream: a family whose runner file the
tree lacks is left out of the module layer. ``export`` leaves those families'
files in src/ as they are.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from overlay.contract import CONTRACT_FILE, Reader, load, tree_reader
from overlay.modules import SRC_DIR, load_modules
from overlay.series import Series
from overlay.tree import UPSTREAM_TAG


def left_out(series_path: Path, read: Reader) -> frozenset[str]:
    """src/ paths of the families whose runner the tree ``read`` reads lacks."""
    contract = load(series_path.parent / CONTRACT_FILE)
    absent = contract.absent(read) if contract is not None else ()
    if not absent:
        return frozenset()
    ours = load_modules(series_path.parent / SRC_DIR)
    return frozenset(m.path for m in ours if any(family.holds(m.path) for family in absent))


def fit(series: Series, repo: Path, ref: str = UPSTREAM_TAG) -> Series:
    """``series`` with only the modules the upstream at ``ref`` of ``repo`` takes."""
    return dataclasses.replace(series, left_out=left_out(series.path, tree_reader(repo, ref)))
