"""Fetching: checksums verified, cache reused offline, downloads through a local index."""

import hashlib
import http.server
import shutil
import threading
from pathlib import Path

import pytest
from support.cli import run_json, run_tool

from overlay import errors


def test_checksum_mismatch_deletes_file_and_shows_both_hashes(upstream):
    cached = upstream.cache / "downloads" / upstream.wheel.name
    cached.write_bytes(b"not the wheel")
    bad = hashlib.sha256(b"not the wheel").hexdigest()
    proc = run_tool("fetch", *upstream.args(), "--target", "cpu")
    assert proc.returncode == errors.FETCH_FAILED
    assert "checksum mismatch" in proc.stderr
    assert bad in proc.stderr
    assert hashlib.sha256(upstream.wheel.read_bytes()).hexdigest() in proc.stderr
    assert not cached.exists()


def test_cached_artifacts_need_no_network(upstream):
    # An index address nothing listens on: any download attempt would fail.
    env = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple/", "PIP_NO_INDEX": "1"}
    code, out = run_json("fetch", *upstream.args(), "--target", "cpu", env=env)
    assert code == errors.OK, out
    assert Path(out["wheels"]["cpu"]).name == upstream.wheel.name


class _Index:
    """A PEP 503 simple index on 127.0.0.1 serving the synthetic artifacts."""

    def __init__(self, root: Path, files: list[Path], project: str):
        pages = root / "simple" / project
        pages.mkdir(parents=True)
        links = []
        for f in files:
            shutil.copy(f, root / f.name)
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
            links.append(f'<a href="../../{f.name}#sha256={digest}">{f.name}</a>')
        (pages / "index.html").write_text("<html><body>" + "\n".join(links) + "</body></html>")
        handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def index(tmp_path, upstream):
    idx = _Index(tmp_path / "index", [upstream.sdist, upstream.wheel], "fakevllm")
    yield idx
    idx.close()


def test_download_from_index_then_offline(upstream, index):
    shutil.rmtree(upstream.cache)
    env = {"PIP_INDEX_URL": index.url, "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": "/dev/null"}
    code, out = run_json("fetch", *upstream.args(), "--target", "cpu", env=env)
    assert code == errors.OK, out
    assert (upstream.cache / "downloads" / upstream.sdist.name).read_bytes() == upstream.sdist.read_bytes()
    assert (upstream.cache / "downloads" / upstream.wheel.name).read_bytes() == upstream.wheel.read_bytes()
    index.close()
    code, out = run_json("fetch", *upstream.args(), "--target", "cpu", env=env)
    assert code == errors.OK, out


def test_registry_file_differing_from_lock_is_refused(upstream, index, tmp_path):
    shutil.rmtree(upstream.cache)
    lock = upstream.root / "upstream.lock"
    real = hashlib.sha256(upstream.wheel.read_bytes()).hexdigest()
    lock.write_text(lock.read_text().replace(real, "0" * 64))
    env = {"PIP_INDEX_URL": index.url, "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": "/dev/null"}
    proc = run_tool("fetch", *upstream.args(), "--target", "cpu", env=env)
    assert proc.returncode == errors.FETCH_FAILED
    assert "0" * 64 in proc.stderr and real in proc.stderr
    assert not (upstream.cache / "downloads" / upstream.wheel.name).exists()
    assert not list((upstream.cache / "downloads").glob(".part-*"))
