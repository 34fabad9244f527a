"""Bilinear resizing written out in numpy: the reference the mask work is checked against."""

from __future__ import annotations

import numpy as np


def bilinear(values: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[n, h, w] -> [n, H, W] in float64: bilinear with half-pixel centres, edges clamped, no antialiasing."""
    def axis(n_in: int, n_out: int):
        src = np.maximum((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0)
        low = np.minimum(np.floor(src).astype(int), n_in - 1)
        return low, np.minimum(low + 1, n_in - 1), src - low

    (y0, y1, fy), (x0, x1, fx) = axis(values.shape[1], size[0]), axis(values.shape[2], size[1])
    rows = values[:, y0] * (1 - fy)[None, :, None] + values[:, y1] * fy[None, :, None]
    return rows[:, :, x0] * (1 - fx)[None, None, :] + rows[:, :, x1] * fx[None, None, :]
