"""loader_for's cached pack of a loose folder follows the folder: a file replaced, touched,
added, removed or renamed, or a class folder renamed, is packed again with a warning that says
what changed; an unchanged folder is reused without a write. Real folders, real packs."""

from __future__ import annotations

import logging
import os
import pickle
import shutil
from pathlib import Path

import pytest

import stoker
from stoker.errors import PackError, PackMismatchError
from stoker.format.layout import MANIFEST_NAME, WORK_DIR_NAME
from stoker.pack.cache import pack_cache_dir
from stoker.pack.source_stamps import stamps_path
from stoker.sample_data import make_sample_photos
from tests.conftest import source_files

SMALL_SHARD = 300_000  # ~4 photos a shard


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """A folder of 12 photos in 3 classes of our own (the tests change it), and a cache of our own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return make_sample_photos(tmp_path / "src", count=12, num_classes=3, seed=2)


def load(folder: Path, caplog, **options) -> tuple[stoker.ShardDataset, str]:
    """The data set loader_for serves for ``folder``, and what it warned."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stoker"):
        loader = stoker.loader_for(folder, batch_size=4, progress=False, **options)
    return loader.dataset, caplog.text


def assert_serves(dataset: stoker.ShardDataset, folder: Path) -> None:
    """The pack holds exactly the folder's files as they are now: keys, bytes and class names."""
    served = {dataset.key(i): bytes(dataset.read_image(i)[0]) for i in range(len(dataset))}
    assert served == source_files(folder)
    assert dataset.classes == sorted(p.name for p in folder.iterdir())


def pack_files(dataset: stoker.ShardDataset) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in Path(dataset.shards.root).iterdir()}


def files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_an_unchanged_folder_is_reused_without_a_write_or_a_warning(folder, caplog):
    first, _ = load(folder, caplog)
    stamps = stamps_path(Path(first.shards.root))
    made, stamped = pack_files(first), stamps.stat().st_mtime_ns
    second, warned = load(folder, caplog)
    assert warned == "" and pack_files(second) == made and stamps.stat().st_mtime_ns == stamped
    assert_serves(second, folder)


def test_a_file_replaced_in_place_is_packed_again_with_a_warning(folder, caplog):
    load(folder, caplog)
    target, other = files(folder)[0], files(folder)[-1]
    target.write_bytes(other.read_bytes())  # new content, size and modification time
    dataset, warned = load(folder, caplog)
    assert "not reusing the pack" in warned and "1 file changed" in warned and target.name in warned
    assert_serves(dataset, folder)


def test_a_file_rewritten_with_its_size_and_modification_time_kept_is_noticed(folder, caplog):
    load(folder, caplog)
    target = files(folder)[3]
    before = target.stat()
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of the entropy-coded data: same size
    target.write_bytes(bytes(data))
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # as cp -p or rsync -t would leave it
    assert (target.stat().st_size, target.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    dataset, warned = load(folder, caplog)
    assert "1 file changed" in warned and target.name in warned
    assert_serves(dataset, folder)


def test_a_touched_file_counts_as_changed(folder, caplog):
    """The same bytes with a new modification time: a stat cannot tell, so the folder is packed again."""
    load(folder, caplog)
    target = files(folder)[5]
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10**9))
    dataset, warned = load(folder, caplog)
    assert "1 file changed" in warned and target.name in warned
    assert_serves(dataset, folder)


def test_files_added_removed_and_renamed_are_named_in_the_warning(folder, caplog):
    load(folder, caplog)
    shutil.copy(files(folder)[0], files(folder)[0].parent / "added.jpg")
    dataset, warned = load(folder, caplog)
    assert "1 file added" in warned and "changed" in warned and len(dataset) == 13
    assert_serves(dataset, folder)

    files(folder)[1].unlink()
    dataset, warned = load(folder, caplog)
    assert "1 file removed" in warned and len(dataset) == 12
    assert_serves(dataset, folder)

    renamed = files(folder)[2]
    renamed.rename(renamed.with_name("renamed.jpg"))
    dataset, warned = load(folder, caplog)
    assert "1 file added; 1 file removed" in warned and len(dataset) == 12
    assert_serves(dataset, folder)


def test_a_renamed_class_folder_is_packed_again_with_its_new_name(folder, caplog):
    first, _ = load(folder, caplog)
    old = sorted(p for p in folder.iterdir())[1]
    old.rename(folder / "zebra")
    dataset, warned = load(folder, caplog)
    assert "4 files added; 4 files removed" in warned
    assert dataset.classes == sorted([*(c for c in first.classes if c != old.name), "zebra"])
    assert_serves(dataset, folder)


def test_a_pack_without_a_record_of_its_files_is_made_again(folder, caplog):
    """A pack made before loader_for recorded the files (or by stoker pack into the same folder)
    cannot be checked against them: it is packed again, once."""
    first, _ = load(folder, caplog)
    stamps_path(Path(first.shards.root)).unlink()
    files(folder)[0].write_bytes(files(folder)[1].read_bytes())
    dataset, warned = load(folder, caplog)
    assert "no record of the files it was made from" in warned
    assert_serves(dataset, folder)
    assert load(folder, caplog)[1] == ""


def test_an_interrupted_pack_starts_over_when_a_file_changed(folder, caplog, tmp_path):
    """Shards an interrupted pack finished are reused only while the files are as they were."""
    bad = files(folder)[-1]
    good = bad.read_bytes()
    bad.write_bytes(good[:200])  # truncated: strict stops the pack at the last shard
    options = {"pack_options": {"shard_bytes": SMALL_SHARD, "strict": True, "workers": 1}}
    with pytest.raises(PackError, match="stopped by --strict|truncated"):
        load(folder, caplog, **options)
    pack_dir = pack_cache_dir(folder, options["pack_options"])
    assert any((pack_dir / WORK_DIR_NAME).glob("shard-000000*.json")) and not (pack_dir / MANIFEST_NAME).exists()
    first = files(folder)[0]  # in the finished first shard
    first.write_bytes(files(folder)[4].read_bytes())
    bad.write_bytes(good)  # the listing is the same: the plan (and each shard's digest) too
    dataset, warned = load(folder, caplog, **options)
    assert "the interrupted pack" in warned and "starts over" in warned and "2 files changed" in warned
    assert_serves(dataset, folder)


def test_a_pack_dir_made_with_other_options_is_packed_again(folder, caplog, tmp_path):
    load(folder, caplog, pack_dir=tmp_path / "pack", pack_options={"shard_bytes": SMALL_SHARD})
    dataset, warned = load(folder, caplog, pack_dir=tmp_path / "pack", pack_options={"shard_bytes": 2 * SMALL_SHARD})
    assert "made with other options" in warned and len(dataset.shards.manifest.shards) < 4
    assert_serves(dataset, folder)


def test_a_pack_of_other_input_raises_a_typed_error(folder, tmp_path):
    stoker.pack(folder, tmp_path / "pack", progress=False)
    files(folder)[0].unlink()
    with pytest.raises(PackMismatchError, match="other input or options") as raised:
        stoker.pack(folder, tmp_path / "pack", progress=False)
    assert isinstance(raised.value, PackError) and raised.value.dst == str(tmp_path / "pack")
    again = pickle.loads(pickle.dumps(raised.value))  # from a worker process, as it was
    assert type(again) is PackMismatchError and str(again) == str(raised.value)


def test_a_path_list_and_a_save_to_disk_folder_follow_their_files(folder, caplog, tmp_path):
    """Any source at a path is cached by its files: a CSV list's images, a save_to_disk folder's Arrow files."""
    listing = tmp_path / "list.csv"
    listing.write_text("file,kind\n" + "".join(f"{p},{p.parent.name}\n" for p in files(folder)))
    dataset, _ = load(listing, caplog, image_column="file", label_column="kind")
    assert dataset.classes == sorted(p.name for p in folder.iterdir()) and len(dataset) == 12
    assert load(listing, caplog, image_column="file", label_column="kind")[1] == ""
    files(folder)[0].write_bytes(files(folder)[1].read_bytes())
    assert "1 file changed" in load(listing, caplog, image_column="file", label_column="kind")[1]

    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict({"image": [p.read_bytes() for p in files(folder)], "label": [0] * 12})
    table.save_to_disk(str(tmp_path / "saved"))
    assert len(load(tmp_path / "saved", caplog)[0]) == 12 and load(tmp_path / "saved", caplog)[1] == ""
    table.select(range(6)).save_to_disk(str(tmp_path / "saved"))
    dataset, warned = load(tmp_path / "saved", caplog)
    assert "changed since it was packed" in warned and len(dataset) == 6
