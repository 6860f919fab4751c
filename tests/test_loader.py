"""stoker.Loader on real shards: determinism, resume, DDP shares, errors, shutdown, pixels."""

from __future__ import annotations

import gc
import io
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image

import stoker
from stoker.decode import per_image
from stoker.decode.crops import crop_box, draw_batch
from stoker.errors import CorruptDataError
from stoker.state import StateWarning
from tests.conftest import PHOTOS


def batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in loader]


def test_same_seed_same_batches_whatever_the_thread_count(packed):
    dataset = stoker.ShardDataset(packed)
    one = batches(stoker.Loader(dataset, 10, threads=1, seed=4))
    three = batches(stoker.Loader(dataset, 10, threads=3, seed=4, prefetch=3))
    assert len(one) == len(three) == -(-PHOTOS // 10)
    for (a, la), (b, lb) in zip(one, three):
        assert torch.equal(a, b) and torch.equal(la, lb)
    other = batches(stoker.Loader(dataset, 10, threads=2, seed=5))
    assert not torch.equal(one[0][0], other[0][0])


def test_every_sample_once_per_epoch_and_epochs_differ(packed):
    dataset = stoker.ShardDataset(packed)
    loader = stoker.Loader(dataset, 16, threads=2, crop=stoker.CropSpec(size=(32, 48)))
    first_order = loader.indices()
    labels = torch.cat([labels for _, labels in loader])
    assert sorted(labels.tolist()) == sorted(dataset.targets.tolist())
    assert sorted(first_order.tolist()) == list(range(PHOTOS))
    assert loader.epoch == 1 and not np.array_equal(loader.indices(), first_order)
    images, _ = next(iter(loader))
    assert images.shape == (16, 3, 32, 48) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_resume_mid_epoch_yields_exactly_the_unseen_batches(packed):
    dataset = stoker.ShardDataset(packed)
    reference = batches(stoker.Loader(dataset, 8, threads=2, seed=1))
    loader = stoker.Loader(dataset, 8, threads=2, seed=1)
    seen = []
    for images, labels in loader:
        seen.append((images.clone(), labels.clone()))
        if len(seen) == 3:
            break
    state = loader.state_dict()
    resumed = stoker.Loader(dataset, 8, threads=1, seed=99)
    with pytest.warns(StateWarning, match="takes seed 1"):  # the state's seed: the saved run's order and crops
        resumed.load_state_dict(state)
    rest = batches(resumed)
    assert len(seen) + len(rest) == len(reference)
    for (a, la), (b, lb) in zip(seen + rest, reference):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_break_and_garbage_collection_leave_no_threads(packed):
    dataset = stoker.ShardDataset(packed)
    before = threading.active_count()
    for _ in range(3):
        for _ in stoker.Loader(dataset, 4, threads=3):
            break
    iterator = iter(stoker.Loader(dataset, 4, threads=3))
    next(iterator)
    del iterator
    gc.collect()
    assert threading.active_count() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("stoker-loader")]


def test_a_bad_image_surfaces_with_its_key(packed, tmp_path):
    root = tmp_path / "bad"
    shutil.copytree(packed, root)
    dataset = stoker.ShardDataset(root, verify=False)
    victim = 5
    shard, local = dataset.shards.locate(victim)
    member = dataset.shards.index(shard).sample_members(local)[0]
    with open(dataset.shards.reader(shard).path, "r+b") as f:
        f.seek(int(member["offset"]) + 2)
        f.write(b"\x00" * 600)  # destroys the JPEG headers after the start-of-image marker
    with pytest.raises(CorruptDataError, match="does not decode") as info:
        for _ in stoker.Loader(dataset, 8, threads=2, order="sequential"):
            pass
    assert info.value.key == dataset.key(victim)


def test_pixels_match_a_reference_crop(packed):
    dataset = stoker.ShardDataset(packed, decode="raw")
    spec = stoker.CropSpec(kind="random_resized", size=(96, 128), flip=True)
    loader = stoker.Loader(dataset, 6, threads=2, crop=spec, order="sequential", layout="NHWC", seed=3)
    images, _ = next(iter(loader))
    draws = draw_batch(3, 0, 0, 6, spec)
    for j in range(6):
        photo = Image.open(io.BytesIO(dataset[j][0])).convert("RGB")
        top, left, ch, cw = crop_box(spec, photo.height, photo.width, draws.tries[j])
        reference = photo.resize((128, 96), Image.Resampling.BILINEAR, box=(left, top, left + cw, top + ch))
        if draws.flips[j]:
            reference = reference.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        ours, theirs = images[j].numpy().astype(float), np.asarray(reference).astype(float)
        # Reduced-scale DCT decode and another resize filter: close, not identical. The photos carry
        # grain (sigma 8 levels), which is where the two differ most; the geometry must agree exactly,
        # which the correlation checks (a crop one pixel off, or a wrong flip, falls well below it).
        assert np.abs(ours - theirs).mean() < 8, (j, np.abs(ours - theirs).mean())
        assert np.corrcoef(ours.ravel(), theirs.ravel())[0, 1] > 0.97, j


@pytest.mark.parametrize("crop", [stoker.CropSpec(size=(96, 128)), stoker.CropSpec(size=(24, 24)),
                                  stoker.CropSpec("center", size=(64, 64)), stoker.CropSpec("resize", size=(40, 30))])
def test_region_decode_gives_the_pixels_of_a_whole_image_decode(packed, monkeypatch, crop):
    pytest.importorskip("stoker.decode._jpeg_region")
    dataset = stoker.ShardDataset(packed)
    region = batches(stoker.Loader(dataset, 16, threads=2, crop=crop, seed=3))
    monkeypatch.setattr(per_image, "decode_region", None)  # what an install without the extension runs
    whole = batches(stoker.Loader(dataset, 16, threads=2, crop=crop, seed=3))
    for (a, _), (b, _) in zip(region, whole):
        assert torch.equal(a, b)


def _rank_main(rank: int, port: int, root: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(rank)  # the ranks' generators differ: rank 0's drawn seed must reach rank 1
    loader = stoker.Loader(stoker.ShardDataset(root), 7, threads=2, crop=stoker.CropSpec(size=(16, 16)))
    sampler = stoker.QuasiRandomSampler(stoker.ShardDataset(root))
    count = sum(1 for _ in loader)
    np.save(Path(out) / f"rank{rank}.npy", np.append(loader.indices(0), [count, loader.seed, sampler.seed]))
    dist.destroy_process_group()


def test_ddp_ranks_get_disjoint_equal_shares(packed, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_main, args=(port, str(packed), str(tmp_path)), nprocs=2, join=True)
    shares = [np.load(tmp_path / f"rank{r}.npy") for r in range(2)]
    counts = [int(s[-3]) for s in shares]
    indices = [set(s[:-3].tolist()) for s in shares]
    assert shares[0][-2] == shares[1][-2] and shares[0][-1] == shares[1][-1], "one seed, rank 0's draw, on every rank"
    assert counts[0] == counts[1] == -(-(PHOTOS // 2) // 7)
    assert indices[0].isdisjoint(indices[1]) and indices[0] | indices[1] == set(range(PHOTOS))


def test_a_dataset_transform_is_refused_not_ignored(packed):
    with pytest.raises(ValueError, match="per-sample transforms"):
        stoker.Loader(stoker.ShardDataset(packed, transform=lambda image: image), 8)


def _scale(image: torch.Tensor) -> torch.Tensor:
    return image.float() / 255


def _fail_on_dark(image: torch.Tensor) -> torch.Tensor:
    if image.float().mean() < 1000:  # every image: the transform always fails
        raise ValueError("too dark")
    return image


def test_a_transform_runs_on_every_sample_after_the_crop(packed):
    dataset = stoker.ShardDataset(packed)
    crop = stoker.CropSpec(size=(24, 32))
    plain = batches(stoker.Loader(dataset, 8, threads=2, seed=2, crop=crop))
    scaled = batches(stoker.Loader(dataset, 8, threads=2, seed=2, crop=crop, transform=_scale))
    assert len(plain) == len(scaled)
    for (a, la), (b, lb) in zip(plain, scaled):
        assert b.dtype == torch.float32 and b.shape == a.shape and b.is_contiguous()
        assert torch.equal(a.float() / 255, b) and torch.equal(la, lb)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_processes_make_the_same_batches_as_threads(packed, context):
    dataset = stoker.ShardDataset(packed)
    crop = stoker.CropSpec(size=(24, 32))
    threads = batches(stoker.Loader(dataset, 8, threads=2, seed=6, crop=crop, transform=_scale))
    loader = stoker.Loader(dataset, 8, seed=6, crop=crop, transform=_scale, processes=2, mp_context=context)
    processes = batches(loader)
    assert len(processes) == len(threads) and loader.epoch == 1
    for (a, la), (b, lb) in zip(threads, processes):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_worker_processes_resume_and_stop_on_break(packed):
    dataset = stoker.ShardDataset(packed)
    crop = stoker.CropSpec(size=(16, 16))
    reference = batches(stoker.Loader(dataset, 8, threads=1, seed=1, crop=crop))
    loader = stoker.Loader(dataset, 8, seed=1, crop=crop, processes=2)
    for seen, _ in enumerate(loader, start=1):
        if seen == 2:
            break
    assert not mp.active_children()
    resumed = stoker.Loader(dataset, 8, seed=1, crop=crop, processes=2)
    resumed.load_state_dict(loader.state_dict())
    rest = batches(resumed)
    assert len(rest) == len(reference) - 2
    for (a, la), (b, lb) in zip(rest, reference[2:]):
        assert torch.equal(a, b) and torch.equal(la, lb)


@pytest.mark.parametrize("processes", [0, 2])
def test_a_failing_transform_surfaces_with_the_sample_key(packed, processes):
    dataset = stoker.ShardDataset(packed)
    loader = stoker.Loader(dataset, 8, threads=2, order="sequential", transform=_fail_on_dark, processes=processes)
    with pytest.raises(Exception, match=f"transform failed on sample '{dataset.key(0)}'.*too dark"):
        next(iter(loader))


def test_batches_come_from_a_ring_of_buffers_that_never_hands_out_a_held_one(packed):
    dataset = stoker.ShardDataset(packed)
    crop = stoker.CropSpec(size=(32, 32))
    reference = batches(stoker.Loader(dataset, 8, crop=crop, threads=2, seed=2))
    loader = stoker.Loader(dataset, 8, crop=crop, threads=2, seed=2, prefetch=2)
    addresses = set()
    for images, _ in loader:  # a loop that lets go of each batch: the ring's buffers come back
        addresses.add(images.data_ptr())
    assert len(addresses) <= loader.prefetch + 1
    loader.set_epoch(0)
    kept = list(loader)  # a loop that keeps every batch: none may be overwritten
    loader.set_epoch(0)
    views = [images[0].numpy() for images, _ in loader]  # views and numpy arrays hold their batch too
    assert len({images.data_ptr() for images, _ in kept}) == len(kept)
    for (images, labels), (expected, expected_labels), view in zip(kept, reference, views):
        assert torch.equal(images, expected) and torch.equal(labels, expected_labels)
        assert np.array_equal(view, expected[0].numpy())


@pytest.mark.parametrize("height, width, size", [(64, 300, (64, 100)), (300, 64, (100, 64)), (300, 300, (100, 100))])
def test_a_crop_shrinking_2x_or_more_is_filtered_not_sampled(height, width, size):
    """One-pixel stripes across each axis that shrinks 3x (one axis, the other, both: a checkerboard).
    Sampled every third pixel, as a plain bilinear resize does, they stay stripes (std ~127);
    filtered, they become (nearly) even gray."""
    yy, xx = np.mgrid[0:height, 0:width]
    across = (yy * (size[0] < height) + xx * (size[1] < width)) % 2
    pattern = np.repeat((across * 255).astype(np.uint8)[..., None], 3, axis=2)
    out = np.zeros((*size, 3), np.uint8)
    per_image.crop_into(pattern, stoker.CropSpec("resize", size, flip=False), np.zeros((10, 4)), False, out)
    assert abs(float(out.mean()) - 127.5) < 3 and float(out.std()) < 45, (out.mean(), out.std())


def _resident_bytes() -> int:
    return int(Path("/proc/self/smaps_rollup").read_text().split("Rss:")[1].split()[0]) << 10


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="Linux's /proc/self/smaps_rollup")
def test_a_thread_buffer_holds_memory_only_for_what_is_written():
    """Each Loader thread keeps a 16 MB read buffer for members of any size: only the pages the
    bytes read into it touch may become resident (a zeroed bytearray made all 16 MB resident)."""
    from stoker.decode.scratch import thread_buffer

    before = _resident_bytes()
    buffer = thread_buffer("residency-test", 64 << 20)
    buffer[: 100 << 10] = b"x" * (100 << 10)
    assert _resident_bytes() - before < 16 << 20
    assert thread_buffer("residency-test", 1 << 20) is buffer and buffer[:1] == b"x"  # kept and reused


def test_exact_boxes_are_torchvisions_resize_and_center_crop():
    from stoker.decode.crops import exact_box

    # Resize(256) of 500x375 -> 341x256 (long side truncated), CenterCrop(224) at (16, 58) of it
    spec = stoker.CropSpec("center", (224, 224), center_fraction=224 / 256, exact=True)
    top, left, height, width = exact_box(spec, 375, 500)
    assert (top, left) == pytest.approx((16 * 375 / 256, 58 * 500 / 341))
    assert (height, width) == pytest.approx((224 * 375 / 256, 224 * 500 / 341))
    assert exact_box(stoker.CropSpec("resize", (64, 80)), 375, 500) == (0.0, 0.0, 375.0, 500.0)
    assert crop_box(spec, 375, 500, None) == (23, 85, 329, 329)  # whole pixels around it: what is decoded


def test_flip_may_be_a_probability():
    tries = [draw_batch(0, 0, b, 500, stoker.CropSpec(flip=p)).flips.mean() for p, b in ((0.2, 1), (True, 2), (False, 3))]
    assert abs(tries[0] - 0.2) < 0.06 and abs(tries[1] - 0.5) < 0.07 and tries[2] == 0


def test_a_plain_callable_still_gets_uint8_crops(packed):
    got = []
    loader = stoker.Loader(stoker.ShardDataset(packed), 8, crop=stoker.CropSpec(size=(16, 16)),
                           transform=lambda image: got.append(image.dtype) or image.float())
    images, _ = next(iter(loader))
    assert set(got) == {torch.uint8} and images.shape == (8, 3, 16, 16) and "per sample, as given" in loader.explain()


def test_loader_for_a_loose_folder_packs_once_and_reuses_the_pack(photos, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = stoker.loader_for(photos, batch_size=16, progress=False)
    pack_dir = Path(first.dataset.shards.root)
    assert pack_dir.parent == tmp_path / "cache" / "stoker" / "packs" and len(first.dataset) == PHOTOS
    made = {p.name: p.stat().st_mtime_ns for p in pack_dir.iterdir()}
    second = stoker.loader_for(photos, batch_size=16, progress=False)
    assert Path(second.dataset.shards.root) == pack_dir
    assert {p.name: p.stat().st_mtime_ns for p in pack_dir.iterdir()} == made  # nothing written again
    images, labels = next(iter(second))
    assert images.shape == (16, 3, 224, 224) and labels.dtype == torch.int64
    assert Path(stoker.loader_for(pack_dir, batch_size=4).dataset.shards.root) == pack_dir  # a packed folder as is
    with pytest.raises(FileNotFoundError, match="not a folder of images"):
        stoker.loader_for(tmp_path / "missing", batch_size=4)
