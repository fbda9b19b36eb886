"""The GPU's own ceilings for the roofline, measured rather than taken from a datasheet: the dense
matmul rate (fp16 and bf16, fp32 accumulate) and device-memory bandwidth from a large copy.

`python -m flashcore_nb peaks` records them like the other experiments, in
results/<gpu>/experiments/peaks.json (stamp and provenance included; no kernel, so never stale)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from . import experiments, results
from .paths import RESULTS_DIR

NAME = "peaks"
MATMUL_N = 8192
MATMUL_DTYPES = ("float16", "bfloat16")
COPY_BYTES = 1 << 30     # 1 GiB each way: twenty times the H100's 50 MB L2, so the copy streams from HBM
COPIES_PER_TIMING = 5
REPEATS = 7


@dataclass(frozen=True)
class Peaks:
    matmul_tflops: dict[str, float]   # dtype -> median TFLOP/s
    bandwidth_gb_s: float             # bytes read + written per second, median, in 1e9 B/s
    provenance: str


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = REPEATS) -> dict:
    """Device-to-device copy of `nbytes`: (bytes read + bytes written) / GPU time, CUDA-event timed."""
    import torch

    from .bench import event_time_us
    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    rates = [2 * nbytes / (event_time_us(lambda: dst.copy_(src), COPIES_PER_TIMING) * 1e-6) / 1e9
             for _ in range(repeats)]
    return {"measure": "copy", "bytes_each_way": nbytes, "gb_s": statistics.median(rates), "gb_s_all": rates}


def matmul(dtype_name: str, repeats: int = REPEATS) -> dict:
    import torch

    from .bench import matmul_tflops
    rates = [matmul_tflops(MATMUL_N, getattr(torch, dtype_name)) for _ in range(repeats)]
    return {"measure": "matmul", "dtype": dtype_name, "n": MATMUL_N, "tflops": statistics.median(rates),
            "tflops_all": rates}


def record() -> Path:
    rows = [matmul(dtype) for dtype in MATMUL_DTYPES] + [copy_bandwidth()]
    return results.write(experiments.make_record(NAME, None, {}, rows))


def load(gpu_slug: str = results.DEFAULT_GPU, root: Path = RESULTS_DIR) -> Peaks | None:
    """The recorded peaks, or None where they were never recorded (the roofline then says so)."""
    if not results.experiment_path(NAME, gpu_slug, root).exists():
        return None
    record = experiments.load(NAME, gpu_slug, root)
    return from_record(record)


def from_record(record: dict) -> Peaks:
    rows = record["rows"]
    return Peaks(matmul_tflops={r["dtype"]: r["tflops"] for r in rows if r["measure"] == "matmul"},
                 bandwidth_gb_s=next(r["gb_s"] for r in rows if r["measure"] == "copy"),
                 provenance=experiments.provenance(record))


def missing_message(gpu_slug: str = results.DEFAULT_GPU) -> str:
    return (f"No measured peaks for {gpu_slug} yet, so no roofline: record them on that GPU with "
            f"`python -m flashcore_nb peaks` (writes {results.experiment_path(NAME, gpu_slug).relative_to(RESULTS_DIR.parent)}).")
