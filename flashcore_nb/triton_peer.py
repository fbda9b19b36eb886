"""The Triton peer: the project's own FlashAttention forward in Triton, timed as a baseline.

It is what a fair engineer writes in an afternoon: one program per (query tile, batch x head), the
online softmax in exp2 with the scale folded in, the key tiles that need no mask run without one,
and the tile sizes, warps and pipeline depth left to Triton's autotuner. The chapters time it beside
SDPA so that readers see what a short high-level kernel reaches, and when ours passes it.

Importing this module needs `triton` (it ships with CUDA builds of PyTorch); bench.py times the
peer only where that import works."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634

# (BLOCK_M, BLOCK_N, warps, stages): the fastest of a 24-configuration sweep on the H100 over the
# timing shapes (64 or 128 rows, 64 or 128 keys, 4 or 8 warps, 2-4 stages). Configurations that do not
# fit a GPU's shared memory are skipped by the autotuner, so one list serves every GPU.
_CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
            for m, n, w, s in [(64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3),
                               (128, 64, 8, 4)]]


def _graph_time(kernel_call, quantiles=None):
    """The autotuner's timer, measuring as bench.py measures every method: CUDA-graph replays of
    back-to-back calls, inputs warm in L2. (Triton's own do_bench clears L2 before every call.)"""
    from .bench import gpu_time_us
    times = torch.tensor(gpu_time_us(kernel_call, repeats=5)["gpu_us_all"])
    return times.median().item() if quantiles is None else times.quantile(torch.tensor(quantiles)).tolist()


@triton.jit
def _attend(acc, m_i, l_i, q, k_ptrs, v_ptrs, offs_m, offs_n, start, end, seqlen_k, stride_k, stride_v,
            scale_log2, CAUSAL_MASK: tl.constexpr, BOUNDS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key tiles [start, end) into the running (acc, max, sum); masks only what the caller asks for."""
    k_ptrs += start * stride_k
    v_ptrs += start * stride_v
    for n0 in range(start, end, BLOCK_N):
        keys = n0 + offs_n
        if BOUNDS:
            k = tl.load(k_ptrs, mask=keys[None, :] < seqlen_k, other=0.0)
            v = tl.load(v_ptrs, mask=keys[:, None] < seqlen_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = tl.dot(q, k)
        if BOUNDS:
            s = tl.where(keys[None, :] < seqlen_k, s, float("-inf"))
        if CAUSAL_MASK:
            s = tl.where(offs_m[:, None] >= keys[None, :], s, float("-inf"))
        # The max in log2 units is the raw max times the (positive) scale, so each score costs one
        # fused multiply-add before exp2, not a multiply and a subtraction.
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2)
        p = tl.math.exp2(s * scale_log2 - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
        k_ptrs += BLOCK_N * stride_k
        v_ptrs += BLOCK_N * stride_v
    return acc, m_i, l_i


# Keyed on the whole problem, batch and heads too: the mission shape (8 heads of 512) and 16x16 heads
# of 512 share their lengths but not their best tiles.
@triton.autotune(configs=_CONFIGS, key=["batch", "heads", "seqlen_q", "seqlen_k", "HEAD_DIM", "CAUSAL"],
                 do_bench=_graph_time)
@triton.jit
def _forward(Q, K, V, O, scale_log2, sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
             batch, heads, seqlen_q, seqlen_k, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tile = tl.program_id(0)
    if CAUSAL:   # longest first: the last query tile sees every key
        tile = tl.num_programs(0) - 1 - tile
    b, head = tl.program_id(1) // heads, tl.program_id(1) % heads
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * sqb + head * sqh + offs_m[:, None] * sqs + offs_d[None, :],
                mask=offs_m[:, None] < seqlen_q, other=0.0)
    k_ptrs = K + b * skb + head * skh + offs_n[None, :] * sks + offs_d[:, None]   # K^T tile
    v_ptrs = V + b * svb + head * svh + offs_n[:, None] * svs + offs_d[None, :]
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # Keys below `full` need no mask: whole tiles, inside seqlen_k, left of every row's diagonal.
    if CAUSAL:
        last = tl.minimum(seqlen_k, (tile + 1) * BLOCK_M)
        full = tl.minimum(last, tile * BLOCK_M) // BLOCK_N * BLOCK_N
    else:
        last = seqlen_k
        full = seqlen_k // BLOCK_N * BLOCK_N
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_ptrs, v_ptrs, offs_m, offs_n, 0, full, seqlen_k, sks, svs,
                            scale_log2, False, False, BLOCK_N)
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_ptrs, v_ptrs, offs_m, offs_n, full, last, seqlen_k, sks, svs,
                            scale_log2, CAUSAL, True, BLOCK_N)
    out = acc / l_i[:, None]
    tl.store(O + b * sob + head * soh + offs_m[:, None] * sos + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=offs_m[:, None] < seqlen_q)


def attention(q, k, v, causal: bool = False, scale: float | None = None, out=None):
    """softmax(q kᵀ · scale) v for (B, H, S, D) CUDA tensors, D 64 or 128, fp16 or bf16; causal is
    top-left aligned, as in SDPA."""
    if not all(isinstance(t, torch.Tensor) and t.is_cuda for t in (q, k, v)):
        raise ValueError("the Triton peer needs CUDA tensors")
    if q.dtype not in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"the Triton peer takes fp16 or bf16 q, k, v of one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if (q.dim() != 4 or k.shape != v.shape or q.shape[-1] not in (64, 128) or k.dim() != 4
            or (k.shape[0], k.shape[1], k.shape[3]) != (q.shape[0], q.shape[1], q.shape[3])):
        raise ValueError(f"the Triton peer takes (B, H, S, D) tensors with D 64 or 128; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if any(t.stride(3) != 1 for t in (q, k, v)):
        raise ValueError("the Triton peer needs a contiguous last dimension")
    batch, heads, seqlen_q, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if scale <= 0:
        raise ValueError(f"the Triton peer takes a positive softmax scale; got {scale}")
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out

    def grid(meta):
        return triton.cdiv(seqlen_q, meta["BLOCK_M"]), batch * heads

    _forward[grid](q, k, v, out, scale * LOG2E, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                   *out.stride()[:3], batch, heads, seqlen_q, k.shape[2], HEAD_DIM=head_dim, CAUSAL=bool(causal))
    return out
