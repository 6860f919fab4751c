"""stoker.augment._photometric: an Augment's ColorJitter, grayscale, scaling and Normalize for a chunk of
crops in one call without the GIL, checked against ``Augment.apply_image`` (the OpenCV path it
replaces) on the same draws: every op alone and together, random draws and sizes, edge values,
uint8 output, threads, every build this CPU runs (AVX-512, AVX2, baseline), and bad arrays.

Equal to 1e-5 in float32 (values after Normalize reach ~2.6; OpenCV's arithmetic differs from row to
row only in its scalar tails and summation order), and within 1 level where rounded back to uint8.
Brightness and the scaling to [0, 1] are numpy's float32 products: bit for bit.
"""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from stoker.augment import Augment, opcodes
from stoker.augment.color import ColorJitter, GaussianBlur, Grayscale, Normalize
from stoker.augment.geometry import HorizontalFlip
from stoker.augment.native import encode, supports

_photometric = pytest.importorskip("stoker.augment._photometric", reason="C extension not built (no C compiler?)")
TOLERANCE = 1e-5

OPS = {
    "brightness": (ColorJitter(brightness=0.8),),
    "contrast": (ColorJitter(contrast=0.8),),
    "saturation": (ColorJitter(saturation=0.8),),
    "hue": (ColorJitter(hue=0.5),),
    "grayscale": (Grayscale(p=0.5),),
    "normalize": (Normalize(),),
    "jitter": (ColorJitter(0.4, 0.4, 0.4, 0.1),),
    "jitter sometimes": (ColorJitter(0.4, 0.4, 0.4, 0.2, p=0.5),),
    "train pipeline": (ColorJitter(0.4, 0.4, 0.4), Normalize()),
    "everything": (ColorJitter(0.4, 0.4, 0.4, 0.1), Grayscale(0.3), Normalize((0.5, 0.4, 0.3), (0.2, 0.3, 0.25))),
    "twice": (ColorJitter(contrast=0.9, hue=0.3), Grayscale(0.5), ColorJitter(0.5, 0.5, 0.5, 0.5)),
    "nothing": (),
}
EDGES = {
    "brightness 0": (ColorJitter(brightness=(0.0, 0.0)),),
    "brightness 2": (ColorJitter(brightness=(2.0, 2.0)),),
    "contrast 0": (ColorJitter(contrast=(0.0, 0.0)),),
    "contrast 2": (ColorJitter(contrast=(2.0, 2.0)),),
    "saturation 0": (ColorJitter(saturation=(0.0, 0.0)),),
    "saturation 3": (ColorJitter(saturation=(3.0, 3.0)),),
    "hue +0.5": (ColorJitter(hue=(0.5, 0.5)),),
    "hue -0.5": (ColorJitter(hue=(-0.5, -0.5)),),
    "hue 0": (ColorJitter(hue=(0.0, 0.0)),),
    "grayscale": (Grayscale(p=1.0),),
    "grayscale then saturation": (Grayscale(p=1.0), ColorJitter(saturation=(2.0, 2.0))),
}
SIZES = [(1, 1), (3, 7), (37, 53), (224, 224)]


def _augment(ops: tuple, seed: int = 0) -> Augment:
    return Augment(*ops, seed=seed, device="cpu", backend="opencv", threads=1)


def _crops(n: int, size: tuple[int, int], seed: int, kind: str = "random") -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "constant":  # every pixel of a crop one colour (a gray one for some)
        colours = rng.integers(0, 256, (n, 1, 1, 3), dtype=np.uint8)
        colours[::2] = colours[::2, ..., :1]
        return np.ascontiguousarray(np.broadcast_to(colours, (n, *size, 3)))
    if kind == "levels":  # few distinct levels: ties between channels, gray pixels, 0 and 255
        return rng.choice(np.array([0, 1, 127, 128, 254, 255], np.uint8), (n, *size, 3))
    return rng.integers(0, 256, (n, *size, 3), dtype=np.uint8)


def _reference(augment: Augment, crops: np.ndarray, draws, dtype: type) -> np.ndarray:
    """apply_image per crop, rounded back to uint8 as BatchMaker._augment does where asked."""
    out = np.empty(crops.shape, np.float32)
    for i, crop in enumerate(crops):
        augment.apply_image(crop, i, draws, out[i])
    if dtype == np.uint8:
        return np.rint(out * np.float32(255)).astype(np.uint8)
    return out


def _native(augment: Augment, crops: np.ndarray, draws, dtype: type, build: str | None = None) -> np.ndarray:
    n = len(crops)
    codes, params = encode(augment, draws, n)
    out = np.full(crops.shape, 7, dtype)
    _photometric.apply_chunk(crops, out, codes, params, np.arange(n, dtype=np.int64), build=build)
    return out


def _compare(ops: tuple, size: tuple[int, int], seed: int, n: int = 6, kind: str = "random",
             dtype: type = np.float32, build: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    augment = _augment(ops, seed)
    assert supports(augment)
    crops = _crops(n, size, seed, kind)
    draws = augment.draw((np.full(n, size[0]), np.full(n, size[1])), step=seed)
    expected, got = _reference(augment, crops, draws, dtype), _native(augment, crops, draws, dtype, build)
    if dtype == np.uint8:
        assert np.abs(got.astype(int) - expected.astype(int)).max() <= 1
    else:
        np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)
    return got, expected


@pytest.mark.parametrize("size", SIZES, ids=str)
@pytest.mark.parametrize("name", OPS)
def test_every_op_alone_and_together_gives_apply_images_pixels(name, size):
    n = 2 if size == (224, 224) else 6
    for seed in range(3 if size == (224, 224) else 8):
        _compare(OPS[name], size, seed, n=n)


@pytest.mark.parametrize("kind", ["random", "constant", "levels"])
@pytest.mark.parametrize("name", EDGES)
def test_edge_values_give_apply_images_pixels(name, kind):
    for seed in range(3):
        _compare(EDGES[name], (19, 23), seed, kind=kind)


def test_contrast_of_a_constant_image_keeps_it_constant():
    got, _ = _compare((ColorJitter(contrast=(1.7, 1.7)),), (16, 16), 0, kind="constant")
    assert (got == got[:, :1, :1]).all()


def test_brightness_and_scaling_are_bit_exact():
    """numpy's float32 products, not OpenCV's: the same bits on every CPU."""
    for ops in [(), (ColorJitter(brightness=0.9),), (ColorJitter(brightness=(2.0, 2.0)),)]:
        got, expected = _compare(ops, (37, 53), 1)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", ["jitter", "everything", "twice", "grayscale"])
def test_rounded_back_to_uint8_within_one_level(name):
    """Where the pipeline is still at uint8 (ColorJitter on PIL images, PILToTensor after):
    out is uint8, as BatchMaker rounds apply_image's floats back."""
    ops = tuple(op for op in OPS[name] if not isinstance(op, Normalize))
    for seed in range(4):
        for kind in ("random", "levels"):
            _compare(ops, (37, 53), seed, kind=kind, dtype=np.uint8)


@pytest.mark.parametrize("build", _photometric.BUILDS)
def test_every_build_this_cpu_runs_gives_apply_images_pixels(build):
    """The tests above run the fastest build (AVX-512 where the CPU has it); the slower ones, which
    other CPUs run, are checked here: every op together, twice, in uint8, and at the edge values."""
    for name in ("everything", "twice", "jitter sometimes"):
        for seed in range(2):
            _compare(OPS[name], (37, 53), seed, build=build)
            _compare(OPS[name][:2], (37, 53), seed, kind="levels", dtype=np.uint8, build=build)
    for ops in EDGES.values():
        for kind in ("random", "constant", "levels"):
            _compare(ops, (19, 23), 0, kind=kind, build=build)


def test_a_build_this_cpu_cannot_run_is_refused():
    args = _good()
    with pytest.raises(ValueError, match="^build sse9 is not one this CPU runs"):
        _photometric.apply_chunk(*args.values(), build="sse9")
    assert _photometric.BUILDS[-1] == "baseline"


def test_a_chunk_goes_to_its_positions_with_their_parameters():
    """Crop i goes to slot positions[i] with that slot's draws; the other slots are not touched."""
    augment = _augment(OPS["everything"], 3)
    n, size = 10, (13, 17)
    crops = _crops(n, size, 3)
    draws = augment.draw((np.full(n, size[0]), np.full(n, size[1])), step=0)
    expected = _reference(augment, crops, draws, np.float32)
    codes, params = encode(augment, draws, n)
    out = np.full(crops.shape, np.nan, np.float32)
    positions = np.array([7, 2, 9, 4], np.int64)
    _photometric.apply_chunk(np.ascontiguousarray(crops[positions]), out, codes, params, positions)
    np.testing.assert_allclose(out[positions], expected[positions], rtol=0, atol=TOLERANCE)
    others = np.setdiff1d(np.arange(n), positions)
    assert np.isnan(out[others]).all()


def test_threads_calling_at_once_give_what_one_call_gives():
    augment = _augment(OPS["everything"], 5)
    n, size = 32, (64, 48)
    crops = _crops(n, size, 5)
    draws = augment.draw((np.full(n, size[0]), np.full(n, size[1])), step=0)
    codes, params = encode(augment, draws, n)
    for dtype in (np.float32, np.uint8):
        alone = np.empty(crops.shape, dtype)
        _photometric.apply_chunk(crops, alone, codes, params, np.arange(n, dtype=np.int64))
        together = np.empty(crops.shape, dtype)
        chunks = np.array_split(np.random.default_rng(0).permutation(n), 8)
        barrier = threading.Barrier(len(chunks))

        def run(positions: np.ndarray, together: np.ndarray, barrier: threading.Barrier) -> None:
            barrier.wait()
            for _ in range(3):
                _photometric.apply_chunk(np.ascontiguousarray(crops[positions]), together, codes, params,
                                         positions.astype(np.int64))

        threads = [threading.Thread(target=run, args=(chunk, together, barrier)) for chunk in chunks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        np.testing.assert_array_equal(together, alone)


def test_supports_photometric_ops_only():
    assert supports(_augment(OPS["everything"]))
    assert supports(_augment(()))
    assert not supports(_augment((ColorJitter(0.4), GaussianBlur())))
    assert not supports(_augment((HorizontalFlip(), ColorJitter(0.4))))


def test_the_python_side_reads_the_headers_values():
    """opcodes.py against what the extension exports of photometric.h: the op codes, the slot width
    and the luma weights (in the float32 the kernels hold them)."""
    assert opcodes.PARAMS == _photometric.PARAMS
    for name in ("BRIGHTNESS", "CONTRAST", "SATURATION", "HUE", "GRAYSCALE", "NORMALIZE"):
        assert getattr(opcodes, name) == getattr(_photometric, name)
    np.testing.assert_array_equal(np.float32(opcodes.GRAY), np.float32(_photometric.GRAY))


def _good(n: int = 4, size: tuple[int, int] = (5, 6)) -> dict:
    augment = _augment(OPS["everything"])
    draws = augment.draw((np.full(n, size[0]), np.full(n, size[1])), step=0)
    codes, params = encode(augment, draws, n)
    return {"crops": _crops(n, size, 0), "out": np.zeros((n, *size, 3), np.float32), "ops": codes, "params": params,
            "positions": np.arange(n, dtype=np.int64)}


@pytest.mark.parametrize("name, bad, says", [
    ("crops", lambda a: a.astype(np.float32), "crops must be a uint8 array"),
    ("crops", lambda a: np.zeros((4, 5, 12, 3), np.uint8)[:, :, ::2], "crops must be C-contiguous"),
    ("crops", lambda a: a[..., :2].copy(), "crops's dimension 3 must be 3"),
    ("crops", lambda a: a[0], "crops must have 4 dimensions"),
    ("crops", lambda a: [[1]], "crops must be a uint8 array, got list"),
    ("out", lambda a: a.astype(np.float64), "out must be a float32 or uint8 array"),
    ("out", lambda a: a[:, :4].copy(), "out's dimension 1 must be 5"),
    ("out", lambda a: np.zeros((4, 5, 12, 3), np.float32)[:, :, ::2], "out must be C-contiguous"),
    ("out", lambda a: np.frombuffer(bytes(a.nbytes), np.float32).reshape(a.shape),
     "out must be a float32 or uint8 array (writable)"),
    ("ops", lambda a: a.astype(np.int64), "ops must be an int32 array"),
    ("ops", lambda a: a[:3].copy(), "ops's dimension 0 must be 4"),
    ("ops", lambda a: np.where(a == a[0, 0], 0, a).astype(np.int32), "ops[0, 0] is 0, not an op code (1..6)"),
    ("ops", lambda a: np.full_like(a, 7), "ops[0, 0] is 7, not an op code"),
    ("params", lambda a: a[..., :5].copy(), "params's dimension 2 must be 6"),
    ("params", lambda a: a[:, :-1].copy(), "params's dimension 1 must be"),
    ("params", lambda a: a.astype(np.float32), "params must be a float64 array"),
    ("positions", lambda a: a.astype(np.int32), "positions must be an int64 array"),
    ("positions", lambda a: a[:3].copy(), "positions's dimension 0 must be 4"),
    ("positions", lambda a: np.array([0, 1, 4, 2]), "positions[2] is 4, not a slot of out (0..3)"),
    ("positions", lambda a: np.array([0, -1, 3, 2]), "positions[1] is -1"),
])
def test_bad_arrays_are_refused_naming_what_is_wrong(name, bad, says):
    args = _good()
    before = args["out"].copy()
    args[name] = bad(args[name])
    with pytest.raises(ValueError, match=f"^{re.escape(says)}"):
        _photometric.apply_chunk(args["crops"], args["out"], args["ops"], args["params"], args["positions"])
    if name != "out":
        np.testing.assert_array_equal(args["out"], before)  # refused before anything is written

