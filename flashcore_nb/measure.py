"""What a chapter shows: measured live on this GPU, or replayed from the recorded results.

The notebook calls the same function in both modes; the returned Measurement says which it was."""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

import pandas as pd

from . import budget, env, results, shapes
from .paths import RESULTS_DIR
from .phases import get

@dataclass
class Measurement:
    runs: pd.DataFrame
    matmul_tflops: float | None
    provenance: str          # the environment line printed beside the numbers
    record: dict | None      # the record replayed (None when measured live)


def dtypes_for(phase) -> list:
    """fp16 always; bf16 too where the phase and this GPU support it."""
    import torch
    return [torch.float16] + ([torch.bfloat16] if phase.supports_dtype_on("bfloat16", env.gpu().cc) else [])


def collect_runs(fn, correctness, timing, processes: int = 1) -> list[dict]:
    """Check every case (each supported dtype) and time the timing cases in fp16, every baseline
    beside it in interleaved rounds: in this process, or spread over `processes` fresh ones (what
    `record` does; processes.py says why)."""
    import torch

    from .bench import bench_case
    from .check import check
    if processes > 1:
        from .processes import timed_in_processes
        torch.cuda.empty_cache()   # the children need the memory this process's caching allocator holds
        timings = timed_in_processes(fn.phase.name, fn.tile_params, timing, processes)
    else:
        timings = {case.name: bench_case(fn, case) for case in timing}
    cases = correctness + [c for c in timing if c.name not in {x.name for x in correctness}]
    runs = []
    for case in cases:
        for dtype in dtypes_for(fn.phase):
            run = check(fn, case, dtype).as_dict()
            run.update(dict.fromkeys(results.TIMING_KEYS))
            if case.name in timings and dtype == torch.float16:
                run.update(timings[case.name])
            runs.append(run)
    return runs


def phase_runs(phase_name: str, gpu_slug: str = results.DEFAULT_GPU) -> Measurement:
    """Live: compile, check and time the phase now. Replay, or live on a GPU that cannot run the phase
    (too old, or too little shared memory for its default tiles; said beside the numbers): the record
    for `gpu_slug`."""
    phase = get(phase_name)
    cannot_run = None
    if env.mode() == "live":
        from .bench import matmul_tflops
        from .binding import SharedMemoryError, check_shared_memory, load
        from .build import InvalidTilesError, compile_message
        gpu = env.gpu()
        if not phase.runs_on(gpu.cc):
            cannot_run = f"cannot run {phase_name} (needs {phase.requirement})"
        else:
            try:
                # up front: the binding would refuse only the first case that does not fit, minutes in
                check_shared_memory(phase, budget.smem_needed(phase_name, phase.tile_params_for(gpu.cc)), gpu)
                runs = collect_runs(load(phase_name), shapes.CORRECTNESS, shapes.TIMING)
            except SharedMemoryError as error:
                cannot_run = f"cannot run {phase_name} with its default tiles ({error})"
            except InvalidTilesError as error:
                cannot_run = f"cannot build {phase_name} with its default tiles ({compile_message(str(error))})"
            else:
                line = results.environment_line(env.environment(), "measured live on")
                return Measurement(pd.DataFrame(runs), matmul_tflops(), line, None)
    record = results.load(phase_name, gpu_slug)
    if record is None:
        raise FileNotFoundError(f"no recorded results for {phase_name} on {gpu_slug}; record them on a GPU "
                                f"with `python -m flashcore_nb record --phase {phase_name}`")
    line = results.provenance(record)
    if cannot_run:
        line = f"{gpu.name} (sm_{gpu.cc}) {cannot_run}; showing the record: {line}"
    return Measurement(pd.DataFrame(record["runs"]), record["matmul_tflops"], line, record)


# --- the timing-method experiment of chapter 0 ---------------------------------------------------

def timing_methods(case: shapes.Case = shapes.MISSION, iterations: int = 200) -> dict:
    """One SDPA call timed four ways on this GPU (microseconds)."""
    import torch
    import torch.nn.functional as F

    from .bench import call_latency_us, gpu_time_us
    from .check import make_inputs
    q, k, v = make_inputs(case)
    call = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    events, host = [], []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        call()
        end.record()
        end.synchronize()
        host.append((time.perf_counter() - t0) * 1e6)
        events.append(start.elapsed_time(end) * 1e3)
    graph = gpu_time_us(call)
    return {
        "events_sync_each_p50": statistics.median(events),
        "events_sync_each_min": min(events),
        "host_clock_sync_each_p50": statistics.median(host),
        "back_to_back_mean": call_latency_us(call, iterations),
        "graph_replay_median": graph["gpu_us"],
        "graph_replay_min": graph["gpu_us_min"],
    }


def record_timing_methods() -> str:
    return str(results.write({"case": shapes.MISSION.label(), **results.stamp(), "us": timing_methods()}))


def timing_method_table(gpu_slug: str = results.DEFAULT_GPU) -> tuple[pd.DataFrame, str]:
    if env.mode() == "live":
        data = timing_methods()
        line = results.environment_line(env.environment(), "measured live on")
    else:
        record = json.loads((RESULTS_DIR / gpu_slug / results.TIMING_METHODS_FILE).read_text())
        data, line = record["us"], results.provenance(record)
    labels = {
        "events_sync_each_p50": "CUDA events around each call, sync each time (p50) — the original method",
        "events_sync_each_min": "same, minimum",
        "host_clock_sync_each_p50": "host clock around call + synchronize (p50)",
        "back_to_back_mean": "back-to-back calls, one sync at the end (mean per call)",
        "graph_replay_median": "CUDA-graph replay of back-to-back calls (median) — GPU time",
        "graph_replay_min": "same, minimum",
    }
    frame = pd.DataFrame({"method": [labels[k] for k in labels], "µs per call": [data[k] for k in labels]})
    return frame, line
