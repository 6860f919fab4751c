"""The tuner inside a real Loader: its decisions change threads, batches ahead, worker processes,
blocks read ahead and echo mid-epoch, and the batches stay the ones an untuned Loader makes, byte
for byte. The measurements are forced (a hook on the Loader's meter gives the tuner scripted
windows, once the real meter has a window), so what the tuner decides does not depend on this
machine's speed; everything else is the real Loader on real shards."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

import stoker
from stoker.decode.crops import CropSpec
from stoker.loader import plan as plan_module
from stoker.loader.meter import Meter
from stoker.loader.process_batches import WorkerProcesses
from stoker.tune.estimate import Window

SPEC = CropSpec("random_resized", (32, 32))


def scripted(monkeypatch: pytest.MonkeyPatch, windows: list[Window]) -> Iterator[Window]:
    """The Loader's meter gives ``windows`` in turn, each where the real one would close a window
    of a batch (after the batches it leaves out following a change); then none."""
    real, script = Meter.window, iter(windows)

    def window(self: Meter, batches: int = 1, seconds: float = 0.0) -> Window | None:
        return None if real(self, 1, 0.0) is None else next(script, None)

    monkeypatch.setattr(Meter, "window", window)
    return script


def batches(loader: stoker.Loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in loader]


def assert_same(made: list, expected: list) -> None:
    assert len(made) == len(expected)
    for (images, labels), (want_images, want_labels) in zip(made, expected, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def window(rate: float, waited: float, busy: float, cpu: float, other: float = 0.0, disk: float = 0.0) -> Window:
    """A second of a Loader's counters at ``rate`` img/s."""
    return Window(1.0, round(rate), round(rate), waited, busy, cpu, cpu, other_cores=other, disk_bytes=disk)


def test_batches_stay_the_same_while_the_tuner_changes_how_they_are_made(packed, monkeypatch):
    """On 4 cores: other processes take 2 (back off 5 -> 3 threads, as fast: kept), the workers idle
    (a batch more ahead), the GIL (2 worker processes, measured worse: undone, back to threads), the
    others leave (4 threads), the disk (more blocks read ahead): every batch as an untuned Loader's."""
    monkeypatch.setattr(plan_module, "available_cores", lambda: 4)
    sample_bytes = 70e3
    scripted(monkeypatch, [
        window(2000, 0.5, 5.0, 2.0, other=2.0),  # the cores others leave are used: back off ...
        window(2000, 0.5, 3.0, 2.0, other=2.0),  # ... as fast: kept, settled
        window(900, 0.5, 1.0, 0.9, other=2.0),  # the rate moved ...
        window(900, 0.5, 1.0, 0.9, other=2.0),  # ... two windows running: looked at again from the next
        window(900, 0.5, 1.0, 0.9, other=2.0),  # 3 threads busy a third of the time: prefetch 3
        window(1000, 0.5, 3.0, 1.0, other=2.0),  # better: kept; the GIL: 2 worker processes of 1 thread
        window(800, 0.6, 2.0, 0.8, other=2.0),  # worse: undone, back to threads
        window(2400, 0.5, 3.0, 2.7),  # the others left ...
        window(2400, 0.5, 3.0, 2.7),  # ... the cores limit, 4 threads
        window(3200, 0.4, 4.0, 3.2),  # better: kept, settled
        window(2000, 0.5, 4.0, 2.0, disk=2000 * sample_bytes),  # the rate moved ...
        window(2000, 0.5, 4.0, 2.0, disk=2000 * sample_bytes),  # ... two windows running
        window(2000, 0.5, 4.0, 2.0, disk=2000 * sample_bytes),  # the disk limits: more blocks ahead
        window(2600, 0.4, 4.0, 2.6, disk=2600 * sample_bytes),  # better: kept
    ])
    in_processes = []
    made_there = WorkerProcesses.batches

    def counted(self, *args, **kwargs):  # the real method; which batches it made is noted
        for made in made_there(self, *args, **kwargs):
            in_processes.append(made[0])
            yield made

    monkeypatch.setattr(WorkerProcesses, "batches", counted)
    loader = stoker.Loader(stoker.ShardDataset(packed), 1, crop=SPEC, seed=7, mp_context="fork")
    made = batches(loader)
    actions = [(d.action, d.settings) for d in loader.decisions]
    assert [a for a, _ in actions] == ["back off", "keep", "settle", "try", "keep", "try", "undo", "settle", "try",
                                       "keep", "settle", "try", "keep", "settle"]
    seen = [s for _, s in actions]
    assert seen[0].threads == 3 and seen[3].prefetch == 3 and (seen[5].processes, seen[5].threads) == (2, 1)
    assert (seen[6].processes, seen[6].threads) == (0, 3) and seen[8].threads == 4 and seen[11].readahead == 64
    assert loader.threads == 4 and loader.prefetch == 3 and loader.processes == 0
    explained = loader.explain()
    assert "processes 0 -> 2" in explained and "tuner: undo" in explained
    assert in_processes  # batches of the epoch were made by the worker processes the tuner tried
    reference = stoker.Loader(stoker.ShardDataset(packed), 1, crop=SPEC, seed=7, threads=2, tune=False)
    assert_same(made, batches(reference))
    assert_same(batches(loader), batches(reference))  # the next epoch, at the settings kept


def test_arguments_given_are_never_tuned(packed, monkeypatch):
    monkeypatch.setattr(plan_module, "available_cores", lambda: 4)
    scripted(monkeypatch, [window(2000, 0.5, 5.0, 2.0, other=2.0), window(900, 0.5, 1.0, 0.9, other=2.0)] * 3)
    loader = stoker.Loader(stoker.ShardDataset(packed), 2, crop=SPEC, seed=7, threads=5, prefetch=2)
    made = batches(loader)
    assert all(d.settings.threads == 5 and d.settings.prefetch == 2 for d in loader.decisions)
    assert "all fixed" not in loader.explain() and "tuned while it runs: readahead" in loader.explain()
    reference = stoker.Loader(stoker.ShardDataset(packed), 2, crop=SPEC, seed=7, threads=2, tune=False)
    assert_same(made, batches(reference))


def test_tune_false_keeps_the_plan(packed, monkeypatch):
    scripted(monkeypatch, [window(900, 0.5, 1.0, 0.9)] * 10)
    loader = stoker.Loader(stoker.ShardDataset(packed), 8, crop=SPEC, seed=7, threads=3, tune=False)
    batches(loader)
    assert loader.decisions == () and "fixed: tune=False" in loader.explain()


def test_the_state_records_nothing_of_the_tuning(packed, monkeypatch):
    """A state saved by a tuned Loader mid-epoch is an untuned one's: each resumes the other's."""
    monkeypatch.setattr(plan_module, "available_cores", lambda: 4)
    scripted(monkeypatch, [window(2000, 0.5, 5.0, 2.0, other=2.0), window(2000, 0.5, 3.0, 2.0, other=2.0)])
    tuned = stoker.Loader(stoker.ShardDataset(packed), 4, crop=SPEC, seed=3)
    untuned = stoker.Loader(stoker.ShardDataset(packed), 4, crop=SPEC, seed=3, threads=2, tune=False)
    passes = iter(tuned)
    for _ in range(12):
        next(passes)
    state = tuned.state_dict()
    assert tuned.decisions and set(state) == set(untuned.state_dict())
    rest = [(images.clone(), labels.clone()) for images, labels in passes]
    untuned.load_state_dict(state)
    assert_same(batches(untuned), rest)


def test_stoker_watch_shows_each_decision(packed, monkeypatch):
    monkeypatch.setattr(plan_module, "available_cores", lambda: 4)
    scripted(monkeypatch, [window(2000, 0.5, 5.0, 2.0, other=2.0)])
    lines: list[str] = []
    for _ in stoker.watch(stoker.Loader(stoker.ShardDataset(packed), 2, crop=SPEC, seed=1), every=8, log=lines.append):
        pass
    shown = [line for line in lines if "tuner: back off: threads 5 -> 3" in line]
    assert len(shown) == 1 and "other processes took 2.0 of 4 cores" in shown[0]


def test_echo_auto_serves_echoes_while_the_input_lags_and_every_fresh_batch_once(numbered, monkeypatch):
    """The cores limit and the loop takes 2.5x what is made: with echo="auto" the tuner allows
    echoes; a batch that is slow to come (the transform holds it until the loop got an echo) is
    stood in for by echoes of the batches before it, and the fresh batches are an untuned
    Loader's, in order."""
    scripted(monkeypatch, [window(1000, 0.6, 1.0, 1.0)])
    echoed = threading.Event()
    calls = 0

    def held_back(image: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 30:  # well after the tuner allowed echoes (its first window: the first batch)
            echoed.wait(timeout=30)
        return image

    loader = stoker.Loader(stoker.ShardDataset(numbered), 4, crop=SPEC, seed=5, threads=1, transform=held_back,
                           echo="auto")
    served, seen = [], set()
    for images, labels in loader:  # sample i is alone in class i: an echo's labels were all seen before
        served.append((images.clone(), labels.clone()))
        if set(labels.tolist()) <= seen:
            echoed.set()
        seen |= set(labels.tolist())
    assert loader.decisions[0].action == "try" and loader.decisions[0].settings.echo > 1
    reference = batches(stoker.Loader(stoker.ShardDataset(numbered), 4, crop=SPEC, seed=5, threads=1,
                                      transform=held_back, tune=False))
    fresh, echoes = [], []
    for images, labels in served:
        is_fresh = len(fresh) < len(reference) and torch.equal(labels, reference[len(fresh)][1])
        (fresh if is_fresh else echoes).append((images, labels))
    assert_same(fresh, reference)
    assert echoes and echoed.is_set()
    for images, labels in echoes:  # each echo's examples are fresh examples served before, pixels and labels
        for image, label in zip(images, labels, strict=True):
            assert any(torch.equal(image, i) and label == j for im, lb in fresh for i, j in zip(im, lb, strict=True))


def test_echo_needs_the_tuner(packed):
    with pytest.raises(stoker.OptionError, match="echo='auto'.*needs tune=True"):
        stoker.Loader(stoker.ShardDataset(packed), 8, echo="auto", tune=False)
    with pytest.raises(stoker.OptionError, match="echo='always'"):
        stoker.Loader(stoker.ShardDataset(packed), 8, echo="always")  # type: ignore[arg-type]
    with pytest.raises(stoker.OptionError, match="tune=1"):
        stoker.Loader(stoker.ShardDataset(packed), 8, tune=1)  # type: ignore[arg-type]


def test_an_object_store_gets_other_reads_in_flight_and_parts_mid_epoch(remote, s3, packed, monkeypatch):
    """Data on S3 (moto): every read in flight busy while the loop waits, the cores idle: the tuner
    changes the reads in flight and their size on the data set's connection, the batches are the
    local pack's."""
    monkeypatch.setattr(plan_module, "available_cores", lambda: 2)
    dataset = stoker.ShardDataset(remote, storage_options=s3.options)
    busy_store = Window(1.0, 500, 500, 0.6, busy_s=3.0, cpu_s=0.3, process_cpu_s=0.3, read_bytes=35e6, read_s=16.0,
                        requests=17)
    scripted(monkeypatch, [busy_store])
    loader = stoker.Loader(dataset, 4, crop=SPEC, seed=2)
    made = batches(loader)
    [tried] = loader.decisions
    assert tried.action == "try" and "object store" in tried.why and "from the store" in tried.why
    settings, connection = tried.settings, dataset.shards.remote
    assert (settings.reads_in_flight, settings.part_bytes) != (16, 2 << 20)
    assert (connection.parallel, connection.part_bytes) == (settings.reads_in_flight, settings.part_bytes)
    assert_same(made, batches(stoker.Loader(stoker.ShardDataset(packed), 4, crop=SPEC, seed=2, tune=False)))
