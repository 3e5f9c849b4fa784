"""README's current figures, from the result files: the table and the plot.

benchmarks/figures.toml declares each row of README.md's "Current figures" table: its label,
the result files it rests on, the values it reads from them and the format strings that show
them: the distance from the forward-only limit (``limit``), the ratio to upstream (``text``)
and the host the figures came from (``host``: CPU model, ISA, cores, the forward's time). This
writes the README region between the figures markers (the table, then the plot line) and
redraws the plot (figures.toml's [plot]) from its result file when matplotlib is importable (it
says so and leaves the PNG as it is otherwise). --check writes nothing and exits 1 when
README's region differs from what it would write.

  python3 benchmarks/bench.py figures           # rewrite README's region (and the plot)
  python3 benchmarks/bench.py figures --check   # README matches the results? (exit 1 if not)

A value is [file, key, key, ...] (a path into that file's JSON), or a table
{files = [...], path = [key, ...], op = "min" | "max" | "median"}: the value at ``path`` in
each file (a number or a list of numbers), all of them together, reduced by ``op``. The host
string may also use {cpu}, {cores} and {isa}: the row's files' ``host`` fields where every file
records the same one; the row's ``isa`` gives the ISA where the files do not record it. The
date column lists the dates of the row's files; a row without files gives its ``date`` as text.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tomllib
from pathlib import Path

from harness import offline, results
from harness.paths import BENCHMARKS, RESULTS, ROOT

HELP = "rewrite README's current-figures table (and its plot) from benchmarks/results/ (--check: compare only)"
CONFIG = BENCHMARKS / "figures.toml"
README = ROOT / "README.md"
BEGIN, END = "<!-- figures:begin", "<!-- figures:end -->"
OPS = {"min": min, "max": max, "median": statistics.median}


class FiguresError(Exception):
    """figures.toml, a result file or README's markers are not as this needs them."""


def lookup(data, path: list, where: str):
    for key in path:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            raise FiguresError(f"{where}: no {key!r} (path {path})") from None
    return data


def value(spec, files: dict[str, dict], where: str):
    """One row value from the row's loaded result files (see the module docstring)."""
    if isinstance(spec, list):
        name, *path = spec
        if name not in files:
            raise FiguresError(f"{where}: {name} is not among the row's files")
        return lookup(files[name], path, f"{where} ({name})")
    names = spec.get("files") or [spec["file"]]
    numbers: list[float] = []
    for name in names:
        if name not in files:
            raise FiguresError(f"{where}: {name} is not among the row's files")
        got = lookup(files[name], spec["path"], f"{where} ({name})")
        numbers.extend(got if isinstance(got, list) else [got])
    op = spec.get("op")
    if op not in OPS:
        raise FiguresError(f"{where}: op {op!r} is not one of {sorted(OPS)}")
    return OPS[op](numbers)


HOST_FIELDS = ("cpu", "cores", "isa")
CELLS = ("what", "limit", "text", "host", "date", "shown")  # the columns, in order


def host_facts(row: dict, files: dict[str, dict], where: str) -> dict:
    """{cpu}, {cores} and {isa} for the row's host string: what every one of its files records alike."""
    facts = {}
    for field in HOST_FIELDS:
        seen = {d["host"].get(field) for d in files.values()}
        if len(seen) == 1 and None not in seen:
            facts[field] = seen.pop()
    if "isa" in row:
        if facts.get("isa", row["isa"]) != row["isa"]:
            raise FiguresError(f"{where}: isa {row['isa']!r}, but its files record {facts['isa']!r}")
        facts["isa"] = row["isa"]
    return facts


def formatted(template: str, values: dict, where: str) -> str:
    try:
        return template.format(**values)
    except KeyError as e:
        why = (" (not one value in the row's files' host fields: give it in the row, or write the host out)"
               if e.args[0] in HOST_FIELDS else "")  # fmt: skip
        raise FiguresError(f"{where}: {template!r}: no value {e.args[0]!r}{why}") from None
    except (ValueError, IndexError) as e:
        raise FiguresError(f"{where}: {template!r}: {e!r}") from None


def row_cells(row: dict, folder: Path) -> list[str]:
    where = f"figures.toml row {row['what']!r}"
    if "host" not in row:
        raise FiguresError(f"{where}: no host (every figure names the host it came from)")
    files = {name: results.read(folder / name) for name in row.get("files", [])}
    values = {name: value(spec, files, f"{where}, value {name}") for name, spec in row.get("values", {}).items()}
    cells = {
        "what": row["what"],
        "limit": formatted(row.get("limit", "-"), values, f"{where}, limit"),
        "text": formatted(row["text"], values, f"{where}, text"),
        "host": formatted(row["host"], host_facts(row, files, where) | values, f"{where}, host"),
    }
    if files:
        undated = [name for name, d in files.items() if d["date"] is None]
        if undated:
            raise FiguresError(f"{where}: {', '.join(undated)} has no date")
        cells["date"] = ", ".join(sorted({d["date"] for d in files.values()}))
    else:
        cells["date"] = row["date"]
    cells["shown"] = row.get("shown") or ", ".join(f"`{name}`" for name in files)
    return [cells[c] for c in CELLS]


def region(config: dict, folder: Path = RESULTS) -> list[str]:
    """The lines between README's figures markers."""
    columns = config["columns"]
    if len(columns) != len(CELLS):
        raise FiguresError(f"figures.toml: columns names {len(columns)} columns, the rows have {len(CELLS)}: {CELLS}")
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(row_cells(row, folder)) + " |" for row in config["row"]]
    plot = config["plot"]
    image = (RESULTS / plot["image"]).relative_to(ROOT)
    return [*lines, "", f"![{plot['alt']}]({image.as_posix()})"]


def load(path: Path = CONFIG) -> dict:
    return tomllib.loads(path.read_text())


def rewritten(readme: str, lines: list[str]) -> str:
    """``readme`` with the lines between its figures markers replaced by ``lines``."""
    old = readme.splitlines(keepends=True)
    begins = [i for i, ln in enumerate(old) if ln.startswith(BEGIN)]
    ends = [i for i, ln in enumerate(old) if ln.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise FiguresError(f"README.md needs one {BEGIN} ... --> line and one {END} line after it")
    return "".join(old[: begins[0] + 1]) + "".join(ln + "\n" for ln in lines) + "".join(old[ends[0] :])


def add_arguments(ap) -> None:
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if README's region differs")
    ap.add_argument("--no-plot", action="store_true", help="leave the plot as it is")
    ap.add_argument("--readme", type=Path, default=README, help=argparse.SUPPRESS)
    ap.add_argument("--config", type=Path, default=CONFIG, help=argparse.SUPPRESS)
    ap.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)


def main(args) -> int:
    try:
        config = load(args.config)
        readme = args.readme.read_text()
        new = rewritten(readme, region(config, args.results))
    except (FiguresError, ValueError, OSError, tomllib.TOMLDecodeError) as e:
        print(f"figures: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != readme:
            print(f"figures: {args.readme} differs from what benchmarks/figures.toml and the results give; "
                  "run `python3 benchmarks/bench.py figures`", file=sys.stderr)  # fmt: skip
            return 1
        print(f"figures: {args.readme} matches the results")
        return 0
    if new != readme:
        args.readme.write_text(new)
        print(f"figures: {args.readme} rewritten")
    else:
        print(f"figures: {args.readme} already up to date")
    if not args.no_plot:
        _redraw(config["plot"], args.results)
    return 0


def _redraw(plot: dict, folder: Path) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"figures: matplotlib is not importable here: {plot['image']} not redrawn "
              "(`.tool-venv/bin/pip install matplotlib`, then run with .tool-venv/bin/python)")  # fmt: skip
        return
    out = folder / plot["image"]
    offline.plot(results.read(folder / plot["file"]), out)
    print(f"figures: {out} redrawn from {plot['file']}")
