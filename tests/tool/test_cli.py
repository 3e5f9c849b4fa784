"""The command line: one exit code per way a command ends, each code written once
(overlay/errors.py's table, which README.md and --help show), each command declared
once (overlay/cli.py's table, which the module docstring and --help show), the options
every command takes also before the command (overlay/cmdline.py), and one way to print
a command's result, JSON or text (overlay/report.py's show)."""

import argparse
import dataclasses
import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from rich.table import Table
from support.cli import ROOT, run_json, run_tool
from support.synthetic import ENGINE, SOURCE, file_patch, snapshot

from overlay import cli, errors, releases, report, testrun


def test_readme_exit_code_table_is_the_one_errors_py_writes():
    block = errors.readme_block((ROOT / "README.md").read_text())
    assert block == errors.markdown_table(), "run `python3 -m overlay.errors --write README.md`"


def test_regenerating_the_readme_table(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{errors.README_BEGIN}\n| stale |\n{errors.README_END}\nrest\n")
    proc = subprocess.run(["python3", "-m", "overlay.errors", "--write", str(readme)], cwd=ROOT, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert readme.read_text() == f"intro\n{errors.README_BEGIN}\n{errors.markdown_table()}{errors.README_END}\nrest\n"


def test_module_docstring_lists_the_command_table():
    listed = cli.__doc__.split("Commands, in the order a user meets them:\n", 1)[1].split("\n\n", 1)[0]
    assert listed == cli.command_list(), "paste cli.command_list() into overlay/cli.py's docstring"
    assert [c.name for c in cli.COMMANDS] == [line.split()[0] for line in listed.splitlines() if line[2] != " "]


def test_help_shows_every_command_and_exit_code():
    proc = run_tool("--help")
    assert proc.returncode == errors.OK
    for command in cli.COMMANDS:
        assert f"\n  {command.name} " in proc.stdout
    for e in errors.EXIT_CODES:
        assert f"  {e.code:<4} {e.name} " in proc.stdout


# -- one test per exit code, through the command line --


def test_ok(upstream):
    assert run_tool("check", *upstream.args()).returncode == errors.OK


def test_patch_failed(upstream):
    e = ENGINE.replace("x + 7\n", "x + 77\n")  # not what the pin has
    upstream.add_patch("0001-bad.patch", file_patch("vllm/engine.py", e, e.replace("x + 77", "x + 8"), "bad"))
    code, out = run_json("check", *upstream.args())
    assert code == errors.PATCH_FAILED and out["patches"][-1]["status"] == "conflict", out


def test_bad_input_unknown_option(upstream):
    proc = run_tool("check", "--bogus", *upstream.args())
    assert proc.returncode == errors.BAD_INPUT and "unrecognized arguments: --bogus" in proc.stderr


def test_bad_input_malformed_series(upstream):
    upstream.series.write_text("0001-a.patch and more\n")
    proc = run_tool("check", *upstream.args())
    assert proc.returncode == errors.BAD_INPUT and "Traceback" not in proc.stderr, proc.stderr


def test_fetch_failed(upstream):
    (upstream.cache / "downloads" / upstream.wheel.name).write_bytes(b"not the wheel")
    proc = run_tool("fetch", *upstream.args(), "--target", "cpu")
    assert proc.returncode == errors.FETCH_FAILED and hashlib.sha256(b"not the wheel").hexdigest() in proc.stderr


def test_build_refused(upstream, tmp_path):
    path = "csrc/kernel.cpp"
    upstream.add_patch("0001-x.patch", file_patch(path, SOURCE[path], SOURCE[path] + "// x\n", "touch"))
    proc = run_tool("build", *upstream.args(), "--target", "cpu", "--dist", str(tmp_path / "dist"))
    assert proc.returncode == errors.BUILD_REFUSED, proc.stderr


def test_git_failure_is_reported_as_git_not_as_bad_input(upstream, tmp_path):
    """A tree whose repository git cannot open: git's message, which repository, code 5."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / ".git").write_text(f"gitdir: {tmp_path / 'gone'}\n")
    before = snapshot(upstream.root)
    proc = run_tool("export", *upstream.args(), "--tree", str(tree))
    assert proc.returncode == errors.GIT_FAILED, proc.stderr
    assert f"git failed in {tree}" in proc.stderr and "not a git repository" in proc.stderr
    assert "Traceback" not in proc.stderr and snapshot(upstream.root) == before


def _crash(exc):
    def run(args):
        raise exc

    return run


def _with_handler(monkeypatch, name, handler):
    commands = tuple(dataclasses.replace(c, run=handler) if c.name == name else c for c in cli.COMMANDS)
    monkeypatch.setattr(cli, "COMMANDS", commands)


def test_internal_error_names_the_command_and_the_traceback_file(upstream, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "CRASH_DIR", tmp_path / "crashes")
    _with_handler(monkeypatch, "check", _crash(ZeroDivisionError("a bug")))
    assert cli.main(["check", *upstream.args()]) == errors.INTERNAL_ERROR
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "internal error in `apply.py check`" in err, err
    report = next((tmp_path / "crashes").iterdir())
    assert str(report) in err and "ZeroDivisionError: a bug" in report.read_text()
    # with --json, a script gets the same in the report it parses
    assert cli.main(["check", *upstream.args(), "--json"]) == errors.INTERNAL_ERROR
    assert '"exit_code": 70' in capsys.readouterr().out


def test_a_failing_command_other_than_git_is_an_internal_error(upstream, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "CRASH_DIR", tmp_path / "crashes")
    _with_handler(monkeypatch, "check", _crash(subprocess.CalledProcessError(2, ["tar", "-x"])))
    assert cli.main(["check", *upstream.args()]) == errors.INTERNAL_ERROR


def test_interrupted(upstream, monkeypatch, capsys):
    _with_handler(monkeypatch, "check", _crash(KeyboardInterrupt()))
    assert cli.main(["check", *upstream.args()]) == errors.INTERRUPTED
    assert "interrupted" in capsys.readouterr().err


# -- test and fuzz: --upstream parsed by argparse, the rest passed on --


def _record_runs(monkeypatch):
    monkeypatch.delenv(testrun.TEST_RELEASE_ENV, raising=False)  # `apply.py test` sets it for this run
    runs = []

    def run(cmd, **kw):
        runs.append((cmd, kw.get("env", {})))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", run)
    return runs


def _a_release() -> str:
    return releases.supported(ROOT)[-1].version


def test_test_takes_upstream_anywhere_and_passes_the_rest_to_pytest(monkeypatch):
    runs, version = _record_runs(monkeypatch), _a_release()
    assert cli.main(["test", "tests/tool", "-q", "--upstream", version, "-k", "not slow"]) == errors.OK
    [(cmd, env)] = runs
    assert cmd[-5:] == ["pytest", "tests/tool", "-q", "-k", "not slow"]
    assert env[testrun.TEST_RELEASE_ENV] == version


def test_fuzz_takes_upstream_and_passes_the_rest_and_help_on(monkeypatch):
    runs, version = _record_runs(monkeypatch), _a_release()
    assert cli.main(["fuzz", f"--upstream={version}", "--minutes", "1", "--help"]) == errors.OK
    [(cmd, env)] = runs
    assert cmd[-5:] == ["-m", "overlay.fuzz", "--minutes", "1", "--help"]
    assert env[testrun.TEST_RELEASE_ENV] == version


def test_unknown_release_for_test_is_bad_input():
    proc = run_tool("test", "--upstream", "9.9.9", "tests/tool")
    assert proc.returncode == errors.BAD_INPUT and "9.9.9" in proc.stderr and "Traceback" not in proc.stderr


def test_fast_runs_the_tool_tests_and_our_unit_tests_with_the_same_arguments(monkeypatch):
    runs = _record_runs(monkeypatch)
    started = []

    class Popen:
        def __init__(self, cmd, **kw):
            started.append((cmd, kw["env"]))
            self.returncode = 0

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Popen)
    version = _a_release()
    assert cli.main(["test", "--fast", "--upstream", version, "-x"]) == errors.OK
    [(tool, tool_env)], [(units, units_env)] = runs, started
    assert tool[-3:] == ["pytest", testrun.TOOL_TESTS, "-x"]
    assert units[-2:] == [str(testrun.SRC_UNIT_TESTS), "-x"]
    assert tool_env[testrun.TEST_RELEASE_ENV] == units_env[testrun.TEST_RELEASE_ENV] == version


def test_the_suite_runs_every_release_after_one_fails(monkeypatch):
    """`apply.py test` without arguments: a release whose tests fail does not stop the others
    (each release's run is its own; the exit code is the first failure's)."""
    ran = []

    def fake_pytest(version, args):
        ran.append(version)
        return 1 if len(ran) == 1 else 0

    monkeypatch.setattr(testrun, "_pytest", fake_pytest)
    assert cli.main(["test"]) == 1
    assert sorted(ran) == sorted(r.version for r in releases.supported(ROOT)) and len(ran) > 1


# -- the options every command takes, also before the command --

EVERY_COMMAND_TAKES = ("json", "quiet", "upstream", "series", "lock", "cache_dir")


def test_the_options_every_command_takes_may_stand_before_it():
    before = ["--json", "-q", "--upstream", "0.32.0", "--series", "s/series", "--lock", "l.lock", "--cache-dir", "c"]
    _command, args = cli.parse([*before, "check"])
    given = (True, True, "0.32.0", Path("s/series"), Path("l.lock"), "c")
    assert tuple(getattr(args, dest) for dest in EVERY_COMMAND_TAKES) == given
    # given nowhere: the defaults, as after the command
    _command, args = cli.parse(["check"])
    defaults = (False, False, None, ROOT / "series", None, None)
    assert tuple(getattr(args, dest) for dest in EVERY_COMMAND_TAKES) == defaults


def test_given_before_and_after_the_command_the_one_after_wins():
    _command, args = cli.parse(["--upstream", "0.32.0", "--series", "a/series", "check", "--upstream", "0.34.0"])
    assert (args.upstream, args.series, args.json) == ("0.34.0", Path("a/series"), False)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--json", "test"], "test does not take --json"),
        (["-q", "--upstream", "0.32.0", "fuzz"], "fuzz does not take -q/--quiet"),
        # before the command, an option the tool does not know is not passed on to the fuzzer or pytest
        (["--repeat-oracle", "fuzz"], "unrecognized arguments: --repeat-oracle"),
        (["-x", "test"], "unrecognized arguments: -x"),
    ],
)
def test_an_option_before_a_command_that_does_not_take_it_is_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as refused:
        cli.parse(argv)
    assert refused.value.code == errors.BAD_INPUT and message in capsys.readouterr().err


def test_every_command_takes_them_before_it_through_the_command_line(upstream):
    proc = run_tool("--json", *upstream.args(), "check")
    assert proc.returncode == errors.OK and json.loads(proc.stdout)["ok"] is True, proc.stderr
    version = _a_release()
    proc = run_tool("-q", "--upstream", version, "releases")
    assert proc.returncode == errors.OK and f"vLLM {version} " in proc.stdout, proc.stderr


def test_upstream_before_fuzz_picks_the_release_and_the_rest_goes_on(monkeypatch):
    runs, version = _record_runs(monkeypatch), _a_release()
    assert cli.main(["--upstream", version, "fuzz", "--minutes", "1"]) == errors.OK
    assert cli.main(["--upstream", "9.9.9", "fuzz", "--upstream", version, "--help"]) == errors.OK  # after wins
    [(first, first_env), (second, second_env)] = runs
    assert first[-4:] == ["-m", "overlay.fuzz", "--minutes", "1"] and second[-1:] == ["--help"]
    assert first_env[testrun.TEST_RELEASE_ENV] == second_env[testrun.TEST_RELEASE_ENV] == version


def test_fuzz_with_upstream_before_it_runs_the_fuzzers_own_help_and_argument_errors():
    """`python -m overlay.fuzz` for real: its --help, and an argument error before any engine."""
    version = _a_release()
    proc = run_tool("--upstream", version, "fuzz", "--help")
    assert proc.returncode == errors.OK and proc.stdout.startswith("usage: apply.py fuzz"), proc.stderr
    assert "--minutes" in proc.stdout
    proc = run_tool("--upstream", version, "fuzz", "--configs", "no-such-config")
    assert proc.returncode == errors.BAD_INPUT and "unknown configs ['no-such-config']" in proc.stderr, proc.stderr


# -- one way to print a command's result --


def test_show_prints_the_json_report_alone_with_json_else_each_piece_of_text(capsys):
    table = Table("column")
    table.add_row("a cell")
    called = []
    pieces = ("a line", table, None, report.stderr("to stderr"), lambda: called.append(True))
    report.show(argparse.Namespace(json=True), {"ok": True}, *pieces)
    out, err = capsys.readouterr()
    assert json.loads(out) == {"ok": True} and err == "" and not called
    report.show(argparse.Namespace(json=False), {"ok": True}, *pieces)
    out, err = capsys.readouterr()
    assert out.startswith("a line\n") and "a cell" in out and '"ok"' not in out
    assert err == "to stderr\n" and called == [True]
    report.show(argparse.Namespace(), {"ok": True}, "text")  # test and fuzz take no --json
    assert capsys.readouterr().out == "text\n"


def test_every_command_prints_its_result_through_show():
    """One place chooses between the JSON report and the text: no other module reads --json."""
    for path in (ROOT / "overlay").rglob("*.py"):
        if path != ROOT / "overlay" / "report.py":
            source = path.read_text()
            assert "args.json" not in source and "emit_json(" not in source, path
