"""Prepare what the GPU check carries to the lent machine: .gpu/ in the repo root.

The GPU machine has torch 2.11.0+cu130, Python 3.12 and no package index; a
call may carry 64 MiB, the repository included. So the bundle holds (about 42 MB):
  up.tar.xz  the Python files of the pinned upstream CUDA wheel (no compiled
             kernels: they need the torch the wheel was built for, and weigh ~230 MB)
  ov.tar.xz  the files of our overlay CUDA wheel (`apply.py build --target
             cuda`) that differ from it, with the overlay's dist-info
  whl/       CPython 3.12 wheels of vLLM's requirements missing from that
             machine's image (names in DEVICE_HAS, from the device notes),
             less those the engine never imports (NOT_IMPORTED)
  model/     the tiny Llama the parity tests use
  eagle/     its EAGLE head (tests/support/tiny_eagle.py), for EAGLE windows
Usage (repo root): .tool-venv/bin/python benchmarks/gpu/prepare_bundle.py
then run benchmarks/gpu/device_check.sh there with `.gpu` carried.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / ".gpu"
CACHE = Path.home() / ".cache" / "vllm-overlay" / "downloads"
# Packages the device image already has (its notes list them); not carried.
DEVICE_HAS = set(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
    charset-normalizer click cloudpickle cuda-bindings cuda-core cuda-pathfinder cython einops filelock
    frozenlist fsspec grpcio h11 hf-xet httpcore httpx huggingface-hub idna jinja2 markdown-it-py markupsafe
    mdurl mpmath msgpack multidict networkx ninja numba numpy nvidia-ml-py opencv-python-headless packaging
    pillow pip prometheus-client propcache protobuf psutil py-cpuinfo pygments pyyaml regex requests rich
    safetensors sentencepiece setuptools shellingham six sympy tiktoken tokenizers torch torchaudio
    torchvision tqdm transformers triton typer typing-extensions urllib3 uvloop yarl zipp""".split()
)
# Requirements of the wheel that an offline `LLM` run never imports (measured 2026-12-04 on the
# 0.34.0 CPU base: sys.modules after a generate with sampling, logprobs, bad words and structured
# output): the serving API's and the Mistral tokenizer's. Not carried: they would not fit.
NOT_IMPORTED = {"anthropic", "cryptography", "mistral-common", "pycountry"}
# Compiled-kernel packages of the CUDA wheel that need torch 2.13 (not usable there).
KERNEL_PACKAGES = re.compile(
    r"^(torch|torchaudio|torchvision|torchcodec|pynvvideocodec|flashinfer|tilelang|nvidia-|nvtx"
    r"|fastsafetensors|instanttensor|quack|tokenspeed|humming|numba|cuda-|triton)"
)
PLATFORM = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
    *[a for n in ("2_17", "2_24", "2_27", "2_28", "2_31", "2_34", "2_35")
      for a in ("--platform", f"manylinux_{n}_x86_64")],
    "--platform", "manylinux2014_x86_64", "--platform", "any",
]  # fmt: skip


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _python_members(wheel: zipfile.ZipFile, skip: dict[str, int] | None = None) -> list[str]:
    """Python sources and data, no compiled kernels or C++ headers; optionally only changed ones."""
    names = [
        n
        for n in wheel.namelist()
        if not n.endswith((".so", "/vllm-rs", ".h", ".hpp", ".cuh", ".cu")) and "/include/" not in n
    ]
    return [n for n in names if skip is None or skip.get(n) != wheel.getinfo(n).CRC]


def _tar(path: Path, wheel: zipfile.ZipFile, names: list[str]) -> None:
    with tarfile.open(path, "w:xz") as tf:
        for n in names:
            data = wheel.read(n)
            info = tarfile.TarInfo(n)
            info.size, info.mode = len(data), 0o644
            tf.addfile(info, io.BytesIO(data))


def _requirements(wheel: zipfile.ZipFile) -> list[str]:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = [ln.split(": ", 1)[1] for ln in wheel.read(meta).decode().splitlines() if ln.startswith("Requires-Dist:")]
    return [r for r in reqs if "extra ==" not in r and not KERNEL_PACKAGES.match(_norm(re.split(r"[ <>=!;\[]", r)[0]))]


def _missing_wheels(reqs: list[str], dest: Path) -> None:
    """Resolve the requirements for CPython 3.12 and download those the device lacks."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--report", report,
               "--target", Path(tmp) / "t", *PLATFORM, *reqs]  # fmt: skip
        subprocess.run(cmd, check=True)
        resolved = json.loads(report.read_text())["install"]
    pins = [
        f"{r['metadata']['name']}=={r['metadata']['version']}"
        for r in resolved
        if _norm(r["metadata"]["name"]) not in DEVICE_HAS | NOT_IMPORTED
        and not KERNEL_PACKAGES.match(_norm(r["metadata"]["name"]))
    ]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", dest, *PLATFORM, *pins], check=True
    )


def main() -> None:
    lock = tomllib.loads((ROOT / "upstream.lock").read_text())
    if tuple(int(x) for x in lock["upstream"]["version"].split(".")[:2]) < (0, 34):
        sys.exit("device_check.py targets Model Runner V2 as vLLM 0.34.0 ships it; the pin is older")
    subprocess.run(
        [sys.executable, ROOT / "apply.py", "build", "-q", "--target", "cuda", "--dist", ROOT / "dist"], check=True
    )
    overlay_path = max((ROOT / "dist").glob("vllm-*+ovl*.whl"), key=lambda p: p.stat().st_mtime)
    shutil.rmtree(BUNDLE, ignore_errors=True)
    (BUNDLE / "whl").mkdir(parents=True)
    with zipfile.ZipFile(CACHE / lock["wheels"]["cuda"]["filename"]) as up, zipfile.ZipFile(overlay_path) as ov:
        _tar(BUNDLE / "up.tar.xz", up, _python_members(up))
        _tar(BUNDLE / "ov.tar.xz", ov, _python_members(ov, {n: up.getinfo(n).CRC for n in up.namelist()}))
        _missing_wheels(_requirements(up), BUNDLE / "whl")
    for name, built in (("model", "tiny-llama"), ("eagle", "tiny-llama-eagle")):
        if not (ROOT / "build" / "models" / built).is_dir():
            sys.exit(f"build/models/{built} is missing: the suite's spec-decode tests build it (venvs.draft_models)")
        shutil.copytree(ROOT / "build" / "models" / built, BUNDLE / name)
    size = sum(p.stat().st_size for p in BUNDLE.rglob("*") if p.is_file())
    print(f"bundle {BUNDLE}: {size / 2**20:.1f} MiB from {overlay_path.name}")


if __name__ == "__main__":
    main()
