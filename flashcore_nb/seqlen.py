"""Where each kernel wins, as curves (issue 15 §3): the sequence-length sweep of the results chapter.

    python -m flashcore_nb seqlen     # writes results/<gpu>/experiments/seqlen_sweep.json

On every case of shapes.SEQLEN_SWEEP (S = 128 ... 16384, D = 64 and 128, causal or not, B·H fixed; shapes.py says
why 16), in fp16:
1. every phase from FIRST_PHASE on, in the book's order (p06, the last of the shared-memory dataflow, and every
   later phase: the dispatch candidates and any phase added after them), that runs the case here: the checks
   `attention` makes before it picks a phase (dispatch.can_run: architecture, dtype, head dim, mask, shared
   memory); the others are named in the row with the reason;
2. each of them checked once against the float64 reference (check.check, the book's rule; reference.attention_fp64
   takes the largest cases in blocks of query rows, so every case is checked, 16k included);
3. they and BASELINES (SDPA default, cuDNN and FA2 forced, the Triton peer) timed in the same interleaved rounds on
   the same inputs (bench.compare, the timer of every record): per method the median GPU time, its spread over the
   rounds, TFLOP/s (Case.flops() / time) and call latency, and every round's sample, so that ratios are paired.
Pages read the record through `frame`, tables.seqlen_tflops / seqlen_wins and plots.seqlen_curves."""
from __future__ import annotations

import math
from dataclasses import asdict
from functools import partial
from pathlib import Path

import pandas as pd

from . import env, experiments, results, shapes, tuning
from .bench import TRITON, paired_ratio
from .paths import RESULTS_DIR
from .phases import PHASES

NAME = "seqlen_sweep"          # results/<gpu>/experiments/seqlen_sweep.json
FIRST_PHASE = "p06_async"      # the "p06-p08 (and the later phases)"
BASELINES = ("sdpa_default", "sdpa_cudnn", "sdpa_flash", TRITON)
REFERENCE = "sdpa_cudnn"       # the yardstick of the tables (SDPA default where cuDNN did not run a case)
CURVE_BASELINES = ("sdpa_cudnn", "sdpa_flash", TRITON)   # SDPA default runs cuDNN on the H100: one line is enough
LABELS = {"sdpa_default": "SDPA default", "sdpa_cudnn": "cuDNN", "sdpa_flash": "FA2 (SDPA flash)",
          TRITON: "Triton peer"}
ROUNDS = experiments.EXPERIMENT_ROUNDS
DTYPE = "float16"
SATURATION = 0.9               # a method "fills the GPU" from the S where it reaches this share of its best TFLOP/s
WAVE_TILE_ROWS = tuning.WAVE_TILE_ROWS


def phases_swept(first: str = FIRST_PHASE) -> list[str]:
    """The phases the sweep measures, in the book's order: FIRST_PHASE and every later one."""
    names = list(PHASES)
    return names[names.index(first):]


def skip_reason(name: str, case: shapes.Case, gpu: env.GpuInfo) -> str | None:
    """Why a phase does not run a case on this GPU (None where it does), by the dispatcher's own test."""
    from .dispatch import can_run
    phase = PHASES[name]
    if not phase.runs_on(gpu.cc):
        return f"needs an {phase.requirement} GPU"
    if can_run(name, tuning.Problem.of_case(case, DTYPE), gpu):
        return None
    if not phase.supports_dtype_on(DTYPE, gpu.cc):
        return f"no {DTYPE}"
    if case.head_dim not in phase.head_dims:
        return f"no head dim {case.head_dim}"
    if case.causal and not phase.causal:
        return "no causal mask"
    return f"its tiles need more shared memory than the {gpu.name} has"


def measure(case: shapes.Case, fns: dict, gpu: env.GpuInfo, rounds: int | None = None) -> dict:
    """One case: the phases of `fns` (name -> binding.load's function) that run it checked, then timed beside the
    baselines in the same interleaved rounds. The row of the record."""
    import torch

    from .bench import compare
    from .check import check
    from .grid import sdpa_default_backend
    skipped = {name: skip_reason(name, case, gpu) for name in fns}
    checks = {}
    for name, fn in fns.items():
        if skipped[name] is None:
            try:
                result = check(fn, case, torch.float16)
            except (RuntimeError, ValueError, TypeError) as error:   # refused by the binding: named, not timed
                torch.cuda.synchronize()   # a launch that broke the GPU ends the run here, loudly
                skipped[name] = f"raised {type(error).__name__}: {error}"
                continue
            checks[name] = {key: getattr(result, key) for key in ("max_abs_err", "sdpa_max_abs_err", "unwritten",
                                                                   "passed")}
    runnable = {name: fn for name, fn in fns.items() if skipped[name] is None}
    timings = compare(runnable, case, BASELINES, rounds=ROUNDS if rounds is None else rounds)
    clock = timings.pop("sm_clock_mhz")
    return {"case": case.name, "shape": case.label(), "batch": case.batch, "heads": case.heads,
            "seqlen": case.seqlen_q, "head_dim": case.head_dim, "causal": case.causal, "dtype": DTYPE,
            "flops": case.flops(), "sdpa_default_backend": sdpa_default_backend(case),
            "skipped": {name: reason for name, reason in skipped.items() if reason},
            "checks": checks, "timings": timings, "sm_clock_mhz": clock}


def record(progress=partial(print, flush=True), cases: list[shapes.Case] | None = None,
           root: Path = RESULTS_DIR) -> Path:
    """The module's three steps on every case (default: the whole sweep) on this GPU, then the record; a line per
    case as it goes (seconds since the start) and the table of where each kernel wins at the end."""
    import time

    from . import grid, tables
    from .binding import load as load_phase
    start = time.perf_counter()
    cases = list(shapes.SEQLEN_SWEEP if cases is None else cases)

    def say(line: str) -> None:
        progress(f"[{time.perf_counter() - start:4.0f} s] {line}")

    gpu = env.gpu()
    names = phases_swept()
    built = [name for name in names if PHASES[name].runs_on(gpu.cc)]
    for name in sorted(set(names) - set(built), key=names.index):
        say(f"{name}: skipped, it needs an {PHASES[name].requirement} GPU")
    grid.prebuild([(name, PHASES[name].tile_params_for(gpu.cc)) for name in built], gpu.cc)   # in parallel
    fns = {name: load_phase(name) for name in built}
    say(f"built {', '.join(built) or 'no phase'}; {len(cases)} cases, {ROUNDS} rounds each")

    def make(rows: list[dict]) -> dict:
        out = experiments.make_record(NAME, None, {name: {} for name in built}, rows,
                                      build_phases={name: name for name in built})
        out.update(phases=built, baselines=list(BASELINES), reference=REFERENCE, rounds=ROUNDS, dtype=DTYPE,
                   gpu_info=asdict(gpu), complete=len(rows) == len(cases))
        return out

    rows = []
    for case in cases:
        row = measure(case, fns, gpu)
        rows.append(row)
        results.write(make(rows), root)   # after every case: a run cut short keeps what it measured
        timings = row["timings"]
        fastest = max(timings, key=lambda m: timings[m]["tflops"])
        wrong = [name for name, c in row["checks"].items() if not c["passed"]]
        say(f"{case.name}: fastest {fastest} {timings[fastest]['tflops']:.0f} TFLOP/s; "
            + ", ".join(f"{name.split('_')[0]} {timings[name]['tflops']:.0f}" for name in row["checks"])
            + (f"; WRONG: {', '.join(wrong)}" if wrong else "; all correct")
            + "".join(f"; {name} not run: {reason}" for name, reason in row["skipped"].items()))
    out = make(rows)
    path = results.write(out, root)
    progress(tables.seqlen_wins(frame(out)).to_string(index=False))
    return path


# --- reading the record (anywhere) -----------------------------------------------------------------------

def load(gpu_slug: str = results.DEFAULT_GPU, root: Path = RESULTS_DIR) -> dict | None:
    return experiments.load_if_recorded(NAME, gpu_slug, root)


def missing_message(gpu_slug: str = results.DEFAULT_GPU) -> str:
    return experiments.missing_message(NAME, "The sequence-length sweep", "seqlen", gpu_slug)


def label(method: str) -> str:
    """'sdpa_cudnn' -> 'cuDNN', 'p07_registers' -> 'p07_registers'."""
    return LABELS.get(method, method)


def frame(record: dict) -> pd.DataFrame:
    """One row per case and method that ran it: the case's sizes, the method and whether it is a phase, its median
    GPU time with the spread over the rounds (min, max), TFLOP/s with the same spread (`tflops_low` from the slowest
    round, `tflops_high` from the fastest), call latency, its speed over the reference (cuDNN, else SDPA default;
    the reference's GPU time over the method's, paired over the rounds: above 1, faster), and for a phase its check
    (`correct`; None for a baseline, which is the yardstick, not checked)."""
    phases = record["phases"]
    rows = []
    for row in record["rows"]:
        timings = row["timings"]
        reference = record.get("reference", REFERENCE)
        reference = reference if reference in timings else "sdpa_default"
        for method, timing in timings.items():
            check = row["checks"].get(method)
            rows.append({
                "case": row["case"], "seqlen": row["seqlen"], "head_dim": row["head_dim"], "causal": row["causal"],
                "method": method, "is_phase": method in phases,
                "gpu_us": timing["gpu_us"], "gpu_us_min": timing["gpu_us_min"], "gpu_us_max": timing["gpu_us_max"],
                "tflops": timing["tflops"],
                "tflops_low": timing["tflops"] * timing["gpu_us"] / timing["gpu_us_max"],
                "tflops_high": timing["tflops"] * timing["gpu_us"] / timing["gpu_us_min"],
                "call_us": timing["call_us"], "reference": reference,
                "speed_vs_reference": paired_ratio(timings[reference], timing) if reference in timings else math.nan,
                "correct": check["passed"] if check else None,
                "err_over_sdpa": check["max_abs_err"] / check["sdpa_max_abs_err"] if check else math.nan})
    return pd.DataFrame(rows)


def one_wave_seqlen(record: dict) -> float | None:
    """The sequence length at which the sweep's B·H heads make one 128-row query tile per SM of the recorded GPU
    (below it the large-tile grids leave SMs idle); None where the recorded cases differ in B·H."""
    batch_heads = {row["batch"] * row["heads"] for row in record["rows"]}
    return WAVE_TILE_ROWS * record["gpu_info"]["sms"] / batch_heads.pop() if len(batch_heads) == 1 else None


def curve_methods(frame_: pd.DataFrame) -> list[str]:
    """The lines of the figure: every phase, then CURVE_BASELINES that ran (SDPA default where cuDNN did not)."""
    present = list(dict.fromkeys(frame_["method"]))
    baselines = [m for m in CURVE_BASELINES if m in present]
    if "sdpa_cudnn" not in present and "sdpa_default" in present:
        baselines.insert(0, "sdpa_default")
    return [m for m in present if m in set(frame_.loc[frame_["is_phase"], "method"])] + baselines
