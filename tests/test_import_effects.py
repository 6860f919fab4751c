"""Importing stoker changes nothing process-wide: OpenCV's thread count is 1 only while a Loader's
pass runs (in its worker processes too) and what it was afterwards, and the fork hooks of the
lock module are registered on the first lock, not at import. Each check runs in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent

IMPORT_ALL = r'''
import importlib, json, os, pkgutil, sys
import cv2

hooks = []
register = os.register_at_fork
def recording(**hooks_given):
    hooks.append(sorted({getattr(f, "__module__", None) or "" for f in hooks_given.values()}))
    register(**hooks_given)
os.register_at_fork = recording
cv2.setNumThreads(3)

import stoker
imported = []
for info in pkgutil.walk_packages(stoker.__path__, "stoker.", onerror=lambda name: None):
    if info.name.startswith("stoker.bench.readers"):  # scripts, run as programs
        continue
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as e:  # an optional dependency not installed here
        if (e.name or "").startswith("stoker"):
            raise
        continue
    imported.append(info.name)
for name in stoker.__all__:
    getattr(stoker, name)
threads_after_import = cv2.getNumThreads()
hooks_after_import = [h for h in hooks if any(m.startswith("stoker") for m in h)]

from stoker.storage import locks
with locks.exclusive(__import__("pathlib").Path(sys.argv[1]), inherit=False):
    fd = next(iter(locks._PRIVATE))
    pid = os.fork()
    if pid == 0:
        try:
            os.fstat(fd)
            os._exit(1)  # the child kept the private lock's descriptor
        except OSError:
            os._exit(0)
    child_closed = os.waitpid(pid, 0)[1] == 0
print(json.dumps({"imported": imported, "threads": threads_after_import, "hooks_at_import": hooks_after_import,
                  "hooks_after_lock": [h for h in hooks if any(m.startswith("stoker") for m in h)],
                  "child_closed": child_closed}))
'''

LOADER_PASS = r'''
import json, sys
import cv2
import torch
import stoker


class Threads:
    """A per-sample transform that reports OpenCV's thread count where it runs."""

    def __call__(self, image):
        return torch.full((1,), cv2.getNumThreads())


def main(path):
    cv2.setNumThreads(3)
    dataset = stoker.ShardDataset(path)
    crop = stoker.CropSpec(size=(32, 32))
    loader = stoker.Loader(dataset, 8, crop=crop, threads=2)
    during = sorted({cv2.getNumThreads() for _ in loader})
    after = cv2.getNumThreads()
    for _ in loader:
        break
    after_break = cv2.getNumThreads()
    workers = stoker.Loader(dataset, 8, crop=crop, transform=Threads(), processes=1, mp_context="spawn")
    in_workers = set()
    for n, (images, _) in enumerate(workers):
        in_workers |= set(images.flatten().tolist())
        if n == 2:
            break
    print(json.dumps({"during": during, "after": after, "after_break": after_break, "in_workers": sorted(in_workers),
                      "after_workers": cv2.getNumThreads()}))


if __name__ == "__main__":
    main(sys.argv[1])
'''


def run(script: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_stoker_sets_no_opencv_threads_and_registers_no_fork_hooks(tmp_path):
    script = tmp_path / "import_all.py"
    script.write_text(IMPORT_ALL)
    found = run(script, str(tmp_path / "a.lock"))
    assert "stoker.decode.per_image" in found["imported"] and "stoker.storage.locks" in found["imported"]
    assert found["threads"] == 3
    assert found["hooks_at_import"] == []
    # the first lock registers them, and a forked child then closes the private lock's descriptor
    assert found["hooks_after_lock"] == [["stoker.storage.locks"]]
    assert found["child_closed"]


def test_opencv_runs_one_thread_only_while_a_loader_pass_runs(packed, tmp_path):
    script = tmp_path / "loader_pass.py"
    script.write_text(LOADER_PASS)
    found = run(script, str(packed))
    assert found["during"] == [1]
    assert found["after"] == 3 and found["after_break"] == 3
    assert found["in_workers"] == [1]  # a spawned worker process, which imported stoker afresh
    assert found["after_workers"] == 3
