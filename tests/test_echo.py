"""stoker.echo: adaptive and fixed-factor data echoing over real producers (threads that take
real time per batch, and a DataLoader with worker processes)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from functools import partial

import pytest
import torch
import torch.utils.data

import stoker

BATCH = 8


class Producer:
    """``batches`` batches per pass, each taking ``delay`` seconds to make: images (B, 3, 4, 4)
    filled with each example's id, and the ids as labels, so every served example can be checked.
    With ``pace``, batch b > 0 is made only once ``pace(b)`` is true (counted work, not time: a
    producer slower than its loop however busy the machine). ``handed`` counts the batches taken
    from it (the consumer of the generator came back for the next)."""

    def __init__(self, batches: int, delay: float = 0.0, fail_after: int | None = None,
                 pace: Callable[[int], bool] | None = None) -> None:
        self.batches, self.delay, self.fail_after, self.pace = batches, delay, fail_after, pace
        self.handed = 0

    def __iter__(self):
        for b in range(self.batches):
            if self.fail_after is not None and b == self.fail_after:
                raise OSError("disk went away")
            if self.pace is not None and b:
                wait_until(partial(self.pace, b))
            time.sleep(self.delay)
            ids = torch.arange(b * BATCH, (b + 1) * BATCH)
            yield ids.float()[:, None, None, None].expand(-1, 3, 4, 4).clone(), ids
            self.handed = b + 1


def wait_until(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    """Wait for ``condition`` (a generous deadline: only a condition never met fails)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def consume(batches, step: float = 0.0, before: Callable[[int], object] | None = None, count: int | None = None):
    """Labels of every served batch (the first ``count``), and the time each ``next()`` took;
    checks images match labels. ``before(k)`` runs before batch k is asked for."""
    labels, waits = [], []
    iterator = iter(batches)
    while count is None or len(labels) < count:
        if before is not None:
            before(len(labels))
        asked = time.perf_counter()
        try:
            images, ids = next(iterator)
        except StopIteration:
            return labels, waits
        waits.append(time.perf_counter() - asked)
        assert images.shape[1:] == (3, 4, 4) and images.shape[0] == len(ids) <= BATCH
        assert torch.equal(images[:, 0, 0, 0].long(), ids)  # every example kept its own label
        labels.append(ids)
        time.sleep(step)
    return labels, waits


def test_adaptive_echoes_nothing_when_the_producer_keeps_up():
    """Each batch after the first (whose ask starts the upstream thread) is asked for once the
    producer has made it (the upstream thread came back for the next): a fresh one is always
    there, so nothing is echoed, however busy the machine."""
    producer = Producer(12)
    echoed = stoker.echo(producer)
    labels, _ = consume(echoed, before=lambda k: k == 0 or wait_until(lambda: producer.handed > k), count=12)
    assert echoed.stats().echoed_batches == 0
    assert torch.equal(torch.cat(labels), torch.arange(12 * BATCH))  # fresh batches, in order


@pytest.mark.parametrize("mode", ["example", "batch"])
def test_adaptive_keeps_a_slow_producer_s_consumer_busy(mode):
    """A producer that makes its next batch only after 5 echoes were served (counted, not timed:
    slower than the loop on any machine): once the first fresh batch is in, the loop never waits
    for a fresh one (the echoer's own count of time blocked on the producer stays at the first
    batch's), no example is served more than max_factor times, and every fresh example comes
    exactly once per pass."""
    echoed = None
    producer = Producer(10, pace=lambda b: echoed.stats().echoed_batches >= start + 5 * b)
    echoed = stoker.echo(producer, mode=mode, max_factor=20)
    for _ in range(2):  # two passes: the second starts afresh
        before = echoed.stats()
        start = before.echoed_batches
        labels, waits = consume(echoed)
        after = echoed.stats()
        counts = Counter(torch.cat(labels).tolist())
        assert set(counts) == set(range(10 * BATCH)) and max(counts.values()) <= 20
        assert after.fresh_batches - before.fresh_batches == 10
        assert after.echoed_batches - before.echoed_batches >= 9 * 5
        assert after.wait_s - before.wait_s <= waits[0], (after.wait_s - before.wait_s, waits[0])


def test_adaptive_respects_max_factor_and_waits_when_it_is_spent():
    """A loop with no step of its own asks far faster than a producer of 30 ms batches: every
    example is echoed up to the limit, then the loop waits for fresh data (most of the 0.3 s the
    producer takes; a busy machine only lengthens it)."""
    echoed = stoker.echo(Producer(10, delay=0.03), max_factor=2)
    labels, waits = consume(echoed)
    assert max(Counter(torch.cat(labels).tolist()).values()) <= 2
    assert echoed.stats().echoed_batches > 0
    assert echoed.stats().wait_s > 0.1  # echoes ran out: the loop waited for fresh data


def test_min_fresh_fraction_bounds_the_echoes():
    """A producer that makes its next batch only after an echo was served: echoes are allowed
    while fresh examples are at least half of those served, and never more."""
    echoed = None
    producer = Producer(10, pace=lambda b: echoed.stats().echoed_batches >= b)
    echoed = stoker.echo(producer, max_factor=10, min_fresh_fraction=0.5)
    consume(echoed)
    stats = echoed.stats()
    assert stats.echoed_examples <= stats.fresh_examples
    assert stats.echoed_batches > 0


@pytest.mark.parametrize("mode", ["example", "batch"])
def test_a_fixed_factor_serves_every_example_exactly_factor_times(mode):
    echoed = stoker.echo(Producer(12), factor=3, mode=mode, buffer_batches=2)
    labels, _ = consume(echoed)
    counts = Counter(torch.cat(labels).tolist())
    assert set(counts.values()) == {3} and len(counts) == 12 * BATCH
    assert echoed.stats().effective_factor == 3.0
    assert sum(len(batch) < BATCH for batch in labels) <= 2  # only the last echoes of the pass may run short


def test_example_echoes_mix_examples_of_several_batches():
    echoed = stoker.echo(Producer(12), factor=2, buffer_batches=4)
    labels, _ = consume(echoed)
    echoes = labels[1:]  # after the first fresh batch, some batches hold examples of more than one fresh batch
    assert any(len(set((batch // BATCH).tolist())) > 1 for batch in echoes)


def test_echoes_get_fresh_augmentation_of_the_original_examples():
    seen = []

    def augment(batch):
        images, ids = batch
        seen.append(torch.equal(images[:, 0, 0, 0].long(), ids))  # the transform sees un-augmented data
        return images + torch.rand_like(images), ids

    echoed = stoker.echo(Producer(6), factor=3, transform=augment)
    served = [images for images, _ in echoed]
    assert all(seen) and len(served) == 18
    assert not any(torch.equal(served[0], other) for other in served[1:])


def test_dict_batches_keep_their_structure():
    def batches():
        for batch in Producer(4):
            yield {"image": batch[0], "label": batch[1], "meta": {"id": batch[1].numpy()}}

    for batch in stoker.echo(batches(), factor=2):
        assert set(batch) == {"image", "label", "meta"}
        assert torch.equal(batch["image"][:, 0, 0, 0].long(), batch["label"])
        assert (batch["meta"]["id"] == batch["label"].numpy()).all()


def test_an_error_in_the_loader_reaches_the_loop():
    with pytest.raises(OSError, match="disk went away"):
        consume(stoker.echo(Producer(10, fail_after=3)))


def test_example_mode_needs_tensors_and_says_so():
    with pytest.raises(TypeError, match="mode='batch'"):
        list(stoker.echo([["a", "b"], ["c", "d"]], factor=2))
    assert len(list(stoker.echo([["a", "b"], ["c", "d"]], factor=2, mode="batch"))) == 4


def test_watch_reports_the_echoes():
    lines = []
    for _ in stoker.watch(stoker.echo(Producer(10, delay=0.02)), every=5, log=lines.append):
        time.sleep(0.005)
    assert lines and all("echo:" in line for line in lines)


class SlowItems(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.full((3, 4, 4), float(i)), i


def test_over_a_dataloader_with_worker_processes():
    loader = torch.utils.data.DataLoader(SlowItems(), batch_size=BATCH, num_workers=2, multiprocessing_context="fork")
    echoed = stoker.echo(loader, max_factor=3)
    labels, _ = consume(echoed, step=0.005)
    counts = Counter(torch.cat(labels).tolist())
    assert set(counts) == set(range(64)) and max(counts.values()) <= 3
    assert echoed.stats().fresh_batches == len(loader)
