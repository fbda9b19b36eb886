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


def make_inputs(case: Case, dtype=torch.float16, seed: int = 0, device="cuda"):
    """Fresh random q, k, v for a case (never zeros: they hide unwritten outputs)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    b, h, sq, d = case.shape

    def draw(seqlen):
        return (torch.randn(b, h, seqlen, d, generator=gen, device=device) * case.magnitude).to(dtype)

    return draw(sq), draw(case.sk), draw(case.sk)


def tolerance(sdpa_err: float) -> float:
    return 2.0 * sdpa_err + ABS_SLACK


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
    reference = attention_fp64(q, k, v, causal=case.causal)
    out = torch.full_like(q, float("nan"))
    fn(q, k, v, causal=case.causal, out=out)
    sdpa_out = F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
    torch.cuda.synchronize()
    unwritten = int(torch.isnan(out).sum())
    err = float((out.double() - reference).abs().max())
    sdpa_err = float((sdpa_out.double() - reference).abs().max())
    passed = unwritten == 0 and err <= tolerance(sdpa_err)
    return CheckResult(case.name, case.shape + ([case.sk] if case.seqlen_k else []), case.causal,
                       str(dtype).removeprefix("torch."), err, sdpa_err, unwritten, passed)
