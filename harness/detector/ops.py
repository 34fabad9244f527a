"""Tensor operations that decoders and the shared post-processing both use."""

from __future__ import annotations

import torch


def top_k_per_group(scores: torch.Tensor, groups: torch.Tensor, k: int | None) -> torch.Tensor:
    """Indices of the `k` best scores of each group (all with k None), ordered by group, best first
    (ties keep their order: stable sorts). One sort for all groups instead of a topk per group."""
    order = torch.argsort(scores, descending=True, stable=True)
    order = order[torch.argsort(groups[order], stable=True)]
    if k is None:
        return order
    sorted_groups = groups[order]
    _, counts = torch.unique_consecutive(sorted_groups, return_counts=True)
    starts = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    rank = torch.arange(order.numel(), device=order.device) - starts
    return order[rank < k]
