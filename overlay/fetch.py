"""Fetch upstream artifacts into the cache and verify them against the lock.

A cached file whose sha256 matches is used as is, so a second run needs no
network. A file whose sha256 does not match is deleted and the run stops with
both hashes shown.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from overlay.errors import FetchError, InputError
from overlay.gitcmd import git
from overlay.lock import Artifact, GitSource

CACHE_ENV = "VLLM_OVERLAY_CACHE"


@dataclass(frozen=True)
class Cache:
    root: Path

    @classmethod
    def locate(cls, explicit: str | None) -> Cache:
        root = explicit or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "vllm-overlay"
        return cls(Path(root).expanduser().resolve())

    def dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verify(path: Path, art: Artifact) -> None:
    """Raise FetchError (deleting ``path``) unless it has the pinned sha256."""
    actual = sha256_file(path)
    if actual != art.sha256:
        path.unlink()
        raise FetchError(
            f"checksum mismatch for {art.filename}: the file was deleted\n"
            f"  expected sha256 {art.sha256} (lock)\n"
            f"  actual   sha256 {actual}"
        )


def fetch_artifact(art: Artifact, cache: Cache, *, quiet: bool = False) -> Path:
    """Return the cached, verified path of ``art``, downloading it if needed."""
    downloads = cache.dir("downloads")
    dest = downloads / art.filename
    if dest.exists():
        verify(dest, art)
        return dest
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".part-") as tmp:
        if art.url:
            got = download_url(art.url, Path(tmp) / art.filename, quiet=quiet)
        elif art.filename.endswith(".whl"):
            got = _pip_download_wheel(art, Path(tmp), quiet=quiet)
        else:
            got = _download_from_index(art, Path(tmp), quiet=quiet)
        verify(got, art)
        os.replace(got, dest)
    return dest


def download_url(url: str, dest: Path, *, quiet: bool = False) -> Path:
    """Download ``url`` (http(s):// or file://) to ``dest``; FetchError on failure."""
    import urllib.error
    import urllib.request

    if not quiet:
        print(f"downloading {url}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, dest.open("wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"download of {url} failed: {e}") from None
    return dest


def _index_url() -> str | None:
    # Honour pip's own setting so a mirror or a local test index works alike.
    return os.environ.get("PIP_INDEX_URL") or None


def _download_from_index(art: Artifact, tmp: Path, *, quiet: bool) -> Path:
    """Download a file by name from the simple index (pip cannot fetch an sdist
    without building its metadata, which needs vLLM's build toolchain)."""
    from pypi_simple import DigestMismatchError, NoSuchProjectError, PyPISimple, tqdm_progress_factory

    endpoint = _index_url()
    kwargs = {"endpoint": endpoint} if endpoint else {}
    dest = tmp / art.filename
    try:
        with PyPISimple(**kwargs) as client:
            page = client.get_project_page(art.distribution)
            matches = [p for p in page.packages if p.filename == art.filename]
            if not matches:
                raise FetchError(f"{art.filename} is not in the index's file list for {art.distribution!r}")
            progress = None if quiet else tqdm_progress_factory(desc=art.filename, file=sys.stderr)
            client.download_package(matches[0], dest, verify=True, progress=progress)
    except NoSuchProjectError:
        raise FetchError(f"the index has no project {art.distribution!r}") from None
    except DigestMismatchError as e:
        raise FetchError(
            f"checksum mismatch for {art.filename} against the index's own digest: "
            f"expected {e.expected_digest}, got {e.actual_digest}"
        ) from None
    except OSError as e:  # network errors from requests are OSErrors
        raise FetchError(f"download of {art.filename} failed: {e}") from None
    return dest


def _pip_download_wheel(art: Artifact, tmp: Path, *, quiet: bool) -> Path:
    """``pip download --no-deps`` of exactly the pinned wheel, for any host."""
    name, version, _build, tags = parse_wheel_filename(art.filename)
    tag = sorted(tags, key=str)[0]
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--platform", tag.platform, "--implementation", tag.interpreter[:2],
        "--abi", tag.abi, "--python-version", f"{sys.version_info[0]}{sys.version_info[1]}",
        "-d", str(tmp), f"{art.distribution}=={version}",
    ]  # fmt: skip
    if quiet:
        cmd.append("--quiet")
    proc = subprocess.run(cmd, stdout=sys.stderr if not quiet else subprocess.DEVNULL)
    got = tmp / art.filename
    if proc.returncode != 0 or not got.exists():
        found = ", ".join(p.name for p in tmp.iterdir()) or "nothing"
        raise FetchError(
            f"pip download of {art.distribution}=={version} did not produce "
            f"{art.filename} (exit {proc.returncode}; got {found})"
        )
    return got


def fetch_git(source: GitSource, cache: Cache, *, quiet: bool = False) -> tuple[Path, str]:
    """Clone (or update) ``source.url`` into a bare repo in the cache; return (repo, full commit).

    The git command line, as everywhere else in the tool: one clone per URL, a
    fetch of branches and tags only when the commit is not there yet.
    """
    key = hashlib.sha256(source.url.encode()).hexdigest()[:16]
    path = cache.dir("git") / f"{key}.git"
    if not path.exists():
        tmp = path.with_name(path.name + f".part-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        if not quiet:
            print(f"cloning {source.url}", file=sys.stderr)
        _git_fetching(path.parent, source.url, "clone", "--quiet", "--bare", source.url, str(tmp))
        os.replace(tmp, path)
    commit = _resolve_commit(path, source.commit)
    if commit is None:
        _git_fetching(path, source.url, "fetch", "--quiet", "--tags", source.url, "+refs/heads/*:refs/heads/*")
        commit = _resolve_commit(path, source.commit)
    if commit is None:
        raise InputError(f"commit {source.commit} not found in {source.url}")
    return path, commit


def _resolve_commit(repo: Path, rev: str) -> str | None:
    proc = git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _git_fetching(cwd: Path, url: str, *args: str) -> None:
    proc = git(cwd, *args, check=False)
    if proc.returncode != 0:
        raise FetchError(f"git could not fetch {url}: {proc.stderr.strip()}")
