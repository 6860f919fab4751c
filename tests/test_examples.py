"""The canonical training scripts switched to stoker, run on a tiny set: pytorch/examples' ImageNet script
(examples/imagenet/main.py) and a timm training loop (examples/timm/train.py). Each trains over every sample
of each epoch and validates every sample, its --resume goes on at the next epoch with the batches an
uninterrupted run read there (not epoch 0's), and its diff turns the script as it reads with a DataLoader
into ours, so that the diff shown to users stays honest.

Each photo of the training set is its own class, so a batch's labels say which samples it holds. This file
is also the script each run starts (``python tests/test_examples.py RECORD SCRIPT -- ARGS``): it runs the
script with the loader its train and validate functions get watched, writing each pass's labels and a
digest of each batch's images to RECORD; and of the ImageNet script's checkpoint, which each epoch
overwrites, it keeps a copy per epoch (checkpoint-EPOCH.pth.tar: the epoch a resume starts at).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
IMAGENET = ROOT / "examples" / "imagenet" / "main.py"
TIMM = ROOT / "examples" / "timm" / "train.py"
# imagenet/main.py of pytorch/examples at commit 77f55b912142e11fcfdf5b530231fb9c52f181e8: its git blob id
IMAGENET_UPSTREAM_BLOB = "42e5e9fa64f023f019689ab871332d5e3ffa2ab8"
TRAIN, VAL, BATCH = 24, 16, 8


class Watched:
    """A loader as the script's function sees it (its length and attributes), each batch noted as it passes."""

    def __init__(self, loader) -> None:
        self.loader, self.labels, self.images = loader, [], []

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        return getattr(self.loader, name)

    def __iter__(self):
        for images, labels in self.loader:
            self.labels.append(labels.tolist())
            self.images.append(hashlib.sha1(images.contiguous().numpy().tobytes()).hexdigest()[:16])
            yield images, labels


def watching(function, phase: str, record: Path):
    """``function`` (it iterates the argument whose name ends in "loader") with that loader watched: each call
    appends a line to ``record`` (the phase, the ``epoch`` argument if any, every batch's labels and images)."""
    signature = inspect.signature(function)

    def watched(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        name = next(name for name in bound.arguments if name.endswith("loader"))
        loader = bound.arguments[name] = Watched(bound.arguments[name])
        result = function(*bound.args, **bound.kwargs)
        line = {"phase": phase, "epoch": bound.arguments.get("epoch"), "labels": loader.labels, "images": loader.images}
        with open(record, "a") as out:
            out.write(json.dumps(line) + "\n")
        return result

    return watched


def run_example(record: Path, script: Path, argv: list[str]) -> None:
    spec = importlib.util.spec_from_file_location("example", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, phase in (("train", "train"), ("train_one_epoch", "train"), ("validate", "validate")):
        if hasattr(module, name):
            setattr(module, name, watching(getattr(module, name), phase, record))
    if hasattr(module, "save_checkpoint"):
        save = module.save_checkpoint

        def save_and_keep(state, is_best, filename="checkpoint.pth.tar"):
            save(state, is_best, filename)
            shutil.copyfile(filename, f"checkpoint-{state['epoch']}.pth.tar")

        module.save_checkpoint = save_and_keep
    sys.argv = [str(script), *argv]
    module.main()


if __name__ == "__main__":
    run_example(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[4:])
    sys.exit()

pytest.importorskip("torchvision", reason="needs torchvision (make test runs these tests in .venv-tv)")
pytest.importorskip("timm", reason="needs timm (make test runs these tests in .venv-tv)")
pytestmark = pytest.mark.torchvision


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """train/ (TRAIN photos, each its own class) and val/ (VAL photos, classes 0 to VAL - 1) as ImageFolder trees."""
    from stoker.sample_data import make_sample_photos

    root = tmp_path_factory.mktemp("tiny")
    make_sample_photos(root / "train", count=TRAIN, num_classes=TRAIN, seed=3)
    make_sample_photos(root / "val", count=VAL, num_classes=VAL, seed=4)
    return root


def run(script: Path, cwd: Path, *args: str) -> list[dict]:
    """One run of ``script`` with ``args`` in ``cwd`` (made here): what its train and validate functions read."""
    cwd.mkdir()
    record = cwd / "record.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # torch's threads not vying with the Loader's
    done = subprocess.run([sys.executable, __file__, str(record), str(script), "--", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in record.read_text().splitlines()]


def passes(records: list[dict], phase: str) -> list[dict]:
    return [line for line in records if line["phase"] == phase]


def labels(line: dict) -> list[int]:
    return [label for batch in line["labels"] for label in batch]


def every_sample_once(line: dict, count: int) -> bool:
    return Counter(labels(line)) == Counter(range(count))


def git_blob_id(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def patched(text: str, diff: Path, folder: Path, reverse: bool = False) -> str:
    """``text`` with ``diff`` applied, or taken back, by git apply (which works outside a repository as patch
    does) on a file of the diff's name (main.py.diff: main.py) in ``folder``, which it leaves there."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / diff.stem
    target.write_text(text)
    alone = {**os.environ, "GIT_CEILING_DIRECTORIES": str(folder.parent)}  # never a repository above it
    subprocess.run(["git", "apply", *(["-R"] if reverse else []), str(diff)], cwd=folder, env=alone, check=True,
                   capture_output=True)
    return target.read_text()


def diff_of(script: Path) -> Path:
    return script.with_name(script.name + ".diff")


def test_the_imagenet_diff_turns_pytorch_examples_script_into_ours(tmp_path):
    before = patched(IMAGENET.read_text(), diff_of(IMAGENET), tmp_path / "before", reverse=True)
    assert git_blob_id(before) == IMAGENET_UPSTREAM_BLOB, "the diff's original is pytorch/examples' main.py"
    assert patched(before, diff_of(IMAGENET), tmp_path / "after") == IMAGENET.read_text()


@pytest.fixture(scope="module")
def imagenet(tiny, tmp_path_factory) -> tuple[list[dict], list[dict]]:
    """The ImageNet script over two epochs, seeded, and a run resumed from its checkpoint after epoch 0."""
    runs = tmp_path_factory.mktemp("imagenet")
    args = [str(tiny), "--arch", "shufflenet_v2_x0_5", "-b", str(BATCH), "--workers", "0", "--seed", "0",
            "--epochs", "2", "--print-freq", "100"]
    whole = run(IMAGENET, runs / "whole", *args)
    resumed = run(IMAGENET, runs / "resumed", *args, "--resume", str(runs / "whole" / "checkpoint-1.pth.tar"))
    return whole, resumed


def test_the_imagenet_script_trains_and_validates_every_sample(imagenet):
    whole, _ = imagenet
    trained, validated = passes(whole, "train"), passes(whole, "validate")
    assert [line["epoch"] for line in trained] == [0, 1] and len(validated) == 2
    assert all(every_sample_once(line, TRAIN) for line in trained)
    assert all(labels(line) == list(range(VAL)) for line in validated), "the whole validation set, in order"
    assert labels(trained[0]) != labels(trained[1]), "each epoch its own order"


def test_the_imagenet_script_resumes_at_the_next_epoch(imagenet):
    """--resume reads epoch 1 as the uninterrupted run did (it replayed epoch 0 when the Loader started at
    epoch 0 whatever the checkpoint said: the script calls set_epoch only under DDP)."""
    whole, resumed = imagenet
    trained = passes(resumed, "train")
    assert [line["epoch"] for line in trained] == [1]
    assert trained[0]["labels"] == passes(whole, "train")[1]["labels"] != passes(whole, "train")[0]["labels"]
    assert trained[0]["images"] == passes(whole, "train")[1]["images"], "the same crops too"
    assert labels(passes(resumed, "validate")[0]) == list(range(VAL))


TIMM_ARGS = ["--model", "resnet10t", "--num-classes", str(TRAIN), "--img-size", "32", "-b", str(BATCH)]


def test_the_timm_loop_trains_every_sample_with_timms_own_loader_before_its_diff(tiny, tmp_path):
    """The diff's original is a working timm loop: timm's create_loader trains and validates every sample."""
    before = patched(TIMM.read_text(), diff_of(TIMM), tmp_path / "before", reverse=True)
    assert patched(before, diff_of(TIMM), tmp_path / "after") == TIMM.read_text()
    records = run(tmp_path / "before" / "train.py", tmp_path / "run", str(tiny), *TIMM_ARGS, "--epochs", "1", "-j", "0")
    assert [line["epoch"] for line in passes(records, "train")] == [0]
    assert every_sample_once(passes(records, "train")[0], TRAIN)
    assert every_sample_once(passes(records, "validate")[0], VAL)


def test_the_timm_loop_on_stoker_trains_every_sample_and_resumes_at_the_next_epoch(tiny, tmp_path):
    """Mixup on; epochs set through loader.batch_sampler as timm's train.py sets them; --resume from the
    checkpoint of epoch 0 reads epoch 1 as the uninterrupted run did."""
    args = [str(tiny), *TIMM_ARGS, "--epochs", "2", "--mixup", "0.2", "--output", "out"]
    whole = run(TIMM, tmp_path / "whole", *args)
    trained = passes(whole, "train")
    assert [line["epoch"] for line in trained] == [0, 1]
    assert all(every_sample_once(line, TRAIN) for line in trained)
    assert all(labels(line) == list(range(VAL)) for line in passes(whole, "validate"))
    resumed = run(TIMM, tmp_path / "resumed", *args, "--resume", str(tmp_path / "whole" / "out" / "checkpoint-0.pth.tar"))
    assert [line["epoch"] for line in passes(resumed, "train")] == [1]
    after = passes(resumed, "train")[0]
    assert (after["labels"], after["images"]) == (trained[1]["labels"], trained[1]["images"])
    assert after["labels"] != trained[0]["labels"]


@pytest.mark.parametrize("script", [IMAGENET, TIMM], ids=["imagenet", "timm"])
def test_the_diff_a_readme_shows_is_part_of_the_diff(script):
    readme = script.with_name("README.md").read_text()
    shown = readme.split("```diff\n")[1].split("```")[0]
    assert shown in diff_of(script).read_text()
