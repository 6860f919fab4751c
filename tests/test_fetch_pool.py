"""FetchPool (storage/fetch_pool.py): an object store's reads in flight, first queued first started,
at most its size at once, resized while reads are queued (the Loader's tuner turns it). Each read
here waits for the test to let it finish, so what runs at once is known, whatever the machine."""

from __future__ import annotations

import threading
import time

import pytest

from stoker.storage.fetch_pool import FetchPool


class Reads:
    """Reads that note when they start and finish only when let go (each its own event)."""

    def __init__(self, count: int) -> None:
        self.go = [threading.Event() for _ in range(count)]
        self.started: list[int] = []
        self.running = self.most = 0
        self._lock = threading.Lock()

    def read(self, k: int) -> int:
        with self._lock:
            self.started.append(k)
            self.running += 1
            self.most = max(self.most, self.running)
        self.go[k].wait(timeout=30)
        with self._lock:
            self.running -= 1
        return k

    def finish(self, futures: list) -> list[int]:
        """Let every read go; their results, in the order submitted."""
        for event in self.go:
            event.set()
        return [future.result(timeout=30) for future in futures]

    def until_started(self, count: int) -> list[int]:
        """The reads started, once ``count`` have (a generous bound: a failure, not a slow machine)."""
        deadline = time.monotonic() + 30
        while len(self.started) < count and time.monotonic() < deadline:
            time.sleep(0.005)
        return list(self.started)


def test_reads_start_in_the_order_queued_no_more_at_once_than_the_size():
    pool, reads = FetchPool(2, "test-fetch"), Reads(6)
    futures = [pool.submit(reads.read, k) for k in range(6)]
    assert reads.until_started(2) == [0, 1]
    reads.go[0].set()
    assert reads.until_started(3) == [0, 1, 2]
    assert reads.finish(futures) == list(range(6)) and reads.most == 2


def test_a_larger_pool_starts_the_reads_queued_at_once():
    pool, reads = FetchPool(1, "test-fetch"), Reads(5)
    futures = [pool.submit(reads.read, k) for k in range(5)]
    assert reads.until_started(1) == [0]
    pool.resize(4)
    assert reads.until_started(4) == [0, 1, 2, 3]
    assert reads.finish(futures) == list(range(5)) and reads.most == 4


def test_a_smaller_pool_takes_effect_as_reads_finish():
    pool, reads = FetchPool(3, "test-fetch"), Reads(6)
    futures = [pool.submit(reads.read, k) for k in range(6)]
    assert reads.until_started(3) == [0, 1, 2]
    pool.resize(1)  # none of the three running is abandoned
    for k in (0, 1, 2):
        reads.go[k].set()
    assert futures[2].result(timeout=30) == 2 and reads.until_started(4) == [0, 1, 2, 3]
    reads.go[3].set()
    assert reads.until_started(5) == [0, 1, 2, 3, 4]
    assert reads.running <= 1
    assert reads.finish(futures) == list(range(6))


def test_a_read_cancelled_while_queued_never_runs_and_errors_reach_the_caller():
    pool, reads = FetchPool(1, "test-fetch"), Reads(3)
    first = pool.submit(reads.read, 0)
    cancelled = pool.submit(reads.read, 1)
    assert reads.until_started(1) == [0] and cancelled.cancel()
    failing = pool.submit(lambda: 1 / 0)
    after = pool.submit(reads.read, 2)
    reads.go[0].set()
    reads.go[2].set()
    assert first.result(timeout=30) == 0 and after.result(timeout=30) == 2 and reads.started == [0, 2]
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=30)
