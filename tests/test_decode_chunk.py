"""The Loader's native path (decode_chunk: one C call per chunk of a batch, without the GIL) against
its per-image path (per_image.py, which the Loader takes where the extension is not built): the
same pixels, labels, errors and skips, on real packs of real JPEGs, odd images and damaged shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker.decode.crops import CropSpec
from stoker.errors import CorruptDataError
from stoker.format.index import HEADER_DTYPE, SAMPLE_DTYPE, IndexBuilder, ShardIndex
from stoker.loader import native_chunk
from tests.conftest import encode
from tests.stress_extensions import claiming, synthetic_jpeg

_jpeg_region = pytest.importorskip("stoker.decode._jpeg_region", reason="C extension not built (no libjpeg headers?)")

SPECS = [
    CropSpec("random_resized", (224, 224)),
    CropSpec("random_resized", (160, 160)),  # crops shrinking 2x or more on an axis: halved first
    CropSpec("random_resized", (48, 64), scale=(0.01, 1.0), ratio=(0.2, 5.0)),  # every DCT scale, thin boxes
    CropSpec("center", (224, 224)),
    CropSpec("center", (224, 320)),  # wider than most resized images: those CenterCrop pads take the exact path
    CropSpec("resize", (96, 128), flip=0.0),
]
# The exact path (a translated Resize + CenterCrop: the whole image decoded as simplejpeg's default,
# Pillow's resize): the val pipeline's crop; an upscale of small images; a 16 px output (many taps
# per pixel); a crop CenterCrop pads, resized bicubic; Resize((h, w)) stretched, flipped.
EXACT_SPECS = [
    CropSpec("center", (224, 224), exact=True),
    CropSpec("center", (224, 320), exact=True, interpolation="bicubic"),
    CropSpec("center", (100, 100), center_fraction=0.9, exact=True),
    CropSpec("center", (16, 16), exact=True),
    CropSpec("resize", (96, 128), exact=True),
]


class Calls:
    """decode_chunk itself, counting its calls and the samples it made (a spy: the real function runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = self.made = 0
        real = native_chunk.decode_chunk

        def spy(*args, **kwargs):
            made = real(*args, **kwargs)
            self.calls += 1
            self.made += made
            return made

        monkeypatch.setattr(native_chunk, "decode_chunk", spy)


def _batches(path: Path, spec: CropSpec, threads: int, **options) -> list[tuple[torch.Tensor, torch.Tensor]]:
    dataset = stoker.ShardDataset(path, on_error=options.pop("on_error", "raise"), verify=options.pop("verify", True))
    loader = stoker.Loader(dataset, batch_size=24, crop=spec, threads=threads, seed=5, **options)
    return [(images.clone(), labels.clone()) for images, labels in loader]


def _per_image(monkeypatch: pytest.MonkeyPatch, *args, **options) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batches the Loader makes without the extension's decode_chunk (per_image.py, image by image)."""
    with monkeypatch.context() as m:
        m.setattr(native_chunk, "decode_chunk", None)
        return _batches(*args, **options)


def _assert_same(native: list, reference: list) -> None:
    assert len(native) == len(reference)
    for (images, labels), (ref_images, ref_labels) in zip(native, reference):
        assert torch.equal(labels, ref_labels)
        assert torch.equal(images, ref_images)


@pytest.fixture(scope="module")
def restart_packed(photos, tmp_path_factory) -> Path:
    """``photos`` packed with --restart-rows: the native path decodes strips of restart intervals."""
    dst = tmp_path_factory.mktemp("restart") / "ds"
    stoker.pack(photos, dst, restart_rows=True, workers=1, progress=False)
    return dst


def _spec_id(spec: CropSpec) -> str:
    return f"{spec.kind}-{spec.size[0]}x{spec.size[1]}{'-exact' if spec.exact else ''}-{spec.interpolation}"


@pytest.mark.parametrize("spec", SPECS + EXACT_SPECS, ids=_spec_id)
@pytest.mark.parametrize("pack", ["packed", "restart_packed"])
def test_native_batches_are_the_per_image_path_s(request, monkeypatch, pack, spec):
    path = request.getfixturevalue(pack)
    calls = Calls(monkeypatch)
    native = _batches(path, spec, threads=3)
    assert calls.made == sum(len(labels) for _, labels in native)  # every sample went the native way
    _assert_same(native, _per_image(monkeypatch, path, spec, threads=1))


def test_images_of_every_size_and_aspect(tmp_path, monkeypatch):
    """Crop boxes (crops.py's rule, ported to C), DCT scales and resizes over sizes from 1x1 to 1,500 x 9."""
    rng = np.random.default_rng(7)
    sizes = [(1, 1), (1, 700), (700, 1), (9, 1500), (17, 16), (16, 17), (333, 1), (8, 8), (2, 3)]
    sizes += [tuple(int(v) for v in rng.integers(1, 900, 2)) for _ in range(40)]
    for i, (h, w) in enumerate(sizes):
        pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        (tmp_path / "src" / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(tmp_path / "src" / f"c{i % 3}" / f"{i:03}.jpg", quality=90)
    stoker.pack(tmp_path / "src", tmp_path / "ds", workers=1, progress=False)
    for spec in SPECS + EXACT_SPECS:
        calls = Calls(monkeypatch)
        native = _batches(tmp_path / "ds", spec, threads=2)
        assert calls.made == len(sizes)
        _assert_same(native, _per_image(monkeypatch, tmp_path / "ds", spec, threads=2))


@pytest.mark.parametrize("restart_rows", [False, True])
def test_exact_crops_of_every_chroma_sampling(tmp_path, monkeypatch, restart_rows):
    """The exact path's decode (accurate IDCT, fancy upsampling: every upsampler libjpeg-turbo has,
    odd sizes, progressive scans, gray) against simplejpeg's, which the per-image path runs."""
    samplings = ("444", "422", "420", "440", "411", None)
    sizes = [(375, 500), (333, 517), (201, 95), (17, 9), (1, 1), (8, 300), (300, 8), (129, 127)]
    for i, (h, w) in enumerate(sizes):
        for sampling in samplings:
            for progressive in (False, True):
                name = f"{i}-{sampling}-{int(progressive)}.jpg"
                (tmp_path / "src" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
                (tmp_path / "src" / f"c{i % 2}" / name).write_bytes(synthetic_jpeg(h, w, sampling, progressive, 85 + i))
    stoker.pack(tmp_path / "src", tmp_path / "ds", restart_rows=restart_rows, workers=1, progress=False)
    for spec in EXACT_SPECS:
        calls = Calls(monkeypatch)
        native = _batches(tmp_path / "ds", spec, threads=2)
        assert calls.made == len(sizes) * len(samplings) * 2
        _assert_same(native, _per_image(monkeypatch, tmp_path / "ds", spec, threads=2))


@pytest.mark.parametrize("spec", [CropSpec("random_resized", (32, 32)), CropSpec("center", (32, 32), exact=True)],
                         ids=_spec_id)
def test_what_only_pillow_decodes_goes_the_per_image_way(odd_images, tmp_path, monkeypatch, spec):
    """CMYK JPEGs, PNG, WebP, BMP: left to the per-image path (Pillow), in the same batch; the rest native."""
    stoker.pack(odd_images, tmp_path / "ds", workers=1, progress=False)
    calls = Calls(monkeypatch)
    native = _batches(tmp_path / "ds", spec, threads=2)
    assert calls.calls >= 1 and calls.made == 2  # gray.jpg and progressive.jpg; cmyk.jpg and the rest by Pillow
    _assert_same(native, _per_image(monkeypatch, tmp_path / "ds", spec, threads=2))


def _damage(path: Path, key: str) -> None:
    """Flip a byte in the middle of sample ``key``'s image bytes in its shard."""
    dataset = stoker.ShardDataset(path)
    shard, local = dataset.shards.locate(next(i for i in range(len(dataset)) if dataset.key(i) == key))
    reader = dataset.shards.reader(shard)
    member = reader.index.sample_members(local)[0]
    offset = int(member["offset"]) + int(member["size"]) // 2
    with open(reader.path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x55]))


@pytest.fixture
def damaged(photos, tmp_path) -> tuple[Path, str]:
    """A pack of ``photos`` with one sample's bytes flipped (its checksum no longer matches)."""
    stoker.pack(photos, tmp_path / "ds", workers=1, progress=False)
    dataset = stoker.ShardDataset(tmp_path / "ds")
    key = dataset.key(len(dataset) // 2)
    _damage(tmp_path / "ds", key)
    return tmp_path / "ds", key


ERROR_SPECS = [SPECS[0], EXACT_SPECS[0]]  # the damaged data below, both ways


@pytest.mark.parametrize("spec", ERROR_SPECS, ids=_spec_id)
def test_a_damaged_sample_raises_naming_it(damaged, spec):
    path, key = damaged
    with pytest.raises(CorruptDataError, match="checksum mismatch") as caught:
        _batches(path, spec, threads=2)
    assert key in str(caught.value)


@pytest.mark.parametrize("spec", ERROR_SPECS, ids=_spec_id)
def test_a_damaged_sample_is_skipped_as_the_per_image_path_skips_it(damaged, monkeypatch, spec):
    path, _ = damaged
    native = _batches(path, spec, threads=2, on_error="skip")
    _assert_same(native, _per_image(monkeypatch, path, spec, threads=2, on_error="skip"))


@pytest.mark.parametrize("spec", ERROR_SPECS, ids=_spec_id)
def test_a_damaged_jpeg_read_unverified_goes_the_per_image_way(damaged, monkeypatch, spec):
    """With verify=False the flipped byte reaches the decoder: the native path leaves the sample to
    per_image.py, which skips it (or makes what Pillow makes of it) as before."""
    path, _ = damaged
    native = _batches(path, spec, threads=2, verify=False, on_error="skip")
    _assert_same(native, _per_image(monkeypatch, path, spec, threads=2, verify=False, on_error="skip"))


@pytest.mark.parametrize("spec", ERROR_SPECS, ids=_spec_id)
def test_a_truncated_shard_raises_naming_it(photos, tmp_path, spec):
    stoker.pack(photos, tmp_path / "ds", workers=1, progress=False)
    shard = next((tmp_path / "ds").glob("shard-*.tar"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(CorruptDataError, match="truncated"):
        _batches(tmp_path / "ds", spec, threads=2)


@pytest.fixture
def damaged_index(photos, tmp_path) -> tuple[Path, str]:
    """A pack of ``photos`` (one shard) whose index gives one sample's members and bytes to the next
    sample (its members: none; rows still in order, which opening checks), read with verify=False
    (the index's checksum would refuse it)."""
    stoker.pack(photos, tmp_path / "ds", workers=1, progress=False)
    dataset = stoker.ShardDataset(tmp_path / "ds")
    assert len(dataset.shards.manifest.shards) == 1
    local = len(dataset) // 2
    key = dataset.key(local)
    index = np.memmap(tmp_path / "ds" / dataset.shards.manifest.shards[0].index, np.uint8, "r+")
    rows = index[HEADER_DTYPE.itemsize : HEADER_DTYPE.itemsize + (len(dataset) + 1) * SAMPLE_DTYPE.itemsize]
    rows = rows.view(SAMPLE_DTYPE)
    rows["first_member"][local + 1] = rows["first_member"][local]
    rows["start"][local + 1] = rows["start"][local]
    index.flush()
    return tmp_path / "ds", key


def test_a_sample_without_members_in_a_damaged_index_raises_naming_it(damaged_index):
    path, key = damaged_index
    with pytest.raises(CorruptDataError, match="no image member") as caught:
        _batches(path, SPECS[0], threads=2, verify=False)
    assert key in str(caught.value)


@pytest.mark.parametrize("spec", ERROR_SPECS, ids=_spec_id)
def test_a_damaged_index_skips_as_the_per_image_path_does(damaged_index, monkeypatch, spec):
    path, _ = damaged_index
    native = _batches(path, spec, threads=2, verify=False, on_error="skip")
    _assert_same(native, _per_image(monkeypatch, path, spec, threads=2, verify=False, on_error="skip"))


def test_first_members_finds_each_samples_image_member():
    builder = IndexBuilder()
    builder.add("a", 0, [("cls", 512, 1, 0), ("jpg", 1536, 5, 0)], 0)  # members where a tar puts them
    builder.add("b", 1, [("jpg", 2560, 5, 0)], 2048)
    builder.add("c", 2, [("cls", 3584, 1, 0)], 3072)  # no image member
    builder.add("d", 3, [("png", 4608, 5, 0), ("jpg", 5632, 5, 0)], 4096)
    index = ShardIndex.from_bytes(builder.to_bytes(6144, 7168), "test")
    assert index.first_members(("jpg",)).tolist() == [1, 2, -1, 5]
    assert index.first_members(("jpg", "png")).tolist() == [1, 2, -1, 4]
    assert index.first_members(("webp",)).tolist() == [-1, -1, -1, -1]


def _chunk_args(n: int = 2, slots: int = 2) -> dict:
    data = encode(Image.new("RGB", (32, 32), (200, 10, 10)), "JPEG")
    return dict(fds=np.zeros(n, np.int32), offsets=np.zeros(n, np.uint64), sizes=np.full(n, len(data), np.uint64),
                checksums=None, tries=np.zeros((n, 10, 4)), flips=np.zeros(n, np.uint8), positions=np.arange(n),
                spec=(0, 8, 8, 0.08, 1.0, 0.75, 1.33, 0.875, False, False, 0, 0),
                out=np.zeros((slots, 8, 8, 3), np.uint8), status=np.zeros(n, np.uint8), max_pixels=2**64 - 1)


@pytest.mark.parametrize("change, message", [
    (dict(offsets=np.zeros(3, np.uint64)), "offsets has 24 bytes"),
    (dict(tries=np.zeros((2, 9, 4))), "tries"),
    (dict(positions=np.array([0, 2])), "position 2 is not a slot"),
    (dict(positions=np.array([-1, 0])), "position -1"),
    (dict(spec=(3, 8, 8, 0.08, 1.0, 0.75, 1.33, 0.875, False, False, 0, 0)), "spec kind 3"),
    (dict(spec=(1, 8, 8, 0.08, 1.0, 0.75, 1.33, 0.875, False, True, 5, 0)), "filter 5"),  # no such Pillow filter
    (dict(spec=(1, 8, 8, 0.08, 1.0, 0.75, 1.33, 0.875, False, True, 0, 2)), "passes 2"),
    (dict(out=np.zeros((2, 8, 7, 3), np.uint8)), "not whole slots"),
    (dict(checksums=np.zeros(1, np.uint64)), "checksums"),
    # a slot of 2^31-1 squared pixels does not fit Py_ssize_t: refused, not wrapped
    (dict(spec=(0, 2**31 - 1, 2**31 - 1, 0.08, 1.0, 0.75, 1.33, 0.875, False, False, 0, 0), out=np.zeros(0, np.uint8)),
     "2147483647x2147483647 output"),
])
def test_decode_chunk_refuses_arrays_that_do_not_fit(change, message):
    args = _chunk_args() | change
    with pytest.raises(ValueError, match=message):
        _jpeg_region.decode_chunk(**args)


@pytest.mark.parametrize("exact", [False, True])
def test_decode_chunk_reports_unreadable_and_undecodable_samples(tmp_path, exact):
    good = encode(Image.new("RGB", (32, 32), (200, 10, 10)), "JPEG")
    png = encode(Image.new("RGB", (32, 32)), "PNG")
    path = tmp_path / "blob"
    path.write_bytes(good + png)
    spec = (1 if exact else 0, 8, 8, 0.08, 1.0, 0.75, 1.33, 0.875, False, exact, 0, 0)
    with open(path, "rb") as f:
        args = _chunk_args(4, 4) | dict(spec=spec,
            fds=np.full(4, f.fileno(), np.int32),
            offsets=np.array([0, len(good), 0, len(good) + len(png) - 4], np.uint64),
            sizes=np.array([len(good), len(png), len(good) // 2, 100], np.uint64))
        assert _jpeg_region.decode_chunk(**args) == 1
        # what a damaged, unverified index may say: no bytes, sizes and offsets of any 64 bits
        damaged = _chunk_args(5, 5) | dict(spec=spec,
            fds=np.full(5, f.fileno(), np.int32), offsets=np.array([0, 0, 0, 2**63, 2**64 - 1], np.uint64),
            sizes=np.array([0, 2**31 + 1, 2**64 - 1, len(good), 1], np.uint64))
        assert _jpeg_region.decode_chunk(**damaged) == 0
    assert args["status"].tolist() == [0, 2, 2, 1]  # made; not a JPEG; truncated JPEG; read past the end
    assert damaged["status"].tolist() == [2, 1, 1, 1, 1]  # no JPEG in 0 bytes; the rest past the file's end
    assert (np.abs(args["out"][0].astype(int) - (200, 10, 10)) <= 3).all()
    assert not args["out"][1:].any()


@pytest.mark.parametrize("spec", [CropSpec("random_resized", (64, 64)), CropSpec("center", (64, 64), exact=True)],
                         ids=_spec_id)
def test_explain_says_how_samples_are_decoded(packed, spec):
    loader = stoker.Loader(stoker.ShardDataset(packed), 8, crop=spec)
    assert "read, decode, crop: one native call per chunk" in loader.explain()


def test_explain_says_when_the_extension_is_missing(packed, monkeypatch):
    monkeypatch.setattr(native_chunk, "decode_chunk", None)
    assert "the region-decode extension is not built" in stoker.Loader(stoker.ShardDataset(packed), 8).explain()


@pytest.mark.parametrize("exact", [False, True])
def test_decode_chunk_leaves_images_above_the_pixel_budget(tmp_path, exact):
    """A JPEG whose header claims more than ``max_pixels`` is not decoded (status 2: the per-image
    path refuses it, naming it) and nothing is allocated for its size (a bomb's 12.9 GB)."""
    good = encode(Image.new("RGB", (32, 24), (200, 10, 10)), "JPEG")
    bomb = claiming(encode(Image.new("RGB", (32, 24), (200, 10, 10)), "JPEG", progressive=True), 65500, 65500)
    path = tmp_path / "blob"
    path.write_bytes(good + bomb)
    spec = (1 if exact else 0, 8, 8, 0.08, 1.0, 0.75, 1.33, 0.875, False, exact, 0, 0)
    with open(path, "rb") as f:
        for max_pixels, made in ((32 * 24, [0, 2]), (32 * 24 - 1, [2, 2]), (10**9, [0, 2])):
            args = _chunk_args(2, 2) | dict(spec=spec, fds=np.full(2, f.fileno(), np.int32),
                                            offsets=np.array([0, len(good)], np.uint64),
                                            sizes=np.array([len(good), len(bomb)], np.uint64), max_pixels=max_pixels)
            _jpeg_region.decode_chunk(**args)
            assert args["status"].tolist() == made, max_pixels
