"""The numbers the photometric ops share with their C kernels, as augment/photometric.h defines them:
torchvision's luma weights, each op's code in the extension's arrays and the numbers in an op's slot.

Every form of an op reads them from here (color.py's torch and OpenCV forms, its encodings for the
kernels); the extension exports the header's own values, and tests/test_photometric.py checks that
they are these.
"""

from __future__ import annotations

import numpy as np

GRAY = (0.2989, 0.587, 0.114)  # ITU-R 601-2 luma, torchvision's weights (the kernels hold them in float32)
BRIGHTNESS, CONTRAST, SATURATION, HUE, GRAYSCALE, NORMALIZE = range(1, 7)
PARAMS = 6  # numbers per op slot (Normalize's 1/std and -mean/std of r, g, b)


def slots(values: np.ndarray) -> np.ndarray:
    """(n, k) single values as (n, k, PARAMS) slots, the value first."""
    out = np.zeros((*values.shape, PARAMS))
    out[..., 0] = values
    return out
