"""Checks of what a model core returns: a NaN or infinity in its raw output fails the cell with one line,
instead of turning into silently dropped candidates (NaN scores never pass a threshold) or boxes clamped
to zero area (inf), i.e. a wrong mAP published with exit 0."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.errors import VaBenchError


class ModelOutputError(VaBenchError):
    """The core produced non-finite numbers."""


def check_finite(raw: Sequence[torch.Tensor], image_ids: Sequence[int]) -> None:
    """Raise ModelOutputError if any raw output holds NaN or inf. One sum per output (a NaN or inf
    anywhere makes the sum non-finite): ~0.3 ms for YOLOX's [8, 3549, 85] on one core, where a full
    isfinite() pass costs ~20 ms; the details are computed only when something is wrong."""
    for k, out in enumerate(raw):
        if not out.is_floating_point() or torch.isfinite(out.sum()):
            continue
        bad = ~torch.isfinite(out)
        if not bad.any():  # finite values whose sum overflowed: not an error of the model
            continue
        kind = "NaN" if torch.isnan(out).any() else "inf"
        per_image = bad.reshape(out.shape[0], -1).any(dim=1).nonzero().flatten().tolist() if out.dim() else []
        ids = ", ".join(str(image_ids[i]) for i in per_image[:5] if i < len(image_ids))
        more = f" (+{len(per_image) - 5} more)" if len(per_image) > 5 else ""
        raise ModelOutputError(f"model output {k} {list(out.shape)} has {kind} values (images {ids}{more}); "
                               "the weights or the export are broken")
