"""One pixel budget for every decoder (issue 40, class 1): an image whose header claims more pixels
than 2 x PIL.Image.MAX_IMAGE_PIXELS is refused before anything is allocated for it, by pack,
ShardDataset and every route of the Loader, which agree on which images are good. The readers run
in a subprocess whose address space is bounded: a decoder that allocated what a bomb's header
claims (12.9 GB) fails there instead of taking the machine's memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.format import read_manifest
from stoker.loader.gpu_decode import gpu_decodable
from tests.conftest import encode
from tests.stress_extensions import claiming

ROOT = Path(__file__).parent.parent
BOMB = (65500, 65500)  # 12.9 GB of RGB claimed by a few KB


def photo(height: int, width: int, seed: int, **options) -> bytes:
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, np.full_like(x, 40 * seed)], axis=-1).astype(np.uint8)
    return encode(Image.fromarray(pixels), "JPEG", quality=90, **options)


def png_claiming(height: int, width: int) -> bytes:
    """A small PNG whose IHDR (CRC fixed) claims ``height`` x ``width`` pixels."""
    data = bytearray(encode(Image.new("RGB", (8, 8), (1, 2, 3)), "PNG"))
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def flipped(data: bytes) -> bytes:
    out = bytearray(data)
    for at in range(len(out) // 2, len(out) // 2 + 40, 7):
        out[at] ^= 0x21
    return bytes(out)


@pytest.fixture(scope="module")
def with_bombs(tmp_path_factory) -> Path:
    """Small photos, larger ones (64x48), bombs (progressive and baseline JPEG, PNG) and a damaged
    JPEG, each its own class, packed with Pillow's limit off (so the pack keeps them all)."""
    src = tmp_path_factory.mktemp("bombs") / "src"
    files = {f"good-{i}": photo(30, 40, i) for i in range(4)}
    files |= {"big-0": photo(48, 64, 5), "big-1": photo(48, 64, 6, progressive=True)}
    files |= {"bomb-progressive": claiming(photo(48, 64, 7, progressive=True), *BOMB),
              "bomb-baseline": claiming(photo(48, 64, 8), *BOMB), "bomb-png": png_claiming(*BOMB),
              "damaged": flipped(photo(30, 40, 9))}
    for name, data in files.items():
        (src / name).mkdir(parents=True)
        (src / name / f"{name}.{'png' if name.endswith('png') else 'jpg'}").write_bytes(data)
    dst = src.parent / "ds"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Image, "MAX_IMAGE_PIXELS", None)
        result = stoker.pack(src, dst, workers=1, progress=False)
    assert result.num_samples == len(files) and result.rejected == []
    return dst


# Run in a subprocess with its address space bounded to what it has after the imports + 2 GiB. The
# budget is 2000 pixels (MAX_IMAGE_PIXELS = 1000): the 40x30 photos pass, the 64x48 ones are refused.
READERS = r'''
import json, os, resource, sys, warnings
import numpy as np
import stoker
from PIL import Image
from stoker.errors import CorruptDataError
from stoker.decode import per_image
from stoker.loader import native_chunk

warnings.simplefilter("ignore", Image.DecompressionBombWarning)
Image.MAX_IMAGE_PIXELS = 1000
path = sys.argv[1]
size = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (size + (2 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))

dataset = stoker.ShardDataset(path, decode="rgb")
refused, messages = {}, {}
for i in range(len(dataset)):
    try:
        dataset[i]
    except CorruptDataError as e:
        messages[dataset.key(i)] = str(e)
refused["dataset"] = sorted(messages)

def loader_refuses(crop, **options):
    loader = stoker.Loader(stoker.ShardDataset(path, on_error="skip"), 4, crop=crop, order="sequential", **options)
    labels = np.concatenate([labels.numpy() for _, labels in loader])
    targets = loader.dataset.targets
    return sorted(loader.dataset.key(i) for i in np.flatnonzero(labels != targets))

crop, exact = stoker.CropSpec(size=(16, 16)), stoker.CropSpec("center", (16, 16), exact=True)
refused["loader"] = loader_refuses(crop, threads=2)
refused["loader exact"] = loader_refuses(exact, threads=2)
refused["loader processes"] = loader_refuses(exact, threads=1, processes=2)
Image.MAX_IMAGE_PIXELS = 89_478_485  # Pillow's default: the issue's case (a worker process died)
default = loader_refuses(stoker.CropSpec("center", (224, 224), exact=True), threads=1, processes=2)
Image.MAX_IMAGE_PIXELS = 1000
native_chunk.decode_chunk = None  # the per-image path (samples the native call leaves, or no extension)
refused["per image"] = loader_refuses(crop, threads=2)
refused["per image exact"] = loader_refuses(exact, threads=2)
per_image.decode_region = None  # and with simplejpeg where the region decode is not built
refused["simplejpeg"] = loader_refuses(crop, threads=2)
try:
    for _ in stoker.Loader(stoker.ShardDataset(path), 4, crop=crop, order="sequential"):
        pass
except CorruptDataError as e:
    raised = [e.shard, e.key, str(e)]
print(json.dumps({"refused": refused, "default": default, "messages": messages, "raised": raised}))
'''


def test_every_reader_refuses_the_same_images_in_bounded_memory(with_bombs):
    run = subprocess.run([sys.executable, "-c", READERS, str(with_bombs)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    dataset = stoker.ShardDataset(with_bombs)
    keys = {name: dataset.key(i) for i, name in enumerate(dataset.classes)}
    over = {keys[name] for name in ("big-0", "big-1", "bomb-progressive", "bomb-baseline", "bomb-png")}
    assert over <= set(found["refused"]["dataset"]) and keys["good-0"] not in found["refused"]["dataset"]
    for route, refused in found["refused"].items():
        assert refused == found["refused"]["dataset"], route
    assert found["default"] == sorted(keys[name] for name in ("bomb-progressive", "bomb-baseline", "bomb-png"))
    for key in over:
        assert "decompression bomb" in found["messages"][key].lower() and "shard-" in found["messages"][key]
    shard, key, message = found["raised"]
    assert key == min(over, key=lambda k: dataset.index_of(k)) and shard.endswith(".tar") and key in message
    assert "decompression bomb" in message.lower()


def test_pack_refuses_bombs_and_records_the_limit_it_used(tmp_path, monkeypatch):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    (src / "bomb.jpg").write_bytes(claiming(photo(48, 64, 1, progressive=True), *BOMB))
    (src / "big.jpg").write_bytes(photo(48, 64, 2))
    (src / "small.jpg").write_bytes(photo(30, 40, 3))
    refused = stoker.pack(tmp_path / "src", tmp_path / "default", workers=1, progress=False)
    assert [(Path(path).name, "decompression bomb" in reason) for path, reason in refused.rejected] == [("bomb.jpg", True)]
    assert read_manifest(tmp_path / "default").source["options"]["max_pixels"] == 2 * 89_478_485
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # the one setting: 2000 pixels
    small = stoker.pack(tmp_path / "src", tmp_path / "small", workers=1, progress=False)
    assert sorted(Path(path).name for path, _ in small.rejected) == ["big.jpg", "bomb.jpg"]
    assert all("decompression bomb" in reason for _, reason in small.rejected)
    assert read_manifest(tmp_path / "small").source["options"]["max_pixels"] == 2000
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert stoker.pack(tmp_path / "src", tmp_path / "all", workers=1, progress=False).rejected == []


def test_images_above_the_budget_stay_off_the_gpu(monkeypatch):
    assert gpu_decodable(photo(48, 64, 1)) and not gpu_decodable(claiming(photo(48, 64, 1), *BOMB))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    assert gpu_decodable(photo(30, 40, 1)) and not gpu_decodable(photo(48, 64, 1))


@pytest.mark.torchvision
def test_the_gpu_decoders_cpu_route_refuses_a_bomb():
    pytest.importorskip("torchvision")
    import torch

    from stoker.errors import CorruptDataError
    from stoker.loader.gpu_decode import decode_on_gpu

    encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8)
               for data in (photo(30, 40, 1), claiming(photo(48, 64, 1), *BOMB))]
    with pytest.raises(CorruptDataError, match="(?i)decompression bomb"):
        decode_on_gpu(encoded, torch.device("cpu"), lambda j, e: CorruptDataError("shard", f"k{j}", f"{type(e).__name__}: {e}"),
                      lambda j: f"k{j}")


def test_decode_region_refuses_a_header_above_max_pixels():
    from stoker.decode import per_image

    if per_image.decode_region is None:
        pytest.skip("the region-decode extension is not built")
    data, out = photo(48, 64, 1), bytearray(48 * 64 * 3)
    assert per_image.decode_region(data, 0, 0, 48, 64, 1, out, max_pixels=48 * 64)[:2] == (48, 64)
    with pytest.raises(ValueError, match="decompression bomb: 64x48 = 3072 pixels, above the limit of 3071"):
        per_image.decode_region(data, 0, 0, 48, 64, 1, out, max_pixels=48 * 64 - 1)
    with pytest.raises(ValueError, match="decompression bomb: 65500x65500"):
        per_image.decode_region(claiming(photo(48, 64, 1, progressive=True), *BOMB), 0, 0, 48, 64, 1, out,
                                max_pixels=10**8)


def test_the_budget_follows_pillows_setting(monkeypatch):
    from stoker.pixels import check_pixels, pixel_limit

    assert pixel_limit() == 2 * Image.MAX_IMAGE_PIXELS
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert pixel_limit() is None
    check_pixels(65535, 65535, pixel_limit())
    with pytest.raises(Image.DecompressionBombError, match="10x10 = 100 pixels, above the limit of 99"):
        check_pixels(10, 10, 99)

