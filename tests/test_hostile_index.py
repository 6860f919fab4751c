"""Damaged and hostile indexes (issue 40, class 6): every reader checks an index's rows when it
opens it, so no span, member, field id or key is trusted, with or without checksums; and a
kernel read-ahead hint never loops over a range larger than its file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import xxhash
from torch.utils.data import DataLoader

import stoker
from stoker.errors import CorruptDataError
from stoker.format import read_manifest
from stoker.storage import willneed
from tests.damage import edit_index, reseal

CROP = stoker.CropSpec("center", size=(32, 32))


def put(section: str, row: int, field: str | None, value: int):
    def edit(rows, members, keys):
        array = {"rows": rows, "members": members, "keys": keys}[section]
        (array[field] if field else array)[row] = value
    return edit


# sample 2 of shard 1 damaged: what reading it must say (its image member is row 4: each sample has jpg, cls)
DAMAGE = {
    "start 2**63": (put("rows", 2, "start", 2**63), "sample 2's bytes start at 9223372036854775808, past the end"),
    "field id": (put("members", 4, "field", 99), "member 4 (of sample 2) refers to field 99"),
    "member size 2**63": (put("members", 4, "size", 2**63), "member 4 (of sample 2) lies past the end of the shard"),
    "key not UTF-8": (lambda rows, members, keys: keys.__setitem__(int(rows[2]["key_offset"]), 0xC3),
                      "sample 2's key is not UTF-8"),
}


@pytest.fixture
def copy(packed, tmp_path) -> Path:
    shutil.copytree(packed, tmp_path / "ds")
    return tmp_path / "ds"


@pytest.mark.parametrize("verify", [False, True], ids=["verify=False", "checksums recomputed"])
@pytest.mark.parametrize("what", DAMAGE)
def test_a_damaged_row_is_named_by_every_reader(copy, what, verify):
    edit, message = DAMAGE[what]
    index = copy / read_manifest(copy).shards[1].index
    edit_index(index, edit)
    if verify:
        reseal(copy)
    dataset = stoker.ShardDataset(copy, verify=verify)
    first = int(dataset.shards.starts[1])
    expected = re.escape(f"{index}: corrupt index: {message}")
    with pytest.raises(CorruptDataError, match=expected):
        dataset[first]
    with pytest.raises(CorruptDataError, match=expected):
        dataset.key(first + 2)
    # the sampler and the Loader hint whole spans to the kernel: a wild span spun forever in willneed
    with pytest.raises(CorruptDataError, match=expected):
        list(stoker.QuasiRandomSampler(stoker.ShardDataset(copy, verify=verify)))
    with pytest.raises(CorruptDataError, match=expected):
        next(iter(stoker.Loader(stoker.ShardDataset(copy, verify=verify), 8, crop=CROP, threads=2)))


def digest(data) -> str:
    return xxhash.xxh3_64_hexdigest(bytes(data))


def test_skip_drops_the_shard_of_a_damaged_index_in_dataloader_workers(packed, copy):
    edit_index(copy / read_manifest(copy).shards[1].index, DAMAGE["start 2**63"][0])
    intact = stoker.ShardDataset(packed, decode="raw")
    starts = intact.shards.starts
    skipping = stoker.ShardDataset(copy, decode="raw", verify=False, on_error="skip")
    seen = Counter()
    for images, _ in DataLoader(skipping, batch_size=8, num_workers=2, multiprocessing_context="fork"):
        seen.update(digest(image) for image in images)
    # shard 1's samples are each replaced by the next readable one: shard 2's first
    expected = Counter(digest(intact[i][0]) for i in range(len(intact)) if not starts[1] <= i < starts[2])
    expected[digest(intact[int(starts[2])][0])] += int(starts[2] - starts[1])
    assert seen == expected


def test_willneed_stops_at_the_end_of_the_file(tmp_path):
    path = tmp_path / "small"
    path.write_bytes(b"x" * 10_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        # one posix_fadvise per 128 KB of 2**63 bytes would take years; clamped, it is a handful of calls
        hint = threading.Thread(target=lambda: [willneed(fd, 0, 2**63), willneed(fd, 2**63, 2**63)], daemon=True)
        hint.start()
        hint.join(timeout=120)
        assert not hint.is_alive(), "willneed looped over a range far past the end of the file"
    finally:
        os.close(fd)


def test_a_smoke_run_of_the_index_fuzzer(tmp_path):
    """tests/fuzz_index.py's first 30 cases of seed 0 (about 5 s; make sanitize runs it for
    minutes): damaged indexes and gaps spliced into a shard, read by every reader; verify's
    "OK" must mean every reader reads the shard, tar readers too (cases 18, 26 and 28 are gaps
    that verify once missed)."""
    root = Path(__file__).parent.parent
    run = subprocess.run([sys.executable, str(root / "tests" / "fuzz_index.py"), "--cases", "30", "--seed", "0",
                          "--keep", str(tmp_path / "failures")], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(root)}, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "30 cases in" in run.stdout and "verify: OK" in run.stdout and "verify: damage found" in run.stdout
