"""Why SDPA's FlashAttention-2 time moved between records: the experiment of the methodology page.

The p01-p06 records read FA2 at 4x16x2048x64 in ~235 µs, the p07/p08 records in ~264 µs, while
cuDNN stayed put. Each condition below runs in a fresh process (`python -m flashcore_nb.drift
CONDITION`) and times FA2 and cuDNN in interleaved rounds on the shapes where FA2 moved:

- fresh-1 … fresh-4: four new processes, nothing else run first (each gets its own memory pages);
- after-record: a phase's whole record workload first (the correctness suite in both dtypes, then
  its timing), as `record` runs it, then FA2 and cuDNN on newly drawn inputs;
- placement: one process, the same inputs copied to different offsets inside one large buffer;
- warm-gpu: FA2 and cuDNN after 20 s of back-to-back tensor-core work (heat, power, clocks);
- one-at-a-time: a fresh process, each method timed alone one after the other (the old method).

`python -m flashcore_nb drift` records every condition in results/<gpu>/experiments/fa2_drift.json."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

CASE_NAMES = ("b4h16_s2048", "b2h16_s4096_d128")
METHODS = ("sdpa_flash", "sdpa_default")
ROUNDS = 5
FRESH_PROCESSES = 4
PLACEMENT_OFFSETS_KB = (0, 4, 64, 512, 1024, 2048, 3072, 5120, 8192, 13312)
WARM_SECONDS = 20.0
RECORD_PHASE = "p07_registers"


def conditions() -> list[str]:
    return [f"fresh-{i}" for i in range(1, FRESH_PROCESSES + 1)] + ["after-record", "placement", "warm-gpu",
                                                                         "one-at-a-time"]


def _time(q, k, v, case) -> dict:
    from . import bench
    calls = bench.baseline_calls(METHODS, [(q, k, v)], case.causal)   # one placement: the one under test
    t = bench.interleaved(calls, bench.latency_calls(case), ROUNDS)
    return {"case": case.name, **{f"{m}_us": t[m]["gpu_us"] for m in METHODS},
            **{f"{m}_spread_us": [t[m]["gpu_us_min"], t[m]["gpu_us_max"]] for m in METHODS},
            "flash_over_default": bench.paired_ratio(t["sdpa_flash"], t["sdpa_default"]),
            "sm_clock_mhz": t["sm_clock_mhz"], "q_address_mod_2mb": q.data_ptr() % (2 << 20)}


def _placed(case, offset_bytes: int):
    """q, k, v with their values from make_inputs, laid out one after another from `offset_bytes`
    into one buffer."""
    import torch

    from .bench import placed
    from .check import make_inputs
    return placed(make_inputs(case, torch.float16, seed=1), offset_bytes)


def run_condition(condition: str) -> list[dict]:
    import torch

    from . import shapes
    from .check import make_inputs
    cases = shapes.select(",".join(CASE_NAMES), "timing")
    if condition == "placement":
        return [{"offset_kb": kb, **_time(*_placed(case, kb * 1024), case)}
                for case in cases for kb in PLACEMENT_OFFSETS_KB]
    if condition == "one-at-a-time":
        from .bench import baseline_calls, gpu_time_us
        rows = []
        for case in cases:
            calls = baseline_calls(METHODS, [make_inputs(case, torch.float16, seed=1)], case.causal)
            rows.append({"case": case.name, **{f"{m}_us": gpu_time_us(calls[m][0])["gpu_us"] for m in METHODS}})
        return rows
    if condition == "after-record":
        from .binding import load
        from .measure import collect_runs
        collect_runs(load(RECORD_PHASE), shapes.CORRECTNESS, cases)
    if condition == "warm-gpu":
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
        end = time.perf_counter() + WARM_SECONDS
        while time.perf_counter() < end:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()
    return [_time(*make_inputs(case, torch.float16, seed=1), case) for case in cases]


def run_all() -> list[dict]:
    from .processes import fresh_process
    return [{"condition": condition, **row} for condition in conditions()
            for row in fresh_process(__name__, condition)]


def record() -> Path:
    from . import experiments, results
    return results.write(experiments.make_record("fa2_drift", None, {}, run_all()))


def table(gpu_slug: str | None = None):
    """The recorded experiment, a row per condition and case (placement: per offset): FA2's and cuDNN's
    GPU time, FA2 / cuDNN (paired over rounds, except one-at-a-time, which has no rounds) and the SM
    clock before and after; and the provenance line."""
    import pandas as pd

    from . import experiments, results
    record = experiments.load("fa2_drift", gpu_slug or results.DEFAULT_GPU)
    rows = []
    for row in record["rows"]:
        clock = row.get("sm_clock_mhz") or [None, None]
        condition = row["condition"] + (f" +{row['offset_kb']} KB" if "offset_kb" in row else "")
        paired = row.get("flash_over_default")
        rows.append({"condition": condition, "case": row["case"], "FA2 µs": row["sdpa_flash_us"],
                     "cuDNN µs": row["sdpa_default_us"],
                     "FA2 / cuDNN": paired if paired else row["sdpa_flash_us"] / row["sdpa_default_us"],
                     "paired": paired is not None, "SM MHz before": clock[0], "SM MHz after": clock[1]})
    return pd.DataFrame(rows), experiments.provenance(record)


if __name__ == "__main__":
    print(json.dumps(run_condition(sys.argv[1])))
