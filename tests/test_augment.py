"""stoker.augment on CPU: each op against a plain per-sample reference, parameters per sample,
seeds, clips, precisions, layouts and the device policy; where CUDA is present, the GPU against
the CPU. The CPU tests pin device="cpu": on a machine with a GPU the default device is CUDA."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import stoker.augment as A
from stoker.augment.color import adjust_brightness, adjust_contrast, adjust_hue, adjust_saturation, gaussian_blur, gray
from stoker.augment.device import pick_device

GRAY = torch.tensor([0.2989, 0.587, 0.114]).view(1, 3, 1, 1)


@pytest.fixture(params=["opencv", "torch"])
def backend(request):
    """Both backends compute the same thing on the CPU: OpenCV image by image, torch batched (the GPU's)."""
    return request.param


def make(backend, *ops, **kwargs):
    return A.Augment(*ops, backend=backend, **{"device": "cpu", **kwargs})


def photos(n: int = 6, h: int = 40, w: int = 56, seed: int = 0) -> torch.Tensor:
    """Smooth random colour images (n, 3, h, w) uint8: blurred noise, so interpolation is tested on texture."""
    g = torch.Generator().manual_seed(seed)
    small = torch.rand((n, 3, h // 4, w // 4), generator=g)
    return (F.interpolate(small, size=(h, w), mode="bicubic", align_corners=False).clamp(0, 1) * 255).round().to(torch.uint8)


def ramps(n: int, h: int, w: int) -> torch.Tensor:
    """Images whose channels hold each pixel's own x and y (pixel centres) and 1: bilinear
    sampling of a ramp is exact, so an output pixel tells where in the source it was taken."""
    y, x = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    return torch.stack([x, y, torch.ones_like(x)]).expand(n, 3, h, w).contiguous()


def test_flips_and_a_quarter_turn_match_torch_exactly(backend):
    x = photos().float() / 255
    assert torch.allclose(make(backend, A.HorizontalFlip(p=1))(x), x.flip(-1), atol=1e-6)
    assert torch.allclose(make(backend, A.VerticalFlip(p=1))(x), x.flip(-2), atol=1e-6)
    square = photos(h=48, w=48).float() / 255
    turned = make(backend, A.Rotate((90, 90)))(square)
    assert torch.allclose(turned, torch.rot90(square, 1, dims=(-2, -1)), atol=1e-5)  # counter-clockwise


def test_random_resized_crop_cuts_a_box_per_sample_and_resizes_it_bilinearly(backend):
    n, h, w, out = 32, 60, 80, (24, 24)
    op = A.RandomResizedCrop(out, scale=(0.2, 0.9))
    where = make(backend, op, seed=4)(ramps(n, h, w))
    images = photos(n, h, w).float() / 255
    ours = make(backend, op, seed=4)(images)  # the same seed: the same boxes
    boxes = set()
    for i in range(n):
        # x and y sampled at the first and last output pixel centres give the box
        x0, x1 = float(where[i, 0, 0, 0]), float(where[i, 0, 0, -1])
        y0, y1 = float(where[i, 1, 0, 0]), float(where[i, 1, -1, 0])
        bw, bh = (x1 - x0) * out[1] / (out[1] - 1), (y1 - y0) * out[0] / (out[0] - 1)
        left, top = round(x0 - bw / out[1] / 2), round(y0 - bh / out[0] / 2)
        bw, bh = round(bw), round(bh)
        assert 0.2 * h * w - 1e-6 <= bw * bh <= 0.9 * h * w * 1.05 and 3 / 4 * 0.9 <= bw / bh <= 4 / 3 * 1.1
        assert 0 <= left and left + bw <= w and 0 <= top and top + bh <= h
        boxes.add((top, left, bh, bw))
        reference = F.interpolate(images[i : i + 1, :, top : top + bh, left : left + bw], size=out, mode="bilinear",
                                  align_corners=False)
        assert torch.allclose(ours[i : i + 1], reference, atol=2e-5)
    assert len(boxes) > n // 2  # parameters differ across samples


def test_geometric_ops_are_fused_in_order(backend):
    # crop then flip then rotate by 180 degrees: the same as the crop flipped vertically
    x = photos(4, 32, 32).float() / 255
    fused = make(backend, A.CenterCrop(16, fraction=0.5), A.HorizontalFlip(p=1), A.Rotate((180, 180)))(x)
    crop = make(backend, A.CenterCrop(16, fraction=0.5))(x)
    assert torch.allclose(fused, crop.flip(-2), atol=1e-5)


def test_colour_ops_match_a_per_sample_reference():
    x = photos(5).float() / 255
    factors = torch.tensor([0.5, 0.8, 1.0, 1.3, 1.7])
    for i, f in enumerate(factors):
        one = x[i : i + 1]
        assert torch.allclose(adjust_brightness(x, factors)[i], (one * f).clamp(0, 1)[0], atol=1e-6)
        mean = (one * GRAY).sum(1, keepdim=True).mean()
        assert torch.allclose(adjust_contrast(x, factors)[i], (f * one + (1 - f) * mean).clamp(0, 1)[0], atol=1e-6)
        luma = (one * GRAY).sum(1, keepdim=True)
        assert torch.allclose(adjust_saturation(x, factors)[i], (f * one + (1 - f) * luma).clamp(0, 1)[0], atol=1e-6)
    assert torch.allclose(gray(x), (x * GRAY).sum(1, keepdim=True), atol=1e-6)


def test_hue_matches_colorsys_per_pixel():
    x = photos(4, 8, 8).float() / 255
    shifts = torch.tensor([-0.4, -0.1, 0.0, 0.25])
    ours = adjust_hue(x, shifts)
    for i, shift in enumerate(shifts.tolist()):
        for yy in range(8):
            for xx in range(8):
                h, s, v = colorsys.rgb_to_hsv(*x[i, :, yy, xx].tolist())
                expected = colorsys.hsv_to_rgb((h + shift) % 1.0, s, v)
                assert np.allclose(ours[i, :, yy, xx].numpy(), expected, atol=1e-5)


def test_blur_matches_a_per_sample_convolution():
    x = photos(3).float() / 255
    sigma = torch.tensor([0.0, 0.8, 2.0])
    ours = gaussian_blur(x, 7, sigma)
    assert torch.equal(ours[0], x[0])  # sigma 0: untouched
    for i in (1, 2):
        t = torch.arange(-3, 4, dtype=torch.float32)
        k = torch.exp(-0.5 * (t / sigma[i]) ** 2)
        k = torch.outer(k, k) / k.sum() ** 2
        padded = F.pad(x[i : i + 1], (3, 3, 3, 3), mode="reflect")
        reference = F.conv2d(padded, k.expand(3, 1, 7, 7), groups=3)
        assert torch.allclose(ours[i : i + 1], reference, atol=1e-5)


def test_probabilities_apply_per_sample(backend):
    x = photos(64, 16, 16).float() / 255
    assert torch.equal(make(backend, A.ColorJitter(brightness=0.5, p=0.0), seed=0)(x), x)
    flipped = make(backend, A.HorizontalFlip(p=0.5), seed=1)(x)
    changed = [not torch.allclose(flipped[i], x[i], atol=1e-5) for i in range(64)]
    assert 16 < sum(changed) < 48
    assert all(torch.allclose(flipped[i], x[i].flip(-1), atol=1e-5) for i in range(64) if changed[i])
    gray_ones = make(backend, A.Grayscale(p=0.5), seed=2)(x)
    is_gray = [bool((gray_ones[i] - gray_ones[i, :1]).abs().max() < 1e-6) for i in range(64)]
    assert 16 < sum(is_gray) < 48


def test_same_seed_same_output_and_each_call_draws_anew(backend):
    x = photos(8)
    ops = (A.RandomResizedCrop(24), A.HorizontalFlip(), A.Rotate(30), A.ColorJitter(0.4, 0.4, 0.4, 0.1), A.Normalize())
    first, second = make(backend, *ops, seed=7), make(backend, *ops, seed=7)
    a = first(x)
    assert torch.equal(a, second(x))
    assert not torch.equal(a, first(x))  # the next call, new parameters
    assert not torch.equal(a, make(backend, *ops, seed=8)(x))


def test_a_clip_shares_one_parameter_set_across_its_frames(backend):
    frames = photos(3, 32, 32)
    clips = frames.unsqueeze(1).expand(3, 5, 3, 32, 32)  # (B, T, C, H, W): 5 identical frames per clip
    out = make(backend, A.RandomResizedCrop(16), A.HorizontalFlip(), A.Rotate(45), A.ColorJitter(0.5, 0.5, 0.5, 0.2),
                    seed=3)(clips)
    assert out.shape == (3, 5, 3, 16, 16)
    for clip in out:
        assert torch.allclose(clip, clip[:1].expand_as(clip), atol=1e-6)
    assert not torch.allclose(out[0, 0], out[1, 0], atol=0.05)


def test_layouts_dtypes_and_memory_format(backend):
    x = photos(4)
    ops = (A.RandomResizedCrop(16), A.Rotate(20), A.ColorJitter(0.3, 0.3, 0.3, 0.05), A.Normalize())
    nchw = make(backend, *ops, seed=1)(x)
    nhwc = make(backend, *ops, seed=1)(x.permute(0, 2, 3, 1).contiguous())
    assert torch.equal(nchw, nhwc)
    assert nchw.shape == (4, 3, 16, 16) and nchw.is_contiguous(memory_format=torch.channels_last)
    assert make(backend, *ops, seed=1, channels_last=False)(x).is_contiguous()
    half = make(backend, *ops, seed=1, dtype=torch.float16)(x)
    assert half.dtype == torch.float16
    assert torch.allclose(half.float(), nchw, atol=0.05)  # normalized values: ~1/255 of the range


def test_images_of_different_sizes_become_one_batch(backend):
    images = [photos(1, h, w)[0] for h, w in ((30, 40), (64, 48), (20, 20))]
    out = make(backend, A.RandomResizedCrop(16), A.HorizontalFlip(), seed=0)(images)
    assert out.shape == (3, 3, 16, 16)
    with pytest.raises(ValueError, match="one output size"):
        make(backend, A.HorizontalFlip())(images)


def test_bad_pipelines_are_refused():
    with pytest.raises(ValueError, match="before photometric"):
        A.Augment(A.ColorJitter(0.1), A.HorizontalFlip())
    with pytest.raises(TypeError, match="not an augmentation"):
        A.Augment(lambda x: x)
    with pytest.raises(ValueError, match="kernel_size"):
        A.GaussianBlur(4)


def test_device_policy():
    assert pick_device(None, 0, None) == torch.device("cpu")
    assert pick_device("3", 0, None) == torch.device("cpu")  # no GPU: the CPU, whatever the rank
    assert pick_device("3", 8, 0) == torch.device("cuda", 3)  # torchrun: the rank's own GPU, not GPU 0
    assert pick_device("9", 8, 0) == torch.device("cuda", 1)  # more ranks than GPUs: shared in turn
    assert pick_device(None, 8, 5) == torch.device("cuda", 5)  # no rank: the current device
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        pick_device("x", 2, 0)
    if not torch.cuda.is_available():
        assert A.default_device() == torch.device("cpu")


@pytest.mark.torchvision
def test_ops_match_torchvision_where_installed():
    v2 = pytest.importorskip("torchvision.transforms.v2.functional", reason="needs torchvision (make test: .venv-tv)")
    x = photos(3).float() / 255
    factors = torch.tensor([0.6, 1.0, 1.4])
    for i, f in enumerate(factors.tolist()):
        assert torch.allclose(adjust_brightness(x, factors)[i], v2.adjust_brightness(x[i], f), atol=1e-5)
        assert torch.allclose(adjust_contrast(x, factors)[i], v2.adjust_contrast(x[i], f), atol=1e-5)
        assert torch.allclose(adjust_saturation(x, factors)[i], v2.adjust_saturation(x[i], f), atol=1e-5)
        assert torch.allclose(adjust_hue(x, factors - 1)[i], v2.adjust_hue(x[i], f - 1), atol=1e-4)


def test_both_backends_give_the_same_batch():
    x = photos(8)
    ops = (A.RandomResizedCrop(24, scale=(0.3, 1.0)), A.HorizontalFlip(), A.Rotate(25), A.ColorJitter(0.4, 0.4, 0.4, 0.1),
           A.Grayscale(0.3), A.GaussianBlur(5, p=0.5), A.Normalize())
    ours = A.Augment(*ops, seed=2, backend="opencv", device="cpu")(x)
    batched = A.Augment(*ops, seed=2, backend="torch", device="cpu")(x)
    # OpenCV rounds the warped uint8 image and weighs neighbours in 1/32 pixel steps; a hue shift
    # magnifies such differences on nearly gray pixels (units: normalized, ~4.4 per [0, 1])
    difference = (ours - batched).abs().flatten()
    assert difference.mean() < 0.01 and torch.quantile(difference, 0.99) < 0.1 and difference.max() < 0.5


def test_hue_shifts_both_ways_agree_across_backends():
    x = photos(16)
    ours = A.Augment(A.ColorJitter(hue=0.5), seed=4, backend="opencv", device="cpu")(x)
    batched = A.Augment(A.ColorJitter(hue=0.5), seed=4, backend="torch", device="cpu")(x)
    assert ours.min() >= 0 and (ours - batched).abs().max() < 1e-3  # negative shifts too


def test_out_receives_the_result(backend):
    x = photos(4)
    aug = make(backend, A.RandomResizedCrop(16), A.ColorJitter(0.3, 0.3), A.Normalize(), seed=0)
    first = aug(x)
    again = make(backend, A.RandomResizedCrop(16), A.ColorJitter(0.3, 0.3), A.Normalize(), seed=0)
    into = torch.empty_like(first)
    assert again(x, out=into) is into and torch.equal(into, first)
    with pytest.raises(ValueError, match="out must be"):
        again(x, out=torch.empty(4, 3, 8, 8))


def test_colour_jitter_applies_its_adjustments_in_an_order_drawn_per_sample(backend):
    from stoker.augment.color import _ORDERS

    x = photos(32).float() / 255
    jitter = A.ColorJitter(brightness=(0.5, 0.7), contrast=0.4, saturation=(1.2, 1.5), hue=0.1)
    aug = make(backend, jitter, seed=3)
    params = aug.draw((np.full(32, 40), np.full(32, 56)), step=0).params[0]
    out = aug(x, step=0)
    assert ((0.5 <= params["brightness"]) & (params["brightness"] <= 0.7)).all()
    assert ((1.2 <= params["saturation"]) & (params["saturation"] <= 1.5)).all()
    orders = params["order"].astype(int)
    assert len(set(orders.tolist())) > 8  # 24 orders, one drawn per sample
    adjust = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
    names = ("brightness", "contrast", "saturation", "hue")
    for i in range(32):
        reference = x[i : i + 1]
        for op in _ORDERS[orders[i]]:
            reference = adjust[op](reference, torch.tensor([params[names[op]][i]], dtype=torch.float32))
        assert torch.allclose(out[i : i + 1], reference, atol=2e-3)  # OpenCV's HSV round trip: ~1e-3


def test_draw_once_then_apply_per_image_gives_the_batch_call():
    x = photos(6, 32, 48)
    ops = (A.Rotate(20), A.ColorJitter(0.4, 0.4, 0.4, 0.1), A.GaussianBlur(5, p=0.5), A.Normalize())
    whole = A.Augment(*ops, seed=5, backend="opencv", device="cpu")(x, step=9)
    aug = A.Augment(*ops, seed=5, backend="opencv", device="cpu")
    draws = aug.draw((np.full(6, 32), np.full(6, 48)), step=9)
    for i in reversed(range(6)):  # any order, any thread
        one = np.empty((32, 48, 3), np.float32)
        aug.apply_image(x[i].permute(1, 2, 0).numpy(), i, draws, one)
        assert torch.equal(torch.from_numpy(one).permute(2, 0, 1), whole[i])


def test_affine_nearest_fill_and_shear_follow_torchvision_conventions(backend):
    x = photos(2, 24, 40).float() / 255
    turned = make(backend, A.Rotate((90, 90), interpolation="nearest", fill=(1.0, 0.0, 0.5)))(x)
    corner = turned[:, :, 0, 0]  # outside a 24x40 image turned a quarter
    assert torch.allclose(corner, torch.tensor([[1.0, 0.0, 0.5]] * 2), atol=1e-6)
    values = set(x.flatten().tolist()) | {0.0, 0.5, 1.0}
    assert set(turned.flatten().tolist()) <= values  # nearest: every value is a source value or the fill
    # a positive x shear moves rows below the centre to the left: torchvision's F.affine gives
    # 21.5956 and 11.4044 at these two pixels of this ramp (bilinear)
    sheared = make(backend, A.Affine(shear=(20, 20)))(ramps(1, 33, 33))
    assert abs(float(sheared[0, 0, 30, 16]) - 21.5956) < 0.05 and abs(float(sheared[0, 0, 2, 16]) - 11.4044) < 0.05
    with pytest.raises(ValueError, match="one fill"):
        A.Augment(A.Rotate(10, fill=0.5), A.Affine(degrees=5, fill=0.2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_gpu_gives_the_cpu_batch(dtype, layout):
    """The torch backend on CUDA draws the same parameters and computes the same batch as on the
    CPU: float32 to rounding; float16 within its precision (sampling runs in float32 there too)."""
    x = photos(16, 96, 128)
    ops = (A.RandomResizedCrop(64), A.HorizontalFlip(), A.Rotate(30), A.ColorJitter(0.4, 0.4, 0.4, 0.1), A.Normalize())
    cpu = A.Augment(*ops, seed=3, device="cpu", backend="torch")(x)
    given = x.permute(0, 2, 3, 1).contiguous() if layout == "NHWC" else x
    gpu = A.Augment(*ops, seed=3, device="cuda", dtype=dtype, backend="torch")(given.cuda())
    assert gpu.device.type == "cuda" and gpu.dtype == dtype and gpu.shape == cpu.shape
    assert gpu.is_contiguous(memory_format=torch.channels_last)
    difference = (gpu.float().cpu() - cpu).abs().flatten()  # normalized units: ~4.4 per [0, 1]
    if dtype == torch.float32:
        assert difference.max() < 1e-3
    else:  # float16 keeps 11 bits; on the CPU (float32 sampling): mean 0.0015, 99.9% 0.017, max 0.039
        assert difference.mean() < 5e-3 and torch.quantile(difference, 0.999) < 0.04 and difference.max() < 0.15
