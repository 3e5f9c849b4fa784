# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The writer pings a MessageQueue's readers only when one may be parked."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest

from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

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


def test_parked_reader_is_pinged_once_then_spins_again():
    with (
        writer_and_reader() as (writer, reader, ping),
        # The ping, not the periodic re-check, must wake the reader.
        mock.patch(f"{SHM_BROADCAST}.SHM_READER_RECHECK_INTERVAL_MS", new=60_000),
    ):
        reader._spin_condition.busy_loop_s = 0  # parks at its first wait
        received = []
        thread = threading.Thread(target=lambda: received.append(reader.dequeue()))
        thread.start()
        wait_for(writer._spin_condition.idle_flags.any_raised)
        time.sleep(0.05)  # let it reach the poll
        started = time.monotonic()
        writer.enqueue("wake")
        thread.join(timeout=10)
        assert received == ["wake"] and time.monotonic() - started < 2
        ping.assert_called_once()

        # Having read, the reader lowered its flag: a busy reader gets no ping.
        assert not writer._spin_condition.idle_flags.any_raised()
        reader._spin_condition.busy_loop_s = 9999
        writer.enqueue("busy")
        assert reader.dequeue(timeout=5) == "busy"
        ping.assert_called_once()


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
