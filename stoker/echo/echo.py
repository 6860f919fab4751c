"""Data echoing (Choi et al., 2019): serve batches made of data already in memory while the input
pipeline cannot keep up, and, in adaptive mode, only then.

    loader ──> upstream thread ──> queue of fresh batches ──┐
                                                           ├─> fresh batch ready? serve it (and keep it)
              recent fresh batches (ExampleBuffer) ────────┘   none ready? serve an echo, if allowed

The upstream thread reads ahead of the training loop, so the wrapped loader's own position runs
ahead of what was consumed; Echo's state is the loader's position after the last fresh batch the
loop was served (see :meth:`Echo.state_dict`). Its passes are the wrapped loader's: each
``iter()`` starts one (a whole pass over the current epoch, or the rest of a loaded state's), as
a DataLoader's would.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from stoker.echo.examples import ExampleBuffer, batch_size, examples_in, flatten
from stoker.state import COUNT, SECONDS, StateError, Stateful, checked, load_state_of, read_state, record, set_epoch_of, state_of

END = object()  # what Upstream gives after the last batch


@dataclass(frozen=True)
class EchoStats:
    """What an :class:`Echo` has served so far (all passes)."""

    fresh_batches: int
    echoed_batches: int
    fresh_examples: int
    echoed_examples: int
    wait_s: float  # time the loop waited for a fresh batch
    step_s: float  # time the loop spent between batches (its own work)

    @property
    def effective_factor(self) -> float:
        """Examples served per fresh example (1.0: no echoing)."""
        return (self.fresh_examples + self.echoed_examples) / self.fresh_examples if self.fresh_examples else 1.0

    @property
    def echoed_fraction(self) -> float:
        """Share of the batches served that were echoes."""
        total = self.fresh_batches + self.echoed_batches
        return self.echoed_batches / total if total else 0.0

    @property
    def time_saved_s(self) -> float:
        """An estimate of the waiting the echoes replaced: echoed batches x the loop's mean step time."""
        served = self.fresh_batches + self.echoed_batches
        return self.echoed_batches * self.step_s / served if served else 0.0


class Echo:
    """An iterable over ``loader``'s batches with echoes mixed in; see :func:`echo`."""

    def __init__(self, loader: Iterable[Any], *, mode: Literal["example", "batch"], factor: int | None,
                 max_factor: int, min_fresh_fraction: float, buffer_batches: int, prefetch: int,
                 transform: Callable[[Any], Any] | None, seed: int) -> None:
        self.loader = loader
        self.mode = mode
        self.factor = factor
        self.adaptive = factor is None
        self.limit = factor if factor is not None else max_factor  # times any example is served, at most
        self.min_fresh_fraction = min_fresh_fraction
        self.buffer_batches = buffer_batches
        self.prefetch = prefetch
        self.transform = transform
        self.rng = np.random.default_rng(seed)
        self._counts = np.zeros(4, dtype=np.int64)  # fresh batches, echoed batches, fresh examples, echoed examples
        self._wait_s = self._step_s = 0.0
        # What the loop consumed of the loader: its state after the last fresh batch served (a
        # stateful loader), and the fresh examples served in this pass (for a DataLoader's sampler).
        self._stateful = isinstance(loader, Stateful)
        self._consumed_state: dict[str, Any] | None = None
        self._fresh_in_pass = 0

    def stats(self) -> EchoStats:
        """Counts and times so far."""
        fb, eb, fe, ee = (int(c) for c in self._counts)
        return EchoStats(fb, eb, fe, ee, self._wait_s, self._step_s)

    def watch_note(self) -> str:
        """One line for :func:`stoker.watch`'s log."""
        s = self.stats()
        inner = getattr(self.loader, "watch_note", None)
        return (f"echo: {100 * s.echoed_fraction:.0f}% of batches echoed, factor {s.effective_factor:.2f}, "
                f"~{s.time_saved_s:.1f} s of waiting saved" + (f"; {text}" if inner and (text := inner()) else ""))

    def set_epoch(self, epoch: int) -> None:
        """Passed on to the wrapped loader (stoker.Loader, or a DataLoader's sampler) when it has one."""
        set_epoch_of(self.loader, epoch)
        self._consumed_state, self._fresh_in_pass = None, 0

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's state after the fresh batches the loop was served (not after what
        the upstream thread fetched ahead), with the counts and the echo generator's state.
        Echoes after a resume are drawn from batches fresh after it: the memory of recent batches
        (hundreds of MB) is not saved, so fresh data resumes exactly and echoes resume in kind."""
        loader = self._consumed_state if self._stateful else state_of(self.loader, self._fresh_in_pass)
        if loader is None:  # no pass yet: the loader has not moved
            loader = state_of(self.loader, 0)
        return record("Echo", loader=loader, counts=self._counts.tolist(), wait_s=self._wait_s, step_s=self._step_s,
                      rng=self.rng.bit_generator.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the wrapped loader resumes after the last fresh batch
        served. Another part's state, or a value out of range, is refused (StateError) before
        anything is loaded; a state saved by the previous format (no record tag) is taken, checked."""
        saved = read_state(state, "Echo", ("loader", "counts", "wait_s", "step_s", "rng"), version_1=True)
        counts = saved["counts"]
        if not isinstance(counts, list | tuple) or len(counts) != 4:
            raise StateError(f"stoker.echo cannot load this state: counts={counts!r} must be 4 counts (fresh batches, "
                             "echoed batches, fresh examples, echoed examples)")
        counts = [checked("Echo", f"counts[{i}]", count, COUNT) for i, count in enumerate(counts)]
        wait_s, step_s = (checked("Echo", name, saved[name], SECONDS) for name in ("wait_s", "step_s"))
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = saved["rng"]
        except (TypeError, ValueError, KeyError) as e:
            raise StateError(f"stoker.echo cannot load this state: rng={saved['rng']!r} is not the state of a "
                             f"{type(rng.bit_generator).__name__} generator ({e})") from None
        load_state_of(self.loader, saved["loader"])
        self._counts = np.array(counts, dtype=np.int64)
        self._wait_s, self._step_s = wait_s, step_s
        self.rng.bit_generator.state = rng.bit_generator.state
        self._consumed_state, self._fresh_in_pass = None, 0

    def __iter__(self) -> Iterator[Any]:
        return self._run()

    def _run(self) -> Iterator[Any]:
        """One pass over the loader: every fresh batch once, echoes between them. Left early, the
        state stays what the loop was served (the upstream thread fetched ahead of it), and the
        next pass is the loader's next: its epoch again, from the start."""
        batches = iter(self.loader)  # here, not in the upstream thread: the pass starts where the loader says now
        self._consumed_state = state_of(self.loader, 0) if self._stateful else None
        self._fresh_in_pass = 0
        upstream = Upstream(batches, self.loader, self.prefetch, self._stateful)
        del batches  # the thread's alone: when it stops, the loader's pass ends (its threads stop)
        finished = False
        memory = EchoMemory(self.mode, self.buffer_batches, self.rng, self.limit, strict=not self.adaptive)
        clock = time.perf_counter

        def give(batch: Any, fresh: bool) -> Iterator[Any]:
            served = self._serve(batch, fresh)
            handed = clock()
            yield served
            self._step_s += clock() - handed

        try:
            while True:
                item = upstream.poll()
                if item is None and self.adaptive:
                    echoed = self._echo(memory)
                    if echoed is not None:
                        yield from give(echoed, fresh=False)
                        continue
                if item is None:
                    asked = clock()
                    item = upstream.get()
                    self._wait_s += clock() - asked
                if item is END:
                    break
                item, self._consumed_state = item
                self._fresh_in_pass += examples_in(item)
                memory.add(item)
                yield from give(item, fresh=True)
                # A fixed factor: echo whatever exceeds a reserve of about buffer_batches batches
                # still to be echoed, so each echo mixes examples of several fresh batches.
                while not self.adaptive and memory.available() > self.buffer_batches * memory.last_size:
                    yield from give(memory.draw(), fresh=False)
            while not self.adaptive and (echoed := memory.draw()) is not None:
                yield from give(echoed, fresh=False)  # the rest of the fixed factor
            finished = True
        finally:
            upstream.stop()
            if not finished:
                upstream.join()  # it lets go of the loader's pass before another can start

    def _echo(self, memory: EchoMemory) -> Any | None:
        """An echoed batch, when the limits allow one."""
        fresh, echoed = self._counts[2], self._counts[3]
        if fresh < self.min_fresh_fraction * (fresh + echoed + memory.last_size):
            return None
        return memory.echo()

    def _serve(self, batch: Any, fresh: bool) -> Any:
        """Count ``batch``, apply the transform (after echoing: each echo gets fresh augmentation)."""
        n = examples_in(batch)
        self._counts[0 if fresh else 1] += 1
        self._counts[2 if fresh else 3] += n
        return self.transform(batch) if self.transform is not None else batch


class EchoMemory:
    """Recent fresh batches: their examples (example mode) or the whole batches (batch mode), with
    how often each was served. Examples may be served ``limit`` times; with ``strict`` (a fixed
    factor) nothing is dropped before it has been, so every example is served exactly that often."""

    def __init__(self, mode: str, buffer_batches: int, rng: np.random.Generator, limit: int, strict: bool) -> None:
        self.mode, self.rng, self.limit, self.strict = mode, rng, limit, strict
        self.buffer_batches = buffer_batches
        self.examples: ExampleBuffer | None = None
        self.batches: deque[list] = deque()  # [batch, times served], batch mode
        self.last_size = 0  # examples in the latest fresh batch: the size of an echoed one

    def add(self, batch: Any) -> None:
        """Keep a fresh batch, just served once."""
        if self.mode == "batch":
            self.batches.append([batch, 1])
            while len(self.batches) > self.buffer_batches and not (self.strict and self.batches[0][1] < self.limit):
                self.batches.popleft()
            self.last_size = 1
            return
        leaves, rebuild = flatten(batch)
        n = batch_size(leaves)
        if self.examples is None:
            self.examples = ExampleBuffer(self.buffer_batches * n, self.rng, self.limit if self.strict else None)
        self.examples.add(leaves, rebuild)
        self.last_size = n

    def available(self) -> int:
        """Examples (or batches) that may be served again."""
        if self.mode == "batch":
            return sum(1 for _, served in self.batches if served < self.limit)
        return self.examples.available(self.limit) if self.examples is not None else 0

    def echo(self) -> Any | None:
        """An echo in place of a fresh batch that is not ready (the adaptive policy): a batch the
        size of the latest fresh one, where that many examples may still be served; else None."""
        n = self.last_size
        return self.draw() if n and self.available() >= n else None

    def draw(self) -> Any | None:
        """An echoed batch, or None when nothing may be served again."""
        if self.mode == "batch":
            eligible = [entry for entry in self.batches if entry[1] < self.limit]
            if not eligible:
                return None
            entry = eligible[int(self.rng.integers(len(eligible)))]
            entry[1] += 1
            return entry[0]
        return self.examples.draw(self.last_size, self.limit) if self.examples is not None else None


class Upstream:
    """A thread that pulls fresh batches of one pass (``batches``, an iterator over ``loader``) into
    a bounded queue, each with the loader's state right after it (``stateful`` loaders; else None),
    taken in this thread where the loader is paused at that batch."""

    def __init__(self, batches: Iterator[Any], loader: Iterable[Any], prefetch: int, stateful: bool) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stopped = threading.Event()
        self._stateful = stateful
        self._thread = threading.Thread(target=self._pull, args=(batches, loader), name="stoker-echo-upstream",
                                        daemon=True)
        self._thread.start()

    def poll(self) -> Any | None:
        """The next fresh batch (or the end) if one is ready, else None."""
        try:
            return self._unwrap(self._queue.get_nowait())
        except queue.Empty:
            return None

    def get(self) -> Any:
        """The next fresh batch (or the end), waiting for it."""
        return self._unwrap(self._queue.get())

    def stop(self) -> None:
        self._stopped.set()

    def join(self) -> None:
        """Wait for the thread to let go of the loader (it stops at the batch it is making)."""
        self._thread.join()

    def _unwrap(self, item: tuple[str, Any]) -> Any:
        kind, value = item
        if kind == "error":
            raise value
        return value

    def _pull(self, batches: Iterator[Any], loader: Iterable[Any]) -> None:
        try:
            for batch in batches:
                state = loader.state_dict() if self._stateful else None  # type: ignore[attr-defined]
                if not self._put(("batch", (batch, state))):
                    return
            self._put(("batch", END))
        except BaseException as e:  # noqa: BLE001 -- handed to the consumer, raised there
            self._put(("error", e))

    def _put(self, item: tuple[str, Any]) -> bool:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


def echo(loader: Iterable[Any], *, mode: Literal["example", "batch"] = "example", factor: int | None = None,
         max_factor: int = 4, min_fresh_fraction: float = 0.0, buffer_batches: int = 8, prefetch: int = 2,
         transform: Callable[[Any], Any] | None = None, seed: int = 0) -> Echo:
    """Wrap ``loader`` (a DataLoader, stoker.Loader, a generator: any iterable of batches) so the
    training loop never waits for data while echoes can stand in.

    Adaptive (default, ``factor=None``): a thread reads fresh batches ahead (``prefetch``); each
    step gets a fresh batch when one is ready and an echo only when none is, so a pipeline that
    keeps up is never echoed. Every fresh batch is served exactly once per pass, and a pass ends
    with the loader's. No example is served more than ``max_factor`` times, and echoes stop while
    fresh examples would fall below ``min_fresh_fraction`` of those served.

    ``factor=k``: every example is served exactly k times, echoes following each fresh batch
    (Choi et al.'s fixed echo factor), whether or not the pipeline keeps up.

    ``mode="example"``: an echo is a new batch of examples drawn at random from the last
    ``buffer_batches`` fresh batches (batches must be tensors or numpy arrays, or tuples, lists
    or dicts of them, sharing their first dimension); ``"batch"``: an echo repeats a whole recent
    batch. Put augmentation after echoing: pass it as ``transform`` (applied to every batch
    served) or apply it in the loop, so echoed examples are the un-augmented ones and get fresh
    random augmentation each time (Choi et al. found echoing before augmentation better).
    ``stats()`` gives the counts; :func:`stoker.watch` logs them.
    """
    if mode not in ("example", "batch"):
        raise ValueError(f"mode must be 'example' or 'batch', got {mode!r}")
    if factor is not None and (not isinstance(factor, int) or factor < 1):
        raise ValueError(f"factor must be a whole number >= 1, got {factor!r}")
    if max_factor < 1:
        raise ValueError(f"max_factor must be >= 1, got {max_factor}")
    if not 0.0 <= min_fresh_fraction <= 1.0:
        raise ValueError(f"min_fresh_fraction must be between 0 and 1, got {min_fresh_fraction}")
    if buffer_batches < 1:
        raise ValueError(f"buffer_batches must be >= 1, got {buffer_batches}")
    return Echo(loader, mode=mode, factor=factor, max_factor=max_factor, min_fresh_fraction=min_fresh_fraction,
                buffer_batches=buffer_batches, prefetch=prefetch, transform=transform, seed=seed)
