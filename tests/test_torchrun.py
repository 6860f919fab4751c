"""stoker.Loader in a plain torchrun training script (examples/train_torchrun.py): two CPU processes over gloo
checkpoint mid-epoch, are killed (SIGKILL), and torchrun starts them again (--max-restarts); they resume from
the checkpoint, every sample of each epoch is trained on exactly once over all ranks, and the same batches go on.

Each sample of the data set is its own class, so a batch's labels say which samples it holds. This file is
also the script torchrun starts (``tests/test_torchrun.py RECORD CRASH_AT -- EXAMPLE ARGS``): it runs the
example with a hook that writes each rank's trained labels and, on torchrun's first attempt, kills every
rank after step CRASH_AT.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.conftest import NUMBERED

EXAMPLE = Path(__file__).parents[1] / "examples" / "train_torchrun.py"
BATCH = 4  # per rank on two ranks: 6 steps an epoch
EVERY = 2  # steps between checkpoints
CRASH_AT = 3  # the step after which every rank is killed: one step after the checkpoint of step 2


def run_example(record: Path, crash_at: int, example_args: list[str]) -> None:
    """Run the example on this rank, each step's labels into ``record``-RANK.jsonl; on torchrun's first
    attempt, SIGKILL after step ``crash_at`` (0: never), once every rank has written that step's line."""
    import torch.distributed as dist

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

    def after_step(step: int, epoch: int, labels) -> None:
        line = {"attempt": attempt, "epoch": epoch, "step": step, "labels": labels.tolist()}
        with open(f"{record}-{dist.get_rank()}.jsonl", "a") as out:
            out.write(json.dumps(line) + "\n")
        if step == crash_at and attempt == 0:
            dist.barrier()  # torchrun stops the other ranks once one dies: each has written its line first
            os.kill(os.getpid(), signal.SIGKILL)

    spec = importlib.util.spec_from_file_location("train_torchrun", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(example_args, after_step=after_step)


if __name__ == "__main__":
    run_example(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[4:])
    sys.exit()


def torchrun(data: Path, runs: Path, name: str, processes: int, batch: int, crash_at: int, restarts: int,
             checkpoint: Path) -> tuple[subprocess.CompletedProcess, list[list[dict]]]:
    """One torchrun of the example (checkpoint file ``checkpoint``): how it ended and each rank's records."""
    record = runs / f"{name}-record"
    args = [str(data), "--batch-size", str(batch), "--size", "16", "--threads", "1", "--epochs", "2",
            "--checkpoint", str(checkpoint), "--every", str(EVERY), "--seed", "5"]
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
                          f"--max-restarts={restarts}", __file__, str(record), str(crash_at), "--", *args],
                         cwd=runs, env={**os.environ, "PYTHONPATH": str(EXAMPLE.parents[1]),
                                        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},  # see the example's docstring
                         capture_output=True, text=True, timeout=300)
    records = [[json.loads(line) for line in Path(f"{record}-{rank}.jsonl").read_text().splitlines()]
               for rank in range(processes)]
    return run, records


def trained(lines: list[list[dict]], epoch: int) -> Counter:
    """How often each sample of ``epoch`` is in these lines of all ranks."""
    return Counter(label for rank in lines for line in rank if line["epoch"] == epoch for label in line["labels"])


def test_torchrun_restarts_after_a_kill_and_every_sample_is_trained_once(numbered, tmp_path):
    # Up to 3 restarts: on a busy machine a restarted gloo group can abort while it connects
    # (pytorch/pytorch#135712, with TORCH_DISABLE_SHARE_RDZV_TCP_STORE already set); torchrun then
    # restarts again from the last checkpoint, which is what a user's job does too.
    run, records = torchrun(numbered, tmp_path, "restarted", processes=2, batch=BATCH, crash_at=CRASH_AT, restarts=3,
                            checkpoint=tmp_path / "run.pt")
    assert run.returncode == 0, run.stderr[-5000:]
    final = max(line["attempt"] for line in records[0])
    killed = [[line for line in rank if line["attempt"] == 0] for rank in records]
    resumed = [[line for line in rank if line["attempt"] == final] for rank in records]
    assert [line["step"] for line in killed[0]] == [1, 2, 3], "step 3 was trained after the checkpoint, then killed"
    start = resumed[0][0]["step"]
    # each step before the final attempt's first, as the last attempt that trained it did: what the checkpoint holds
    earlier = [{line["step"]: line for line in rank if line["attempt"] < final} for rank in records]
    kept = [[steps[step] for step in sorted(steps) if step < start] for steps in earlier]
    for rank in range(2):  # the same ranks go on with the batch that followed the checkpoint
        if start in earlier[rank]:
            assert resumed[rank][0] == {**earlier[rank][start], "attempt": final}
    assert trained(kept, 0) + trained(resumed, 0) == Counter(range(NUMBERED))
    assert trained(kept, 1) + trained(resumed, 1) == Counter(range(NUMBERED)), "the next epoch is whole"
    assert [line["step"] for line in resumed[0]] == list(range(start, 2 * NUMBERED // (2 * BATCH) + 1))


def test_killed_on_one_process_resumed_on_two(numbered, tmp_path):
    """The same per-rank batch on twice the ranks: each step now takes twice the samples."""
    batch, checkpoint = 2 * BATCH, tmp_path / "run.pt"
    run, (killed,) = torchrun(numbered, tmp_path, "one", processes=1, batch=batch, crash_at=CRASH_AT, restarts=0,
                              checkpoint=checkpoint)
    assert run.returncode != 0 and [line["step"] for line in killed] == [1, 2, 3]
    run, resumed = torchrun(numbered, tmp_path, "two", processes=2, batch=batch, crash_at=0, restarts=0,
                            checkpoint=checkpoint)
    assert run.returncode == 0, run.stderr[-5000:]
    assert "resumed at step 2, epoch 0" in run.stdout
    assert resumed[0][0]["labels"] == killed[EVERY]["labels"], "the epoch goes on with the batch after the checkpoint"
    assert trained([killed[:EVERY]], 0) + trained(resumed, 0) == Counter(range(NUMBERED))
    assert trained(resumed, 1) == Counter(range(NUMBERED)), "the next epoch is whole"
    rest = (NUMBERED - EVERY * batch) // (2 * batch) + NUMBERED // (2 * batch)  # steps of the rest and of epoch 1
    assert [line["step"] for line in resumed[1]] == list(range(EVERY + 1, EVERY + 1 + rest))
