"""The Loader's plan (stoker/loader/plan.py): every decision about its passes from a given data set
description, options and machine, without files; a measured first pass makes a new plan; the
engine a plan calls for (engine.py) and a Loader that reads the same plan for explain() and its
passes."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

import stoker
from stoker.data.epoch import RankBatches
from stoker.decode.crops import CropSpec
from stoker.errors import OptionError
from stoker.loader.batches import PerImage
from stoker.loader.engine import engine_for
from stoker.loader.images import Images
from stoker.loader.native_chunk import NativeChunk
from stoker.loader.plan import Description, Machine, Options, plan_loader
from stoker.loader.thread_augment import NativeAugment, OpenCvAugment

IMAGES, CLIPS = Description(), Description(clips=True, clip_layout="THWC")
EIGHT = Machine(cores=8)


def to_float(image: torch.Tensor) -> torch.Tensor:
    return image.float()


def test_images_left_to_choose_decode_natively_on_threads_the_tuner_starts_from():
    plan = plan_loader(IMAGES, Options(), EIGHT)
    assert (plan.decode, plan.augment, plan.layout, plan.crop) == ("native", "none", "NCHW", CropSpec())
    assert not plan.measuring and (plan.workers.processes, plan.workers.threads) == (0, 9)
    assert plan.bounds is not None and plan.bounds.free("threads") and plan.bounds.free("processes")
    assert "until the tuner measures them" in plan.workers.reason and "tuned while it runs" in plan.explain("h", "n")


def test_without_the_tuner_threads_measure_the_first_pass():
    plan = plan_loader(IMAGES, Options(tune=False), EIGHT)
    assert plan.measuring and plan.bounds is None and (plan.workers.processes, plan.workers.threads) == (0, 9)
    assert "threads until the first batches are measured" in plan.workers.reason
    assert "fixed: tune=False" in plan.explain("head", "next")


@pytest.mark.parametrize(("data", "options", "here", "why"), [
    (IMAGES, Options(), Machine(8, region_decode=False), "the region-decode extension is not built"),
    (CLIPS, Options(), EIGHT, "video clips"),
    (IMAGES, Options(transform=to_float), Machine(8, region_decode=False), "the region-decode extension"),
])
def test_what_is_not_decoded_natively_says_why(data, options, here, why):
    plan = plan_loader(data, options, here)
    assert plan.decode == "python" and why in plan.why_python
    assert f"per image from Python ({plan.why_python})" in plan.explain("head", "next")


def test_clips_take_their_layout_and_a_crop_and_run_a_transform_per_clip():
    assert plan_loader(CLIPS, Options(), EIGHT).layout == "NHWC"
    assert plan_loader(Description(clips=True, clip_layout="TCHW"), Options(), EIGHT).layout == "NCHW"
    plan = plan_loader(CLIPS, Options(transform=to_float, layout="NCHW"), EIGHT)
    assert plan.layout == "NCHW" and plan.crop == CropSpec() and plan.transform.per_sample == (to_float,)


def test_counts_given_are_kept_and_nothing_is_measured():
    plan = plan_loader(IMAGES, Options(processes=3), EIGHT)
    assert not plan.measuring and (plan.workers.processes, plan.workers.threads, plan.workers.reason) == (3, 1, "as given")
    assert "in 3 worker processes of 1 thread each" in plan.explain("head", "next")
    assert plan_loader(IMAGES, Options(threads=2), EIGHT).workers.describe() == "2 threads"


def test_a_callable_transform_runs_per_sample_after_the_native_decode():
    plan = plan_loader(IMAGES, Options(transform=to_float), EIGHT)
    assert plan.decode == "native" and plan.augment == "none" and plan.transform.per_sample == (to_float,)
    assert "not fixed by seed with threads" in plan.explain("head", "next")


def test_a_measured_first_pass_makes_a_new_plan_and_changes_nothing_else():
    first = plan_loader(IMAGES, Options(tune=False), Machine(16))
    after = first.measured(2.6, 0.5)  # the GIL-bound case of workers.choose_workers: 7 processes of 4 threads
    assert first.measuring and first.workers.processes == 0  # the first plan is as it was
    assert not after.measuring and (after.workers.processes, after.workers.threads) == (7, 4)
    assert dataclasses.replace(after, settings=first.settings, why_workers=first.why_workers, measuring=True) == first
    assert "7 processes x 4 threads" in after.explain("head", "next")
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.settings = first.settings  # type: ignore[misc]
    fetched = plan_loader(Description(fetched_per_process=True), Options(tune=False), Machine(16)).measured(2.6, 0.5)
    assert fetched.workers.processes == 0 and "object store" in fetched.workers.reason


def test_decode_gpu_takes_the_machine_s_gpu_and_refuses_what_it_cannot_do():
    gpu = Machine(8, gpu=torch.device("cuda", 1))
    plan = plan_loader(IMAGES, Options(decode="gpu"), gpu)
    assert (plan.decode, plan.device, plan.measuring) == ("gpu", torch.device("cuda", 1), False)
    assert "nvJPEG decodes and crops each batch on cuda:1" in plan.explain("head", "next")
    refusals = [
        (IMAGES, Options(decode="gpu"), EIGHT, "needs a CUDA device"),
        (IMAGES, Options(decode="gpu", device=torch.device("cpu")), gpu, "needs a CUDA device"),
        (IMAGES, Options(decode="gpu", on_error="skip"), gpu, "on_error='skip' needs decode='cpu'"),
        (Description(mix=True), Options(decode="gpu"), gpu, "a stoker.Mix is decoded on the CPU"),
        (CLIPS, Options(decode="gpu"), gpu, "video clips are decoded on the CPU"),
        (IMAGES, Options(decode="gpu", processes=2), gpu, "no per-sample transform or worker processes"),
        (IMAGES, Options(decode="gpu", transform=to_float), gpu, "no per-sample transform"),
    ]
    for data, options, here, says in refusals:
        with pytest.raises(OptionError, match=says):
            plan_loader(data, options, here)


def test_the_engine_is_made_of_the_strategies_the_plan_names(packed):
    dataset = stoker.ShardDataset(packed)
    batches = RankBatches(0, len(dataset), 1, 0, 8)
    native = engine_for(plan_loader(IMAGES, Options(), EIGHT), dataset, 3, batches, "raise")
    assert isinstance(native.samples, Images) and isinstance(native.decode, NativeChunk) and native.augment is None
    python = engine_for(plan_loader(IMAGES, Options(), Machine(8, region_decode=False)), dataset, 3, batches, "skip")
    assert isinstance(python.decode, PerImage) and python.on_error == "skip"
    copy = pickle.loads(pickle.dumps(native))  # what a worker process gets
    assert copy.samples.dataset.root == dataset.root and copy.decode.__class__ is NativeChunk and copy.seed == 3


def test_the_loader_s_explain_and_passes_read_one_plan(packed):
    loader = stoker.Loader(stoker.ShardDataset(packed), 8, crop=CropSpec(size=(32, 32)), threads=2, seed=1)
    assert "  workers: 2 threads (as given)" in loader.explain()
    assert (loader.processes, loader.threads, loader.workers.describe()) == (0, 2, "2 threads")
    assert sum(len(labels) for _, labels in loader) == len(loader.dataset)


@pytest.mark.torchvision
@pytest.mark.parametrize(("photometric", "device", "route"), [
    (True, None, "native"), (False, None, "opencv"), (True, torch.device("cuda"), "device"),
])
def test_where_the_batched_ops_run(packed, photometric, device, route):
    T = pytest.importorskip("torchvision.transforms")
    here = Machine(8, photometric=photometric)
    pipeline = T.Compose([T.RandomResizedCrop(32), T.ColorJitter(0.4, 0.4), T.ToTensor(), T.Normalize((0.5,) * 3, (0.2,) * 3)])
    plan = plan_loader(IMAGES, Options(transform=pipeline, device=device), here)
    assert plan.augment == route and plan.decode == "native" and not plan.transform.per_sample
    with_rest = T.Compose([T.RandomResizedCrop(32), T.ColorJitter(0.4), T.RandomRotation(5), T.ToTensor()])
    rest = plan_loader(IMAGES, Options(transform=with_rest, device=device), here)
    assert rest.augment == ("opencv" if route == "opencv" else "native")  # a per-sample rest follows: not on the device
    engine = engine_for(rest, stoker.ShardDataset(packed), 0, RankBatches(0, 8, 1, 0, 8), "raise")
    assert isinstance(engine.augment, OpenCvAugment if route == "opencv" else NativeAugment)
    assert engine.pixel_dtype() == torch.uint8  # rounded back to uint8 for the PIL images of the rest
