"""Speed: GPU time per call from CUDA-graph replay, call latency from back-to-back Python calls,
SDPA's backends timed in the same run, and the GPU's own matmul rate for "% of peak"."""
from __future__ import annotations

import statistics
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .check import make_inputs
from .shapes import Case

SDPA_BACKENDS = {
    "sdpa_default": None,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
}
GRAPH_TARGET_MS = 20.0   # each graph replay lasts about this long
REPEATS = 15


def event_time_us(call, iterations: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iterations


def gpu_time_us(call) -> dict:
    """Min and median GPU time of one call, from replays of a CUDA graph of back-to-back calls, so
    that launch overhead is excluded. `call` must launch on the current stream and not allocate."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    estimate = event_time_us(call, 3)
    calls = max(1, min(200, round(GRAPH_TARGET_MS * 1e3 / max(estimate, 1e-3))))
    repeats = REPEATS if estimate * calls < 50e3 else 3
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    graph.replay()
    times = [event_time_us(graph.replay, 1) / calls for _ in range(repeats)]
    return {"gpu_us": statistics.median(times), "gpu_us_min": min(times)}


def call_latency_us(call, calls: int = 50) -> float:
    """Wall time per call for back-to-back Python calls (what a user's loop sees)."""
    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / calls


def time_call(call, latency_calls: int) -> dict:
    timing = gpu_time_us(call)
    timing["call_us"] = call_latency_us(call, latency_calls)
    return timing


def bench_case(fn, case: Case, dtype=torch.float16) -> dict:
    """Time a FlashCore function and every SDPA backend on the same inputs, in the same run."""
    ours = time_ours(fn, case, dtype)
    q, k, v = make_inputs(case, dtype, seed=1)
    ours["baselines"] = {name: _time_sdpa(backend, q, k, v, case) for name, backend in SDPA_BACKENDS.items()}
    return ours


def time_ours(fn, case: Case, dtype=torch.float16) -> dict:
    q, k, v = make_inputs(case, dtype, seed=1)
    out = torch.empty_like(q)
    ours = time_call(lambda: fn(q, k, v, causal=case.causal, out=out), _latency_calls(case))
    ours["tflops"] = case.flops() / (ours["gpu_us"] * 1e-6) / 1e12
    return ours


def time_sdpa_default(case: Case, dtype=torch.float16) -> dict:
    """SDPA with PyTorch's own backend choice, on the inputs time_ours uses."""
    return _time_sdpa(None, *make_inputs(case, dtype, seed=1), case)


def _latency_calls(case: Case) -> int:
    return 50 if case.flops() < 1e10 else 5


def _time_sdpa(backend, q, k, v, case: Case) -> dict | None:
    """None where this backend does not support the inputs (or this GPU)."""
    context = sdpa_kernel(backend) if backend is not None else nullcontext()
    call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)  # noqa: E731
    try:
        with context:
            call()
            timing = time_call(call, _latency_calls(case))
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    timing["tflops"] = case.flops() / (timing["gpu_us"] * 1e-6) / 1e12
    return timing


def baseline_us(baselines: dict | None, name: str) -> float | None:
    """GPU time of one SDPA backend from a run's `baselines` (None where it did not run)."""
    timing = (baselines or {}).get(name)
    return timing["gpu_us"] if timing else None


def matmul_tflops(n: int = 8192, dtype=torch.float16) -> float:
    """This GPU's measured dense matmul rate (fp32 accumulate): the "100%" of % of peak."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    us = event_time_us(lambda: a @ b, 10)
    return 2.0 * n ** 3 / (us * 1e-6) / 1e12
