"""stoker.pack_spark on a real local Spark (local[2], one SparkSession for the session): a
DataFrame's partitions written as shards by Spark's Python workers, read back with ShardDataset
and compared with `stoker pack` of the same rows, as an image folder and as a CSV path list."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import stoker
from stoker.errors import OptionError, PackError
from stoker.format import MANIFEST_NAME, REJECTED_NAME, read_manifest
from stoker.format.verify import verify_dataset
from stoker.pack import destination
from stoker.pack.destination import pack_lock
from stoker.storage.locks import exclusive
from tests.same_samples import assert_same_samples
from tests.test_sources import write_hf_parquet


def java_major() -> int | None:
    """The major version of the ``java`` on the PATH (8 for "1.8.0_402"), 0 where it names none,
    None where there is no ``java``."""
    if shutil.which("java") is None:
        return None
    said = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60).stderr
    found = re.search(r'version "(\d+)(?:\.(\d+))?', said)
    if found is None:
        return 0
    return int(found[2] or 0) if found[1] == "1" else int(found[1])


pyspark = pytest.importorskip("pyspark")
JAVA = java_major()
NEEDED = 17 if int(pyspark.__version__.split(".")[0]) >= 4 else 8
if JAVA is None or JAVA < NEEDED:
    pytest.skip(f"Spark {pyspark.__version__} needs Java {NEEDED} or later, "
                + ("no java found" if JAVA is None else f"`java -version` says {JAVA}")
                + " (.ci/run installs openjdk-17-jre-headless)", allow_module_level=True)

PARTITIONS = 4


@pytest.fixture(scope="session")
def spark():
    """One local Spark with two cores; its Python workers run this interpreter (and this stoker)."""
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", sys.executable)
        session = (SparkSession.builder.master("local[2]").appName("stoker-tests")
                   .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                   .getOrCreate())
        session.sparkContext.setLogLevel("ERROR")
        yield session
        session.stop()


def photo_rows(photos: Path) -> list[tuple[bytes, str, str]]:
    """Each photo as (its bytes, its class folder, its path without extension), in file order."""
    return [(f.read_bytes(), f.parent.name, f.relative_to(photos).with_suffix("").as_posix())
            for f in sorted(photos.rglob("*.jpg"))]


def frame(spark, rows: list[tuple], schema: str, partitions: int = PARTITIONS):
    """A DataFrame of ``rows`` split in order into ``partitions``."""
    return spark.createDataFrame(spark.sparkContext.parallelize(rows, partitions), schema)


def test_partitions_are_written_as_the_shards_stoker_pack_writes(spark, photos, packed, tmp_path):
    rows = photo_rows(photos)
    df = frame(spark, rows, "image binary, label string, key string")
    result = stoker.pack_spark(df, tmp_path / "ds", key_column="key")
    assert_same_samples(tmp_path / "ds", packed)
    manifest = read_manifest(tmp_path / "ds")
    # one shard per partition, in partition order, each as big as its partition (parallelize cuts even slices)
    assert [s.name for s in manifest.shards] == [f"shard-{n:06d}.tar" for n in range(PARTITIONS)]
    assert len(rows) % PARTITIONS == 0 and [s.count for s in manifest.shards] == [len(rows) // PARTITIONS] * PARTITIONS
    assert manifest.source["kind"] == "spark_dataframe" and manifest.source["listed"] == len(rows)
    assert result.num_samples == len(rows) and result.rejected == []
    assert sorted(p.name for p in (tmp_path / "ds").iterdir() if not p.name.startswith("shard-")) == [
        ".stoker-pack.lock", REJECTED_NAME, MANIFEST_NAME]


def test_paths_read_by_the_executors_give_what_a_csv_path_list_gives(spark, photos, tmp_path):
    rows = [(str(f), int(f.parent.name.removeprefix("class_"))) for f in sorted(photos.rglob("*.jpg"))][:40]
    listing = tmp_path / "list.csv"
    listing.write_text("".join(f"{path},{label}\n" for path, label in rows))
    stoker.pack(listing, tmp_path / "packed", progress=False)
    stoker.pack_spark(frame(spark, rows, "path string, target long", 3), tmp_path / "ds", image_column="path",
                      label_column="target")
    assert_same_samples(tmp_path / "ds", tmp_path / "packed")


def test_hugging_face_parquet_read_by_spark_gives_the_samples_stoker_pack_gives(spark, photos, tmp_path):
    classes = write_hf_parquet(photos, tmp_path / "hf")
    stoker.pack(tmp_path / "hf", tmp_path / "packed", progress=False)
    df = spark.read.parquet(str(tmp_path / "hf"))  # image: struct<bytes, path>; Spark drops the ClassLabel names
    stoker.pack_spark(df, tmp_path / "ds", image_column="image.bytes", classes=classes)
    ours, theirs = stoker.ShardDataset(tmp_path / "ds", decode="raw"), stoker.ShardDataset(tmp_path / "packed", decode="raw")
    assert ours.classes == theirs.classes == classes
    # Spark orders a folder's files its own way: the same samples, as a whole
    assert sorted(ours[i] for i in range(len(ours))) == sorted(theirs[i] for i in range(len(theirs)))


def test_bad_rows_are_listed_or_stop_the_write(spark, photos, tmp_path):
    rows = photo_rows(photos)[:12]
    rows[3] = (b"not an image", rows[3][1], rows[3][2])
    rows[7] = (None, rows[7][1], rows[7][2])
    df = frame(spark, rows, "image binary, label string, key string", 2)
    result = stoker.pack_spark(df, tmp_path / "ds", key_column="key")
    assert result.num_samples == 10
    report = (tmp_path / "ds" / REJECTED_NAME).read_text().splitlines()
    assert report[1].startswith("partition 0, row 3\t") and "image" in report[1]
    assert report[2] == "partition 1, row 1\tno image bytes in this row (null or empty)"
    assert stoker.ShardDataset(tmp_path / "ds").key(3) == rows[4][2]
    with pytest.raises(PackError, match=r"partition 0, row 3: .*\(stopped by --strict\)"):
        stoker.pack_spark(df, tmp_path / "strict", key_column="key", strict=True)
    assert not (tmp_path / "strict" / MANIFEST_NAME).exists()


def test_a_rerun_after_a_failure_replaces_what_the_failed_run_left(spark, photos, tmp_path):
    rows = photo_rows(photos)[:16]
    dst = tmp_path / "ds"
    dst.mkdir()
    for name in ("shard-000000.tar", "shard-000000.idx", "shard-000007.tar", "shard-000007.idx",
                 ".shard-000001.tar.123-abcd.tmp"):
        (dst / name).write_bytes(b"left by a killed run")
    stoker.pack_spark(frame(spark, rows, "image binary, label string, key string", 2), dst, key_column="key")
    assert sorted(p.name for p in dst.glob("shard-*")) == [f"shard-00000{n}.{e}" for n in (0, 1) for e in ("idx", "tar")]
    assert verify_dataset(dst) == []
    with pytest.raises(PackError, match="holds a finished stoker data set; write into a new folder"):
        stoker.pack_spark(frame(spark, rows, "image binary, label string, key string", 2), dst, key_column="key")


def waiting_for_a_lock(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside stoker's lock wait (storage/locks.py ``exclusive``) right now."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None and frame.f_code is not exclusive.__wrapped__.__code__:
        frame = frame.f_back
    return frame is not None


def test_a_write_that_waited_for_another_is_refused_where_that_one_finished(spark, photos, packed, tmp_path,
                                                                           monkeypatch):
    """Two writes into one folder: the second waits for the first's lock, then finds the data set
    the first finished there and is refused, instead of writing its shards over it."""
    monkeypatch.setattr(destination, "LOCK_WAIT_SECONDS", 600.0)  # however slow the machine
    dst = tmp_path / "ds"
    dst.mkdir()
    df = frame(spark, photo_rows(photos)[:8], "image binary, label string, key string", 2)
    outcome: list[BaseException | None] = []

    def second_write() -> None:
        try:
            stoker.pack_spark(df, dst, key_column="key")
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 -- handed to the test
            outcome.append(e)

    second = threading.Thread(target=second_write, daemon=True)
    with pack_lock(dst):  # the first write, writing
        second.start()
        while second.is_alive() and not waiting_for_a_lock(second):
            time.sleep(0.02)
        shutil.copytree(packed, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".stoker-pack*"))  # it finishes
    second.join(300)
    assert outcome and isinstance(outcome[0], PackError), outcome
    assert "holds a finished stoker data set" in str(outcome[0])
    assert verify_dataset(dst) == [] and read_manifest(dst) == read_manifest(packed)


def test_options_that_do_not_fit_the_rows_are_refused_before_anything_runs(spark, photos, tmp_path):
    df = frame(spark, [(b"x", "cat", 1.5, "k")], "image binary, target string, score double, key string", 1)
    with pytest.raises(OptionError, match=r"label_column='label': the DataFrame has no such column \(it has image, "
                                          r"target, score, key\); pass label_column=None for unlabelled rows"):
        stoker.pack_spark(df, tmp_path / "a")
    with pytest.raises(OptionError, match=r"label_column='score': a column of double; it must hold integer labels"):
        stoker.pack_spark(df, tmp_path / "a", label_column="score")
    with pytest.raises(OptionError, match=r"image_column='score': a column of double; it must hold encoded images"):
        stoker.pack_spark(df, tmp_path / "a", image_column="score", label_column=None)
    with pytest.raises(OptionError, match=r"classes= lacks 'cat', found in the DataFrame's column 'target'"):
        stoker.pack_spark(df, tmp_path / "a", label_column="target", classes=["dog"])
    with pytest.raises(OptionError, match=r"quality=0 \(--quality\)"):
        stoker.pack_spark(df, tmp_path / "a", label_column="target", max_side=64, quality=0)
    assert not (tmp_path / "a").exists()


def test_integer_labels_beyond_the_class_names_stop_the_write(spark, photos, tmp_path):
    rows = [(data, 5 if n == 2 else 0, key) for n, (data, _, key) in enumerate(photo_rows(photos)[:4])]
    df = frame(spark, rows, "image binary, label int, key string", 1)
    with pytest.raises(PackError, match=r"partition 0, row 2: label 5 has no class name \(classes= holds 2\)"):
        stoker.pack_spark(df, tmp_path / "ds", key_column="key", classes=["a", "b"])
    assert not (tmp_path / "ds" / MANIFEST_NAME).exists()
