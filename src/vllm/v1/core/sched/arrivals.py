# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Multi-step decode: windows yield to requests that arrive while they run.

The engine core's input thread counts each request it receives into a
counter in shared memory (`ArrivalCounter.arrived`); its busy loop counts each
one it hands to the scheduler (`seen`). A window carries the count the
scheduler had seen when it planned the window; the worker reads the shared
counter between inner steps (`ArrivalReader.since`) and ends the window once a
request arrived after that, as a stop would end it, so that the engine core
can admit the request at its next schedule. A read is one load from host
memory: no device sync, no message to the engine core.
"""

import contextlib
import weakref
from multiprocessing import resource_tracker, shared_memory
from typing import Any
from unittest import mock

import numpy as np

from vllm.logger import init_logger

logger = init_logger(__name__)


class ArrivalCounter:
    """The engine core's side: one counter in shared memory, written only by
    the input thread; the count seen by the busy loop stays in this process."""

    def __init__(self) -> None:
        self._shm = shared_memory.SharedMemory(create=True, size=8)
        self._count = np.ndarray((1,), dtype=np.uint64, buffer=self._shm.buf)
        self._count[0] = 0
        self.num_seen = 0
        # Unlinked when the scheduler goes (an `LLM` made after another) or
        # at exit, not left to the resource tracker's leak warning.
        self._release = weakref.finalize(self, _release, self._shm)

    @property
    def name(self) -> str:
        return self._shm.name

    def arrived(self) -> None:
        self._count[0] += 1

    def seen(self) -> None:
        self.num_seen += 1

    def close(self) -> None:
        del self._count
        self._release()


class ArrivalReader:
    """A worker's side: the counter of the engine core that planned a window."""

    def __init__(self) -> None:
        self._name: str | None = None
        self._shm: shared_memory.SharedMemory | None = None
        self._count: np.ndarray | None = None

    def since(self, name: str, num_seen: int) -> bool:
        """Whether a request arrived at the engine core `name` after it had
        seen `num_seen` of them."""
        if name != self._name:
            self._attach(name)
        return self._count is not None and int(self._count[0]) > num_seen

    def _attach(self, name: str) -> None:
        self._name = name
        self._count = None
        try:
            # Attaching registers the segment with this process's resource
            # tracker, which would unlink it when the worker exits (Python
            # < 3.13 has no track=False): the engine core owns it.
            with mock.patch.object(resource_tracker, "register", _no_register):
                self._shm = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            # Another host (multi-node tensor parallelism): never yield here;
            # the ranks agree on the cut (window.py).
            logger.info_once("Multi-step decode: no arrival counter on this host.")
            return
        self._count = np.ndarray((1,), dtype=np.uint64, buffer=self._shm.buf)


def _no_register(*args: Any, **kwargs: Any) -> None:
    return None


def _release(shm: shared_memory.SharedMemory) -> None:
    # At exit the counter's view may still hold the buffer: unlink all the same.
    with contextlib.suppress(BufferError):
        shm.close()
    shm.unlink()


def note_arrival(engine_core: Any) -> None:
    """The input thread received a request (hook in EngineCoreProc)."""
    counter = _counter(engine_core)
    if counter is not None:
        counter.arrived()


def note_seen(engine_core: Any) -> None:
    """The busy loop took a request in (hook in EngineCoreProc)."""
    counter = _counter(engine_core)
    if counter is not None:
        counter.seen()


def _counter(engine_core: Any) -> ArrivalCounter | None:
    planner = getattr(getattr(engine_core, "scheduler", None), "multi_step", None)
    return getattr(planner, "arrivals", None)
