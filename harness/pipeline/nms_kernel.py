"""torchvision's NMS kernel without importing torchvision's Python package.

`torchvision.ops.nms` is a thin wrapper around `torch.ops.torchvision.nms`, which torchvision's C++ extension
registers. Importing the package to reach it costs ~2 s of every run's start on the reference box
(`torchvision.ops` pulls in `torch._dynamo` through roi_align): more than a cell's whole evaluation. A run that
needs nothing else of torchvision loads the extension alone, found the way torchvision's own loader finds it.
Where torchvision is imported already, or its extension is not found there, `torchvision.ops.nms` itself: the
same kernel either way.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from functools import cache

import torch

# The extension's name: "_C_stable" since torchvision built it against torch's stable ABI, "_C" before
EXTENSIONS = ("_C_stable", "_C")


@cache
def _kernel() -> Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]:
    if "torchvision" not in sys.modules:
        spec = importlib.util.find_spec("torchvision")
        folders = list(spec.submodule_search_locations or []) if spec else []
        for folder in folders:
            finder = importlib.machinery.FileFinder(
                folder, (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES))
            for name in EXTENSIONS:
                found = finder.find_spec(name)
                if found is not None and found.origin:
                    try:
                        torch.ops.load_library(found.origin)
                    except OSError:
                        continue
                    return torch.ops.torchvision.nms
    from torchvision.ops import nms as torchvision_nms

    return torchvision_nms


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """`torchvision.ops.nms`: indices of the boxes kept, by decreasing score."""
    return _kernel()(boxes, scores, iou_threshold)
