"""Nsight Compute over a phase's kernel: where its time goes (chapter 7 profiles p07, the default).

`python -m flashcore_nb profile` runs the phase's default build under `ncu` on each large timing case
(its kernel only, by the registry's kernel name) and records the counters that explain where it levels
off: how busy the tensor pipe and the issue slots are, how many warps each scheduler holds and how
many of them are ready to issue, and what the others wait for. The stall reasons are in cycles per
issued instruction; they add up to the cycles between two instructions of one warp. The profiled
program is `python -m flashcore_nb.profile PHASE CASE`.

A kernel under the profiler runs alone, once, with the clocks left as they are: its duration is not a
benchmark number (those come from graph replay beside SDPA); the proportions are what this records."""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

from . import results
from .paths import ROOT
from .phases import get

PHASE = "p07_registers"   # chapter 7's profile, what the CLI records
CASES = ("b16h16_s512", "b4h16_s2048", "b4h16_s2048_causal", "b2h16_s4096_d128")
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "SchedulerStats", "WarpStateStats", "Occupancy",
            "LaunchStats")
COUNTERS = {
    "duration_ns": "gpu__time_duration.sum",
    "registers": "launch__registers_per_thread",
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "issue_busy_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "warps_per_scheduler": "smsp__warps_active.avg.per_cycle_active",
    "eligible_per_scheduler": "smsp__warps_eligible.avg.per_cycle_active",
    "cycles_per_issue": "smsp__average_warp_latency_per_inst_issued.ratio",
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
# ncu's names for the reasons, as the chapter says them.
STALL_LABELS = {
    "wait": "fixed-latency wait",
    "selected": "issuing",
    "not_selected": "another warp issued",
    "dispatch_stall": "dispatch",
    "short_scoreboard": "shared memory / MUFU result",
    "long_scoreboard": "global memory (cp.async wait)",
    "math_pipe_throttle": "math pipe busy",
    "mio_throttle": "MIO queue full",
    "barrier": "barrier (__syncthreads)",
}
LAUNCHES_SKIPPED = 2   # the profiled program's warm-up launches


def record_name(phase_name: str) -> str:
    return f"{phase_name}_profile"


def command(case_name: str, phase_name: str = PHASE) -> list[str]:
    sections = [arg for section in SECTIONS for arg in ("--section", section)]
    return ["ncu", "--clock-control", "none", *sections, "--print-units", "base", "--csv", "--page", "raw",
            "--kernel-name", f"regex:{get(phase_name).kernel_name}", "--launch-skip", str(LAUNCHES_SKIPPED),
            "--launch-count", "1", sys.executable, "-m", "flashcore_nb.profile", phase_name, case_name]


def parse(text: str) -> dict:
    """ncu's raw page as CSV, for one profiled kernel -> the counters kept and every nonzero stall reason."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no CSV table in ncu's output (did the kernel run?)")
    header, _units, values = list(csv.reader(lines[start:start + 3]))
    raw = dict(zip(header, values))
    missing = [metric for metric in COUNTERS.values() if metric not in raw]
    if missing:
        raise ValueError(f"ncu's report lacks {missing}")
    row = {key: _number(raw[metric]) for key, metric in COUNTERS.items()}
    row["stalls"] = {match.group(1): _number(value) for name, value in raw.items()
                     if (match := STALL.fullmatch(name)) and _number(value) > 0}
    return row


def _number(text: str) -> float:
    return float(text.replace(",", ""))   # ncu groups thousands


def profile_case(case_name: str, phase_name: str = PHASE) -> dict:
    proc = subprocess.run(command(case_name, phase_name), capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise RuntimeError(f"ncu failed on {case_name} (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
    return {"case": case_name, **parse(proc.stdout)}


def record(phase_name: str = PHASE) -> Path:
    from . import experiments
    rows = [profile_case(case_name, phase_name) for case_name in CASES]
    return results.write(experiments.make_record(record_name(phase_name), phase_name, {"defaults": {}}, rows))


def runs(phase_name: str = PHASE, gpu_slug: str = results.DEFAULT_GPU) -> tuple[pd.DataFrame, str]:
    """The recorded profile, a row per case, stall reasons as columns (cycles per issued instruction);
    reasons without a label of their own are summed as "other"."""
    from . import experiments
    recorded = experiments.load(record_name(phase_name), gpu_slug)
    rows = []
    for row in recorded["rows"]:
        stalls = dict(row["stalls"])
        flat = {key: row[key] for key in ("case", *COUNTERS)}
        flat.update({label: stalls.pop(reason, 0.0) for reason, label in STALL_LABELS.items()})
        flat["other"] = sum(stalls.values())
        rows.append(flat)
    return pd.DataFrame(rows), experiments.provenance(recorded)


def main(phase_name: str, case_name: str) -> int:
    """The profiled program: the case's launches, the first LAUNCHES_SKIPPED of them warm-ups."""
    import torch

    from . import shapes
    from .binding import load
    from .check import make_inputs
    case = shapes.select(case_name)[0]
    fn = load(phase_name)
    q, k, v = make_inputs(case, torch.float16, seed=1)
    for _ in range(LAUNCHES_SKIPPED + 1):
        fn(q, k, v, causal=case.causal)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
