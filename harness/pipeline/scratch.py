"""How much memory the whole-batch letterbox and NMS may take for their scratch tensors.

Both trade memory for Python calls: the fewer chunks a batch goes in, the fewer tensor operations it costs, and the
larger their temporaries. A run's peak VRAM includes them, so their share is bounded by the device: 1 % of its memory
(1.4 GB on an H200, 240 MB on a 24 GB card, 80 MB on an 8 GB Jetson; a smaller budget means more chunks, never other
results). On the host (tests, a CPU forced to the whole-batch ways) a fixed 256 MiB.
"""

from __future__ import annotations

from functools import cache

import torch

DEVICE_SHARE = 0.01
HOST_BYTES = 256 << 20


@cache
def scratch_bytes(device: torch.device) -> int:
    """The scratch budget, in bytes, of the whole-batch ways on `device`."""
    if device.type != "cuda":
        return HOST_BYTES
    return int(torch.cuda.get_device_properties(device).total_memory * DEVICE_SHARE)
