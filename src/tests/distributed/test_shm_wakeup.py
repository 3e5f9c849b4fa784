# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The writer wakes a MessageQueue's readers only when one may be parked, and
through the reader's own pipe where it has one."""

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest

from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
from vllm.distributed.device_communicators.shm_wakeup import ReaderPipe, pipe_path

SHM_BROADCAST = "vllm.distributed.device_communicators.shm_broadcast"


@contextmanager
def writer_and_reader() -> Iterator[tuple[MessageQueue, MessageQueue, mock.Mock]]:
    """One writer and one local reader in this process; yields the ping mock."""
    writer = MessageQueue(
        n_reader=1, n_local_reader=1, max_chunk_bytes=1024 * 1024, max_chunks=4
    )
    reader = MessageQueue.create_from_handle(writer.export_handle(), rank=0)
    notify_socket = writer._spin_condition.local_notify_socket
    try:
        writer.wait_until_ready()
        reader.wait_until_ready()
        with mock.patch.object(
            writer._spin_condition,
            "local_notify_socket",
            mock.Mock(wraps=notify_socket),
        ) as pings:
            yield writer, reader, pings.send
    finally:
        writer.shutdown()
        reader.shutdown()
        writer._spin_condition.wake_pipes.close()
        if reader._spin_condition.wake_pipe is not None:
            reader._spin_condition.wake_pipe.close()
        for socket in (
            writer.local_socket,
            notify_socket,
            reader.local_socket,
            reader._spin_condition.local_notify_socket,
            reader._spin_condition.read_cancel_socket,
            reader._spin_condition.write_cancel_socket,
        ):
            socket.close(linger=0)


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_no_ping_while_the_reader_spins():
    with writer_and_reader() as (writer, reader, ping):
        reader._spin_condition.busy_loop_s = 9999  # never parks
        received = []
        thread = threading.Thread(
            target=lambda: received.extend(reader.dequeue(timeout=5) for _ in range(6))
        )
        thread.start()
        for i in range(6):
            writer.enqueue(i)
            time.sleep(0.01)
        thread.join(timeout=10)
        assert received == list(range(6))
        ping.assert_not_called()


@pytest.mark.parametrize("machine", ["aarch64", "arm64", "ppc64le"])
def test_without_a_full_fence_the_writer_pings_every_write(machine: str):
    """Where memory_fence() does not order a store before a load, the
    handshake could miss a parked reader: upstream's ping after every write."""
    with (
        mock.patch("platform.machine", return_value=machine),
        writer_and_reader() as (writer, reader, ping),
    ):
        assert writer._spin_condition.idle_flags is None
        assert reader._spin_condition.idle_flags is None
        reader._spin_condition.busy_loop_s = 9999  # spins: flags would skip pings
        for i in range(3):
            writer.enqueue(i)
            assert reader.dequeue(timeout=5) == i
        assert ping.call_count == 3


def dequeue_parked(writer: MessageQueue, reader: MessageQueue, item) -> float:
    """Park `reader` on an empty queue, write `item`; seconds until it read it."""
    received = []
    thread = threading.Thread(target=lambda: received.append(reader.dequeue()))
    thread.start()
    wait_for(writer._spin_condition.idle_flags.any_raised)
    time.sleep(0.05)  # let it reach the poll
    started = time.monotonic()
    writer.enqueue(item)
    thread.join(timeout=10)
    assert received == [item]
    return time.monotonic() - started


def test_parked_reader_is_woken_through_its_pipe_once_then_spins_again():
    with (
        writer_and_reader() as (writer, reader, ping),
        # The pipe, not the periodic re-check, must wake the reader.
        mock.patch(f"{SHM_BROADCAST}.SHM_READER_RECHECK_INTERVAL_MS", new=60_000),
    ):
        pipe = reader._spin_condition.wake_pipe
        assert pipe is not None and pipe.fd is None  # made at the first park
        reader._spin_condition.busy_loop_s = 0  # parks at its first wait
        with mock.patch.object(pipe, "drain", wraps=pipe.drain) as drain:
            assert dequeue_parked(writer, reader, "wake") < 2
        drain.assert_called_once()
        ping.assert_not_called()  # no ZMQ message: the pipe woke it
        # Written to, the pipe keeps no name behind (both ends are open).
        assert pipe.fd is not None and not os.path.exists(pipe.path)
        assert dequeue_parked(writer, reader, "again") < 2
        ping.assert_not_called()

        # Having read, the reader lowered its flag: a busy reader is not woken.
        assert not writer._spin_condition.idle_flags.any_raised()
        reader._spin_condition.busy_loop_s = 9999
        with mock.patch("os.write", side_effect=AssertionError("woken")):
            writer.enqueue("busy")
        assert reader.dequeue(timeout=5) == "busy"
        ping.assert_not_called()


def test_parked_reader_without_a_pipe_is_pinged_once():
    with (
        mock.patch.object(ReaderPipe, "create", return_value=None),
        writer_and_reader() as (writer, reader, ping),
        mock.patch(f"{SHM_BROADCAST}.SHM_READER_RECHECK_INTERVAL_MS", new=60_000),
    ):
        assert reader._spin_condition.wake_pipe is None
        reader._spin_condition.busy_loop_s = 0
        assert dequeue_parked(writer, reader, "wake") < 2
        ping.assert_called_once()


@pytest.mark.parametrize("broken", ["not-made", "unwritable", "stale-name"])
def test_a_pipe_the_writer_cannot_use_falls_back_to_the_ping(broken: str):
    with (
        writer_and_reader() as (writer, reader, ping),
        mock.patch(f"{SHM_BROADCAST}.SHM_READER_RECHECK_INTERVAL_MS", new=60_000),
    ):
        reader._spin_condition.busy_loop_s = 0
        pipe = reader._spin_condition.wake_pipe
        if broken == "not-made":
            with mock.patch("os.mkfifo", side_effect=OSError(28, "No space")):
                assert dequeue_parked(writer, reader, "wake") < 2
            assert pipe.unusable and not os.path.exists(pipe.path)
            ping.assert_called_once()
        elif broken == "unwritable":
            with mock.patch("os.write", side_effect=OSError(28, "No space")):
                assert dequeue_parked(writer, reader, "wake") < 2
            assert not writer._spin_condition.wake_pipes.fds  # closed
            ping.assert_called_once()
        else:  # a pipe a killed reader left under this name is replaced
            os.mkfifo(pipe.path, 0o600)
            assert dequeue_parked(writer, reader, "wake") < 2
            ping.assert_not_called()


def test_a_pipe_its_writer_closed_is_no_longer_watched():
    """At end of file a poll would return at once, every time: the reader
    stops watching the pipe and is pinged over ZMQ from then on."""
    with writer_and_reader() as (writer, reader, ping):
        pipe = reader._spin_condition.wake_pipe
        pipe.make()
        writer._spin_condition.wake_pipes.wake([0])
        writer._spin_condition.wake_pipes.close()
        pipe.drain()  # the byte, then end of file
        assert pipe.fd is None and pipe.unusable
        assert not os.path.exists(pipe.path)
        reader._spin_condition.busy_loop_s = 0
        assert dequeue_parked(writer, reader, "wake") < 2
        ping.assert_called_once()


def test_the_pipe_goes_with_its_reader():
    with writer_and_reader() as (_, reader, _):
        pipe = reader._spin_condition.wake_pipe
        pipe.make()
        assert os.path.exists(pipe.path)
        assert pipe.path == pipe_path(reader.buffer, 0)
        pipe.close()
        assert not os.path.exists(pipe.path)


def test_write_landing_as_the_reader_parks_is_read_without_a_poll():
    """The writer wrote after the reader's last check but before its flag went
    up, so the writer saw no flag and sent no ping: the reader's re-check after
    raising its flag must find the chunk instead of parking on the socket."""
    with writer_and_reader() as (writer, reader, ping):
        reader._spin_condition.busy_loop_s = 0
        flags = reader._spin_condition.idle_flags
        park_unless = flags.park_unless

        def write_then_park(ready):
            assert not writer._spin_condition.idle_flags.any_raised()
            writer.enqueue(7)  # sees no raised flag: no ping
            return park_unless(ready)

        with (
            mock.patch.object(flags, "park_unless", side_effect=write_then_park),
            mock.patch.object(
                reader._spin_condition.poller,
                "poll",
                side_effect=AssertionError("parked on a written chunk"),
            ),
        ):
            assert reader.dequeue(timeout=5) == 7
        ping.assert_not_called()


@pytest.mark.parametrize("n_reader", [1, 3])
def test_idle_flags_sit_after_the_metadata(n_reader: int):
    writer = MessageQueue(
        n_reader=n_reader,
        n_local_reader=n_reader,
        max_chunk_bytes=1024,
        max_chunks=2,
    )
    try:
        buffer = writer.buffer
        end_of_metadata = buffer.metadata_offset + buffer.metadata_size * 2
        assert buffer.idle_flags_offset == end_of_metadata
        assert buffer.total_bytes_of_buffer == end_of_metadata + n_reader
        assert not writer._spin_condition.idle_flags.any_raised()
    finally:
        writer.shutdown()
        writer.local_socket.close(linger=0)
        writer._spin_condition.local_notify_socket.close(linger=0)
