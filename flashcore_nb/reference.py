"""Attention in float64: the ground truth every kernel (and SDPA) is measured against."""
from __future__ import annotations

import math

import torch


def causal_mask(seqlen_q: int, seqlen_k: int, device=None) -> torch.Tensor:
    """True where query i may see key j. Top-left aligned, as PyTorch SDPA: j <= i."""
    return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device).tril()


def attention_fp64(q, k, v, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale [+ mask]) v computed in float64 on q's device; any Sq, Sk >= 1."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)
