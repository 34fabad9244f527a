"""The device abstraction: owns synchronisation, so no code path calls CUDA sync on a CPU run."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.config import device_spec
from harness.errors import UsageError


@dataclass(frozen=True)
class Device:
    """Where the core runs. `synchronize` is a no-op on CPU (never touches torch.cuda)."""

    kind: str  # cpu | cuda
    index: int = 0

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu") if self.kind == "cpu" else torch.device("cuda", self.index)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def synchronize(self) -> None:
        """Wait for queued device work; on CPU there is nothing queued."""
        if self.is_cuda:
            torch.cuda.synchronize(self.index)

    def synchronize_stream(self) -> None:
        """Wait for the work queued on the calling thread's current stream only (other streams, e.g. the
        overlapped workers' preprocessing, keep running); nothing on CPU."""
        if self.is_cuda:
            torch.cuda.current_stream(self.index).synchronize()

    def name(self) -> str:
        if self.is_cuda:
            return torch.cuda.get_device_name(self.index)
        return "cpu"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


def parse_device(spec: str) -> Device:
    """'cpu', 'cuda', 'cuda:1' -> Device; a CUDA device that is not there is a usage error."""
    kind, index = device_spec(spec)
    if kind == "cpu":
        return Device("cpu")
    if not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but torch sees no CUDA device; use --device cpu")
    if index >= torch.cuda.device_count():
        raise UsageError(f"--device {spec.strip().lower()}: only {torch.cuda.device_count()} CUDA device(s) present")
    return Device("cuda", index)
