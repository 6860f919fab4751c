"""stoker.ShardDatasink and stoker.ShardDatasource on a real local Ray: a Dataset's rows written as
the shards `stoker pack` writes, and stoker data sets (a folder, an object store) read back as
ShardDataset reads them. All Ray work runs in one driver process (tests/ray_data_driver.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import stoker
from stoker.format import read_manifest
from stoker.format.verify import verify_dataset
from tests.same_samples import assert_same_samples

if importlib.util.find_spec("ray") is None:  # not importorskip: this process never loads Ray
    pytest.skip("needs ray", allow_module_level=True)

ROOT = Path(__file__).parent.parent
DRIVER = Path(__file__).with_name("ray_data_driver.py")
BLOCKS = 4
CACHE_LIMIT = 2_000_000  # about three of `packed`'s shards


@pytest.fixture(scope="module")
def ray_results(photos, packed, numbered, s3, remote, tmp_path_factory) -> dict:
    """What each step of the driver gave (see tests/ray_data_driver.py), with the folders it wrote."""
    root = tmp_path_factory.mktemp("ray-data")
    classes = sorted(p.name for p in photos.iterdir())
    s3.fs.mkdir("written")
    steps = [
        {"name": "sink", "kind": "write", "photos": str(photos), "dst": str(root / "sink"), "blocks": BLOCKS,
         "options": {"classes": classes}},
        {"name": "sink_rows_per_shard", "kind": "write", "photos": str(photos), "dst": str(root / "rows"),
         "blocks": 8, "options": {"classes": classes, "rows_per_shard": 40}},
        {"name": "sink_to_url", "kind": "write", "photos": str(photos), "dst": "s3://written/ds", "blocks": 2,
         "options": {"classes": classes, "storage_options": s3.options}},
        {"name": "sink_names_without_classes", "kind": "write", "photos": str(photos), "dst": str(root / "refused"),
         "blocks": 2, "options": {}},
        {"name": "sink_unknown_class", "kind": "write", "photos": str(photos), "dst": str(root / "unknown"),
         "blocks": 2, "options": {"classes": classes[1:]}},
        # the lock: let go after a failed write and after a complete one, and waited for while another holds it
        {"name": "sink_after_failure", "kind": "write", "photos": str(photos), "dst": str(root / "unknown"),
         "blocks": 2, "options": {"classes": classes}},
        {"name": "sink_again", "kind": "write", "photos": str(photos), "dst": str(root / "sink"), "blocks": 2,
         "options": {"classes": classes}},
        {"name": "sink_locked", "kind": "write", "photos": str(photos), "dst": str(root / "locked"), "blocks": 2,
         "options": {"classes": classes}, "locked": True},
        {"name": "source_raw", "kind": "read", "path": str(packed), "blocks": 3, "options": {"decode": "raw"}},
        {"name": "source_rgb", "kind": "read", "path": str(numbered), "blocks": 2, "options": {}},
        {"name": "source_url", "kind": "read", "path": remote, "blocks": 2,
         "options": {"decode": "raw", "storage_options": s3.options}},
        {"name": "source_pil", "kind": "read", "path": str(packed), "blocks": 2, "options": {"decode": "pil"}},
        # relative to the driver's working directory, which is not the read tasks'; the storage settings passed on
        {"name": "source_relative", "kind": "read", "path": os.path.relpath(packed, root), "cwd": str(root),
         "blocks": 2, "options": {"decode": "raw", "cache_dir": "node-cache", "cache_limit": CACHE_LIMIT,
                                  "read_timeout": 30.0, "reads_in_flight": 2}},
        {"name": "source_bad_setting", "kind": "read", "path": str(packed), "blocks": 2,
         "options": {"reads_in_flight": 0}},
    ]
    (root / "steps.json").write_text(json.dumps(steps))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(DRIVER), str(root / "steps.json"), str(root / "results.pickle")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return {"root": root, **pickle.loads((root / "results.pickle").read_bytes())}


def test_datasink_writes_the_shards_stoker_pack_writes(ray_results, packed):
    dst = ray_results["root"] / "sink"
    assert_same_samples(dst, packed)
    manifest = read_manifest(dst)
    assert [s.name for s in manifest.shards] == [f"shard-{n:06d}.tar" for n in range(BLOCKS)]
    assert manifest.source["kind"] == "ray_dataset"
    assert ray_results["sink"].num_samples == len(stoker.ShardDataset(packed)) and ray_results["sink"].rejected == []


def test_datasink_writes_a_shard_of_at_least_rows_per_shard_rows_per_task(ray_results, packed):
    dst = ray_results["root"] / "rows"
    counts = [s.count for s in read_manifest(dst).shards]
    assert len(counts) < 8 and all(count >= 40 for count in counts[:-1]) and sum(counts) == len(stoker.ShardDataset(packed))
    assert verify_dataset(dst) == []


def test_datasink_writes_to_an_object_store(ray_results, s3, packed):
    assert ray_results["sink_to_url"].dst == "s3://written/ds"
    there = stoker.ShardDataset("s3://written/ds", decode="raw", storage_options=s3.options)
    here = stoker.ShardDataset(packed, decode="raw")
    assert [there.key(i) for i in range(len(there))] == [here.key(i) for i in range(len(here))]
    assert [there[i] for i in range(len(there))] == [here[i] for i in range(len(here))]


def test_datasink_refuses_class_names_it_cannot_index(ray_results, packed):
    assert ray_results["sink_names_without_classes"] == (
        "OptionError", "label_column='label' holds class names: give classes=, the names in label order "
                       "(e.g. classes=sorted(ds.unique('label')))")
    kind, message = ray_results["sink_unknown_class"]
    assert kind == "PackError" and message.startswith("write task 0, row 0: label 'class_00' is not one of the classes")
    # a rerun into the same folder writes it: the failed write left no data set there, and let go of its lock
    assert ray_results["sink_after_failure"].num_samples == len(stoker.ShardDataset(packed))


def test_datasink_holds_the_pack_lock_of_its_destination_while_it_writes(ray_results):
    """Taken on the driver before the destination is checked, let go when the write ends (after
    a failed write too: test_datasink_refuses_class_names_it_cannot_index)."""
    assert ray_results["sink_locked"] == ("PackError", f"{ray_results['root'] / 'locked'}: another stoker pack is "
                                                       "writing here")
    assert not any(ray_results["root"].joinpath("locked").glob("shard-*"))
    assert ray_results["sink_again"] == ("PackError", f"{ray_results['root'] / 'sink'}: holds a finished stoker data "
                                                      "set; write into a new folder, or delete it first")


def test_datasource_rows_are_the_shard_dataset_items_in_order(ray_results, packed):
    dataset = stoker.ShardDataset(packed, decode="raw")
    rows = ray_results["source_raw"]["rows"]
    assert [(row["image"], row["label"], row["key"]) for row in rows] == [
        (*dataset[i], dataset.key(i)) for i in range(len(dataset))]
    assert ray_results["source_raw"]["blocks"] == 3  # one read task per run of whole shards


def test_datasource_decodes_images_as_arrays(ray_results, numbered):
    dataset = stoker.ShardDataset(numbered, decode="rgb")
    rows = ray_results["source_rgb"]["rows"]
    assert len(rows) == len(dataset)
    for i, row in enumerate(rows):
        image, label = dataset[i]
        assert row["image"].dtype == image.dtype and (row["image"] == image).all()
        assert (row["label"], row["key"]) == (label, dataset.key(i))


def test_datasource_reads_an_object_store(ray_results, packed):
    dataset = stoker.ShardDataset(packed, decode="raw")
    assert [(row["image"], row["label"], row["key"]) for row in ray_results["source_url"]["rows"]] == [
        (*dataset[i], dataset.key(i)) for i in range(len(dataset))]


def test_datasource_refuses_other_decodes(ray_results):
    assert ray_results["source_pil"] == (
        "OptionError", "decode='pil': must be 'rgb' (decoded HWC uint8 arrays) or 'raw' (the stored bytes)")


def test_datasource_reads_a_relative_path_with_the_storage_settings_given(ray_results, packed):
    dataset = stoker.ShardDataset(packed, decode="raw")
    assert [(row["image"], row["label"], row["key"]) for row in ray_results["source_relative"]["rows"]] == [
        (*dataset[i], dataset.key(i)) for i in range(len(dataset))]
    copies = list((ray_results["root"] / "node-cache").rglob("shard-*.tar"))  # the driver's folder, not the tasks'
    assert copies and sum(copy.stat().st_size for copy in copies) <= CACHE_LIMIT
    kind, message = ray_results["source_bad_setting"]
    assert kind == "OptionError" and message.startswith("reads_in_flight=0")
