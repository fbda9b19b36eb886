"""Attention in float64: the ground truth every kernel (and SDPA) is measured against."""
from __future__ import annotations

import math

import torch


def causal_mask(seqlen_q: int, seqlen_k: int, device=None) -> torch.Tensor:
    """True where query i may see key j. Top-left aligned, as PyTorch SDPA: j <= i."""
    return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device).tril()


# Query rows are independent, so the reference takes them in blocks whose float64 scores stay under this
# many elements (2 GiB): the grid's largest problem (4 x 16 x 8192 keys) would otherwise need 34 GB per copy.
MAX_SCORE_ELEMENTS = 1 << 28


def attention_fp64(q, k, v, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale [+ mask]) v computed in float64 on q's device; any Sq, Sk >= 1."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    seqlen_q, seqlen_k = q.shape[-2], k.shape[-2]
    rows = max(1, MAX_SCORE_ELEMENTS // (q[..., 0, 0].numel() * seqlen_k))
    out = torch.empty_like(q)
    visible = causal_mask(seqlen_q, seqlen_k, q.device) if causal else None
    for start in range(0, seqlen_q, rows):
        stop = min(start + rows, seqlen_q)
        scores = torch.matmul(q[..., start:stop, :], k.transpose(-2, -1)) * scale
        if causal:
            scores = scores.masked_fill(~visible[start:stop], float("-inf"))
        out[..., start:stop, :] = torch.matmul(torch.softmax(scores, dim=-1), v)
    return out


def chunked_online_attention(q, k, v, chunk: int = 128, causal: bool = False, scale: float | None = None):
    """Phase 1's algorithm in float32 on the CPU, one query row at a time: keys in chunks, a running
    max and sum, the output rescaled whenever the max grows. Same function as `attention_fp64`."""
    q, k, v = (t.to(torch.float32) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    seqlen_q, seqlen_k = q.shape[-2], k.shape[-2]
    out = torch.empty_like(q)
    for i in range(seqlen_q):
        kv_end = min(seqlen_k, i + 1) if causal else seqlen_k
        row_max = torch.full(q.shape[:-2], float("-inf"))
        row_sum = torch.zeros(q.shape[:-2])
        acc = torch.zeros(*q.shape[:-2], q.shape[-1])
        for start in range(0, kv_end, chunk):
            scores = torch.einsum("...d,...nd->...n", q[..., i, :], k[..., start:min(start + chunk, kv_end), :]) * scale
            new_max = torch.maximum(row_max, scores.amax(-1))
            probs = torch.exp(scores - new_max[..., None])
            correction = torch.exp(row_max - new_max)
            row_sum = row_sum * correction + probs.sum(-1)
            acc = acc * correction[..., None] + torch.einsum("...n,...nd->...d", probs, v[..., start:start + probs.shape[-1], :])
            row_max = new_max
        out[..., i, :] = acc / row_sum[..., None]
    return out
