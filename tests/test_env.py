"""``stoker env`` lists every optional fast path quickly, and a missing one is never silent: the
Loader warns once per process and the doctor's report carries the same line."""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
import warnings

import pytest

import stoker
from stoker.augment import Augment, native
from stoker.decode import per_image
from stoker.doctor.report import SCHEMA_PATH
from stoker.env import REGION_DECODE, FallbackWarning, fallback_notes

PARTS = ("region decode", "exact resize", "photometric", "simplejpeg", "OpenCV", "PyAV", "GPU decode", "Ray", "s3fs")

# Run in a fresh process: the region-decode extension refused at import, as on an install built
# without libjpeg-turbo's headers. Prints what `stoker env` says, the FallbackWarnings of two
# Loaders iterated, and a doctor report's notes, as JSON.
WITHOUT_EXTENSION = f"""
import json, sys, warnings

class RefuseRegionDecode:
    def find_spec(self, name, path=None, target=None):
        if name == {REGION_DECODE!r}:
            raise ImportError("refused by the test")

sys.meta_path.insert(0, RefuseRegionDecode())
import torch
import stoker
from stoker.env import FallbackWarning, report

env = report()  # before stoker.loader is imported: the extension is looked up beside it
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")  # the filter would show each once too: once per process must be stoker's doing
    for _ in range(2):
        loader = stoker.Loader(stoker.ShardDataset(sys.argv[1]), batch_size=16, threads=2)
        batches = sum(1 for _ in loader)

class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.zeros((3, 8, 8), dtype=torch.uint8), 0

doctor = stoker.doctor(Squares(), step_time=1.0, quick=True, workers=0)
print(json.dumps({{"env": env, "batches": batches, "text": doctor.to_text(), "report": doctor.to_dict(),
                   "warnings": [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]}}))
"""


def test_a_missing_extension_is_said_once_by_the_loader_and_in_the_doctor_report(packed):
    run = subprocess.run([sys.executable, "-c", WITHOUT_EXTENSION, str(packed)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["batches"] == 6  # 96 photos: the Loader read them all, decoded whole by simplejpeg
    [warning] = out["warnings"]
    assert f"{REGION_DECODE} did not import: refused by the test" in warning
    assert "simplejpeg" in warning and "make wheel" in warning and "headers" in warning  # what and the fix
    note = warning.removeprefix("stoker.Loader: ")
    assert note in out["report"]["notes"] and f"note: {note}" in out["text"]
    import jsonschema

    jsonschema.validate(out["report"], json.loads(SCHEMA_PATH.read_text()))
    region = next(line for line in out["env"].splitlines() if line.strip().startswith("region decode"))
    assert region.split()[2] == "no" and "refused by the test" in region


@pytest.mark.skipif(per_image.decode_region is None, reason="C extension not built (no libjpeg headers?)")
def test_no_warning_where_the_extension_is_built(packed):
    assert fallback_notes() == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            next(iter(stoker.Loader(stoker.ShardDataset(packed), batch_size=16, threads=2)))
    assert [w for w in caught if issubclass(w.category, FallbackWarning)] == []


def test_stoker_env_lists_each_part_quickly():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run([sys.executable, "-m", "stoker.cli", "env"], capture_output=True, text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds, not wall-clock ones: a busy machine delays the command, it does not make it do more.
    seconds = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert run.returncode == 0, run.stderr
    assert seconds < 2.0, f"stoker env took {seconds:.2f} s of CPU"
    head, *lines = run.stdout.splitlines()
    assert head.startswith(f"stoker {stoker.__version__}, Python ")
    found = {name: line[len(name) + 2:].split()[0] for line in lines for name in PARTS if line.startswith(f"  {name} ")}
    assert sorted(found) == sorted(PARTS) and set(found.values()) <= {"yes", "no"}
    if per_image.decode_region is not None:
        from stoker.decode import _jpeg_region

        assert found["region decode"] == "yes" and f"libjpeg-turbo {_jpeg_region.LIBJPEG_TURBO_VERSION}" in run.stdout
    else:
        assert found["region decode"] == "no" and "Fix: " in run.stdout
    assert found["exact resize"] == ("yes" if per_image.resize_crop is not None else "no")
    assert found["photometric"] == ("yes" if native.supports(Augment()) else "no")
    assert found["simplejpeg"] == found["OpenCV"] == "yes"  # dependencies
    version = subprocess.run([sys.executable, "-m", "stoker.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.splitlines()[0] == head


@pytest.mark.skipif(not os.environ.get("STOKER_REQUIRE_EXTENSIONS"),
                    reason="set STOKER_REQUIRE_EXTENSIONS=1 (`make test` does) where the C extensions must be built")
def test_every_c_extension_is_built_where_required():
    """The extensions' own tests skip where one is not built (a user's install without a compiler or
    libjpeg's headers); where the build must have made them, a missing one fails here instead."""
    for name in ("stoker.decode._jpeg_region", "stoker.decode._resample", "stoker.augment._photometric",
                 "stoker.pack._jpeg_restart"):
        importlib.import_module(name)
