# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Identify a vllm-overlay build: which patch series this installation carries.

The overlay's wheel builder writes ``vllm_overlay.json`` into the wheel's
``.dist-info`` (upstream version and commit, series hash, each patch). This
module reads it so that ``vllm --version``, ``vllm collect-env`` and the
engine's startup log name the overlay. On an unpatched installation, or in a
source tree, there is no such file and nothing changes.
"""

import functools
import json
from importlib.metadata import (
    PackageNotFoundError,
    distribution,
    packages_distributions,
)
from typing import Any

from vllm.version import installed_version

PROVENANCE_FILE = "vllm_overlay.json"


@functools.cache
def overlay_provenance() -> dict[str, Any] | None:
    """The provenance record of the installed overlay build, if any."""
    for name in packages_distributions().get("vllm", []):
        try:
            text = distribution(name).read_text(PROVENANCE_FILE)
        except PackageNotFoundError:
            continue
        if text:
            return json.loads(text)
    return None


def describe_overlay() -> str | None:
    """One line naming the overlay version, series hash and upstream base."""
    info = overlay_provenance()
    if info is None:
        return None
    upstream = info["upstream"]
    return (
        f"vllm-overlay {info['overlay_version']}, "
        f"series {info['series_sha256'][:12]} ({len(info['patches'])} patches), "
        f"upstream vLLM {upstream['version']} ({upstream['commit']})"
    )


def version_line() -> str:
    """``vllm --version``: the installed version, then the overlay if any.

    The version stays the first word, so scripts that read it keep working.
    """
    overlay = describe_overlay()
    version = installed_version()
    return f"{version} ({overlay})" if overlay else version
