"""Roofline arithmetic: how many FLOPs attention does per byte it must move, and what the measured
ceilings (peaks.py) allow at that intensity."""
from __future__ import annotations

from .shapes import Case

FP16_BYTES = 2


def min_hbm_bytes(case: Case, bytes_per_element: int = FP16_BYTES) -> float:
    """The least device-memory traffic any attention kernel can have: read Q, K and V once and write O
    once, B·H·(Sq + Sk + Sk + Sq)·D elements. Causal masking removes FLOPs but no bytes: every K and V
    row is still read by some query."""
    elements = case.batch * case.heads * (2 * case.seqlen_q + 2 * case.sk) * case.head_dim
    return float(elements * bytes_per_element)


def intensity(case: Case, bytes_per_element: int = FP16_BYTES) -> float:
    """Arithmetic intensity in FLOP per byte: case.flops() over min_hbm_bytes(). For Sq = Sk = S,
    non-causal, in fp16 it is 4·S²·D / (4·S·D·2) = S/2, whatever B, H and D."""
    return case.flops() / min_hbm_bytes(case, bytes_per_element)


def attainable_tflops(flop_per_byte: float, peak_tflops: float, bandwidth_gb_s: float) -> float:
    """The roofline: the lower of the compute ceiling and bandwidth x intensity (GB/s x FLOP/B = GFLOP/s)."""
    return min(peak_tflops, bandwidth_gb_s * flop_per_byte / 1e3)


def ridge(peak_tflops: float, bandwidth_gb_s: float) -> float:
    """The intensity where the two ceilings meet: below it a kernel is bound by memory, above by math."""
    return peak_tflops * 1e3 / bandwidth_gb_s
