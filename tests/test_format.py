"""The format module on its own: index round trip and validation, manifest safety checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stoker.errors import FormatError
from stoker.format import IndexBuilder, Manifest, ShardEntry, ShardIndex, read_manifest, write_manifest


def build_index() -> bytes:
    builder = IndexBuilder()
    builder.add("a/one", 3, [("jpg", 512, 100, 11), ("cls", 1536, 1, 12)], 0)
    builder.add("b/two", -1, [(f"{i:03d}.jpg", 2560 + 1024 * i, 10, i) for i in range(5)], 2048)
    builder.add("c", 7, [], 7680)
    return builder.to_bytes(7680, 10240)


def test_index_round_trip(tmp_path):
    path = tmp_path / "x.idx"
    path.write_bytes(build_index())
    index = ShardIndex.open(path)
    assert isinstance(index.buffer.base, np.memmap)  # mapped, not read into memory
    assert len(index) == 3
    assert [index.key(i) for i in range(3)] == ["a/one", "b/two", "c"]
    assert index.labels.tolist() == [3, -1, 7]
    assert index.fields[:2] == ("jpg", "cls")
    members = index.sample_members(1)
    assert len(members) == 5 and members["offset"].tolist() == [2560 + 1024 * i for i in range(5)]
    assert [index.fields[f] for f in members["field"]] == [f"{i:03d}.jpg" for i in range(5)]
    assert len(index.sample_members(2)) == 0
    assert index.find("b/two") == 1 and index.find("c") == 2 and index.find("a/on") == -1
    assert index.span(0, 0) == (0, 2048) and index.span(1, 2) == (2048, 7680)
    index.check()


@pytest.mark.parametrize("damage, message", [
    (lambda b: b"NOTANIDX" + b[8:], "bad magic"),
    (lambda b: b[:-3], "header describes"),
    (lambda b: b[:20], "too short"),
    (lambda b: b"", "too short"),
])
def test_index_damage_is_named(tmp_path, damage, message):
    path = tmp_path / "bad.idx"
    path.write_bytes(damage(build_index()))
    with pytest.raises(FormatError, match=message) as info:
        ShardIndex.open(path)
    assert str(path) in str(info.value)


def test_full_check_finds_damaged_rows():
    data = bytearray(build_index())
    data[64 + 4 * 24 : 64 + 4 * 24 + 8] = (20_000).to_bytes(8, "little")  # member 0's offset
    with pytest.raises(FormatError, match="past the end of the shard"):
        ShardIndex.from_bytes(bytes(data), "mem").check()
    data = bytearray(build_index())
    data[64 + 24 + 8 : 64 + 24 + 12] = (99).to_bytes(4, "little")  # sample 1's first_member
    with pytest.raises(FormatError, match="member ranges are not in order"):
        ShardIndex.from_bytes(bytes(data), "mem").check()
    data = bytearray(build_index())
    data[64 + 3 * 24 + 8 : 64 + 3 * 24 + 12] = (3).to_bytes(4, "little")  # closing row's first_member
    with pytest.raises(FormatError, match="closing row"):
        ShardIndex.from_bytes(bytes(data), "mem")


def manifest(names=("shard-000000.tar",)) -> Manifest:
    shards = [ShardEntry(name, i * 2, 2, 1024, "xxh3_128:0", 64, "xxh3_128:0") for i, name in enumerate(names)]
    return Manifest(num_samples=2 * len(names), shards=shards, schema={"jpg": "image"}, classes=["a"])


def test_manifest_round_trip(tmp_path):
    write_manifest(tmp_path, manifest(["shard-000000.tar", "shard-000001.tar"]))
    loaded = read_manifest(tmp_path)
    assert loaded == manifest(["shard-000000.tar", "shard-000001.tar"])
    assert loaded.shard_starts().tolist() == [0, 2, 4]
    assert loaded.shards[1].index == "shard-000001.idx"


@pytest.mark.parametrize("name", ["../evil.tar", "/etc/passwd.tar", "sub/x.tar", ".hidden.tar", "a..b.tar", "x.tar\n"])
def test_manifest_paths_cannot_leave_the_folder(tmp_path, name):
    write_manifest(tmp_path, manifest([name]))
    with pytest.raises(FormatError, match="unsafe file name"):
        read_manifest(tmp_path)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(format_version=99), "format version 99 is not supported"),
    (lambda d: d.update(num_samples=5), "manifest says 5"),
    (lambda d: d.pop("shards"), "malformed"),
    (lambda d: d.update(format="other"), "not a stoker manifest"),
])
def test_manifest_problems_are_named(tmp_path, edit, message):
    data = json.loads(manifest().to_json())
    edit(data)
    (tmp_path / "stoker.json").write_text(json.dumps(data))
    with pytest.raises(FormatError, match=message):
        read_manifest(tmp_path)


def test_missing_manifest_says_so(tmp_path):
    with pytest.raises(FormatError, match="not a stoker data set"):
        read_manifest(tmp_path)


def test_manifest_holds_no_pickle(packed):
    text = (packed / "stoker.json").read_text()
    data = json.loads(text)
    assert data["format"] == "stoker" and data["format_version"] == 1
    assert {"source", "created_by", "schema", "classes", "shards"} <= set(data)


def test_verify_catches_counts_that_disagree_with_the_manifest(packed, tmp_path):
    import shutil

    from stoker.format.verify import verify_dataset

    root = tmp_path / "counts"
    shutil.copytree(packed, root)
    data = json.loads((root / "stoker.json").read_text())
    data["shards"][0]["count"] -= 1
    data["shards"][1]["count"] += 1
    data["shards"][1]["start"] -= 1
    (root / "stoker.json").write_text(json.dumps(data))
    problems = verify_dataset(root)
    assert [p.path.rsplit("/", 1)[-1] for p in problems] == ["stoker.json"] * 3  # the indexes are intact
    assert "checksum" in problems[0].reason
    assert [p.reason.split(" ")[0] for p in problems[1:]] == ["shard-000000.idx", "shard-000001.idx"]
    assert all("manifest says" in p.reason for p in problems[1:])
