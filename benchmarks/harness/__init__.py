"""The benchmark harness behind benchmarks/bench.py, one module per job.

  paths         where things are: the repository, the results, the build folders
  builds        the upstream and overlay venvs and the locally built models
  worker        runs benchmarks/offline_worker.py inside a build's venv
  results       the result schema every file in benchmarks/results/ follows: write, read, check
  cpu_use       CPU use of a process tree over time, from /proc (serve)
  offline, serve, spec, profile, forward_only, tool_timings, figures
                one bench.py subcommand each (`add_arguments(parser)`, `main(args)`)

Importing the package puts the repository root (the tool's `overlay` package) and tests/ (the
test support modules the benchmarks share: engines, venvs, tiny models) on sys.path. Module
top levels import only the standard library and these, so `bench.py --help` and `bench.py
figures` run under any Python 3.11+; what needs the tool's dependencies is imported where used.
"""

import sys

from harness.paths import ROOT, TESTS

for _path in (str(TESTS), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
