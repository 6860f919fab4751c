"""One RandomResizedCrop rule (stoker/boxes.py): stoker.augment's op cuts the boxes stoker.Loader's
crop_box cuts from the same uniforms, fallback included."""

from __future__ import annotations

import numpy as np

import stoker.augment as A
from stoker.decode.crops import CROP_TRIES, CropSpec, crop_box


def test_augment_cuts_the_loaders_boxes_from_the_same_numbers():
    heights, widths = np.array([375, 60, 20, 400, 1, 333, 480]), np.array([500, 80, 400, 20, 1, 333, 640])
    out, scale, ratio = (24, 32), (0.3, 0.9), (0.5, 2.0)
    matrices, (out_h, out_w) = A.RandomResizedCrop(out, scale, ratio).draw(np.random.default_rng(7), (heights, widths))
    assert (out_h == 24).all() and (out_w == 32).all()
    tries = np.random.default_rng(7).random((len(heights), CROP_TRIES, 4))  # what the op drew, in its order
    spec = CropSpec(size=out, scale=scale, ratio=ratio)
    for i, (h, w) in enumerate(zip(heights.tolist(), widths.tolist())):
        top, left, ch, cw = crop_box(spec, h, w, tries[i])
        # the op's map takes output pixel (x, y) to (left + x * cw / out_w, top + y * ch / out_h)
        assert (matrices[i, 1, 2], matrices[i, 0, 2]) == (top, left)
        assert np.allclose((matrices[i, 1, 1] * out[0], matrices[i, 0, 0] * out[1]), (ch, cw), rtol=0, atol=1e-9)
    # 20 x 400 fits no box of aspect <= 2 and area >= 30%: the central fallback, aspect clamped to 2
    assert crop_box(spec, 20, 400, tries[2]) == (0, 180, 20, 40)
