"""`stoker verify` checks every member (issue 40, class 10): its bytes against its checksum, and
the tar headers around it, even where the manifest's checksums were recomputed over damaged
files; so "OK" means every reader reads the data set, tar readers too."""

from __future__ import annotations

import re
import shutil
import tarfile
from pathlib import Path

import pytest
import xxhash

import stoker
from stoker.cli import main
from stoker.format import ShardIndex, read_manifest
from stoker.format.verify import verify_dataset
from tests.damage import edit_index, insert_gap, reseal


@pytest.fixture
def copy(packed, tmp_path) -> Path:
    shutil.copytree(packed, tmp_path / "ds")
    return tmp_path / "ds"


def test_member_sizes_of_zero_with_recomputed_checksums_are_damage(copy, capsys):
    entry = read_manifest(copy).shards[1]
    edit_index(copy / entry.index, lambda rows, members, keys: members["size"].__setitem__(slice(None), 0))
    reseal(copy)
    assert main(["verify", str(copy), "--quiet"]) == 1
    out = capsys.readouterr().out.splitlines()
    keys = [ShardIndex.open(copy / entry.index).key(i) for i in range(entry.count)]
    assert out == [f"DAMAGED {copy / entry.name}, sample {key!r}: checksum mismatch in member 'jpg'" for key in keys]


def header_offset(root: Path, shard: int, sample: int) -> int:
    """Where sample ``sample`` of shard ``shard`` has its image member's tar header."""
    index = ShardIndex.open(root / read_manifest(root).shards[shard].index)
    return int(index.sample_members(sample)[0]["offset"]) - tarfile.BLOCKSIZE


def rewrite_header(root: Path, at: int, change) -> None:
    """Re-encode the tar header at byte ``at`` of shard 1 with ``change(info)`` applied (its own
    checksum right, as a tool editing the tar would leave it), then reseal the manifest."""
    shard = root / read_manifest(root).shards[1].name
    data = bytearray(shard.read_bytes())
    info = tarfile.TarInfo.frombuf(bytes(data[at : at + 512]), "utf-8", "surrogateescape")
    change(info)
    data[at : at + 512] = info.tobuf(format=tarfile.USTAR_FORMAT)
    shard.write_bytes(bytes(data))
    reseal(root)


@pytest.mark.parametrize("change, reason", [
    (lambda info: setattr(info, "name", info.name.replace("img", "gmi")), r"tar header names '.*/gmi_\d+.jpg' \("),
    (lambda info: setattr(info, "size", info.size - 100), r"tar header names '.*' \(\d+ bytes at \d+\), index says"),
    (lambda info: setattr(info, "type", tarfile.DIRTYPE), r"tar member '.*' is not a regular file"),
])
def test_a_tar_header_that_disagrees_with_the_index_is_named(copy, change, reason):
    rewrite_header(copy, header_offset(copy, 1, 3), change)
    problems = verify_dataset(copy)
    key = ShardIndex.open(copy / read_manifest(copy).shards[1].index).key(3)
    assert [(Path(p.path).name, p.key) for p in problems] == [("shard-000001.tar", key)]
    assert re.match(reason, problems[0].reason), problems[0].reason


def test_a_damaged_tar_header_is_named(copy):
    shard = copy / read_manifest(copy).shards[1].name
    at = header_offset(copy, 1, 2)
    data = bytearray(shard.read_bytes())
    data[at + 140] ^= 0x01  # inside mtime: the header's own checksum no longer matches
    shard.write_bytes(bytes(data))
    reseal(copy)
    problems = verify_dataset(copy)
    assert len(problems) == 1 and problems[0].reason.startswith("damaged tar header")


def test_bytes_after_the_last_sample_are_named(copy):
    shard = copy / read_manifest(copy).shards[1].name
    data = bytearray(shard.read_bytes())
    data[-5] = 7
    shard.write_bytes(bytes(data))
    reseal(copy)
    problems = verify_dataset(copy)
    assert [(Path(p.path).name, p.reason) for p in problems] == [
        ("shard-000001.tar", "non-zero bytes after the last sample (end-of-archive padding)")]


def test_a_gap_between_samples_is_named(copy):
    """Zeros spliced in between two samples, the index moved to match and the checksums recomputed:
    every stoker reader still reads every sample, but a tar reader stops at the zeros (its end of
    archive) and lists only the members before them. stoker's writer never leaves a gap."""
    entry = read_manifest(copy).shards[1]
    index = bytearray((copy / entry.index).read_bytes())
    shard = insert_gap((copy / entry.name).read_bytes(), index, 3, bytes(1024))
    (copy / entry.name).write_bytes(shard)
    (copy / entry.index).write_bytes(bytes(index))
    reseal(copy)
    with tarfile.open(copy / entry.name) as tar:
        assert len(tar.getmembers()) < len(ShardIndex.open(copy / entry.index).members)
    problems = verify_dataset(copy)
    key = ShardIndex.open(copy / entry.index).key(2)
    assert [(Path(p.path).name, p.key, p.reason) for p in problems] == [
        ("shard-000001.tar", key, "1024 bytes after this sample that the index does not describe "
         "(tar readers read them as members or the end of the archive)")]


def test_pax_headers_of_long_and_non_ascii_names_verify(photos, tmp_path):
    src = tmp_path / "src"
    photo = sorted(photos.rglob("*.jpg"))
    names = ["classé/ünïcode.jpg", "long/" + "x" * 150 + ".jpg", "plain/a.jpg", "日本/写真.jpg"]
    for name, path in zip(names, photo):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, src / name)
    dst = stoker.pack(src, tmp_path / "ds", workers=1, progress=False).dst
    assert verify_dataset(dst) == []
    with tarfile.open(Path(dst) / read_manifest(dst).shards[0].name) as tar:
        assert sorted(m.name for m in tar.getmembers() if m.name.endswith(".jpg")) == sorted(names)


def test_an_index_pointing_inside_a_member_with_its_checksum_is_named(copy):
    """A member row moved 512 bytes into its data, its checksum computed over those bytes: readers
    would read it without complaint, but it is not where the tar says the member is."""
    entry = read_manifest(copy).shards[1]
    data = (copy / entry.name).read_bytes()

    def shift(rows, members, keys):
        offset, size = int(members[2]["offset"]) + 512, int(members[2]["size"]) - 512
        members["offset"][2], members["size"][2] = offset, size
        members["checksum"][2] = xxhash.xxh3_64_intdigest(data[offset : offset + size])

    edit_index(copy / entry.index, shift)
    reseal(copy)
    moved = ShardIndex.open(copy / entry.index).members[2]  # sample 1's image (each sample: jpg, cls)
    read = stoker.ShardDataset(copy, decode="raw")[entry.start + 1][0]
    assert read == data[int(moved["offset"]) : int(moved["offset"]) + int(moved["size"])]
    problems = verify_dataset(copy)
    assert len(problems) == 1 and re.match(r"tar header names '.*' \(\d+ bytes at \d+\), index says", problems[0].reason)
