"""stoker.echo: adaptive and fixed-factor data echoing over real producers (threads that take
real time per batch, and a DataLoader with worker processes)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch
import torch.utils.data

import stoker

BATCH = 8


class Producer:
    """``batches`` batches per pass, each taking ``delay`` seconds to make: images (B, 3, 4, 4)
    filled with each example's id, and the ids as labels, so every served example can be checked."""

    def __init__(self, batches: int, delay: float = 0.0, fail_after: int | None = None) -> None:
        self.batches, self.delay, self.fail_after = batches, delay, fail_after

    def __iter__(self):
        for b in range(self.batches):
            if self.fail_after is not None and b == self.fail_after:
                raise OSError("disk went away")
            time.sleep(self.delay)
            ids = torch.arange(b * BATCH, (b + 1) * BATCH)
            yield ids.float()[:, None, None, None].expand(-1, 3, 4, 4).clone(), ids


def consume(batches, step: float = 0.0):
    """Labels of every served batch, and the time each ``next()`` took; checks images match labels."""
    labels, waits = [], []
    iterator = iter(batches)
    while True:
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


def test_adaptive_echoes_nothing_when_the_producer_keeps_up():
    """A producer that makes a batch at once, a loop of 100 ms steps: the upstream thread refills
    its two prefetched batches within a step unless the machine starves it for ~200 ms."""
    echoed = stoker.echo(Producer(12))
    labels, _ = consume(echoed, step=0.1)
    assert echoed.stats().echoed_batches == 0
    assert torch.equal(torch.cat(labels), torch.arange(12 * BATCH))  # fresh batches, in order


@pytest.mark.parametrize("mode", ["example", "batch"])
def test_adaptive_keeps_a_slow_producer_s_consumer_busy(mode):
    """Producer 10x slower than the loop: once the first fresh batch is in, the loop never waits
    for a fresh one (the echoer's own count of time blocked on the producer stays at the first
    batch's), no example is served more than max_factor times, and every fresh example comes
    exactly once per pass. Wide margins: a busy machine slows the loop's steps and the producer alike."""
    echoed = stoker.echo(Producer(10, delay=0.1), mode=mode, max_factor=20)
    for _ in range(2):  # two passes: the second starts afresh
        before = echoed.stats()
        labels, waits = consume(echoed, step=0.01)
        after = echoed.stats()
        counts = Counter(torch.cat(labels).tolist())
        assert set(counts) == set(range(10 * BATCH)) and max(counts.values()) <= 20
        assert after.fresh_batches - before.fresh_batches == 10
        assert after.echoed_batches - before.echoed_batches >= 10  # ~9 per fresh batch; 1 unless the loop is 10x slow
        # Without echoing, every step would wait ~90 ms for a fresh batch.
        assert after.wait_s - before.wait_s <= waits[0], (after.wait_s - before.wait_s, waits[0])


def test_adaptive_respects_max_factor_and_waits_when_it_is_spent():
    echoed = stoker.echo(Producer(10, delay=0.03), max_factor=2)
    labels, waits = consume(echoed, step=0.001)
    assert max(Counter(torch.cat(labels).tolist()).values()) <= 2
    assert echoed.stats().wait_s > 0.1  # echoes ran out: the loop waited for fresh data


def test_min_fresh_fraction_bounds_the_echoes():
    echoed = stoker.echo(Producer(10, delay=0.03), max_factor=10, min_fresh_fraction=0.5)
    consume(echoed, step=0.001)
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
