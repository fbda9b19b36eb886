"""Tables a chapter prints: correctness, speed beside SDPA, ptxas stats per arch, occupancy per GPU."""
from __future__ import annotations

import pandas as pd

from . import budget, build, results
from .bench import SDPA_BACKENDS, baseline_us
from .phases import get


def correctness(runs: pd.DataFrame) -> pd.DataFrame:
    table = runs[["case", "shape", "causal", "dtype", "max_abs_err", "sdpa_max_abs_err", "unwritten", "passed"]].copy()
    table["shape"] = table["shape"].map(lambda s: "x".join(map(str, s)))
    table["err / sdpa err"] = table["max_abs_err"] / table["sdpa_max_abs_err"].where(table["sdpa_max_abs_err"] > 0)
    return table.reset_index(drop=True)


def speed(runs: pd.DataFrame, matmul_tflops: float | None = None) -> pd.DataFrame:
    """GPU time (µs, graph replay, median) of the phase and each SDPA backend from the same run."""
    timed = runs[runs["gpu_us"].notna()]
    rows = []
    for _, run in timed.iterrows():
        row = {"case": run["case"], "ours µs": run["gpu_us"]}
        for name in SDPA_BACKENDS:
            row[f"{name.removeprefix('sdpa_')} µs"] = baseline_us(run["baselines"], name)
        row["ours / default"] = run["gpu_us"] / row["default µs"]
        row["TFLOP/s"] = run["tflops"]
        if matmul_tflops:
            row["% of matmul peak"] = 100.0 * run["tflops"] / matmul_tflops
        row["call µs"] = run["call_us"]
        rows.append(row)
    return pd.DataFrame(rows)


def ptxas(phase_name: str, record: dict | None = None) -> tuple[pd.DataFrame, str]:
    """Per-arch stats compiled now with nvcc when it is here (any machine), else the record's. ptxas
    sees only static shared memory; for phases that ask for theirs at launch, the dynamic size is
    added from budget.py (which a CPU test checks against the kernels' own sizeof)."""
    phase = get(phase_name)
    try:
        rows = [{"arch": f"sm_{cc}", **vars(build.compile_only(phase.kernel_file, cc, phase.tile_params_for(cc)))}
                for cc in phase.archs]
        source = "compiled just now with nvcc " + (build.env.nvcc_version() or "")
    except build.CompileError as error:
        if record is None or "nvcc not found" not in str(error):
            raise
        rows = [{"arch": f"sm_{record['env']['cc']}", **record["ptxas"]}]
        source = "from the record (no nvcc on this machine): " + results.provenance(record)
    table = pd.DataFrame(rows).rename(columns={"smem_bytes": "static smem bytes"})
    if phase_name in budget.PHASES_WITH_LAYOUT:
        for head_dim in phase.head_dims:
            table[f"dynamic smem bytes (D={head_dim})"] = budget.smem_bytes(phase_name, head_dim)
    return table, source


def steps(records: list[dict], cases=("mission", "b16h16_s512"), labels: list[str] | None = None) -> pd.DataFrame:
    """GPU time per case across successive records of one phase (see results.history)."""
    rows = []
    for i, record in enumerate(records):
        timed = {run["case"]: run for run in record["runs"] if run["gpu_us"] is not None}
        row = {"step": labels[i] if labels else record["commit"][:7], "commit": record["commit"][:7]}
        for case in cases:
            row[f"{case} µs"] = timed[case]["gpu_us"]
            row[f"{case} / SDPA default"] = timed[case]["gpu_us"] / baseline_us(timed[case]["baselines"], "sdpa_default")
        rows.append(row)
    return pd.DataFrame(rows)


def occupancy(configs, gpus=tuple(budget.GPUS.values())) -> pd.DataFrame:
    """Blocks per SM, occupancy and its limiter on each GPU, one row per (label, phase, head_dim,
    tile_params, registers) config; registers per thread come from the caller (ptxas records)."""
    rows = []
    for label, phase_name, head_dim, tile_params, registers in configs:
        threads = budget.threads_per_block(phase_name, tile_params)
        smem = budget.smem_bytes(phase_name, head_dim, tile_params)
        row = {"config": label, "threads": threads, "registers": registers, "smem KB": smem / 1024}
        for gpu in gpus:
            occ = budget.occupancy(gpu, threads, registers, smem)
            row[f"{gpu.name} blocks/SM"] = occ.blocks_per_sm
            row[f"{gpu.name} occupancy %"] = 100.0 * occ.occupancy
            row[f"{gpu.name} limiter"] = occ.limiter if occ.fits else f"does not fit ({occ.limiter})"
        rows.append(row)
    return pd.DataFrame(rows)
