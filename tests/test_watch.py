"""stoker.watch: wait vs step timing, the log line, stalls, timeline files, pass-through of batches."""

from __future__ import annotations

import csv
import json
import re
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import stoker
from stoker.watch import WatchSummary, watch


def slow_batches(n: int, wait: float, slow: dict[int, float] | None = None, waited: list[float] | None = None):
    """``n`` batches (ints), each after sleeping ``wait`` seconds (or ``slow[i]`` for batch i);
    ``waited`` receives how long each sleep really took (a busy machine oversleeps)."""
    for i in range(n):
        start = time.perf_counter()
        time.sleep((slow or {}).get(i, wait))
        if waited is not None:
            waited.append(time.perf_counter() - start)
        yield i


def loop(watched, step: float = 0.0) -> tuple[list[float], list[float], float]:
    """Loop over ``watched``, each step sleeping ``step`` seconds; the test's own clock around the
    watch's: the gaps from one step's end to the next step's start (each holds the watch's wait
    for that batch), each step's length (held by the watch's step) and the whole loop's length."""
    gaps, steps = [], []
    begin = end = time.perf_counter()
    for _ in watched:
        start = time.perf_counter()
        gaps.append(start - end)
        time.sleep(step)
        end = time.perf_counter()
        steps.append(end - start)
    return gaps, steps, time.perf_counter() - begin


def test_injected_wait_gives_the_data_wait_fraction():
    """The summary against the waits and steps the test itself measured: the sleeps in the loader
    lie inside the watch's waits, which lie inside the gaps between the loop's steps; the loop's
    steps inside the watch's. Exact bounds, however long a busy machine makes any of them."""
    waited: list[float] = []
    w = watch(slow_batches(30, 0.020, waited=waited), every=1000, log=None)
    gaps, stepped, total = loop(w, 0.010)
    s = w.summary()
    assert isinstance(s, WatchSummary)
    assert s.steps == 30
    assert sum(waited) <= s.wait_s <= sum(gaps)
    assert sum(stepped) <= s.step_s <= total - s.wait_s
    assert s.data_wait_fraction == pytest.approx(s.wait_s / (s.wait_s + s.step_s))
    assert s.batches_per_s == pytest.approx(30 / (s.wait_s + s.step_s))
    # a sleep of 20 ms is a stall only where the machine made it last over 100 ms
    assert sum(t > 0.1 for t in waited) <= s.stalls <= sum(g > 0.1 for g in gaps)


def test_one_line_every_n_steps_with_step_ranges():
    lines: list[str] = []
    w = watch(range(25), every=10, log=lines.append)
    for _ in w:
        pass
    assert len(lines) == 2
    assert lines[0].startswith("stoker.watch: steps 1-10: data wait ")
    assert lines[1].startswith("stoker.watch: steps 11-20: data wait ")
    assert re.search(r"\d+\.\d% \(\d+\.\d ms/step of \d+\.\d\), \d+\.\d batches/s, 0 stalls > 100 ms", lines[0])
    # A second pass (epoch) keeps counting steps and windows.
    for _ in w:
        pass
    assert [line.split(":")[1] for line in lines[2:]] == [" steps 21-30", " steps 31-40", " steps 41-50"]
    assert w.summary().steps == 50


def test_default_log_goes_to_the_stoker_watch_logger(caplog):
    with caplog.at_level("INFO", logger="stoker.watch"):
        for _ in watch(range(4), every=2):
            pass
    assert [r.name for r in caplog.records] == ["stoker.watch", "stoker.watch"]
    assert "steps 3-4" in caplog.records[1].getMessage()


def test_a_long_wait_counts_as_a_stall():
    lines: list[str] = []
    waited: list[float] = []
    w = watch(slow_batches(10, 0.001, slow={6: 0.150}, waited=waited), every=5, stall=0.1, log=lines.append)
    gaps, _, _ = loop(w)
    s = w.summary()
    assert 1 + sum(t > 0.1 for k, t in enumerate(waited) if k != 6) <= s.stalls <= sum(g > 0.1 for g in gaps)
    assert waited[6] <= s.max_wait_s <= max(gaps)
    assert "0 stalls > 100 ms" in lines[0] or max(gaps[:5]) > 0.1
    assert re.search(r"\d stalls? > 100 ms", lines[1])
    if max(gaps[:6] + gaps[7:]) < waited[6]:  # no other wait can be longer than step 7's
        assert f"(max {s.max_wait_s * 1e3:.0f} ms at step 7)" in lines[1]


def read_timeline(path) -> list[dict[str, float]]:
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_timeline_has_one_row_per_step(tmp_path, suffix):
    path = tmp_path / f"timeline{suffix}"
    for _ in watch(slow_batches(12, 0.002), every=5, timeline=path, log=None):
        time.sleep(0.001)
    rows = read_timeline(path)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert set(rows[0]) == {"step", "start", "wait_s", "step_s"}
    assert all(r["wait_s"] >= 0.002 and r["step_s"] >= 0.001 for r in rows)
    starts = [r["start"] for r in rows]
    assert starts == sorted(starts) and starts[-1] >= 11 * 0.003


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_timeline_is_written_when_the_loop_breaks(tmp_path, suffix):
    path = tmp_path / f"timeline{suffix}"
    for i in watch(range(100), every=4, timeline=path, log=None):
        if i == 5:
            time.sleep(0.020)
            break
    rows = read_timeline(path)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert rows[-1]["step_s"] >= 0.020  # the last step lasts until the loop ended


def test_timeline_is_written_when_the_loop_raises(tmp_path):
    path = tmp_path / "timeline.csv"
    w = watch(range(100), every=50, timeline=path, log=None)
    with pytest.raises(RuntimeError):
        for i in w:
            if i == 2:
                raise RuntimeError("training step failed")
    assert len(read_timeline(path)) == 3
    assert w.summary().steps == 3


def test_timeline_appends_over_passes(tmp_path):
    path = tmp_path / "timeline.jsonl"
    w = watch(range(3), every=2, timeline=path, log=None)
    for _ in range(2):
        for _ in w:
            pass
    assert [r["step"] for r in read_timeline(path)] == [1, 2, 3, 4, 5, 6]


def test_bad_timeline_suffix_names_the_path(tmp_path):
    bad = tmp_path / "timeline.txt"
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        watch(range(3), timeline=bad)


def test_batches_pass_through_unchanged_and_len_passes_through():
    batches = [object(), {"x": 1}, torch.zeros(2)]
    w = watch(batches, log=None)
    assert all(a is b for a, b in zip(w, batches, strict=True))
    assert len(w) == 3
    with pytest.raises(TypeError):
        len(watch(iter(batches)))


class Squares(Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((3,), float(i * i)), i


def test_over_a_torch_dataloader_with_workers():
    loader = DataLoader(Squares(), batch_size=4, num_workers=2)
    w = watch(loader, every=2, log=None)
    assert len(w) == 5
    watched = list(w)
    plain = list(loader)
    assert len(watched) == len(plain) == 5
    for (x, y), (px, py) in zip(watched, plain, strict=True):
        assert torch.equal(x, px) and torch.equal(y, py)
    assert w.summary().steps == 5


def test_over_a_stoker_loader(packed):
    dataset = stoker.ShardDataset(packed)
    crop = stoker.CropSpec(size=(32, 32))
    plain = [(x.clone(), y.clone()) for x, y in stoker.Loader(dataset, 16, threads=2, seed=3, crop=crop)]
    w = watch(stoker.Loader(dataset, 16, threads=2, seed=3, crop=crop), every=2, log=None)
    assert len(w) == len(plain)
    watched = [(x.clone(), y.clone()) for x, y in w]
    assert len(watched) == len(plain)
    for (x, y), (px, py) in zip(watched, plain, strict=True):
        assert torch.equal(x, px) and torch.equal(y, py)
    assert w.summary().steps == len(plain)
