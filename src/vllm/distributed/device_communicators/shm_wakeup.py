# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Wake a shared-memory queue's readers only when one may be parked.

A `MessageQueue` writer used to ping its local readers over a ZMQ PUB socket
after every write, but a reader only listens on that socket once it has gone
``busy_loop_s`` without reading (`SpinCondition.wait`); until then it spins on
the buffer's flags and never looks at the ping. Each ping still costs a send
and wake-ups of ZMQ's I/O threads in both processes, twice per engine step from
the engine core and once from the worker: on a host with few cores those
threads take turns with the worker's forward pass.

So each reader owns one byte after the ring buffer's metadata, raised before it
parks on the socket and lowered once it reads again, and the writer pings only
while some reader's byte is up. The two sides form a Dekker-style handshake:
the reader raises its byte, then re-checks the chunk's written flag; the writer
sets the written flag, then reads the bytes. A memory fence sits between the
store and the load on both sides (the reader's check and `acquire_write` begin
and end with one), so at least one side sees the other: either the reader finds
the chunk and does not park, or the writer sees the raised byte and pings.

That fence (`memory_fence`: a threading.Lock acquired and released) must order
a store before a later load (StoreLoad). On x86-64 it does: taking and giving
back the lock are LOCK-prefixed atomics, full barriers under x86's memory
model. On AArch64, POWER and the like, lock acquire and release are one-way
barriers (acquire, release) that let the reader's flag store and its later
load of the written flag pass each other, so both sides could miss the other
and a parked reader would wait for the next message. There the flags are not
used (`idle_flags_for` returns None) and the writer pings after every write,
as upstream does.

A parked reader is woken through a named pipe of its own where it has one
(`ReaderPipe`, `WriterPipes`): the writer writes one byte, and the reader's
poll, which also watches its ZMQ sockets, returns at once. The ZMQ ping it
replaces passes through an I/O thread in each process, and on a host whose
cores are all busy those threads wait their turn: a parked engine core then
sees a step's output late (docs/benchmarks.md). A reader without a pipe (none
could be made, or its writer closed it) is pinged over ZMQ, as before; so are
the readers when a pipe cannot be opened or written.
"""

import contextlib
import os
import platform
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import zmq

# Machines where memory_fence() is a full barrier (see above).
FULL_FENCE_MACHINES = ("x86_64", "amd64")


def idle_flags_size(n_reader: int) -> int:
    """Bytes the flags take at the end of a ring buffer with n_reader readers."""
    return n_reader


def idle_flags_for(buffer: Any, reader_rank: int | None = None) -> "IdleFlags | None":
    """The writer's (no rank) or a reader's flags; None where the handshake
    cannot be exact, so that the writer always pings."""
    if platform.machine().lower() not in FULL_FENCE_MACHINES:
        return None
    return IdleFlags(buffer, reader_rank)


class IdleFlags:
    """The idle bytes of one ring buffer's readers, seen by a reader or the writer.

    `buffer` is the `ShmRingBuffer`; its `idle_flags_offset` marks the bytes.
    """

    def __init__(self, buffer: Any, reader_rank: int | None = None) -> None:
        self.buffer = buffer
        self.reader_rank = reader_rank
        self.raised = False  # this reader's own byte, to skip redundant stores
        self.pipe: ReaderPipe | None = None  # a reader's, where it has one

    def park_unless(self, written: Callable[[], bool] | None) -> bool:
        """Raise this reader's byte; True if the chunk was written meanwhile.

        `written` must begin with a memory fence (MessageQueue's check does).
        """
        if not self.raised:
            if self.pipe is not None:
                self.pipe.make()  # before the writer can see the byte
            self._set_own(1)
            self.raised = True
        return written is not None and written()

    def lower(self) -> None:
        """This reader reads again: the writer need not ping it."""
        if self.raised:
            self._set_own(0)
            self.raised = False

    def any_raised(self) -> bool:
        """Whether some reader's byte is up (as `raised_ranks`)."""
        return bool(self.raised_ranks())

    def raised_ranks(self) -> list[int]:
        """The readers whose byte is up. For the writer, after the fence that
        follows its written-flag store."""
        start = self.buffer.idle_flags_offset
        with self.buffer.shared_memory.buf[start : start + self.buffer.n_reader] as f:
            return [rank for rank, flag in enumerate(f) if flag]

    def _set_own(self, value: int) -> None:
        assert self.reader_rank is not None, "only a reader has its own byte"
        offset = self.buffer.idle_flags_offset + self.reader_rank
        self.buffer.shared_memory.buf[offset] = value


# Where the pipes live: beside the ring buffers' shared memory.
PIPE_DIR = "/dev/shm"


def pipe_path(buffer: Any, reader_rank: int) -> str:
    """The named pipe of reader `reader_rank` of `buffer` (a `ShmRingBuffer`)."""
    name = buffer.shared_memory.name.lstrip("/")
    return os.path.join(PIPE_DIR, f"{name}-wake{reader_rank}")


class ReaderPipe:
    """A reader's own named pipe, watched by its poll. Made when the reader
    first parks, before its byte goes up (the writer opens it by name when it
    first sees the byte), and unlinked once the writer has written to it, or
    when the reader is collected or its process exits. A reader killed in its
    first park leaves an empty pipe, which the next reader of its name
    replaces."""

    @classmethod
    def create(cls, idle_flags: "IdleFlags | None", poller: Any) -> "ReaderPipe | None":
        """The pipe of the reader these flags belong to, to be watched by its
        `poller` (a zmq.Poller); None without flags."""
        if idle_flags is None or idle_flags.reader_rank is None:
            return None
        pipe = cls(pipe_path(idle_flags.buffer, idle_flags.reader_rank), poller)
        idle_flags.pipe = pipe
        return pipe

    def __init__(self, path: str, poller: Any) -> None:
        self.path = path
        self.poller = poller
        self.fd: int | None = None
        self.unusable = False  # could not be made, or the writer closed it
        # What the finalizer closes and unlinks, as it stands then.
        self._left = {"fd": None, "path": None}
        self._finalizer = weakref.finalize(self, _close_and_unlink, self._left)

    def make(self) -> None:
        """Make, open and watch the pipe, once; nothing where it cannot be
        made (the writer finds none and pings over ZMQ)."""
        if self.fd is not None or self.unusable:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # left by a reader that was killed
            os.mkfifo(self.path, 0o600)
            self._left["path"] = self.path
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            self.unusable = True
            return
        self._left["fd"] = self.fd
        self.poller.register(self.fd, zmq.POLLIN)

    def drain(self) -> None:
        """Read what the writer wrote, so that the next poll waits again."""
        assert self.fd is not None
        written = False
        while True:
            try:
                chunk = os.read(self.fd, 4096)
            except BlockingIOError:
                break
            if not chunk:  # the writer closed its end: a poll would not wait
                self._stop_watching()
                return
            written = True
        path = self._left["path"]
        if written and path is not None:
            # The writer has it open: the name is no longer needed.
            with contextlib.suppress(OSError):
                os.unlink(path)
            self._left["path"] = None

    def _stop_watching(self) -> None:
        self.poller.unregister(self.fd)
        self.fd = None
        self.unusable = True
        self._finalizer()

    def close(self) -> None:
        self._finalizer()


class WriterPipes:
    """The writer's ends of its readers' pipes, opened when first needed (a
    reader makes its pipe before its byte goes up)."""

    def __init__(self, idle_flags: "IdleFlags | None") -> None:
        self.buffer = idle_flags.buffer if idle_flags is not None else None
        self.fds: dict[int, int] = {}
        self._finalizer = weakref.finalize(self, _close_all, self.fds)

    def wake(self, reader_ranks: Iterable[int]) -> bool:
        """Write one byte to each of these readers' pipes; False where one could
        not be opened or written (the caller pings over ZMQ then)."""
        woken = True
        for rank in reader_ranks:
            woken = self._wake(rank) and woken
        return woken

    def _wake(self, rank: int) -> bool:
        fd = self.fds.get(rank)
        if fd is None:
            if self.buffer is None:
                return False
            try:
                fd = os.open(pipe_path(self.buffer, rank), os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                return False  # no such reader, or it has not opened its pipe
            self.fds[rank] = fd
        try:
            os.write(fd, b"\x00")
        except BlockingIOError:
            return True  # full: the reader has bytes to wake it already
        except OSError:  # the reader is gone (EPIPE), or the pipe is unusable
            with contextlib.suppress(OSError):
                os.close(self.fds.pop(rank))
            return False
        return True

    def close(self) -> None:
        self._finalizer()


def _close_and_unlink(left: dict) -> None:
    if left["fd"] is not None:
        with contextlib.suppress(OSError):
            os.close(left["fd"])
    if left["path"] is not None:
        with contextlib.suppress(OSError):
            os.unlink(left["path"])
    left["fd"] = left["path"] = None


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
