"""CPU use over time: the whole machine and each process of one tree.

Read from /proc (Linux), no dependency. Used by `bench.py serve` (harness/serve.py) to show where the
2 cores went while `vllm bench serve` ran: the server's processes (API server,
engine core, worker) and everything else (mostly the benchmark client).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The name (field 2) is in parentheses and may hold spaces.
    return text[text.rindex(")") + 2 :].split()


def _tree(root: int) -> dict[int, str]:
    """pid -> name for root and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    names, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:
            names[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        todo.extend(children.get(pid, ()))
    return names


def _cpu_seconds(pid: int) -> float:
    fields = _stat_fields(pid)
    # utime and stime (fields 14 and 15 of the full line).
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / TICK


def _machine_busy() -> float:
    """Busy CPU seconds of the whole machine (all cores) since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / TICK


class CpuMonitor:
    """Samples machine and per-process CPU time of one process tree (the
    processes present on entry) in a background thread; `usage(seconds)` averages over the last `seconds`
    before the monitor stopped (e.g. a benchmark's request phase, without the
    client's start-up)."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root, self.interval = root, interval
        self.samples: list[tuple[float, float, dict[int, tuple[str, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        # Found once on entry: a served model's processes all exist by then, and
        # rescanning /proc every sample would add load to the machine measured.
        self._names: dict[int, str] = {}

    def _sample(self) -> None:
        per_pid = {pid: (name, _cpu_seconds(pid)) for pid, name in self._names.items()}
        self.samples.append((time.monotonic(), _machine_busy(), per_pid))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> CpuMonitor:
        self._names = _tree(self.root)
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def usage(self, seconds: float) -> dict:
        """Cores used on average: the machine, each process of the tree (by
        name), and the rest of the machine (other processes: the client)."""
        end_t, end_busy, end_pids = self.samples[-1]
        start_t, start_busy, start_pids = next((s for s in self.samples if s[0] >= end_t - seconds), self.samples[0])
        wall = end_t - start_t
        per_name: dict[str, float] = {}
        for pid, (name, end) in end_pids.items():
            begin = start_pids.get(pid, (name, end))[1]
            per_name[name] = per_name.get(name, 0.0) + (end - begin) / wall
        machine = (end_busy - start_busy) / wall
        return {
            "seconds": round(wall, 1),
            "cores": os.cpu_count(),
            "machine_busy_cores": round(machine, 2),
            "server_processes_cores": {k: round(v, 2) for k, v in sorted(per_name.items())},
            "rest_cores": round(machine - sum(per_name.values()), 2),
        }
