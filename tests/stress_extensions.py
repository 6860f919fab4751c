"""Thread stress of stoker's C extensions (region decode, decode_chunk, exact resize, restart
transcode, the photometric ops).

    python tests/stress_extensions.py [--seconds 30] [--threads 48] [--seed 0] [--require-build DIR]

``make sanitize`` runs it against a copy of the package whose extensions are built with
AddressSanitizer and UndefinedBehaviorSanitizer (docs/architecture.md, "Native code under
sanitizers"); it also runs as it is against the in-place build. Not a pytest file (no ``test_``
prefix, so pytest never collects it): it is meant to run for minutes with many more threads than
cores, which the test suite on a shared machine cannot afford, and what it looks for (a crash, a
sanitizer report) kills the process rather than failing an assertion. The fast, deterministic
checks of the same code are tests/test_jpeg_region.py, test_restart_rows.py, test_resample.py and
test_extensions_threads.py.

It makes a fixed set of cases: region decodes of sample photos and of synthetic JPEGs of every
chroma subsampling (odd sizes, progressive, gray), at every DCT scale, with random boxes; the same
through the strip path of their restart-marker transcodes (what ``stoker pack --restart-rows``
stores); damaged copies of both (bit flips, cuts at random points, garbage in the restart table);
exact resizes (``_resample.resize_crop``) of random sizes, filters and padded crops; restart transcodes of damaged JPEGs;
``decode_chunk`` (the Loader's native path: read through a real file's descriptor, xxh3 check,
region decode, crop, halving, bilinear resize, flip; or, for exact crops, the whole image decoded
with the accurate IDCT and fancy upsampling and Pillow's resize cut to the crop) on chunks of those
JPEGs and restart packs, damaged and truncated members, wrong checksums, members past the file's
end or of absurd sizes, a directory's descriptor, random CropSpecs of every kind, exact or not,
with outputs down to 1x1, JPEGs whose header claims 65500 x 65500 pixels and pixel budgets that
refuse some of the others; and
``_photometric.apply_chunk`` with the op codes and parameters ``native.encode`` makes of random
ColorJitter / Grayscale / Normalize pipelines, float32 and uint8 output, in every build the CPU
runs, now and then with an op code that is none. Each case's outcome (a digest of the output bytes,
or the error's type and message) is computed on one thread first; then THREADS threads run cases
picked at random for SECONDS, and every outcome must equal that reference, and every error must be a
ValueError (the extensions' documented errors; decode_chunk reports a sample it cannot make as a
status, which is part of its outcome). Output buffers are the Loader's per-thread maps
(stoker.decode.scratch.thread_buffer), grown as larger images come, and filled with a new byte
before each call: output that depended on memory the call did not write would differ from the
reference. Exits 1 on any difference.

Run it also with JSIMD_FORCENONE=1 (``make sanitize`` does): libjpeg-turbo then takes its plain-C
paths, which read tables its SIMD code does not (a crop that overwrote the merged upsampler's colour
tables crashed only there).
"""

from __future__ import annotations

import argparse
import ctypes
import io
import os
import pathlib
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image

from stoker.augment import Augment, _photometric
from stoker.augment.color import ColorJitter, Grayscale, Normalize
from stoker.augment.native import encode
from stoker.decode import _jpeg_region, _resample
from stoker.decode.crops import CROP_TRIES, RESAMPLE_FILTERS
from stoker.decode.per_image import _STRIP_SLACK
from stoker.decode.scratch import thread_buffer
from stoker.format.checksum import member_checksum
from stoker.pack import _jpeg_restart, restarts
from stoker.sample_data import make_sample_photos

EXTENSIONS = (_jpeg_region, _resample, _jpeg_restart, _photometric)
SCALES = (1, 2, 4, 8)
MAX_BLOCK = 8 << 20  # decode buffers at most this large: a smaller one than a block needs is an error to report
# The pixel budget the cases pass (stoker/pixels.py): a damaged SOF's claim above it is refused before
# libjpeg allocates for it (a smaller budget than the default keeps 64 threads' memory small).
BUDGET = 1 << 24
# (height, width, OpenCV's sampling factor or None for gray, progressive): odd sizes and every
# sampling libjpeg-turbo's merged and plain upsamplers handle.
SYNTHETIC = [(h, w, s, p) for (h, w) in ((333, 517), (201, 95), (17, 9), (47, 33), (1, 1), (8, 1000), (1000, 8), (129, 127),
                                        (1, 300), (300, 1))
             for s in ("444", "422", "420", "440", "411", None) for p in (False, True)]


@dataclass(frozen=True)
class Case:
    """One call and the bytes it reads; ``run`` returns its outcome (see :func:`outcome`)."""

    kind: str
    run: Callable[[int], tuple]


def synthetic_jpeg(height: int, width: int, sampling: str | None, progressive: bool, quality: int = 90) -> bytes:
    """A JPEG of gradients and noise (every block has AC coefficients) with OpenCV's chroma
    ``sampling`` (None: gray)."""
    rng = np.random.default_rng([height, width, quality])
    yy, xx = np.mgrid[0:height, 0:width]
    pixels = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1), (xx + yy) % 256], -1)
    pixels = (pixels // 2 + rng.integers(0, 128, (height, width, 3))).astype(np.uint8)
    params = [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)]
    if sampling is None:
        pixels = cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY)
    else:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, getattr(cv2, f"IMWRITE_JPEG_SAMPLING_FACTOR_{sampling}")]
    ok, encoded = cv2.imencode(".jpg", pixels, params)
    assert ok
    return encoded.tobytes()


def chroma_ramp(subsampling: int) -> bytes:
    """A 4:2:2 (1) or 4:2:0 (2) JPEG whose rows hold every Cr value: colour-table entries that
    photos never use are read too."""
    ycc = np.full((512, 48, 3), 128, np.uint8)
    ycc[..., 2] = (np.arange(512) // 2)[:, None]
    buffer = io.BytesIO()
    Image.fromarray(ycc, mode="YCbCr").save(buffer, "JPEG", quality=100, subsampling=subsampling)
    return buffer.getvalue()


def damaged(data: bytes, rng: np.random.Generator) -> bytes:
    """``data`` with bit flips, cut at a random point, or with garbage in its restart table."""
    out = bytearray(data)
    how = rng.integers(3)
    table = data.find(b"StokerRST\0")
    if how == 0 or (how == 2 and table < 0):
        for at in rng.integers(2, len(out), int(rng.integers(1, 8))):
            out[at] ^= 1 << int(rng.integers(8))
    elif how == 1:
        del out[int(rng.integers(2, len(out))):]
    else:
        length = int.from_bytes(data[table - 2 : table], "big") - 2
        for at in rng.integers(table + 11, table + length, int(rng.integers(1, 6))):
            out[at] = int(rng.integers(256))
    return bytes(out)


def claiming(data: bytes, height: int, width: int) -> bytes:
    """``data`` with its frame header claiming ``height`` x ``width`` pixels: a decompression bomb
    (the scan's few KB cannot fill it)."""
    out = bytearray(data)
    pos = 2
    while pos + 9 <= len(out) and out[pos] == 0xFF:
        marker, length = out[pos + 1], int.from_bytes(out[pos + 2 : pos + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            out[pos + 5 : pos + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
            break
        pos += 2 + length
    return bytes(out)


def digest(buffer, nbytes: int) -> int:
    return zlib.crc32(memoryview(buffer)[:nbytes])


def fill(buffer, nbytes: int, value: int) -> None:
    """Overwrite what a call may write, so that output it did not write shows."""
    np.frombuffer(buffer, np.uint8, nbytes).fill(value)


def outcome(call: Callable[[], tuple]) -> tuple:
    """What ``call`` returned, or the type and message of the ValueError it raised; any other
    exception propagates (a bug)."""
    try:
        return call()
    except ValueError as e:
        return type(e).__name__, str(e)


def region_case(data: bytes, box: tuple[int, int, int, int], scale: int, strip: bool) -> Case:
    """decode_region as the Loader calls it: the JPEG in the thread's read buffer, the block into its
    decode buffer (full size), a strip buffer of len(data) + _STRIP_SLACK for restart-marker files."""
    height, width = box_limits(data)

    def run(noise: int) -> tuple:
        read = thread_buffer("read", len(data))
        read[: len(data)] = data
        nbytes = min(max(1, height * width * 3), MAX_BLOCK)  # a damaged SOF may claim 65535x65535
        out = thread_buffer("decode", nbytes)
        fill(out, nbytes, noise)
        strip_buffer = thread_buffer("strip", len(data) + _STRIP_SLACK) if strip else None
        if strip_buffer is not None:
            fill(strip_buffer, len(strip_buffer), noise)

        def call() -> tuple:
            extra = () if strip_buffer is None else (strip_buffer,)
            rows, cols, dy, dx = _jpeg_region.decode_region(memoryview(read)[: len(data)], *box, scale, out, *extra,
                                                            max_pixels=BUDGET)
            return rows, cols, dy, dx, digest(out, rows * cols * 3)

        return outcome(call)

    return Case("region", run)


def box_limits(data: bytes) -> tuple[int, int]:
    """The height and width in the SOF of ``data`` (any SOFn), (0, 0) where there is none."""
    pos = 2
    while pos + 9 <= len(data) and data[pos] == 0xFF:
        marker, length = data[pos + 1], int.from_bytes(data[pos + 2 : pos + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return int.from_bytes(data[pos + 5 : pos + 7], "big"), int.from_bytes(data[pos + 7 : pos + 9], "big")
        pos += 2 + length
    return 0, 0


def random_box(rng: np.random.Generator, height: int, width: int) -> tuple[int, int, int, int]:
    """A box inside the image, mostly; sometimes one past its edges (an error to report)."""
    if height == 0 or width == 0 or rng.random() < 0.03:
        return tuple(int(v) for v in rng.integers(-2, 600, 4))  # type: ignore[return-value]
    h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
    if rng.random() < 0.15:  # a few pixels wide or high: narrow crops take other paths in libjpeg
        h, w = (min(h, int(rng.integers(1, 5))), w) if rng.random() < 0.5 else (h, min(w, int(rng.integers(1, 5))))
    return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w


def resize_case(rng: np.random.Generator) -> Case:
    """resize_crop with random source, resize and crop sizes (up and down, 1 px edges included), every
    filter and order of passes, crops partly or wholly outside the resize (padded) for a fifth."""
    height, width = (int(v) for v in rng.integers(1, 400, 2))
    src = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    resized_h, resized_w = (int(v) for v in rng.integers(1, 500, 2))
    out_h, out_w = int(rng.integers(1, resized_h + 1)), int(rng.integers(1, resized_w + 1))
    top, left = int(rng.integers(0, resized_h - out_h + 1)), int(rng.integers(0, resized_w - out_w + 1))
    if rng.random() < 0.2:
        out_h, out_w = out_h + int(rng.integers(0, 50)), out_w + int(rng.integers(0, 50))
        top, left = top - int(rng.integers(0, out_h + 20)), left - int(rng.integers(0, out_w + 20))
    filter_, passes = int(rng.integers(len(RESAMPLE_FILTERS))), int(rng.integers(2))

    def run(noise: int) -> tuple:
        out = thread_buffer("resize", out_h * out_w * 3)
        fill(out, len(out), noise)

        def call() -> tuple:
            _resample.resize_crop(src, height, width, resized_h, resized_w, top, left, out, out_h, out_w, filter_, passes)
            return (digest(out, out_h * out_w * 3),)

        return outcome(call)

    return Case("resize", run)


def transcode_case(data: bytes) -> Case:
    def run(noise: int) -> tuple:  # noqa: ARG001  # the output is a new bytes object: nothing to fill
        return outcome(lambda: (zlib.crc32(_jpeg_restart.transcode(data, restarts.MAX_GROWTH)),))

    return Case("transcode", run)


@dataclass(frozen=True)
class Member:
    """Where decode_chunk reads one image: its offset, size and checksum in the members file."""

    offset: int
    size: int
    checksum: int


def members_file(workdir: pathlib.Path, pools: list[list[bytes]],
                 rng: np.random.Generator) -> tuple[int, list[list[Member]]]:
    """The images of ``pools`` written one after another (a few junk bytes between) into a real
    file, opened (the descriptor outlives ``workdir``), and each pool's members; then a last pool of
    the members a damaged index may describe: no bytes, one running past the file's end (a
    truncated shard), one past the end, absurd sizes and offsets."""
    path, blob, members = workdir / "members.bin", bytearray(), []
    for pool in pools:
        members.append([])
        for data in pool:
            blob += rng.integers(0, 256, int(rng.integers(0, 9)), dtype=np.uint8).tobytes()
            members[-1].append(Member(len(blob), len(data), member_checksum(data)))
            blob += data
    last = members[-1][-1]
    members.append([Member(last.offset, last.size + 1 + int(rng.integers(1000)), last.checksum), Member(0, 0, 0),
                    Member(len(blob) + 1, 10, 0), Member(0, 2**31 + 5, 0), Member(2**63 + 1, 100, 0),
                    Member(7, 2**64 - 1, 0)])
    path.write_bytes(blob)
    return os.open(path, os.O_RDONLY), members


def chunk_case(rng: np.random.Generator, members: list[list[Member]], fd: int, directory: int) -> Case:
    """decode_chunk on 1-4 members (of JPEGs, restart transcodes, damaged ones, the damaged index's:
    ``members_file``'s pools, 40/30/20/10%; a wrong checksum now and then; a directory's or no
    descriptor for a few) with a random CropSpec (every kind, outputs from 1x1, thin aspect ranges,
    exact (Pillow's resize of the whole decoded image) for a third), strips on or off; a few calls
    with a position outside ``out`` (a ValueError). The outcome: the count made, every status, and
    the bytes of the slots made (the others keep the filled byte)."""
    m = int(rng.integers(1, 5))
    pools = [members[i] for i in rng.choice(len(members), m, p=[0.4, 0.3, 0.2, 0.1])]
    picked = [pool[rng.integers(len(pool))] for pool in pools]
    out_h, out_w = (int(rng.integers(1, 4)) if rng.random() < 0.3 else int(rng.integers(1, 97)) for _ in range(2))
    scale_lo = float(rng.uniform(0.005, 0.6))
    ratio_lo = float(rng.uniform(0.1, 1.0))
    spec = (int(rng.integers(3)), out_h, out_w, scale_lo, float(rng.uniform(scale_lo, 1.0)), ratio_lo,
            float(rng.uniform(1.0, 6.0)), float(rng.uniform(0.3, 1.0)), bool(rng.random() < 0.6), bool(rng.random() < 0.33),
            int(rng.integers(len(RESAMPLE_FILTERS))), int(rng.integers(2)))
    fds = np.array([fd if rng.random() < 0.95 else [directory, -1][rng.integers(2)] for _ in range(m)], np.int32)
    offsets = np.array([p.offset for p in picked], np.uint64)
    sizes = np.array([p.size for p in picked], np.uint64)
    checksums = None
    if rng.random() < 0.8:
        checksums = np.array([p.checksum ^ (1 << int(rng.integers(64)) if rng.random() < 0.1 else 0)
                              for p in picked], np.uint64)
    tries = rng.random((m, CROP_TRIES, 4))
    flips = (rng.random(m) < 0.5).astype(np.uint8)
    slots = m + int(rng.integers(3))
    positions = rng.permutation(slots)[:m].astype(np.int64)
    if rng.random() < 0.02:
        positions[-1] = slots
    slot_bytes = out_h * out_w * 3
    max_pixels = BUDGET if rng.random() < 0.8 else int(rng.integers(1, 300_000))

    def run(noise: int) -> tuple:
        nbytes = slots * slot_bytes
        out = np.frombuffer(thread_buffer("chunk", nbytes), np.uint8, nbytes).reshape(slots, out_h, out_w, 3)
        out.fill(noise)
        status = np.full(m, 255, np.uint8)

        def call() -> tuple:
            made = _jpeg_region.decode_chunk(fds, offsets, sizes, checksums, tries, flips, positions, spec, out, status,
                                             max_pixels)
            return made, tuple(status.tolist()), zlib.crc32(out[positions[status == 0]].tobytes())

        return outcome(call)

    return Case("chunk", run)


def photometric_case(rng: np.random.Generator, builds: tuple[str, ...]) -> Case:
    """apply_chunk with what ``encode`` makes of a random pipeline of ColorJitter (ranges out to
    their edges, sometimes only some of them, applied with p), Grayscale and Normalize, on random
    crops from 1x1, into float32 or uint8 slots of a larger out, in one of the CPU's builds; now and
    then an op code that is none (a ValueError)."""
    ops: list = []
    for _ in range(int(rng.integers(0, 4))):
        pick = rng.random()
        if pick < 0.5:
            def factor() -> float | None:
                return None if rng.random() < 0.3 else float(rng.uniform(0, 1.5))
            hue = None if rng.random() < 0.3 else float(rng.uniform(0, 0.5))
            ops.append(ColorJitter(factor(), factor(), factor(), hue, p=float(rng.choice([1.0, 0.5]))))
        elif pick < 0.75:
            ops.append(Grayscale(p=float(rng.uniform())))
        else:
            ops.append(Normalize(tuple(rng.uniform(0, 1, 3).tolist()), tuple(rng.uniform(0.05, 1, 3).tolist())))
    augment = Augment(*ops, seed=int(rng.integers(1 << 30)), device="cpu", backend="opencv", threads=1)
    height, width = (int(rng.integers(1, 4)) if rng.random() < 0.3 else int(rng.integers(1, 80)) for _ in range(2))
    m = int(rng.integers(1, 5))
    slots = m + int(rng.integers(3))
    draws = augment.draw((np.full(slots, height), np.full(slots, width)), step=int(rng.integers(1000)))
    codes, params = encode(augment, draws, slots)
    if rng.random() < 0.03 and codes.size:
        codes.flat[int(rng.integers(codes.size))] = int(rng.choice([0, 7, -1]))
    crops = rng.integers(0, 256, (m, height, width, 3), dtype=np.uint8)
    positions = rng.permutation(slots)[:m].astype(np.int64)
    dtype = np.float32 if rng.random() < 0.6 else np.uint8
    build = builds[int(rng.integers(len(builds)))]

    def run(noise: int) -> tuple:
        nbytes = slots * height * width * 3 * np.dtype(dtype).itemsize
        out = np.frombuffer(thread_buffer("photometric", nbytes), dtype, nbytes // np.dtype(dtype).itemsize)
        out = out.reshape(slots, height, width, 3)
        fill(thread_buffer("photometric", nbytes), nbytes, noise)

        def call() -> tuple:
            _photometric.apply_chunk(crops, out, codes, params, positions, build=build)
            return (zlib.crc32(out[positions].tobytes()),)

        return outcome(call)

    return Case("photometric", run)


def make_cases(seed: int, count: int, workdir: pathlib.Path) -> list[Case]:
    rng = np.random.default_rng(seed)
    photos = make_sample_photos(workdir / "photos", count=12, num_classes=12, seed=seed)
    sources = [path.read_bytes() for path in sorted(photos.glob("*/*.jpg"))]
    ramps = [chroma_ramp(1), chroma_ramp(2)]
    sources += [synthetic_jpeg(*spec) for spec in SYNTHETIC] + ramps
    packed = []
    for data in sources:
        stored, how = restarts.with_restart_markers(data, "JPEG")
        if how == restarts.TRANSCODED:
            packed.append(stored)
    damaged_sources = [damaged(data, rng) for data in sources + packed for _ in range(3)]
    damaged_sources += [claiming(data, 65500, 65500) for data in sources[:2] + sources[12:14] + packed[:2]]  # [13]: progressive
    fd, members = members_file(workdir, [sources, packed, damaged_sources], rng)
    directory = os.open(workdir, os.O_RDONLY)  # read by pread: EISDIR
    cases = []
    for _ in range(count):
        pick = rng.random()
        if pick < 0.2:
            cases.append(chunk_case(rng, members, fd, directory))
            continue
        if pick < 0.28:
            cases.append(photometric_case(rng, _photometric.BUILDS))
            continue
        pick = (pick - 0.28) / 0.72  # the region, resize and transcode cases as before
        if pick < 0.08:
            cases.append(resize_case(rng))
            continue
        if pick < 0.12:
            pool = sources + damaged_sources
            cases.append(transcode_case(pool[rng.integers(len(pool))]))
            continue
        if pick < 0.17:  # narrow regions of every Cr value, at every column
            data = ramps[rng.integers(2)]
            left, w = int(rng.integers(48)), int(rng.integers(1, 5))
            cases.append(region_case(data, (0, left, 512, min(w, 48 - left)), SCALES[rng.integers(4)], strip=False))
            continue
        pool = [sources, packed, damaged_sources][int(rng.integers(3))]
        data = pool[rng.integers(len(pool))]
        cases.append(region_case(data, random_box(rng, *box_limits(data)), SCALES[rng.integers(4)],
                                 strip=pool is not sources))
    print(f"{len(sources)} JPEGs, {len(packed)} restart transcodes, {len(damaged_sources)} damaged; "
          f"{len(cases)} cases", flush=True)
    return cases


def check_build(directory: str) -> None:
    """Every extension imported from ``directory`` and built with AddressSanitizer (else a failed
    optional build, or an import from another tree, would pass the stress unsanitized)."""
    root = pathlib.Path(directory).resolve()
    for module in EXTENSIONS:
        path = pathlib.Path(module.__file__ or "").resolve()
        if root not in path.parents or b"__asan_init" not in path.read_bytes():
            sys.exit(f"{module.__name__} is {path}, not a sanitizer build under {root}")
    if not hasattr(ctypes.CDLL(None), "__asan_init"):
        sys.exit("AddressSanitizer's runtime is not loaded: LD_PRELOAD=$(gcc -print-file-name=libasan.so)")


def stress(cases: list[Case], references: list[tuple], threads: int, seconds: float, seed: int) -> tuple[Counter, list[str]]:
    counts: Counter = Counter()
    failures: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker(index: int) -> None:
        rng = np.random.default_rng((seed, 1, index))
        done: Counter = Counter()
        try:
            while time.monotonic() < deadline and len(failures) < 20:
                i = int(rng.integers(len(cases)))
                got = cases[i].run(int(rng.integers(256)))
                done[cases[i].kind] += 1
                if got != references[i]:
                    with lock:
                        failures.append(f"case {i} ({cases[i].kind}): {got} on thread {index}, {references[i]} alone")
        except Exception as e:  # noqa: BLE001  # anything but ValueError is a bug: report it, stop the thread
            with lock:
                failures.append(f"thread {index}: {type(e).__name__}: {e}")
        with lock:
            counts.update(done)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return counts, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=max(48, 4 * (os.cpu_count() or 1)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--require-build", metavar="DIR", help="fail unless the extensions are ASan builds under DIR")
    args = parser.parse_args()
    if args.require_build:
        check_build(args.require_build)
    with tempfile.TemporaryDirectory() as workdir:
        cases = make_cases(args.seed, args.cases, pathlib.Path(workdir))
    start = time.monotonic()
    references = [case.run(0) for case in cases]  # one thread: the reference outcomes
    errors = Counter(r[0] for r in references if isinstance(r[0], str))
    print(f"reference on one thread: {time.monotonic() - start:.1f} s; errors among them: {dict(errors)}", flush=True)
    counts, failures = stress(cases, references, args.threads, args.seconds, args.seed)
    print(f"{args.threads} threads, {args.seconds:g} s on {os.cpu_count()} cores: {sum(counts.values())} calls "
          f"{dict(counts)}", flush=True)
    for failure in failures:
        print("FAIL", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
