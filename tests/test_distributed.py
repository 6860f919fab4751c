"""Multi-rank training reads, under a real two-process torchrun (gloo): every rank gets a disjoint,
equal share of each epoch, and both ranks resume from saved state to the batches they would have read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import stoker

RANKS = 2
SCRIPT = Path(__file__).with_name("ddp_rank.py")


def torchrun(data: Path, out: Path, phase: str) -> list[dict]:
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
                    str(SCRIPT), str(data), str(out), phase], check=True, timeout=180, cwd=SCRIPT.parent.parent)
    return [json.loads((out / f"{phase}-{rank}.json").read_text()) for rank in range(RANKS)]


@pytest.fixture(scope="module")
def runs(packed, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    return {phase: torchrun(packed, out, phase) for phase in ("full", "first", "resume")}


def test_ranks_get_disjoint_equal_shares_covering_the_data_set(runs, packed):
    every_key = {stoker.ShardDataset(packed).key(i) for i in range(len(stoker.ShardDataset(packed)))}
    full = runs["full"]
    for epoch in (0, 1):
        per_epoch = len(full[0]["keys"]) // 2
        shares = [[k for batch in rank["keys"][epoch * per_epoch : (epoch + 1) * per_epoch] for k in batch]
                  for rank in full]
        assert len(shares[0]) == len(shares[1]) == len(every_key) // RANKS
        assert not set(shares[0]) & set(shares[1]) and set(shares[0]) | set(shares[1]) == every_key
        loader_shares = [rank["loader_indices"][epoch] for rank in full]
        assert not set(loader_shares[0]) & set(loader_shares[1]) and len(loader_shares[0]) == len(loader_shares[1])
    assert full[0]["batch_counts"] == full[1]["batch_counts"] == [[5, 4], [5, 4]]
    assert full[0]["keys"][:5] != full[0]["keys"][5:], "each epoch has its own order"


def test_both_ranks_resume_from_saved_state(runs):
    for rank in range(RANKS):
        full, first, resume = runs["full"][rank], runs["first"][rank], runs["resume"][rank]
        assert len(first["keys"]) == len(first["batches"]) == 2
        assert first["keys"] + resume["keys"] == full["keys"]
        assert first["batches"] + resume["batches"] == full["batches"]
