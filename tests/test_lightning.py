"""stoker.Loader inside PyTorch Lightning's Trainer (examples/train_lightning.py): two CPU processes over gloo
checkpoint mid-epoch, are killed (SIGKILL), and the run resumes from the checkpoint; across the kill every
sample of each epoch is trained on exactly once over all ranks, and the resumed run goes on where it stopped.

Each sample of the data set is its own class, so a batch's labels say which samples it holds. This file is
also the script each run starts (``python tests/test_lightning.py RECORD CRASH_AT -- EXAMPLE ARGS``): it
runs the example with two callbacks, one writing each rank's trained labels, one killing the rank.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import NUMBERED

EXAMPLE = Path(__file__).parents[1] / "examples" / "train_lightning.py"
BATCH = 4  # per rank on two ranks: 6 steps an epoch
EVERY = 2  # steps between checkpoints
CRASH_AT = 3  # the step whose start kills every rank: after the checkpoint of step 2, with step 3 trained


def run_example(record: Path, crash_at: int, example_args: list[str]) -> None:
    """Run the example with ``Record`` (each rank's trained labels into ``record``-RANK.jsonl) and, unless
    ``crash_at`` is 0, ``Crash`` (SIGKILL at the start of that step). Every rank runs this."""
    from lightning.pytorch.callbacks import Callback

    class Record(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            line = {"epoch": trainer.current_epoch, "step": trainer.global_step, "labels": batch[1].tolist()}
            with open(f"{record}-{trainer.global_rank}.jsonl", "a") as out:
                out.write(json.dumps(line) + "\n")

    class Crash(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == crash_at:  # the checkpoint before it is on disk (save_checkpoint waits)
                os.kill(os.getpid(), signal.SIGKILL)

    example().main(example_args, callbacks=[Record(), *([Crash()] if crash_at else [])])


def example():
    """examples/train_lightning.py as a module."""
    spec = importlib.util.spec_from_file_location("train_lightning", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    run_example(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[4:])
    sys.exit()

pytest.importorskip("lightning", reason="needs lightning (the test extra)")


def fit(data: Path, runs: Path, name: str, devices: int, batch: int, crash_at: int = 0,
        resume_from: str | None = None) -> list[list[dict]]:
    """One run of the example (its checkpoints in runs/name; with ``resume_from``, a copy of that run's to
    resume from): each rank's records, in order."""
    checkpoints = runs / name
    if resume_from:
        shutil.copytree(runs / resume_from, checkpoints)
    args = [str(data), "--devices", str(devices), "--accelerator", "cpu", "--batch-size", str(batch), "--size", "16",
            "--threads", "1", "--epochs", "2", "--checkpoints", str(checkpoints), "--every", str(EVERY),
            "--seed", "5", *(["--resume"] if resume_from else [])]
    record = runs / f"{name}-record"
    run = subprocess.run([sys.executable, __file__, str(record), str(crash_at), "--", *args], cwd=runs,
                         env={**os.environ, "PYTHONPATH": str(EXAMPLE.parents[1])}, capture_output=True, text=True,
                         timeout=300, start_new_session=True)
    if crash_at:  # every rank killed itself; the command's process is rank 0
        assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]
    else:
        assert run.returncode == 0, run.stderr[-3000:]
    return [[json.loads(line) for line in Path(f"{record}-{rank}.jsonl").read_text().splitlines()]
            for rank in range(devices)]


def trained(*runs: tuple[list[list[dict]], int], epoch: int) -> Counter:
    """How often each sample of ``epoch`` was trained on over all ranks of these (records, up to step) runs."""
    return Counter(label for records, last in runs for rank in records for line in rank
                   if line["epoch"] == epoch and line["step"] <= last for label in line["labels"])


def checkpoint_step(path: Path) -> int:
    import torch

    return torch.load(path, weights_only=False)["global_step"]


@pytest.fixture(scope="module")
def killed(numbered, tmp_path_factory):
    """Two processes that trained 3 steps of epoch 0, checkpointed after step 2, then were killed."""
    runs = tmp_path_factory.mktemp("lightning")
    return runs, fit(numbered, runs, "killed", devices=2, batch=BATCH, crash_at=CRASH_AT)


def test_the_checkpoint_holds_the_loaders_position(killed):
    import torch

    runs, records = killed
    checkpoint = torch.load(runs / "killed" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == EVERY
    (state,) = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert state["part"] == "Loader" and state["epoch"] == 0 and state["world_size"] == 2
    assert state["samples_done"] == EVERY * BATCH * 2, "the batches both ranks trained on, not those read ahead"
    assert [line["step"] for line in records[0]] == [1, 2, 3], "step 3 was trained, then the ranks were killed"


def test_resumed_on_two_processes_every_sample_once_per_epoch(numbered, killed):
    runs, before = killed
    after = fit(numbered, runs, "resumed-2", devices=2, batch=BATCH, resume_from="killed")
    saved = checkpoint_step(runs / "killed" / "last.ckpt")
    for rank in range(2):  # the same ranks go on with the batch that followed the checkpoint
        assert after[rank][0] == before[rank][saved]
    assert trained((before, saved), (after, 99), epoch=0) == Counter(range(NUMBERED))
    assert trained((after, 99), epoch=1) == Counter(range(NUMBERED)), "the next epoch is whole"
    assert [line["step"] for line in after[0]] == list(range(saved + 1, 2 * NUMBERED // (2 * BATCH) + 1))


def test_resumed_on_one_process_with_the_same_global_batch(numbered, killed):
    runs, before = killed
    (after,) = fit(numbered, runs, "resumed-1", devices=1, batch=2 * BATCH, resume_from="killed")
    saved = checkpoint_step(runs / "killed" / "last.ckpt")
    assert after[0]["labels"] == before[0][saved]["labels"] + before[1][saved]["labels"], "the same global batch goes on"
    assert trained((before, saved), ([after], 99), epoch=0) == Counter(range(NUMBERED))
    assert trained(([after], 99), epoch=1) == Counter(range(NUMBERED)), "the next epoch is whole"
    assert [line["step"] for line in after] == list(range(saved + 1, 2 * NUMBERED // (2 * BATCH) + 1))


def test_resumed_on_one_process_with_the_same_per_rank_batch(numbered, killed):
    runs, before = killed
    (after,) = fit(numbered, runs, "resumed-1-per-rank", devices=1, batch=BATCH, resume_from="killed")
    saved = checkpoint_step(runs / "killed" / "last.ckpt")
    assert after[0]["labels"] == before[0][saved]["labels"], "the epoch goes on with the batch after the checkpoint"
    assert trained((before, saved), ([after], 99), epoch=0) == Counter(range(NUMBERED))
    assert trained(([after], 99), epoch=1) == Counter(range(NUMBERED)), "the next epoch is whole"


def test_a_loader_alone_gives_lightning_every_epoch(numbered, tmp_path):
    import lightning as L

    import stoker

    class Bare(example().Classifier):  # the example's model, without its on_train_epoch_start
        def on_train_epoch_start(self) -> None:
            pass

        def training_step(self, batch, batch_idx):
            seen.update((self.current_epoch, label) for label in batch[1].tolist())
            return super().training_step(batch, batch_idx)

    seen: Counter = Counter()
    loader = stoker.Loader(stoker.ShardDataset(numbered), BATCH, crop=stoker.CropSpec(size=(16, 16)), threads=1)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(Bare(NUMBERED), train_dataloaders=loader)
    assert seen == Counter((epoch, label) for epoch in (0, 1) for label in range(NUMBERED))


def test_a_stoker_validation_loader_covers_every_sample_after_the_sanity_check(numbered, tmp_path):
    """Lightning's default sanity check takes 2 validation batches and leaves the pass; every validation
    afterwards must still cover the whole set (it covered 18 of 50 samples when a pass left early was resumed)."""
    import lightning as L

    import stoker

    class Validated(example().Classifier):
        def validation_step(self, batch, batch_idx):
            if not self.trainer.sanity_checking:
                validated.update((self.current_epoch, label) for label in batch[1].tolist())

    validated: Counter = Counter()
    crop = stoker.CropSpec("center", size=(16, 16), flip=False)
    train = stoker.Loader(stoker.ShardDataset(numbered), BATCH, crop=crop, threads=1, seed=0)
    val = stoker.Loader(stoker.ShardDataset(numbered), BATCH, crop=crop, threads=1, order="sequential")
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    assert trainer.num_sanity_val_steps == 2
    trainer.fit(Validated(NUMBERED), train_dataloaders=train, val_dataloaders=val)
    assert validated == Counter((epoch, label) for epoch in (0, 1) for label in range(NUMBERED))
