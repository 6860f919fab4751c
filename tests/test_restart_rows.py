"""``stoker pack --restart-rows``: lossless transcode with restart markers, and strip decodes.

The transcoded file must decode to the source's exact pixels (with the loader's settings and with
Pillow's), keep every APPn/COM segment byte for byte, and a region decoded from a strip (the rows
and restart intervals around it) must equal the same place of a whole-image decode, at every edge
and every DCT scale. Damage to the restart data is an error naming the sample, never other pixels.
"""

from __future__ import annotations

import importlib
import io
import math
import shutil

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

import stoker
from stoker.cli import main
from stoker.errors import CorruptDataError, PackError
from stoker.format import read_manifest
from tests.conftest import encode, source_files
from tests.test_jpeg_region import SCALES, _encode, _reference

_jpeg_restart = pytest.importorskip("stoker.pack._jpeg_restart", reason="C extension not built (no libjpeg headers?)")
_jpeg_region = pytest.importorskip("stoker.decode._jpeg_region", reason="C extension not built (no libjpeg headers?)")
transcode, NotTranscodable = _jpeg_restart.transcode, _jpeg_restart.NotTranscodable
decode_region = _jpeg_region.decode_region

TABLE_ID = b"StokerRST\0"

SOURCES = {  # (height, width, mode, Pillow save options)
    "420_333x517": (333, 517, "RGB", {"subsampling": 2}),
    "422_201x95": (201, 95, "RGB", {"subsampling": 1}),
    "444_150x257": (150, 257, "RGB", {"subsampling": 0}),
    "gray_150x257": (150, 257, "L", {}),
    "restarts_every_7_blocks": (120, 300, "RGB", {"subsampling": 2, "restart_marker_blocks": 7}),
    "restarts_every_2_rows": (120, 300, "RGB", {"subsampling": 0, "restart_marker_rows": 2}),
    "optimized_tables": (200, 333, "RGB", {"subsampling": 2, "optimize": True}),
    "420_17x9": (17, 9, "RGB", {"subsampling": 2}),
}


@pytest.fixture(scope="module")
def jpegs() -> dict[str, tuple[bytes, bytes]]:
    """Each source and its transcoded file (grown by up to 10%: the tiny one's markers and table
    are a large part of it; a pack allows 2%)."""
    out = {}
    for name, (h, w, mode, save) in SOURCES.items():
        source = _encode(h, w, mode, **save)
        out[name] = source, transcode(source, 0.1)
    return out


def segments(data: bytes) -> list[tuple[int, bytes]]:
    """The (marker, payload) of every segment before the scan."""
    found, pos = [], 2
    while data[pos + 1] != 0xDA:
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        found.append((data[pos + 1], data[pos + 4 : pos + 2 + length]))
        pos += 2 + length
    return found


def restart_table(data: bytes) -> tuple[int, np.ndarray, np.ndarray]:
    """(where the scan's data starts, each MCU row's offset from there, and the offsets of the
    further intervals of each row from the row's start) of a transcoded file (docs/format.md)."""
    found = dict(segments(data))
    sof, table = found[0xC0], next(p for m, p in segments(data) if m == 0xE9 and p.startswith(TABLE_ID))
    height, components = int.from_bytes(sof[1:3], "big"), sof[5]
    mcu_height = 8 * max(sof[7 + 3 * c] & 15 for c in range(components)) if components > 1 else 8
    rows = -(-height // mcu_height)
    groups = (len(table) - 11 - 4 * (rows + 1)) // (2 * rows) + 1
    pos = 2
    while data[pos + 1] != 0xDA:
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    scan = pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    row_offsets = np.frombuffer(table, "<u4", rows + 1, 11)
    inside = np.frombuffer(table, "<u2", rows * (groups - 1), 11 + 4 * (rows + 1)).reshape(rows, groups - 1)
    return scan, row_offsets, inside


@pytest.mark.parametrize("name", SOURCES)
def test_transcoded_files_decode_to_the_source_pixels(jpegs, name):
    source, out = jpegs[name]
    assert out != source and out.count(TABLE_ID) == 1
    for fast in (True, False):  # the loader's settings, and libjpeg's defaults
        np.testing.assert_array_equal(simplejpeg.decode_jpeg(out, fastdct=fast, fastupsample=fast),
                                      simplejpeg.decode_jpeg(source, fastdct=fast, fastupsample=fast))
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(out))), np.asarray(Image.open(io.BytesIO(source))))
    assert transcode(out, 0.1).count(TABLE_ID) == 1  # a stale table is replaced, not copied


def test_app_and_comment_segments_are_kept_byte_for_byte():
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (90, 160, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x010F], exif[0x0110] = "stoker", "test camera"
    icc = np.random.default_rng(2).integers(0, 256, 70_000, dtype=np.uint8).tobytes()  # two APP2 segments
    source = encode(image, "JPEG", quality=85, exif=exif.tobytes(), icc_profile=icc, comment=b"kept")
    kept = [s for s in segments(source) if s[0] >= 0xE0 and s[0] != 0xDB]
    assert [m for m, _ in kept] == [0xE0, 0xE1, 0xE2, 0xE2, 0xFE]
    out = transcode(source)
    assert [s for s in segments(out) if s[0] >= 0xE0 and not s[1].startswith(TABLE_ID)] == kept
    with Image.open(io.BytesIO(out)) as reopened:
        assert reopened.info["icc_profile"] == icc and reopened.getexif()[0x0110] == "test camera"


def test_files_of_other_kinds_are_not_transcoded(jpegs):
    source = jpegs["420_333x517"][0]
    rgb = Image.open(io.BytesIO(source))
    sof9 = bytearray(source)  # the same header as an arithmetic-coded frame: refused before the scan is read
    sof9[sof9.index(b"\xff\xc0") + 1] = 0xC9
    for data, reason in [(encode(rgb, "JPEG", progressive=True), "progressive"), (bytes(sof9), "arithmetic"),
                         (encode(rgb.convert("CMYK"), "JPEG"), "not a grayscale, YCbCr or RGB")]:
        with pytest.raises(NotTranscodable, match=reason):
            transcode(data)
    with pytest.raises(NotTranscodable, match="would add more than 0.01%"):
        transcode(source, 0.0001)
    with pytest.raises(ValueError, match="Premature end"):
        transcode(source[: len(source) // 2])
    with pytest.raises(ValueError, match="Not a JPEG"):
        transcode(encode(rgb, "PNG"))


def _edge_regions(height: int, width: int, rng: np.random.Generator):
    """Whole image, first/last rows and columns, 1-pixel corners, regions across MCU and interval
    boundaries, and random ones."""
    yield from [(0, 0, height, width), (0, 0, 1, width), (height - 1, 0, 1, width), (0, 0, height, 1),
                (0, width - 1, height, 1), (0, 0, 1, 1), (height - 1, width - 1, 1, 1), (0, width - 1, 1, 1),
                (height - 1, 0, 1, 1)]
    for y in (7, 8, 15, 16, 63, 64):
        for x in (15, 16, 63, 64, 127, 128):
            if y < height and x < width:
                yield y, x, min(2, height - y), min(2, width - x)
    for _ in range(25):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        yield int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w


@pytest.mark.parametrize("name", SOURCES)
def test_strip_regions_equal_a_whole_decode(jpegs, name):
    source, out = jpegs[name]
    height, width = SOURCES[name][:2]
    rng = np.random.default_rng(len(out))
    strip = bytearray(len(out) + 64)
    for scale in SCALES:
        full = _reference(source, scale)
        block_buffer = bytearray(full.size + 64)
        for top, left, h, w in _edge_regions(height, width, rng):
            rows, cols, dy, dx = decode_region(out, top, left, h, w, scale, block_buffer, strip)
            block = np.frombuffer(block_buffer, np.uint8, rows * cols * 3).reshape(rows, cols, 3)
            y0, x0 = top // scale, left // scale
            assert dy == 0 and rows == min(math.ceil((top + h) / scale), full.shape[0]) - y0
            np.testing.assert_array_equal(block, full[y0:y0 + rows, x0 - dx:x0 - dx + cols],
                                          err_msg=f"{name} scale 1/{scale} region {(top, left, h, w)}")


def test_strips_read_only_the_rows_and_intervals_around_the_region(jpegs):
    source, out = jpegs["420_333x517"]  # 33 MCUs a row: 3 restart intervals of 11 (176 px)
    scan, rows, inside = restart_table(out)
    assert inside.shape == (21, 2)
    damaged = bytearray(out)

    def zero(start: int, end: int) -> None:  # garbage in whole intervals, markers intact
        damaged[scan + start : scan + end] = b"\0" * (end - start)

    for row in (2, 15):  # above and below the region
        zero(int(rows[row]), int(rows[row + 1]) - 2)
    zero(int(rows[8]), int(rows[8]) + int(inside[8, 0]) - 2)  # left of it: row 8, interval 0
    zero(int(rows[9]) + int(inside[9, 1]), int(rows[10]) - 2)  # right of it: row 9, interval 2
    region, buffer = (6 * 16, 200, 100, 100), bytearray(333 * 517 * 3)
    with pytest.raises(ValueError, match="Corrupt JPEG data"):  # a decode of the file meets the damage
        decode_region(bytes(damaged), *region, 1, buffer)
    height, width, dy, dx = decode_region(bytes(damaged), *region, 1, buffer, bytearray(len(out)))
    block = np.frombuffer(buffer, np.uint8, height * width * 3).reshape(height, width, 3)
    np.testing.assert_array_equal(block, _reference(source, 1)[96:96 + height, 200 - dx:200 - dx + width])


def test_a_file_without_table_decodes_as_without_strip(jpegs):
    source = jpegs["420_333x517"][0]
    a, b = bytearray(333 * 517 * 3), bytearray(333 * 517 * 3)
    assert decode_region(source, 100, 200, 50, 60, 2, a, bytearray(16)) == decode_region(source, 100, 200, 50, 60, 2, b)
    assert a == b


def _damaged(out: bytes, what: str) -> bytes:
    scan, rows, inside = restart_table(out)
    data = bytearray(out)
    marker = scan + int(rows[5]) + int(inside[5, 1]) - 1  # the RSTn byte before interval 1 of row 5
    if what == "marker":
        data[marker] ^= 0x03
    elif what == "table":
        at = out.index(TABLE_ID) + 11 + 4 * 5
        data[at : at + 4] = (int(rows[5]) + 8).to_bytes(4, "little")
    elif what == "version":
        data[out.index(TABLE_ID) + 10] = 2
    return bytes(data)


@pytest.mark.parametrize("what, message", [("marker", "does not start after restart marker"),
                                           ("table", "does not start after restart marker"),
                                           ("version", "does not match the image")])
def test_damaged_restart_data_is_an_error(jpegs, what, message):
    out = _damaged(jpegs["420_333x517"][1], what)
    with pytest.raises(ValueError, match=message):
        decode_region(out, 5 * 16 + 3, 100, 40, 80, 1, bytearray(333 * 517 * 3), bytearray(len(out) + 64))


def test_damaged_tables_and_scans_never_crash(jpegs):
    rng = np.random.default_rng(7)
    out = jpegs["420_333x517"][1]
    table = out.index(TABLE_ID)
    buffer, strip = bytearray(333 * 517 * 3), bytearray(len(out) + 64)
    for i in range(400):
        data = bytearray(out)
        spots = rng.integers(table + 11, table + 300, 3) if i % 2 else rng.integers(2, len(data), 3)
        for at in spots:
            data[at] = int(rng.integers(0, 256))
        top, left = int(rng.integers(0, 300)), int(rng.integers(0, 500))
        try:
            decode_region(bytes(data), top, left, 33, 17, int(rng.choice(SCALES)), buffer, strip)
        except ValueError:
            pass


def test_transcoding_damaged_files_never_crashes(jpegs):
    rng = np.random.default_rng(8)
    source = jpegs["422_201x95"][0]
    for _ in range(150):
        data = bytearray(source)
        for at in rng.integers(2, len(data), 3):
            data[at] = int(rng.integers(0, 256))
        try:
            out = transcode(bytes(data), 0.1)
        except ValueError:  # NotTranscodable is one
            continue
        assert np.array_equal(simplejpeg.decode_jpeg(out), simplejpeg.decode_jpeg(bytes(data)))


def test_strip_buffer_too_small_is_an_error(jpegs):
    out = jpegs["420_333x517"][1]
    with pytest.raises(ValueError, match="strip buffer has 100 bytes"):
        decode_region(out, 100, 100, 40, 80, 1, bytearray(333 * 517 * 3), bytearray(100))


@pytest.fixture(scope="module")
def packs(photos, odd_images, tmp_path_factory) -> dict:
    """The sample photos and the odd images, packed byte-exact and with restart rows."""
    root = tmp_path_factory.mktemp("restart-packs")
    return {f"{name}-{mode}": stoker.pack(src, root / f"{name}-{mode}", restart_rows=mode == "restart", workers=2,
                                          progress=False)
            for name, src in (("photos", photos), ("odd", odd_images)) for mode in ("exact", "restart")}


def _data_set_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.suffix in (".tar", ".idx"))


def test_restart_pack_counts_and_size(photos, packs):
    result, exact = packs["photos-restart"], packs["photos-exact"]
    assert result.restarts == {"transcoded": len(source_files(photos)), "kept": 0, "kept_reasons": {}}
    assert exact.restarts is None
    growth = _data_set_bytes(result.dst) / _data_set_bytes(exact.dst)
    assert 1.0 < growth <= 1.02
    manifest = read_manifest(result.dst)
    assert manifest.source["options"]["restart_rows"] and manifest.source["restart_rows"] == result.restarts
    assert stoker.ShardDataset(result.dst).restart_rows and not stoker.ShardDataset(exact.dst).restart_rows


def test_restart_pack_keeps_other_images_as_they_are(odd_images, packs):
    result = packs["odd-restart"]
    assert result.restarts == {"transcoded": 0, "kept": 8, "kept_reasons": {
        "not a plain JPEG (PNG)": 3, "restart markers would add more than 2%": 1,  # gray.jpg: 48x64 px, 2.5 KB
        "not a grayscale, YCbCr or RGB JPEG": 1, "progressive JPEG": 1, "not a plain JPEG (WEBP)": 1,
        "not a plain JPEG (BMP)": 1}}
    sources = source_files(odd_images)
    for mode in ("restart", "exact"):
        dataset = stoker.ShardDataset(packs[f"odd-{mode}"].dst, decode="raw")
        assert all(dataset[i][0] == sources[dataset.key(i)] for i in range(len(dataset)))


def test_loader_batches_equal_on_both_packs(packs):
    exact, restart = (stoker.ShardDataset(packs[f"photos-{mode}"].dst) for mode in ("exact", "restart"))
    for size in (224, 160, 40):
        for kind in ("random_resized", "center"):
            spec = stoker.CropSpec(kind=kind, size=(size, size))
            a = [b[0].clone() for b in stoker.Loader(exact, 32, crop=spec, order="sequential", seed=size, threads=2)]
            b = [b[0].clone() for b in stoker.Loader(restart, 32, crop=spec, order="sequential", seed=size, threads=2)]
            assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)), (size, kind)


def test_stoker_info_says_how_images_are_stored(packs, capsys):
    assert main(["info", str(packs["photos-restart"].dst)]) == 0
    assert f"restart rows: {packs['photos-restart'].restarts['transcoded']} JPEGs transcoded" in capsys.readouterr().out
    assert main(["info", str(packs["photos-exact"].dst)]) == 0
    assert "the source files' bytes (byte-exact)" in capsys.readouterr().out


def test_without_the_extension_restart_rows_is_refused(photos, tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.import_module("stoker.pack.restarts"), "transcode", None)  # no libjpeg headers
    with pytest.raises(PackError, match="--restart-rows needs stoker's libjpeg extension"):
        stoker.pack(photos, tmp_path / "ds", restart_rows=True, progress=False)
    assert not (tmp_path / "ds").exists()


def _damage_in_pack(packs, tmp_path, what: str) -> tuple[stoker.ShardDataset, int]:
    """A copy of the restart pack with sample 3's restart data damaged, inside the center crop."""
    root = tmp_path / "damaged"
    shutil.copytree(packs["photos-restart"].dst, root)
    dataset = stoker.ShardDataset(root)
    victim = 3
    shard, local = dataset.shards.locate(victim)
    member = dataset.shards.index(shard).sample_members(local)[0]
    image = dataset.read_image(victim)[0]
    scan, rows, inside = restart_table(image)
    if what == "entropy":  # zeros in the middle of row 12, interval 2
        at = scan + int(rows[12]) + int(inside[12, 1]) + 10
        patch = b"\0" * 12
    else:  # the RSTn marker before interval 3 of row 12 renumbered
        at = scan + int(rows[12]) + int(inside[12, 2]) - 1
        patch = bytes([image[at] ^ 0x01])
    with open(dataset.shards.reader(shard).path, "r+b") as f:
        f.seek(int(member["offset"]) + at)
        f.write(patch)
    return dataset, victim


@pytest.mark.parametrize("what", ["entropy", "marker"])
def test_damaged_restart_segment_names_the_sample(packs, tmp_path, what):
    dataset, victim = _damage_in_pack(packs, tmp_path, what)
    spec = stoker.CropSpec(kind="center", size=(64, 64))
    with pytest.raises(CorruptDataError, match="checksum mismatch") as info:  # checksums on: the read fails
        dataset[victim]
    assert info.value.key == dataset.key(victim)
    with pytest.raises(CorruptDataError, match="checksum mismatch") as info:
        list(stoker.Loader(dataset, 4, crop=spec, order="sequential", threads=2))
    assert info.value.key == dataset.key(victim)
    if what == "marker":  # without checksums, the strip's check of every marker it uses notices
        unchecked = stoker.ShardDataset(dataset.root, verify=False)
        with pytest.raises(CorruptDataError, match="does not start after restart marker") as info:
            list(stoker.Loader(unchecked, 4, crop=spec, order="sequential", threads=2))
        assert info.value.key == dataset.key(victim) and info.value.shard.endswith(".tar")
