"""Shared fixtures: real sample photos, odd-but-valid images, and packed data sets built from them."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.sample_data import make_sample_photos

PHOTOS = 96
CLASSES = 4
SMALL_SHARD = 600_000  # ~8 photos of ~70 KB: many shards from a small set
NUMBERED = 48  # samples of `numbered`, each its own class


@pytest.fixture(scope="session", autouse=True)
def own_cache_home(tmp_path_factory):
    """Keep stoker's node-local files (``$XDG_CACHE_HOME/stoker``: remote metadata, source stamps,
    packs made by ``loader_for``) in the session's temporary folder, never the user's ``~/.cache``.
    Set in ``os.environ`` so that worker processes and subprocesses inherit it; a test may still
    point it elsewhere with ``monkeypatch``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="session")
def photos(tmp_path_factory) -> Path:
    """An ImageFolder tree of real-looking JPEG photos (read-only for tests)."""
    return make_sample_photos(tmp_path_factory.mktemp("photos") / "src", count=PHOTOS, num_classes=CLASSES, seed=1)


@pytest.fixture(scope="session")
def packed(photos, tmp_path_factory) -> Path:
    """``photos`` packed with small shards, so samples spread over many shards."""
    dst = tmp_path_factory.mktemp("packed") / "ds"
    stoker.pack(photos, dst, shard_bytes=SMALL_SHARD, workers=2, progress=False)
    return dst


PIXELS_CROP = stoker.CropSpec("resize", size=(8, 8), flip=False)  # no random draw: a sample's pixels identify it


@pytest.fixture(scope="session")
def fingerprints(packed) -> dict[bytes, int]:
    """Each sample of ``packed``: its 8x8 pixels under PIXELS_CROP (by a sequential pass on one rank) -> its index."""
    loader = stoker.Loader(stoker.ShardDataset(packed), 16, crop=PIXELS_CROP, order="sequential", threads=2)
    images = np.concatenate([batch.numpy() for batch, _ in loader])
    table = {image.tobytes(): index for index, image in enumerate(images)}
    assert len(table) == len(images), "two samples share their pixels: they cannot be told apart"
    return table


@pytest.fixture(scope="session")
def numbered(tmp_path_factory) -> Path:
    """NUMBERED small photos packed over three shards, sample i alone in class i: a batch's labels say which
    samples it holds (what the trainer tests check: every sample of an epoch trained on once)."""
    root = tmp_path_factory.mktemp("numbered")
    src = make_sample_photos(root / "src", count=NUMBERED, num_classes=NUMBERED, seed=2)
    stoker.pack(src, root / "ds", shard_bytes=64 << 10, max_side=48, workers=1, progress=False)
    return root / "ds"


@pytest.fixture
def small_disk(tmp_path):
    """A real 3 MB tmpfs, to fill up for real. Needs root (CI runs as root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def source_files(root: Path) -> dict[str, bytes]:
    """Relative path without extension -> bytes, for every image below ``root``."""
    return {p.relative_to(root).with_suffix("").as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


@pytest.fixture(scope="session")
def odd_images(tmp_path_factory) -> Path:
    """Valid images in every awkward mode: grayscale, CMYK, palette, alpha, 16-bit, progressive."""
    root = tmp_path_factory.mktemp("odd") / "src"
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    files = {
        "modes/gray.jpg": encode(rgb.convert("L"), "JPEG"),
        "modes/cmyk.jpg": encode(rgb.convert("CMYK"), "JPEG"),
        "modes/palette.png": encode(rgb.convert("P"), "PNG"),
        "modes/alpha.png": encode(rgb.convert("RGBA"), "PNG"),
        "modes/gray16.png": encode(Image.fromarray(rng.integers(0, 65535, (48, 64), dtype=np.uint16)), "PNG"),
        "modes/progressive.jpg": encode(rgb, "JPEG", progressive=True),
        "modes/nested/deeper/rgb.webp": encode(rgb, "WEBP"),
        "more/plain.bmp": encode(rgb, "BMP"),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server of this test module's own."""
    from tests.s3server import S3Server  # boto3 and s3fs: the test extra; imported where used

    server = S3Server(tmp_path_factory.mktemp("moto") / "requests.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def remote(s3, packed) -> str:
    """``packed`` uploaded to s3://data/packed."""
    s3.fs.mkdir("data")
    s3.fs.put(str(packed) + "/", "data/packed", recursive=True)
    return "s3://data/packed"




@pytest.fixture(scope="session")
def video_folder(tmp_path_factory) -> Path:
    """Numbered-frame videos in two class folders (see tests/videos.py), a truncated and a garbage one."""
    from tests.videos import VIDEO_FRAMES, make_video  # PyAV: the video extra; imported where used

    root = tmp_path_factory.mktemp("video_src") / "videos"
    options = {"b/vfr.mkv": {"vfr_ms": [20, 20, 70]}, "b/mpeg4.avi": {"codec": "mpeg4", "options": {"bf": "2", "g": "12"}},
               "a/cfr_bframes.mp4": {"options": {"bf": "3"}},
               "b/long_gop.mp4": {"options": {"g": "90", "bf": "3", "sc_threshold": "0"}}}
    for name, frames in VIDEO_FRAMES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        make_video(root / name, frames, **options.get(name, {}))
    (root / "a" / "truncated.mp4").write_bytes((root / "a" / "cfr_bframes.mp4").read_bytes()[:3000])
    (root / "b" / "garbage.mkv").write_bytes(np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8).tobytes())
    return root


@pytest.fixture(scope="session", params=["frames", "video"])
def packed_videos(request, video_folder, tmp_path_factory):
    """``video_folder`` packed in each video mode: (mode, folder, PackResult)."""
    dst = tmp_path_factory.mktemp(f"video_{request.param}") / "ds"
    result = stoker.pack(video_folder, dst, video_mode=request.param, shard_bytes=200_000, workers=2, progress=False)
    return request.param, dst, result


@pytest.fixture
def damaged(photos, tmp_path) -> tuple[Path, str]:
    """A fresh pack of the sample photos with one image member overwritten in the middle (its
    checksum no longer matches): the pack's path and that sample's key."""
    stoker.pack(photos, tmp_path / "ds", workers=1, progress=False)
    dataset = stoker.ShardDataset(tmp_path / "ds")
    index = len(dataset) // 2
    shard, local = dataset.shards.locate(index)
    reader = dataset.shards.reader(shard)
    member = reader.index.sample_members(local)[0]
    with open(reader.path, "r+b") as f:
        f.seek(int(member["offset"]) + 100)
        f.write(b"\0\1\2\3")
    return tmp_path / "ds", dataset.key(index)
