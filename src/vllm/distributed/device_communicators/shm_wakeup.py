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
"""

import platform
from collections.abc import Callable
from typing import Any

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

    def park_unless(self, written: Callable[[], bool] | None) -> bool:
        """Raise this reader's byte; True if the chunk was written meanwhile.

        `written` must begin with a memory fence (MessageQueue's check does).
        """
        if not self.raised:
            self._set_own(1)
            self.raised = True
        return written is not None and written()

    def lower(self) -> None:
        """This reader reads again: the writer need not ping it."""
        if self.raised:
            self._set_own(0)
            self.raised = False

    def any_raised(self) -> bool:
        """For the writer, after the fence that follows its written-flag store."""
        start = self.buffer.idle_flags_offset
        with self.buffer.shared_memory.buf[start : start + self.buffer.n_reader] as f:
            return any(f)

    def _set_own(self, value: int) -> None:
        assert self.reader_rank is not None, "only a reader has its own byte"
        offset = self.buffer.idle_flags_offset + self.reader_rank
        self.buffer.shared_memory.buf[offset] = value
