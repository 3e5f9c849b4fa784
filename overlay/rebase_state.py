"""A rebase in progress: the per-patch steps and their statuses, the result, and the state kept in
the rebase tree's ``.git/overlay-rebase/`` so that ``rebase --continue`` (and an interrupted rebase)
takes up where it stopped (overlay/rebase.py)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from overlay import lock as lockmod
from overlay.errors import InputError
from overlay.gitcmd import git, git_env
from overlay.lock import Lock

CLEAN = "clean"
MERGED_3WAY = "merged-3way"
CONFLICT = "conflict"
ALREADY_UPSTREAM = "already-upstream"
TARGET_GONE = "target-gone"
NOT_TRIED = "not-tried"
STOPS = (CONFLICT, TARGET_GONE)

OLD_BASE_REF = "refs/overlay/old-upstream"
OLD_BRANCH = "old-patched"
STATE_DIR = "overlay-rebase"


@dataclass
class Step:
    patch: str
    status: str = NOT_TRIED
    detail: str = ""
    file: str | None = None
    hunk: str | None = None
    renamed_to: str | None = None
    offsets: list[str] = field(default_factory=list)
    drift: list[dict] = field(default_factory=list)
    resolution: str | None = None  # after a stop: "resolved" (committed by hand) or "dropped"

    def as_json(self) -> dict:
        return asdict(self)


@dataclass
class RebaseResult:
    tree: Path
    steps: list[Step]
    old: dict
    new: dict
    completed: bool
    series_before: str
    series_after: str | None = None
    changes: list[tuple[str, str]] = field(default_factory=list)
    missing_wheels: dict[str, str] = field(default_factory=dict)
    contract: list[str] = field(default_factory=list)  # upstream names our modules use, gone on the new base

    @property
    def stopped_at(self) -> Step | None:
        return next((s for s in self.steps if s.status in STOPS and s.resolution is None), None)

    @property
    def needs_review(self) -> bool:
        """Completed, but a patch drifted, was dropped, or is already upstream, or the contract broke."""
        steps = any(s.drift or s.status == ALREADY_UPSTREAM or s.resolution == "dropped" for s in self.steps)
        return steps or bool(self.contract)

    def as_json(self) -> dict:
        stop = self.stopped_at
        return {
            "ok": self.completed and not self.needs_review,
            "completed": self.completed,
            "stopped_at": stop.patch if stop else None,
            "tree": str(self.tree),
            "from": self.old,
            "to": self.new,
            "series_sha256_before": self.series_before,
            "series_sha256_after": self.series_after,
            "patches": [s.as_json() for s in self.steps],
            "exported": [{"patch": n, "change": c} for n, c in self.changes],
            "missing_wheels": self.missing_wheels,
            "contract": self.contract,
        }


def pin_json(lock: Lock) -> dict:
    return {"version": lock.version, "commit": lock.commit, "source": lock.source_id}


@dataclass
class RebaseState:
    """What a rebase in progress keeps in the tree's ``.git/overlay-rebase/state.json``."""

    series: str  # the series file being rebased
    lock: str  # its lock file
    series_before: str  # the series hash at the start (export refuses if it moved)
    old: dict  # the pins, as pin_json writes them
    new: dict
    new_lock: str  # the lock to write on success (TOML)
    lock_before_sha: str  # file digests at the start
    series_before_sha: str
    steps: list[Step]  # one per patch of the series (the module layer first)
    next: int = 0  # index of the next step to replay
    head_before_step: str | None = None  # HEAD before that step, to undo an interrupted one
    version: int = 2
    # A release other than the primary being advanced ("": the primary; overlay/releases.py).
    release: str = ""
    # Keep the old primary as a supported release (rebase --add).
    add: bool = False

    def as_json(self) -> dict:
        return {**asdict(self), "steps": [s.as_json() for s in self.steps]}

    @classmethod
    def from_json(cls, data: dict) -> RebaseState:
        if data.get("version") != 2:
            raise InputError(f"rebase state version {data.get('version')}: started by another overlay version; "
                             "`rebase --abort` and start again")  # fmt: skip
        return cls(**{**data, "steps": [Step(**s) for s in data["steps"]]})


class Rebase:
    """A rebase in a tree, with its persisted state."""

    def __init__(self, tree: Path):
        self.tree = tree
        self.dir = tree / ".git" / STATE_DIR
        self.state: RebaseState

    @property
    def in_progress(self) -> bool:
        return (self.dir / "state.json").exists()

    def load(self) -> Rebase:
        if not self.in_progress:
            raise InputError(f"no rebase in progress in {self.tree}")
        self.state = RebaseState.from_json(json.loads((self.dir / "state.json").read_text()))
        return self

    def save(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.state.as_json(), indent=2, sort_keys=True))
        os.replace(tmp, self.dir / "state.json")

    def git(self, *args: str, check: bool = True):
        return git(self.tree, *args, env=git_env(extra={"GIT_EDITOR": "true"}), check=check)

    def result(self, completed: bool) -> RebaseResult:
        st = self.state
        return RebaseResult(
            self.tree, list(st.steps), st.old, st.new, completed, st.series_before,
            missing_wheels=lockmod.loads(st.new_lock).missing_wheels,
        )  # fmt: skip

    def am_in_progress(self) -> bool:
        return (self.tree / ".git" / "rebase-apply").exists()


def file_digest(path: Path | None) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path and path.exists() else ""
