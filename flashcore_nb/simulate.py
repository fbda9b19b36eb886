"""A CPU model of the 32x32 tiled kernels' arithmetic, for chapter 4's experiment without a GPU.

It follows phase 4 tile by tile: fp16 inputs, S = Q·Kᵀ in fp32, online softmax in fp32, P rounded
to fp16 or kept in fp32, O accumulated in fp32, output rounded to fp16 — and, optionally, the
original project's padding bug applied to every Q and V tile exactly as the teaching variant of
kernels/p04_fp32p.cu does it. It is a model (CPU matmuls sum in another order than tensor cores),
so its errors match the kernel's in size, not bit for bit."""
from __future__ import annotations

import math

import pandas as pd
import torch

from .reference import attention_fp64
from .shapes import Case

BLOCK = 32                      # phase 4's BLOCK_M = BLOCK_N
VARIANTS = {                    # label -> (P kept in fp32, padding bug)
    "FP16 P": (False, False),
    "FP32 P": (True, False),
    "padding bug (teaching)": (False, True),
}


def pitch(head_dim: int) -> int:
    """Row pitch of a padded fp16 tile in elements: 16 bytes of padding, as in the kernels."""
    return head_dim + 8


def wrong_stride_pad_mask(valid_rows: int, head_dim: int) -> torch.Tensor:
    """(BLOCK, head_dim) bool: the elements the buggy pad loop zeroes. The loop zeroes flat indices
    valid_rows * D .. BLOCK * pitch of a tile whose rows are `pitch` apart."""
    rows = torch.arange(BLOCK)[:, None]
    cols = torch.arange(head_dim)[None, :]
    return rows * pitch(head_dim) + cols >= min(valid_rows, BLOCK) * head_dim


def _tiles(x: torch.Tensor, padding_bug: bool) -> torch.Tensor:
    """(B, H, S, D) -> (B, H, T, BLOCK, D), zero-filled past S, with the bug applied if asked."""
    b, h, s, d = x.shape
    n = math.ceil(s / BLOCK)
    tiles = torch.zeros(b, h, n * BLOCK, d, dtype=x.dtype)
    tiles[:, :, :s] = x
    tiles = tiles.view(b, h, n, BLOCK, d)
    if padding_bug:
        masks = torch.stack([wrong_stride_pad_mask(s - t * BLOCK, d) for t in range(n)])
        tiles = tiles.masked_fill(masks, 0.0)
    return tiles


def tiled_attention(q, k, v, p_fp32: bool = False, padding_bug: bool = False,
                    round_output: bool = True) -> torch.Tensor:
    """Non-causal attention of fp16 (B, H, S, D) CPU tensors as the 32x32 kernel computes it
    (round_output=False returns the fp32 result before the final rounding to fp16)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    sq, sk = q.shape[2], k.shape[2]
    q_tiles = _tiles(q.float(), padding_bug)                    # (B, H, Tq, BLOCK, D)
    k_tiles = _tiles(k.float(), False)                          # K is not touched by the bug
    v_tiles = _tiles(v.float(), padding_bug)
    shape = q_tiles.shape[:-1] + (1,)
    row_max = torch.full(shape, -torch.inf)
    row_sum = torch.zeros(shape)
    out = torch.zeros(q_tiles.shape)
    for t in range(k_tiles.shape[2]):
        s = q_tiles @ k_tiles[:, :, t, None].transpose(-1, -2) * scale     # (B, H, Tq, BLOCK, BLOCK)
        keys = t * BLOCK + torch.arange(BLOCK)
        s = s.masked_fill(keys >= sk, -torch.inf)
        new_max = torch.maximum(row_max, s.amax(-1, keepdim=True))
        p = torch.exp(s - new_max)
        correction = torch.exp(row_max - new_max)
        row_sum = row_sum * correction + p.sum(-1, keepdim=True)
        p_used = p if p_fp32 else p.half().float()
        out = out * correction + p_used @ v_tiles[:, :, t, None]
        row_max = new_max
    out = (out / row_sum).flatten(2, 3)[:, :, :sq]
    return out.half() if round_output else out


def error_sources(case: Case, seed: int = 0) -> pd.DataFrame:
    """Split the kernel's error into its sources: rounding P to fp16 alone, rounding the output to
    fp16 alone, and both (max |error| vs float64)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*case.shape[:3], case.head_dim, generator=gen).half() for _ in range(3))
    reference = attention_fp64(q, k, v)

    def err(out):
        return float((out.double() - reference).abs().max())
    return pd.DataFrame([
        {"source": "fp32 arithmetic only (P and output kept in fp32)",
         "max_abs_err": err(tiled_attention(q, k, v, p_fp32=True, round_output=False))},
        {"source": "+ P rounded to fp16", "max_abs_err": err(tiled_attention(q, k, v, round_output=False))},
        {"source": "+ output rounded to fp16 (P in fp32)", "max_abs_err": err(tiled_attention(q, k, v, p_fp32=True))},
        {"source": "both: what phase 3 does", "max_abs_err": err(tiled_attention(q, k, v))},
    ])


def precision_table(cases: list[Case], seeds=(0, 1)) -> pd.DataFrame:
    """Max |error| vs float64 per variant, case and seed: the CPU half of chapter 4's experiment."""
    rows = []
    for case in cases:
        for seed in seeds:
            gen = torch.Generator().manual_seed(seed)
            q, k, v = (torch.randn(*case.shape[:3], case.head_dim, generator=gen).half() for _ in range(3))
            reference = attention_fp64(q, k, v)
            for label, (p_fp32, padding_bug) in VARIANTS.items():
                out = tiled_attention(q, k, v, p_fp32, padding_bug)
                rows.append({"variant": label, "case": case.name, "shape": case.label(), "seed": seed,
                             "max_abs_err": float((out.double() - reference).abs().max())})
    return pd.DataFrame(rows)
