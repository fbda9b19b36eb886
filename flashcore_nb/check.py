"""Correctness: a kernel's error vs the float64 reference, beside SDPA's own error on the same inputs.

A phase is correct on a case when every output element was written (the output is poisoned with NaN
first) and its max error is within 2x SDPA's fp16/bf16 error + 1e-4."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .reference import attention_fp64
from .shapes import Case

ABS_SLACK = 1e-4
# How q, k and v are stored, each seen as (B, H, S, D): "bhsd" contiguous, as SDPA's own layout;
# "bshd" a (B, S, H, D) tensor transposed, the heads of each position side by side, as a projection
# writes them. Every phase takes both (rows contiguous, strides 16-byte multiples at D = 64 and 128).
LAYOUTS = ("bhsd", "bshd")


def make_inputs(case: Case, dtype=torch.float16, seed: int = 0, device="cuda", layout: str = "bhsd"):
    """Fresh random q, k, v for a case (never zeros: they hide unwritten outputs), stored in `layout`."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout is one of {LAYOUTS}, not {layout!r}")
    gen = torch.Generator(device=device).manual_seed(seed)
    b, h, sq, d = case.shape

    def draw(seqlen):
        if layout == "bshd":
            x = torch.randn(b, seqlen, h, d, generator=gen, device=device).transpose(1, 2)
        else:
            x = torch.randn(b, h, seqlen, d, generator=gen, device=device)
        return (x * case.magnitude).to(dtype)

    return draw(sq), draw(case.sk), draw(case.sk)


def tolerance(sdpa_err: float) -> float:
    return 2.0 * sdpa_err + ABS_SLACK


def passes(err: float, sdpa_err: float, unwritten: int) -> bool:
    """The book's rule: every output written, and the error within tolerance(SDPA's)."""
    return unwritten == 0 and err <= tolerance(sdpa_err)


def reference_and_sdpa_error(q, k, v, causal: bool, scale: float | None = None):
    """The float64 reference, and SDPA's max |error| against it on these inputs."""
    reference = attention_fp64(q, k, v, causal=causal, scale=scale)
    sdpa_out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return reference, float((sdpa_out.double() - reference).abs().max())


def kernel_error(fn, q, k, v, causal: bool, scale: float | None, reference) -> tuple[float, int]:
    """fn's max |error| against `reference`, written into a NaN-poisoned output, and the elements it
    left unwritten (still NaN)."""
    out = torch.full_like(q, float("nan"))
    fn(q, k, v, causal=causal, scale=scale, out=out)
    unwritten = int(torch.isnan(out).sum())
    return float((out.double() - reference).abs().max()), unwritten


@dataclass
class CheckResult:
    case: str
    shape: list
    causal: bool
    dtype: str
    max_abs_err: float
    sdpa_max_abs_err: float
    unwritten: int          # elements still NaN after the call
    passed: bool

    def as_dict(self):
        return asdict(self)


def check(fn, case: Case, dtype=torch.float16, seed: int = 0) -> CheckResult:
    q, k, v = make_inputs(case, dtype, seed)
    reference, sdpa_err = reference_and_sdpa_error(q, k, v, case.causal)
    err, unwritten = kernel_error(fn, q, k, v, case.causal, None, reference)
    return CheckResult(case.name, case.shape + ([case.sk] if case.seqlen_k else []), case.causal,
                       str(dtype).removeprefix("torch."), err, sdpa_err, unwritten, passes(err, sdpa_err, unwritten))
