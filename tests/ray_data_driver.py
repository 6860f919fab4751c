"""The Ray Data side of tests/test_ray_data.py, run as a program: one local Ray instance for all
its steps, so that the test process never loads Ray (processes forked after Ray crashed; see
stoker/pack/ray_engine.py).

    python tests/ray_data_driver.py STEPS.json RESULTS.pickle

Each step writes the photos of a folder as rows through stoker.ShardDatasink (with ``locked``, into
a folder this process holds the pack lock of), or reads a data set through stoker.ShardDatasource
(made, with ``cwd``, in that working directory). RESULTS maps each step's name to what it gave: the
sink's PackResult, the rows read and the number of blocks they came in, or the StokerError raised
as (class name, message).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import ray
import ray.data

import stoker
from stoker.pack import destination


def write(step: dict[str, Any]) -> stoker.PackResult | None:
    photos = Path(step["photos"])
    rows = [{"image": f.read_bytes(), "label": f.parent.name, "key": f.relative_to(photos).with_suffix("").as_posix()}
            for f in sorted(photos.rglob("*.jpg"))]
    sink = stoker.ShardDatasink(step["dst"], key_column="key", **step["options"])
    with locked(Path(step["dst"])) if step.get("locked") else nullcontext():
        ray.data.from_items(rows, override_num_blocks=step["blocks"]).write_datasink(sink)
    return sink.result


@contextmanager
def locked(dst: Path) -> Iterator[None]:
    """``dst`` locked as a pack writing there locks it; another waits half a second for it."""
    dst.mkdir(parents=True, exist_ok=True)
    waited, destination.LOCK_WAIT_SECONDS = destination.LOCK_WAIT_SECONDS, 0.5
    try:
        with destination.pack_lock(dst):
            yield
    finally:
        destination.LOCK_WAIT_SECONDS = waited


def read(step: dict[str, Any]) -> dict[str, Any]:
    here = os.getcwd()
    os.chdir(step.get("cwd", here))  # Ray's workers stay where ray.init() started them
    try:
        source = stoker.ShardDatasource(step["path"], **step["options"])
    finally:
        os.chdir(here)
    dataset = ray.data.read_datasource(source, override_num_blocks=step["blocks"]).materialize()
    return {"rows": dataset.take_all(), "blocks": dataset.num_blocks()}


def main(steps_file: str, results_file: str) -> None:
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    results: dict[str, Any] = {}
    try:
        for step in json.loads(Path(steps_file).read_text()):
            try:
                results[step["name"]] = (write if step["kind"] == "write" else read)(step)
            except stoker.StokerError as e:
                results[step["name"]] = (type(e).__name__, str(e))
    finally:
        ray.shutdown()
    Path(results_file).write_bytes(pickle.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
