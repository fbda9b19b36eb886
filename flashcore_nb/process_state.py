"""What one process keeps: the two-run check's last outliers (chapter 0, the methodology page).

Two `record` runs of phase 2 at the mission shape, causal, disagreed by about 4%, with its GPU time steady
within each process and different between them. Each of PROCESSES fresh processes (`python -m
flashcore_nb.process_state`) times every subject on PLACEMENTS copies of the same inputs at different
offsets, so the record tells the spread within a process (placement) from the spread between
processes. The mission shape without the mask, whose CTAs all do the same work, is the control;
phase 7 and SDPA's default backend show whether other kernels move with the process too.

`python -m flashcore_nb procstate` records it in results/<gpu>/experiments/process_state.json."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

NAME = "process_state"
SUBJECTS = (("p02_vectorized", "mission_causal"), ("p02_vectorized", "mission"),
            ("p07_registers", "mission_causal"), ("sdpa_default", "mission_causal"))
PHASES = ("p02_vectorized", "p07_registers")
PROCESSES = 6
PLACEMENTS = 8
REPLAYS = 5            # per placement: the median of this many graph replays


def _offset_bytes(placement: int) -> int:
    """Each copy starts at a different MB and a different page within it."""
    return (2 * placement + 1) * (1 << 20) + placement * 4096


def run_process() -> list[dict]:
    """One process's rows: every subject on every placement, GPU time of one call."""
    import torch

    from . import shapes
    from .bench import gpu_time_us, placed, sdpa_call
    from .binding import load
    from .check import make_inputs
    functions = {name: load(name) for name in PHASES}
    keep, rows = [], []   # every copy stays allocated, so each placement is a buffer of its own
    for subject, case_name in SUBJECTS:
        case = shapes.select(case_name, "timing")[0]
        inputs = make_inputs(case, torch.float16, seed=1)
        for placement in range(PLACEMENTS):
            q, k, v = placed(inputs, _offset_bytes(placement))
            keep.append((q, k, v))
            call = sdpa_call(None, q, k, v, case.causal) if subject == "sdpa_default" else \
                (lambda fn=functions[subject], q=q, k=k, v=v: fn(q, k, v, causal=case.causal))
            rows.append({"subject": subject, "case": case_name, "placement": placement,
                         "gpu_us": gpu_time_us(call, REPLAYS)["gpu_us"]})
    return rows


def run_all() -> list[dict]:
    from .processes import fresh_process
    return [{"process": process, **row} for process in range(PROCESSES)
            for row in fresh_process(__name__, timeout=600)]


def record() -> Path:
    from . import experiments, results
    builds = {name: {} for name in PHASES}
    return results.write(experiments.make_record(NAME, None, builds, run_all(), build_phases={n: n for n in PHASES}))


def summary(rows: list[dict]):
    """Per subject and case: the median GPU time, the spread over placements inside a process (each process's
    max / min, the median over processes: one odd sample does not set it), the spread of the per-process
    medians, and those medians in process order."""
    import pandas as pd
    frame = pd.DataFrame(rows)
    out = []
    for (subject, case), part in frame.groupby(["subject", "case"], sort=False):
        per_process = part.groupby("process")["gpu_us"]
        medians = [statistics.median(times) for _, times in per_process]
        out.append({"subject": subject, "case": case, "median µs": statistics.median(part["gpu_us"]),
                    "within a process %": 100 * statistics.median(t.max() / t.min() - 1 for _, t in per_process),
                    "between processes %": 100 * (max(medians) / min(medians) - 1),
                    "process medians µs": ", ".join(f"{m:.1f}" for m in medians)})
    return pd.DataFrame(out)


def table(gpu_slug: str | None = None):
    """The recorded experiment's summary() and its provenance line."""
    from . import experiments, results
    record = experiments.load(NAME, gpu_slug or results.DEFAULT_GPU)
    return summary(record["rows"]), experiments.provenance(record)


if __name__ == "__main__":
    print(json.dumps(run_process()))
