"""``stoker doctor --prove``: the top two remedies run for real on the sample, side by side with
what was predicted for them.

Each runs on the pack of the sample the doctor made (repacked with ``--max-side`` for that
remedy; copied into /dev/shm for staging into RAM), with the user's batch size and a training
loop whose step is a sleep of ``step_time`` (the GPU's share: it leaves the cores to the
loader), read as one long epoch (stoker/doctor/timing.py). Where the sample pack shares the
data's disk every pass is read cold, as a data set larger than RAM is; the loose files of a
DataLoader remedy are read cold each pass too.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch.utils.data

from stoker.data.dataset import ShardDataset
from stoker.data.decode import DecodeMode
from stoker.data.sampler import QuasiRandomSampler
from stoker.doctor.loader_probe import collate_or_list, sampled_dataset
from stoker.doctor.numbers import rounded
from stoker.doctor.pack_probe import PackProbe, loader_transform, stoker_loader
from stoker.doctor.remedies import Remedy
from stoker.doctor.target import Target
from stoker.doctor.timing import time_passes
from stoker.storage import evict

PROVED = 2


@dataclass(frozen=True)
class Proof:
    """One remedy run for real: predicted (and, at this step time, expected) against measured img/s."""

    name: str
    predicted: float
    expected: float
    measured: float
    seconds: float
    setup: str

    @property
    def ratio(self) -> float:
        """Measured over expected (1.0: the prediction was exact)."""
        return self.measured / self.expected if self.expected else 0.0

    def to_dict(self) -> dict:
        """One row of the report's ``proof`` list."""
        return {"name": self.name, "predicted_images_per_s": rounded(self.predicted),
                "expected_images_per_s": rounded(self.expected), "measured_images_per_s": rounded(self.measured),
                "ratio": round(self.ratio, 3), "seconds": round(self.seconds, 2), "setup": self.setup}


@dataclass
class Sample:
    """What a trial needs: the sample (its stored bytes and where it lies) and its pack."""

    target: Target
    blobs: Sequence[bytes]
    pack: PackProbe
    transform: Callable | None
    decode: DecodeMode
    size: int
    workers: int  # every core: the workers remedy
    best_workers: int  # the best DataLoader's: the pack + DataLoader remedy keeps them
    scratch: str
    data_evicts: bool  # eviction works on the data's files


def run_proof(remedies: Sequence[Remedy], sample: Sample, *, batch_size: int, step_time: float | None,
          seconds: float) -> tuple[list[Proof], list[str]]:
    """Run the first ``PROVED`` remedies that have a prediction and a trial, about ``seconds``
    each; notes on those that could not run."""
    proofs, notes = [], []
    needed = batch_size / step_time if step_time else None
    runnable = [(r, r.trial, r.predicted_images_per_s) for r in remedies
                if r.trial is not None and r.predicted_images_per_s is not None]
    for remedy, kind, rate_predicted in runnable[:PROVED]:
        predicted = float(rate_predicted)
        trial = None
        try:
            trial = _trial(kind, sample, batch_size)
            rate = time_passes(trial.loader, seconds, step_time=step_time, before_pass=trial.before_pass)
        except (OSError, ValueError, RuntimeError, ImportError) as e:
            notes.append(f"{remedy.name}: not run ({type(e).__name__}: {e})")
            continue
        finally:
            if trial is not None and trial.made is not None:
                shutil.rmtree(trial.made, ignore_errors=True)
        proofs.append(Proof(remedy.name, predicted, min(predicted, needed) if needed else predicted, rate.per_second,
                            rate.seconds, trial.setup))
    return proofs, notes


@dataclass
class _Trial:
    """The loader a remedy's trial runs, what runs before each pass, a line saying what it is,
    and a folder made for it outside the scratch folder (removed after)."""

    loader: Any
    before_pass: Callable[[], object] | None
    setup: str
    made: Path | None = None


def _trial(kind: str, s: Sample, batch_size: int) -> _Trial:
    """The trial of a remedy whose ``trial`` is ``kind``."""
    pack_files = s.pack.files()
    cold = s.pack.same_device and s.pack.eviction_worked
    pack_pass = (lambda: evict(pack_files)) if cold else None
    pack_state = "every pass cold" if cold else "warm"
    _, rest = loader_transform(s.transform)
    if kind in ("loader", "gpu"):
        decode: Literal["cpu", "gpu"] = "gpu" if kind == "gpu" else "cpu"
        loader = stoker_loader(s.pack.folder, batch_size, s.size, rest, decode=decode)
        return _Trial(loader, pack_pass, f"stoker.Loader(decode={decode!r}) on the sample pack, {pack_state}")
    if kind == "max_side" and s.pack.capped_folder is not None:  # its prediction came from that pack
        folder = Path(s.pack.capped_folder)
        files = [str(p) for p in folder.iterdir() if p.is_file()]
        loader = stoker_loader(folder, batch_size, s.size, rest)
        return _Trial(loader, (lambda: evict(files)) if cold else None,
                      f"stoker.Loader on the sample packed --max-side, {pack_state}")
    if kind == "ram":
        shm = Path(tempfile.mkdtemp(prefix="stoker-doctor-", dir="/dev/shm"))
        shutil.rmtree(shm)
        shutil.copytree(s.pack.folder, shm)
        return _Trial(stoker_loader(shm, batch_size, s.size, rest), None, "stoker.Loader on the sample pack in /dev/shm", shm)
    if kind == "dataloader_packed":
        dataset = ShardDataset(s.pack.folder, decode=s.decode, transform=s.transform)
        quasi = QuasiRandomSampler(dataset)
        return _Trial(_dataloader(dataset, batch_size, s.best_workers, _Passes(lambda k: _epoch(quasi, k), pack_pass)),
                      None, f"DataLoader ({s.best_workers} workers) over ShardDataset of the sample pack, {pack_state}")
    if kind == "workers":
        items = sampled_dataset(s.target, s.transform, s.decode)
        files = s.target.files_read()
        order = _Passes(lambda k: np.random.default_rng(k).permutation(len(items)).tolist(),
                        (lambda: evict(files)) if s.data_evicts else None)
        state = "every pass cold" if s.data_evicts else "warm"
        return _Trial(_dataloader(items, batch_size, s.workers, order), None,
                      f"DataLoader ({s.workers} workers) over the sampled items, {state}")
    raise ValueError(f"no trial for {kind!r}")


def _dataloader(dataset: torch.utils.data.Dataset, batch_size: int, workers: int,
                sampler: torch.utils.data.Sampler) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers, sampler=sampler,
                                       collate_fn=collate_or_list)


class _Passes(torch.utils.data.Sampler):
    """Pass after pass over a small sample as one endless epoch (a DataLoader started per pass
    of a few batches would keep most workers idle), ``before_pass`` run as each pass is drawn."""

    def __init__(self, order: Callable[[int], Iterable[int]], before_pass: Callable[[], object] | None) -> None:
        self.order, self.before_pass = order, before_pass

    def __iter__(self) -> Iterator[int]:
        for number in itertools.count():
            if self.before_pass is not None:
                self.before_pass()
            yield from self.order(number)


def _epoch(sampler: QuasiRandomSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)
