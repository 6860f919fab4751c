"""The manifest checks itself, missing and damaged metadata is named, and tensors are writable
(issue 18, classes 5 and 7). Real data sets, edited on disk as a person or a tool would."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import stoker
from stoker.cli import main
from stoker.errors import CorruptDataError, FormatError
from stoker.format import read_manifest
from stoker.format.manifest import canonical_json, content_checksum
from stoker.format.verify import verify_dataset
from stoker.video.table import FrameTable, VideoError


@pytest.fixture
def copy(packed, tmp_path) -> Path:
    shutil.copytree(packed, tmp_path / "ds")
    return tmp_path / "ds"


def edit_manifest(root: Path, change, *, keep_checksum: bool = True) -> None:
    """Change the parsed manifest with ``change`` and write it back, its stored checksum untouched
    (as a hand edit leaves it) or dropped."""
    data = json.loads((root / "stoker.json").read_text())
    change(data)
    if not keep_checksum:
        data.pop("checksum", None)
    (root / "stoker.json").write_text(json.dumps(data, indent=1))


def as_old_manifest(root: Path) -> None:
    """What a stoker before format 1.1 wrote: no checksum, no minor version, no counts of what was left out."""
    def strip(data):
        data.pop("format_minor")
        for key in ("skipped_extensions", "repeated_folders"):
            data["source"].pop(key)
    edit_manifest(root, strip, keep_checksum=False)


EDITS = {
    "class names": lambda d: d["classes"].__setitem__(0, "renamed"),
    "schema": lambda d: d["schema"].__setitem__("cls", "bytes"),
    "counts": lambda d: (d["shards"][0].__setitem__("count", d["shards"][0]["count"] - 1),
                         d["shards"][1].__setitem__("count", d["shards"][1]["count"] + 1),
                         d["shards"][1].__setitem__("start", d["shards"][1]["start"] - 1)),
    "shard checksum": lambda d: d["shards"][2].__setitem__("checksum", "xxh3_128:" + "0" * 32),
    "index checksum": lambda d: d["shards"][2].__setitem__("index_checksum", "xxh3_128:" + "1" * 32),
    "source path": lambda d: d["source"].__setitem__("path", "/elsewhere"),
}


@pytest.mark.parametrize("what", EDITS)
def test_an_edited_manifest_is_refused_by_readers_and_named_by_verify(copy, capsys, what):
    edit_manifest(copy, EDITS[what])
    with pytest.raises(FormatError, match=r"stoker.json: the content does not match the manifest's checksum"):
        stoker.ShardDataset(copy)
    with pytest.raises(FormatError, match="checksum"):
        read_manifest(copy)
    assert main(["verify", str(copy), "--quiet"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"DAMAGED {copy / 'stoker.json'}: the content does not match")
    assert all(line.startswith(f"DAMAGED {copy / 'stoker.json'}") for line in out), out  # no intact file blamed


def test_a_manifest_without_its_checksum_is_refused_when_its_version_writes_one(copy):
    edit_manifest(copy, lambda d: None, keep_checksum=False)
    with pytest.raises(FormatError, match=r"no checksum, though format 1\.[1-9] writes one"):
        stoker.ShardDataset(copy)


def test_the_checksum_ignores_formatting_and_key_order(copy):
    data = json.loads((copy / "stoker.json").read_text())
    (copy / "stoker.json").write_text(json.dumps(dict(reversed(list(data.items()))), separators=(",", ":")))
    assert len(stoker.ShardDataset(copy)) == data["num_samples"]
    assert canonical_json(data) == canonical_json(dict(reversed(list(data.items()))))
    assert content_checksum(data) == data["checksum"] and "checksum" not in json.loads(canonical_json(data))


def test_an_older_manifest_without_a_checksum_is_read_and_verified(copy, capsys):
    as_old_manifest(copy)
    dataset = stoker.ShardDataset(copy)
    assert dataset[0][1] == 0 and read_manifest(copy).format_minor == 0
    assert verify_dataset(copy) == []
    assert main(["info", str(copy)]) == 0 and main(["verify", str(copy), "--quiet"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("what, names", [("shard checksum", "checksum of shard-000002.tar does not match the shard"),
                                         ("index checksum", "index checksum of shard-000002.idx does not match")])
def test_a_wrong_checksum_in_an_older_manifest_names_the_manifest_not_the_intact_file(copy, what, names):
    as_old_manifest(copy)
    edit_manifest(copy, EDITS[what], keep_checksum=False)
    problems = verify_dataset(copy)
    assert [(Path(p.path).name, p.key) for p in problems] == [("stoker.json", None)]
    assert names in problems[0].reason and "the manifest was edited?" in problems[0].reason


def test_damage_to_a_shard_is_still_named_in_the_shard(copy):
    shard = copy / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[2000] ^= 0xFF
    shard.write_bytes(bytes(data))
    problems = verify_dataset(copy)
    assert problems and all(Path(p.path).name == "shard-000001.tar" for p in problems)


def test_a_missing_index_is_a_format_error_naming_it(copy, capsys):
    (copy / "shard-000003.idx").unlink()
    dataset = stoker.ShardDataset(copy)
    first = int(dataset.shards.starts[3])
    for verify in (True, False):
        with pytest.raises(FormatError, match=r"shard-000003.idx: cannot (read the|open) index"):
            stoker.ShardDataset(copy, verify=verify)[first]
    assert main(["verify", str(copy), "--quiet"]) == 1
    assert f"DAMAGED {copy / 'shard-000003.idx'}: missing" in capsys.readouterr().out


def test_stage_copies_the_manifest_byte_for_byte(packed, tmp_path):
    from stoker.storage.stage import stage

    as_old = tmp_path / "old"
    shutil.copytree(packed, as_old)
    as_old_manifest(as_old)
    for source in (packed, as_old):
        staged = tmp_path / f"staged-{source.name}"
        stage(str(source), staged, progress=False)
        assert (staged / "stoker.json").read_bytes() == (source / "stoker.json").read_bytes()


# Class 5: a damaged frames.json

TABLE = {"pts": [0, 512, 1024], "time_base": [1, 12800], "fps": 25.0, "size": [64, 48], "codec": "h264",
         "header_frames": 3, "source_frames": 3, "seekable": True}


@pytest.mark.parametrize("damage", [
    b"not json", b"\xff\xfe", b"[]", b"{}",
    {"time_base": [1, 0]}, {"time_base": [0, 1]}, {"time_base": [1]}, {"pts": []}, {"pts": [0, 0, 1]},
    {"pts": [2, 1]}, {"pts": "012"}, {"pts": [[0]]}, {"pts": [0.5, 1.5]}, {"size": []}, {"size": [0, 48]},
    {"keyframe": [1]}, {"header_frames": "many"}, {"codec": 7},
    {"packets": {"offset": [0], "size": [1, 2], "pts": [0], "key": [1], "extradata": ""}},
    {"packets": {"offset": [0], "size": [1], "pts": [0], "key": [1], "extradata": "zz"}},
    {"pts": [10**30]},
])
def test_a_damaged_frame_table_is_a_video_error_never_a_raw_one(damage):
    data = damage if isinstance(damage, bytes) else json.dumps({**TABLE, **damage}).encode()
    with pytest.raises(VideoError, match=r"damaged frames.json"):
        FrameTable.from_json(data)


def test_a_sound_frame_table_still_reads():
    table = FrameTable.from_json(json.dumps(TABLE).encode())
    assert len(table) == 3 and table.fps == pytest.approx(25.0)


@pytest.mark.parametrize("damage", [{"time_base": [1, 0]}, {"pts": []}, {"pts": [0, 1]}])
def test_a_video_data_set_with_a_damaged_frame_table_raises_corrupt_data(packed_videos, tmp_path, damage):
    mode, root, _ = packed_videos
    shutil.copytree(root, tmp_path / "ds")
    dataset = stoker.VideoClipDataset(tmp_path / "ds", clip_len=2, verify=False)
    video = dataset.open_video(0)
    member = video.members["frames.json"]
    offset, size = int(member["offset"]), int(member["size"])
    shard = Path(video.reader.path)
    table = json.loads(shard.read_bytes()[offset : offset + size])
    replacement = json.dumps({**table, **damage}).encode()
    assert len(replacement) <= size
    with open(shard, "r+b") as f:  # same length, so every offset stays right
        f.seek(offset)
        f.write(replacement.ljust(size))
    fresh = stoker.VideoClipDataset(tmp_path / "ds", clip_len=2, verify=False)
    with pytest.raises(CorruptDataError, match=r"frames.json") as info:
        fresh[0]
    assert info.value.key == video.key
    with pytest.raises(CorruptDataError, match="checksum mismatch"):  # with checksums on, the damage shows first
        stoker.VideoClipDataset(tmp_path / "ds", clip_len=2)[0]


# Class 7: tensors never warn about read-only memory

WRITABLE_TENSORS = """
import io, sys, warnings
from PIL import Image
import stoker
warnings.simplefilter("error")  # torch warns once per process: this process has seen nothing before
dataset = stoker.ShardDataset(sys.argv[1], decode="tensor")
for i in range(len(dataset)):
    image, _ = dataset[i]
    image[0, 0, 0] = 7  # writable, and ours
print(len(dataset))
"""


def test_decode_tensor_gives_writable_tensors_without_warnings(tmp_path):
    src = tmp_path / "src"
    sizes = {"one.png": (1, 1), "one.jpg": (1, 1), "row.png": (5, 1), "column.png": (1, 5), "square.jpg": (9, 9)}
    for mode, folder in (("RGB", "rgb"), ("L", "gray"), ("P", "palette")):
        (src / folder).mkdir(parents=True)
        for name, size in sizes.items():
            if not (mode == "P" and name.endswith(".jpg")):
                Image.new(mode, size, 200).save(src / folder / name)
    stoker.pack(src, tmp_path / "ds", progress=False, workers=1)
    run = subprocess.run([sys.executable, "-c", WRITABLE_TENSORS, str(tmp_path / "ds")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "13" and "Warning" not in run.stderr
