"""build on a synthetic upstream: valid wheel, provenance, refusals, atomic output."""

import json
import os
import signal
import subprocess
import sys
import venv
import zipfile

import pytest
from support.cli import run_json, run_tool
from support.synthetic import ENGINE, SOURCE, file_patch

from overlay import errors

EDITED = ENGINE.replace("return x + 20\n", "return x + 2000\n")


def _series(upstream):
    upstream.add_patch("0001-engine.patch", file_patch("vllm/engine.py", ENGINE, EDITED, "engine: edit"))
    for path, text in (("vllm/new.py", "X = 1\n"), ("tests/test_new.py", "def test(): pass\n")):
        (upstream.root / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (upstream.root / "src" / path).write_text(text)  # our files: the module layer


def _build(upstream, tmp_path, *extra):
    return run_json("build", *upstream.args(), "--target", "cpu", "--dist", str(tmp_path / "dist"), *extra)


def test_wheel_has_patched_files_provenance_and_valid_record(upstream, tmp_path):
    from installer.sources import WheelFile

    _series(upstream)
    code, out = _build(upstream, tmp_path)
    assert code == errors.OK, out
    wheel = tmp_path / "dist" / os.path.basename(out["wheel"])
    assert wheel.name.startswith("fakevllm-1.0.0+ovl.") and wheel.name.endswith("-py3-none-any.whl")
    with WheelFile.open(wheel) as w:
        w.validate_record(validate_contents=True)
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(upstream.wheel) as orig:
        names = z.namelist()
        assert z.read("vllm/engine.py").decode() == EDITED
        assert z.read("vllm/new.py") == b"X = 1\n"
        assert "tests/test_new.py" not in names  # not part of the package
        # untouched members are the binary wheel's own, byte for byte
        for name in ("vllm/_C.abi3.so", "vllm/platforms/__init__.py", "vllm/__init__.py"):
            assert z.read(name) == orig.read(name)
            assert z.getinfo(name).CRC == orig.getinfo(name).CRC
        info = f"fakevllm-{out['version']}.dist-info"
        assert f"Version: {out['version']}" in z.read(f"{info}/METADATA").decode()
        prov = json.loads(z.read(f"{info}/vllm_overlay.json"))
    assert prov["upstream"]["version"] == "1.0.0"
    assert prov["upstream"]["commit"] == "abcdef012"
    assert [p["name"] for p in prov["patches"]] == ["0001-engine.patch"]
    assert [m["path"] for m in prov["modules"]] == ["src/tests/test_new.py", "src/vllm/new.py"]
    assert prov["files"]["added"] == ["tests/test_new.py", "vllm/new.py"]
    assert prov["series_sha256"].startswith(out["version"].rsplit(".s", 1)[1])
    assert prov["files"]["modified"] == ["vllm/engine.py"]


def test_wheel_installs_with_pip(upstream, tmp_path):
    _series(upstream)
    code, out = _build(upstream, tmp_path)
    assert code == errors.OK, out
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", out["wheel"]], check=True)
    got = subprocess.run(
        [py, "-c", "import vllm.engine, vllm.new; print(vllm.engine.step_20(0), vllm.new.X)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert got.stdout.split() == ["2000", "1"]
    check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def test_build_is_reproducible(upstream, tmp_path):
    _series(upstream)
    _, a = _build(upstream, tmp_path / "a")
    _, b = _build(upstream, tmp_path / "b")
    assert open(a["wheel"], "rb").read() == open(b["wheel"], "rb").read()


@pytest.mark.parametrize("path", ["csrc/kernel.cpp", "setup.py", "vllm/platforms/__init__.py", "vllm/_version.py"])
def test_build_refuses_native_and_build_specific_files(upstream, tmp_path, path):
    upstream.add_patch("0001-x.patch", file_patch(path, SOURCE[path], SOURCE[path] + "// x\n", "touch"))
    proc = run_tool("build", *upstream.args(), "--target", "cpu", "--dist", str(tmp_path / "dist"))
    assert proc.returncode == errors.BUILD_REFUSED, proc.stderr
    assert path in proc.stderr
    assert not list((tmp_path / "dist").glob("*")) if (tmp_path / "dist").exists() else True


def test_failed_patch_builds_nothing(upstream, tmp_path):
    upstream.add_patch("0001-gone.patch", file_patch("vllm/gone.py", "A = 1\n", "A = 2\n", "gone"))
    proc = run_tool("build", *upstream.args(), "--target", "cpu", "--dist", str(tmp_path / "dist"))
    assert proc.returncode == errors.PATCH_FAILED
    assert "0001-gone.patch" in proc.stdout
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def test_interrupted_build_leaves_nothing(upstream, tmp_path, monkeypatch):
    """SIGTERM in the middle of writing the wheel: no file, partial or final, remains."""
    from overlay import build, fetch, lock, series, wheel

    _series(upstream)
    real_write = wheel._write

    def write_then_die(*args, **kwargs):
        row = real_write(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill` or a CI timeout would
        return row

    monkeypatch.setattr(wheel, "_write", write_then_die)
    dist = tmp_path / "dist"
    with pytest.raises(KeyboardInterrupt):
        build.build(
            lock.load(upstream.root / "upstream.lock"),
            series.load(upstream.series),
            fetch.Cache(upstream.cache),
            "cpu",
            dist,
            quiet=True,
        )
    assert list(dist.iterdir()) == []


def test_unknown_target_is_clear(upstream, tmp_path):
    lock = upstream.root / "upstream.lock"
    proc = run_tool("build", *upstream.args(), "--target", "cuda", "--dist", str(tmp_path / "dist"))
    assert proc.returncode == errors.BAD_INPUT
    assert "no binary wheel pinned for target 'cuda'" in proc.stderr
    assert lock.exists()


def test_help_explains_commands():
    proc = subprocess.run(
        [sys.executable, "apply.py", "--help"],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    for word in ("build", "fetch", "check", "apply", "export", "test", "exit codes"):
        assert word in proc.stdout


def test_copy_member_raw_keeps_a_member_byte_for_byte(tmp_path):
    """The wheel writer's one use of zipfile internals: a member copied without recompressing."""
    from overlay.wheel import copy_member_raw

    src_path, out_path = tmp_path / "src.zip", tmp_path / "out.zip"
    with zipfile.ZipFile(src_path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.txt", "alpha " * 1000)
        z.writestr("b.bin", bytes(range(256)) * 40)
    with zipfile.ZipFile(src_path) as src, src_path.open("rb") as raw, zipfile.ZipFile(out_path, "w") as out:
        infos = src.infolist()
        copy_member_raw(out, infos[1], raw, src.start_dir - infos[1].header_offset)
        out.writestr("c.txt", "written after the copy")
    with zipfile.ZipFile(out_path) as out, zipfile.ZipFile(src_path) as src:
        assert out.testzip() is None and out.namelist() == ["b.bin", "c.txt"]
        assert out.read("b.bin") == src.read("b.bin")
        copied, orig = out.getinfo("b.bin"), src.getinfo("b.bin")
        assert (copied.CRC, copied.compress_size, copied.compress_type) == (
            orig.CRC,
            orig.compress_size,
            orig.compress_type,
        )
