"""The format module on its own: index round trip and validation, manifest safety checks."""

from __future__ import annotations

import json
import mmap
import re

import numpy as np
import pytest

from stoker.errors import CorruptDataError, FormatError
from stoker.format import IndexBuilder, Manifest, ShardEntry, ShardIndex, read_manifest, write_manifest
from stoker.format.index import HEADER_DTYPE
from tests.damage import index_sections


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
    base = index.buffer
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)  # mapped, not read into memory
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
    assert index.key_table() == [b"a/one", b"b/two", b"c"]


@pytest.mark.parametrize("damage, error, message", [
    (lambda b: b"NOTANIDX" + b[8:], FormatError, "bad magic"),
    (lambda b: b[:-3], CorruptDataError, "header describes"),
    (lambda b: b[:20], CorruptDataError, "too short"),
    (lambda b: b"", CorruptDataError, "too short"),
])
def test_index_damage_is_named(tmp_path, damage, error, message):
    path = tmp_path / "bad.idx"
    path.write_bytes(damage(build_index()))
    with pytest.raises(error, match=message) as info:
        ShardIndex.open(path)
    assert str(path) in str(info.value)


def set_header(data: bytearray, field: str, value: int) -> None:
    np.frombuffer(data, np.uint8)[:64].view(HEADER_DTYPE)[0][field] = value


# Each damages one row of build_index() (samples a/one, b/two with 5 members, c with none) as a
# damaged disk or a hostile file would: (section, row, field, value) edits, and what opening must say.
ROW_DAMAGE = {
    "start 2**63": ([("rows", 1, "start", 2**63)], "sample 1's bytes start at 9223372036854775808, past the end"),
    "starts out of order": ([("rows", 1, "start", 8000)], "sample 2's bytes start before sample 1's"),
    "first member past the table": ([("rows", 1, "first_member", 99)], "sample 1's members start at row 99, past"),
    "member ranges backwards": ([("rows", 2, "first_member", 1)], "sample 2's members start before sample 1's"),
    "first row's members": ([("rows", 0, "first_member", 1)], "sample 0's members start at row 1, not 0"),
    "field id": ([("members", 3, "field", 7)], "member 3 (of sample 1) refers to field 7, the field table has 7"),
    "field id 2**32-1": ([("members", 0, "field", 2**32 - 1)], "member 0 (of sample 0) refers to field 4294967295"),
    "offset 2**64-1": ([("members", 2, "offset", 2**64 - 1)], "member 2 (of sample 1) lies past the end of the shard"),
    "size 2**63": ([("members", 0, "size", 2**63)], "member 0 (of sample 0) lies past the end of the shard"),
    "size into the next member": ([("members", 2, "size", 600)], "member 3 (of sample 1) starts before the end"),
    "member in its header": ([("members", 0, "offset", 100)], "sample 0's first member starts before its tar header"),
    "member past its sample": ([("members", 6, "size", 1500)], "sample 1's last member ends past the sample's bytes"),
    "key offsets": ([("rows", 1, "key_offset", 4)], "sample 0's key does not end with NUL"),
    "key offset 2**32-1": ([("rows", 2, "key_offset", 2**32 - 1)], "sample 1's key does not end"),
    "NUL inside a key": ([("keys", 8, None, 0)], "sample 1's key does not end with NUL"),
    "no leading NUL": ([("keys", 0, None, 65)], "the key table does not start with NUL"),
    "key not UTF-8": ([("keys", 8, None, 0xFF)], "sample 1's key is not UTF-8"),
}


@pytest.mark.parametrize("what", ROW_DAMAGE)
def test_every_row_is_checked_on_open(tmp_path, what):
    data = bytearray(build_index())
    edits, message = ROW_DAMAGE[what]
    views = dict(zip(("rows", "members", "keys"), index_sections(data)))
    for section, row, field, value in edits:
        (views[section][field] if field else views[section])[row] = value
    path = tmp_path / "x.idx"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match=re.escape(message)) as info:
        ShardIndex.open(path)
    assert info.value.shard == str(path) and "corrupt index" in str(info.value)


@pytest.mark.parametrize("field, value, message", [
    ("num_members", 3, "the closing row does not match the header"),
    ("shard_bytes", 2**64 - 1, "the header's shard size 18446744073709551615 is beyond any file"),
    ("shard_bytes", 7000, "the closing row does not match the header"),
])
def test_the_header_is_checked_against_the_rows(field, value, message):
    data = bytearray(build_index())
    set_header(data, field, value)
    if field == "num_members":  # the sections still add up to the file: shorter members, a longer field table
        set_header(data, "fields_nbytes", int(np.frombuffer(data, np.uint8)[:64].view(HEADER_DTYPE)[0]["fields_nbytes"]) + 4 * 28)
    with pytest.raises(CorruptDataError, match=re.escape(message)):
        ShardIndex.from_bytes(bytes(data), "mem")


def test_a_field_table_without_its_last_nul_is_damage():
    data = build_index()
    at = data.rindex(b"004.jpg\0") + 7  # the last field name's NUL
    with pytest.raises(CorruptDataError, match="the field table does not end with NUL"):
        ShardIndex.from_bytes(data[:at] + b"x" + data[at + 1 :], "mem")


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
