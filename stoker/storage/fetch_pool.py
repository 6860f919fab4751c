"""FetchPool: an object store's reads in flight, first queued first started, at most ``size`` at
once, the size changed while reads are queued (the Loader's tuner turns it; a ThreadPoolExecutor's
cannot change). A smaller size takes effect as reads finish: no read is abandoned.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class FetchPool:
    """Runs what :meth:`submit` queues on at most ``size`` threads named ``name``, in order."""

    def __init__(self, size: int, name: str) -> None:
        self.size, self.name = size, name
        self._queue: deque[tuple[Future, Callable[..., Any], tuple]] = deque()
        self._changed = threading.Condition()
        self._threads = 0  # started and not yet ended
        self._waiting = 0  # of those, waiting for work

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """``fn(*args)`` once a thread is free and everything queued before has started."""
        future: Future[T] = Future()
        with self._changed:
            self._queue.append((future, fn, args))
            self._start_threads()
            self._changed.notify()
        return future

    def resize(self, size: int) -> None:
        """At most ``size`` reads at once from now: more start at once, fewer as reads finish."""
        with self._changed:
            self.size = size
            self._start_threads()
            self._changed.notify_all()

    def _start_threads(self) -> None:
        """Threads for the queued work up to ``size`` (the condition held)."""
        while self._threads < self.size and len(self._queue) > self._waiting:
            self._threads += 1
            threading.Thread(target=self._work, name=f"{self.name}_{self._threads}", daemon=True).start()
            self._waiting += 1  # counted as waiting until it takes work

    def _work(self) -> None:
        while True:
            with self._changed:
                while not self._queue and self._threads <= self.size:
                    self._changed.wait()
                self._waiting -= 1
                if self._threads > self.size:  # the pool was made smaller: this thread ends
                    self._threads -= 1
                    return
                future, fn, args = self._queue.popleft()
            if future.set_running_or_notify_cancel():  # False: cancelled while queued
                try:
                    result = fn(*args)
                except BaseException as e:  # noqa: BLE001 -- the future carries it to whoever waits
                    future.set_exception(e)
                else:
                    future.set_result(result)
            with self._changed:
                self._waiting += 1
