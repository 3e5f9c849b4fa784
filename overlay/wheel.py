"""Lay the patched Python files over the pinned binary wheel.

The result keeps the binary wheel's distribution name and takes the version
``<upstream>+ovl.<overlay version>.s<series hash>``. Unchanged members are
copied byte for byte (compressed data included), so a build costs about one
copy of the wheel; only patched files and the renamed .dist-info are written
anew. RECORD keeps upstream's hashes for unchanged members and hashes the
rest. The wheel appears in its folder atomically, or not at all.
"""

from __future__ import annotations

import base64
import copy
import csv
import hashlib
import io
import json
import os
import re
import signal
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from packaging.utils import canonicalize_name, parse_wheel_filename

from overlay.errors import BuildRefused

PROVENANCE = "vllm_overlay.json"
# Reproducible timestamps for the members we write.
ZIP_DATE = (1980, 1, 1, 0, 0, 0)

# Files a precompiled wheel cannot take from a patch: native sources and
# build inputs are compiled into the binaries, and these Python files differ
# per build (CPU vs CUDA), so each wheel must keep its own copy.
BUILD_SPECIFIC = frozenset({"vllm/platforms/__init__.py", "vllm/utils/cpu_triton_utils.py", "vllm/_version.py"})
NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".cmake", ".so")
BUILD_FILES = frozenset({"CMakeLists.txt", "setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in"})
BUILD_DIRS = ("csrc/", "cmake/", "requirements/", "rust/")


@dataclass(frozen=True)
class Change:
    status: str  # A(dded), M(odified), D(eleted)
    path: str
    data: bytes | None  # new content (None when deleted)
    base: bytes | None  # upstream content (None when added)
    mode: int = 0o100644


def refusal(path: str) -> str | None:
    """Why a patch touching ``path`` cannot be laid over a binary wheel, or None."""
    if path in BUILD_SPECIFIC:
        return "build-specific file: each binary wheel keeps its own copy"
    name = path.rsplit("/", 1)[-1]
    if path.endswith(NATIVE_SUFFIXES) or name in BUILD_FILES or path.startswith(BUILD_DIRS):
        return "native source or build input: needs a from-source build, not a precompiled wheel"
    return None


def local_version(base: str, overlay_version: str, series_sha: str) -> str:
    # 's' keeps the hash one alphanumeric segment (PEP 440 would strip leading zeros).
    return f"{base}+ovl.{overlay_version}.s{series_sha[:8]}"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def build_wheel(
    src_wheel: Path,
    distribution: str,
    version: str,
    changes: list[Change],
    provenance: dict,
    dist_dir: Path,
) -> Path:
    """Write the overlay wheel into ``dist_dir`` atomically; return its path."""
    name, base_version, _build, _tags = parse_wheel_filename(src_wheel.name)
    if name != canonicalize_name(distribution):
        raise BuildRefused(f"{src_wheel.name} is not a wheel of {distribution}")
    tag = src_wheel.name.removesuffix(".whl").split("-", 2)[2]
    wheel_name = re.sub(r"[-_.]+", "_", distribution).lower()
    out_name = f"{wheel_name}-{version}-{tag}.whl"
    old_info = f"{wheel_name}-{base_version}.dist-info/"
    new_info = f"{wheel_name}-{version}.dist-info/"

    dist_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src_wheel) as src:
        members = {i.filename: i for i in src.infolist()}
        _check_overlay(changes, members, src)
        by_path = {c.path: c for c in changes}
        record = _read_record(src, old_info)
        with _atomic_output(dist_dir / out_name) as tmp, open(src_wheel, "rb") as raw:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
                rows = _copy_unchanged(src, raw, out, by_path, old_info, record)
                for change in changes:
                    if change.data is not None and _packaged(change.path, members):
                        rows.append(_write(out, change.path, change.data, change.mode))
                rows += _write_dist_info(src, out, old_info, new_info, version, provenance)
                record_name = new_info + "RECORD"
                rows.append([record_name, "", ""])
                buf = io.StringIO()
                csv.writer(buf, lineterminator="\n").writerows(rows)
                _write(out, record_name, buf.getvalue().encode(), 0o100644)
    return dist_dir / out_name


def _packaged(path: str, members: dict[str, zipfile.ZipInfo]) -> bool:
    """Whether ``path`` of the source tree belongs inside the wheel."""
    tops = {m.split("/", 1)[0] for m in members if ".dist-info/" not in m and ".data/" not in m}
    return path in members or path.split("/", 1)[0] in tops


def _check_overlay(changes: list[Change], members: dict, src: zipfile.ZipFile) -> None:
    for change in changes:
        if reason := refusal(change.path):
            raise BuildRefused(f"the series changes {change.path}: {reason}")
    # The binary wheel must have been built from the pinned source, or laying
    # patched files over it would mix two versions of vLLM.
    for change in changes:
        if change.status != "A" and change.path in members and change.base is not None:
            if src.read(change.path) != change.base:
                raise BuildRefused(
                    f"the wheel's {change.path} differs from the pinned source's: "
                    "the binary wheel was not built from this source"
                )


def _read_record(src: zipfile.ZipFile, info_dir: str) -> dict[str, list[str]]:
    try:
        text = src.read(info_dir + "RECORD").decode()
    except KeyError:
        raise BuildRefused(f"the wheel has no {info_dir}RECORD") from None
    return {row[0]: row for row in csv.reader(io.StringIO(text)) if row}


def _copy_unchanged(src, raw, out: zipfile.ZipFile, by_path, old_info, record) -> list[list[str]]:
    """Copy every member no change touches, compressed bytes and all."""
    infos = sorted(src.infolist(), key=lambda i: i.header_offset)
    ends = [i.header_offset for i in infos[1:]] + [src.start_dir]
    rows = []
    for info, end in zip(infos, ends, strict=False):
        if info.filename in by_path or info.filename.startswith(old_info):
            continue
        copy_member_raw(out, info, raw, end - info.header_offset)
        rows.append(record.get(info.filename) or _missing_row(info.filename))
    return rows


def copy_member_raw(out: zipfile.ZipFile, info: zipfile.ZipInfo, raw: BinaryIO, length: int) -> None:
    """Append a member to ``out`` as it is: its local header and compressed data, ``length``
    bytes of ``raw`` (the source archive) from ``info.header_offset``.

    zipfile has no public way to copy a member without decompressing and
    recompressing it (which would change its bytes and cost the build seconds),
    so this is the one place the tool uses zipfile's internals: ``fp``,
    ``filelist``, ``NameToInfo`` and ``start_dir`` of a ZipFile open for
    writing, as ``ZipFile.write`` itself updates them. ``out`` must not be
    written by anything else meanwhile. Tested in tests/tool/test_build.py.
    """
    new = copy.copy(info)
    new.header_offset = out.fp.tell()
    raw.seek(info.header_offset)
    remaining = length
    while remaining:
        chunk = raw.read(min(remaining, 1 << 22))
        if not chunk:
            raise BuildRefused(f"{info.filename}: the wheel ends inside this member")
        out.fp.write(chunk)
        remaining -= len(chunk)
    out.filelist.append(new)
    out.NameToInfo[new.filename] = new
    out.start_dir = out.fp.tell()


def _missing_row(name: str) -> list[str]:
    raise BuildRefused(f"the wheel's RECORD has no entry for {name}")


def _write(out: zipfile.ZipFile, name: str, data: bytes, mode: int) -> list[str]:
    info = zipfile.ZipInfo(name, ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (mode & 0o777 | 0o100000) << 16
    out.writestr(info, data)
    return [name, _record_hash(data), str(len(data))]


def _write_dist_info(src, out, old_info, new_info, version, provenance) -> list[list[str]]:
    rows = []
    for info in src.infolist():
        name = info.filename
        if not name.startswith(old_info) or name == old_info + "RECORD":
            continue
        data = src.read(name)
        if name == old_info + "METADATA":
            data = re.sub(rb"(?m)^Version: .*$", f"Version: {version}".encode(), data, count=1)
        rows.append(_write(out, new_info + name[len(old_info) :], data, info.external_attr >> 16))
    body = json.dumps(provenance, indent=2, sort_keys=True).encode() + b"\n"
    rows.append(_write(out, new_info + PROVENANCE, body, 0o100644))
    return rows


@contextmanager
def _atomic_output(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; rename it into place on success.

    On any failure, and on SIGTERM, the temporary file is removed, so a failed
    or interrupted build leaves no file behind.
    """
    for stale in final.parent.glob(".overlay-build-*.whl"):
        stale.unlink(missing_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=".overlay-build-", suffix=".whl")
    os.close(fd)
    tmp = Path(tmp_name)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    finally:
        signal.signal(signal.SIGTERM, previous)
        tmp.unlink(missing_ok=True)
