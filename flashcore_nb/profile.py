"""Nsight Compute over a phase's kernel: what limits it, measured (every chapter's "What limits it now").

`python -m flashcore_nb profile --phase NAME|all` runs each phase's default build under `ncu` on the cases
its registry entry names (`Phase.profile_cases`), its kernel only (by the registry's kernel name), and
records the counters that explain where it levels off: how many warps each SM holds (achieved occupancy)
and each scheduler, how many of them are ready to issue, how busy the tensor pipe and the issue slots
are, how many shared-memory wavefronts bank conflicts add, and what the warps wait for. The stall
reasons are in cycles per issued instruction; they add up to the cycles between two instructions of
one warp.

One `ncu` process per phase: the profiled program, `python -m flashcore_nb.profile PHASE CASE ...`, warms
each case up with the profiler off and brackets exactly one launch per case with cudaProfilerStart/Stop,
so with `--profile-from-start off` ncu profiles one kernel per case, in the order of the cases.

A phase with rungs (chapter 7: its kernel built up a technique or two at a time, the variants tagged
"rung") gets a second record, `<phase>_rungs_profile`: the same counters for every rung on RUNG_CASES, so
each rung's section can show what its change did to them.

A kernel under the profiler runs alone, once, with the clocks left as they are: its duration is not a
benchmark number (those come from graph replay beside SDPA); the proportions are what this records."""
from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from . import results
from .paths import ROOT
from .phases import get

PHASE = "p07_registers"   # chapter 7's profile, what runs() reads by default
SECTIONS = ("WarpStateStats",)   # the stall reasons: one metric per reason this GPU has (STALL)
COUNTERS = {
    "duration_ns": "gpu__time_duration.sum",
    "registers": "launch__registers_per_thread",
    # The tensor pipe's busy cycles: mma.sync (HMMA) and Hopper's wgmma (HGMMA) alike (ncu's description
    # of this counter on the H100: "HMMA/HFMA2.MMA/HGMMA/QGMMA ops"; it has no separate wgmma one)
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "issue_busy_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "warps_per_scheduler": "smsp__warps_active.avg.per_cycle_active",
    "eligible_per_scheduler": "smsp__warps_eligible.avg.per_cycle_active",
    "cycles_per_issue": "smsp__average_warp_latency_per_inst_issued.ratio",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    # Bank conflicts count the wavefronts a shared-memory access needs beyond the fewest its width allows,
    # so over all wavefronts they are the share the conflicts add. Load/store-unit accesses only: wgmma's
    # reads of its shared-memory operands do not go through it, so p08's GEMM operands are not counted.
    "smem_ld_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "smem_st_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "smem_ld_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "smem_st_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
# ncu's names for the reasons, as the chapter says them.
STALL_LABELS = {
    "wait": "fixed-latency wait",
    "selected": "issuing",
    "not_selected": "another warp issued",
    "dispatch_stall": "dispatch",
    "short_scoreboard": "shared memory / MUFU result",
    "long_scoreboard": "global memory",   # a global load, or (phases 6 on) the cp.async wait
    "math_pipe_throttle": "math pipe busy",
    "mio_throttle": "MIO queue full",
    "barrier": "barrier (__syncthreads)",
}
WARMUPS = 2   # launches per case before the profiled one, with the profiler off
# The rungs' cases: a large problem, where rungs 1-5 act, and the mission shape, where the key split does.
RUNG_CASES = ("b4h16_s2048", "mission")


def record_name(phase_name: str) -> str:
    return f"{phase_name}_profile"


def rungs_record_name(phase_name: str) -> str:
    return f"{phase_name}_rungs_profile"


def command(phase_name: str, defines: dict | None = None, cases: tuple[str, ...] | None = None) -> list[str]:
    """ncu over the profiled program: one process for all of the cases (by default the phase's own) of one
    build (the defaults, or these defines over them)."""
    from .sanitize import format_target
    phase = get(phase_name)
    sections = [arg for section in SECTIONS for arg in ("--section", section)]
    return ["ncu", "--clock-control", "none", "--profile-from-start", "off",
            "--kernel-name", f"regex:{phase.kernel_name}", *sections,
            "--metrics", ",".join(COUNTERS.values()), "--print-units", "base", "--csv", "--page", "raw",
            sys.executable, "-m", "flashcore_nb.profile", format_target(phase_name, defines or {}),
            *(cases or phase.profile_cases)]


def parse(text: str, counters: dict[str, str] = COUNTERS) -> list[dict]:
    """ncu's raw page as CSV -> per profiled kernel, in launch order: the counters kept and every nonzero
    stall reason."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no CSV table in ncu's output (did the kernel run?)")
    table = [line for line in lines[start:] if line.startswith('"')]
    header, _units, *kernels = list(csv.reader(table))
    missing = [metric for metric in counters.values() if metric not in header]
    if missing:
        raise ValueError(f"ncu's report lacks {missing}")
    rows = []
    for values in kernels:
        raw = dict(zip(header, values))
        row = {key: _number(raw[metric]) for key, metric in counters.items()}
        row["stalls"] = {match.group(1): _number(value) for name, value in raw.items()
                         if (match := STALL.fullmatch(name)) and _number(value) > 0}
        rows.append(row)
    return rows


def _number(text: str) -> float:
    return float(text.replace(",", ""))   # ncu groups thousands


def prebuild(phase_names: list[str], cc: int) -> None:
    """Compile the phases' default builds and their rungs at once, in parallel, before any ncu process
    (which then finds them in the build cache); raise on one that fails or where ncu is missing."""
    from . import experiments
    from .build import CompileError, compile_message
    if shutil.which("ncu") is None:
        raise RuntimeError("ncu (Nsight Compute) is not on PATH")
    builds = [(name, {**get(name).tile_params_for(cc), **defines}) for name in phase_names
              for defines in ({}, *get(name).variants_tagged("rung").values())]
    failures = [f"{name}: {compile_message(log)}"
                for (name, _), log in zip(builds, experiments.compile_in_parallel(builds, cc)) if log]
    if failures:
        raise CompileError("\n".join(failures))


def profile_phase(phase_name: str, defines: dict | None = None, cases: tuple[str, ...] | None = None) -> list[dict]:
    """One build's cases (by default the phase's defaults on its own cases) under one ncu process: a row
    per case."""
    cases = cases or get(phase_name).profile_cases
    proc = subprocess.run(command(phase_name, defines, cases), capture_output=True, text=True, cwd=ROOT,
                          timeout=1800, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise RuntimeError(f"ncu failed on {phase_name} (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
    rows = parse(proc.stdout)
    if len(rows) != len(cases):
        raise RuntimeError(f"ncu profiled {len(rows)} kernels for {phase_name}'s {len(cases)} cases {cases}")
    return [{"case": case, **row} for case, row in zip(cases, rows)]


def record(phase_name: str) -> Path:
    from . import experiments
    rows = profile_phase(phase_name)
    return results.write(experiments.make_record(record_name(phase_name), phase_name, {"defaults": {}}, rows))


def record_rungs(phase_name: str) -> Path:
    """Every rung of the phase on RUNG_CASES, one ncu process per rung: rows carry the rung's label."""
    from . import experiments
    rungs = get(phase_name).variants_tagged("rung")
    rows = [{"build": label, **row} for label, defines in rungs.items()
            for row in profile_phase(phase_name, defines, RUNG_CASES)]
    return results.write(experiments.make_record(rungs_record_name(phase_name), phase_name, rungs, rows))


def runs(phase_name: str = PHASE, gpu_slug: str = results.DEFAULT_GPU) -> tuple[pd.DataFrame, str]:
    """The recorded profile, a row per case, stall reasons as columns (cycles per issued instruction);
    reasons without a label of their own are summed as "other"."""
    from . import experiments
    recorded = experiments.load(record_name(phase_name), gpu_slug)
    rows = []
    for row in recorded["rows"]:
        stalls = dict(row["stalls"])
        flat = {"case": row["case"], **{key: row[key] for key in COUNTERS}}
        flat.update({label: stalls.pop(reason, 0.0) for reason, label in STALL_LABELS.items()})
        flat["other"] = sum(stalls.values())
        rows.append(flat)
    return pd.DataFrame(rows), experiments.provenance(recorded)


def stall_label(reason: str) -> str:
    return STALL_LABELS.get(reason, reason.replace("_", " "))


def limits_table(phase_name: str, gpu_slug: str = results.DEFAULT_GPU, rungs: bool = False):
    """A chapter's "What limits it now, measured": (the table, formatted, and the provenance line), or
    (None, what to run) where the phase's profile is not recorded for the GPU yet. `rungs`: the rungs'
    profile (a row per rung and case) instead of the defaults'."""
    from . import experiments, tables
    name = rungs_record_name(phase_name) if rungs else record_name(phase_name)
    recorded = experiments.load_if_recorded(name, gpu_slug)
    if recorded is None:
        what = f"{phase_name}'s {'rungs under ' if rungs else ''}Nsight Compute profile"
        return None, experiments.missing_message(name, what, f"profile --phase {phase_name}", gpu_slug)
    table = tables.limits(recorded).style.format(precision=2, na_rep="–").hide(axis="index")
    return table, experiments.provenance(recorded)


def main(target: str, *case_names: str) -> int:
    """The profiled program: one build ('phase' or 'phase:NAME=value,...'); per case, WARMUPS launches
    with the profiler off, then one with it on."""
    import torch

    from . import shapes
    from .binding import load
    from .check import make_inputs
    from .sanitize import parse_target
    phase_name, defines = parse_target(target)
    fn = load(phase_name, **defines)
    for case in shapes.select(",".join(case_names)):
        q, k, v = make_inputs(case, torch.float16, seed=1)
        for _ in range(WARMUPS):
            fn(q, k, v, causal=case.causal)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn(q, k, v, causal=case.causal)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
