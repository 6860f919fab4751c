"""ShardDataset through real DataLoader workers (fork and spawn), and damaged shards."""

from __future__ import annotations

import os
import pickle
import shutil
from collections import Counter

import pytest
import torch
import xxhash
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler

import stoker
from stoker.errors import CorruptDataError, OptionError
from stoker.format import read_manifest
from tests.conftest import PHOTOS, source_files


def digests(items) -> Counter:
    return Counter(xxhash.xxh3_64_hexdigest(b) for b in items)


def raw_pass(loader) -> tuple[Counter, list[int]]:
    seen, labels = Counter(), []
    for images, batch_labels in loader:
        seen += digests(images)
        labels += batch_labels.tolist()
    return seen, labels


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_see_every_sample_once(photos, packed, context):
    dataset = stoker.ShardDataset(packed, decode="raw")
    loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2, multiprocessing_context=context)
    seen, labels = raw_pass(loader)
    assert seen == digests(source_files(photos).values())
    assert Counter(labels) == Counter(dataset.targets.tolist())


def test_persistent_workers_and_decoded_tensors(packed):
    dataset = stoker.ShardDataset(packed, decode="tensor", transform=torch.nn.Identity())
    loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True,
                        sampler=stoker.QuasiRandomSampler(dataset))
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        shapes = Counter()
        for image, _ in loader:
            assert image.dtype == torch.uint8 and image.shape[0] == 3
            shapes[tuple(image.shape)] += 1
        assert sum(shapes.values()) == PHOTOS


def test_distributed_sampler_shares_cover_the_data_set(packed):
    dataset = stoker.ShardDataset(packed, decode="raw")
    seen = Counter()
    for rank in range(2):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=3)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2)
        seen += raw_pass(loader)[0]
    assert sum(seen.values()) == PHOTOS and all(v == 1 for v in seen.values())


def test_decode_modes_and_imagefolder_compatibility(packed):
    pil, label = stoker.ShardDataset(packed, decode="pil")[5]
    assert isinstance(pil, Image.Image) and pil.mode == "RGB"
    rgb, _ = stoker.ShardDataset(packed, decode="rgb")[5]
    assert rgb.shape == (pil.height, pil.width, 3) and rgb.flags.writeable
    raw, negated = stoker.ShardDataset(packed, decode="raw", target_transform=lambda y: -y)[5]
    assert isinstance(raw, bytes) and negated == -label
    dataset = stoker.ShardDataset(packed)
    assert dataset[-1][1] == dataset[len(dataset) - 1][1]
    with pytest.raises(IndexError):
        dataset[len(dataset)]
    with pytest.raises(OptionError, match="decode='jpeg': must be one of 'pil', 'rgb', 'tensor' or 'raw'"):
        stoker.ShardDataset(packed, decode="jpeg")
    with pytest.raises(OptionError, match="on_error='ignore': must be one of 'raise' or 'skip'"):
        stoker.ShardDataset(packed, on_error="ignore")
    assert dataset.index_of(dataset.key(17)) == 17
    with pytest.raises(KeyError):
        dataset.index_of("no/such/key")


def test_pickling_carries_only_paths(packed):
    dataset = stoker.ShardDataset(packed, decode="raw")
    opened = [dataset[i] for i in range(len(dataset))]  # opens every shard and index in this process
    assert len(opened) == len(dataset.targets)
    blob = pickle.dumps(dataset)
    assert len(blob) < 4096, len(blob)
    clone = pickle.loads(blob)
    assert clone[3] == dataset[3]


@pytest.fixture
def damaged(packed, tmp_path):
    """A copy of ``packed`` with one flipped byte inside a photo of shard 1 and shard 3 truncated."""
    root = tmp_path / "damaged"
    shutil.copytree(packed, root)
    manifest = read_manifest(root)
    dataset = stoker.ShardDataset(root, decode="raw")
    flipped = manifest.shards[1].start + 2
    member = dataset.shards.index(1).sample_members(2)[0]
    with open(root / manifest.shards[1].name, "r+b") as f:
        f.seek(int(member["offset"]) + 1000)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    shard3 = root / manifest.shards[3].name
    with open(shard3, "r+b") as f:
        f.truncate(int(dataset.shards.index(3).samples[1]["start"]) + 700)
    truncated = range(manifest.shards[3].start + 1, manifest.shards[3].start + manifest.shards[3].count)
    return root, flipped, dataset.key(flipped), list(truncated), [dataset.key(i) for i in truncated]


def test_reading_damage_names_shard_and_sample(damaged):
    root, flipped, key, truncated, truncated_keys = damaged
    dataset = stoker.ShardDataset(root)
    with pytest.raises(CorruptDataError, match="checksum mismatch") as info:
        dataset[flipped]
    assert info.value.key == key and info.value.shard.endswith("shard-000001.tar") and key in str(info.value)
    with pytest.raises(CorruptDataError, match="shard truncated") as info:
        dataset[truncated[0]]
    assert info.value.key == truncated_keys[0]
    loader = DataLoader(stoker.ShardDataset(root, decode="raw"), batch_size=4, num_workers=2)
    with pytest.raises(Exception, match="shard-00000[13].tar, sample"):
        list(loader)


def test_skip_policy_counts_and_continues(damaged, packed):
    root, flipped, _, truncated, _ = damaged
    dataset = stoker.ShardDataset(root, decode="raw", on_error="skip")
    items = [dataset[i] for i in range(len(dataset))]
    assert len(items) == len(dataset)
    assert dataset.skipped == 1 + len(truncated)  # each item served by another sample, once
    expected = bytearray(stoker.ShardDataset(packed, decode="raw")[flipped][0])
    expected[1000] ^= 0x10
    assert stoker.ShardDataset(root, decode="raw", verify=False)[flipped][0] == bytes(expected)


def test_verify_finds_flipped_byte_and_truncation(damaged):
    from stoker.format.verify import verify_dataset

    root, _, key, _, truncated_keys = damaged
    problems = verify_dataset(root)
    by_key = {p.key: p for p in problems}
    assert "checksum mismatch" in by_key[key].reason and by_key[key].path.endswith("shard-000001.tar")
    assert all(k in by_key and "truncated" in by_key[k].reason for k in truncated_keys)
    assert any(p.key is None and "manifest says" in p.reason for p in problems)


def test_open_shards_are_bounded(photos, tmp_path):
    dst = stoker.pack(photos, tmp_path / "many", shard_bytes=150_000, workers=2, progress=False).dst
    dataset = stoker.ShardDataset(dst, decode="raw", max_open_shards=4)
    assert len(dataset.shards.manifest.shards) > 20
    before = len(os.listdir("/proc/self/fd"))
    seen = digests(dataset[i][0] for i in range(len(dataset)))
    assert seen == digests(source_files(photos).values())
    assert len(os.listdir("/proc/self/fd")) <= before + 2 * 4
    loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2)
    assert raw_pass(loader)[0] == seen


def test_damaged_index_is_named_and_skippable(packed, tmp_path):
    root = tmp_path / "idx"
    shutil.copytree(packed, root)
    index = root / read_manifest(root).shards[2].index
    data = bytearray(index.read_bytes())
    data[-3] ^= 0x01  # inside the key table
    index.write_bytes(bytes(data))
    first = read_manifest(root).shards[2].start
    with pytest.raises(CorruptDataError, match="index checksum does not match"):
        stoker.ShardDataset(root)[first]
    skipping = stoker.ShardDataset(root, decode="raw", on_error="skip")
    assert skipping[first][0] == stoker.ShardDataset(packed, decode="raw")[read_manifest(root).shards[3].start][0]
