"""Recorded measurements: results/<gpu-slug>/<phase>.json, written only by the CLI on a real GPU.

A record names the kernel it measured by `kernel_sha256` (source + common headers + defines). When
the kernel changes, the record is stale: pages flag it and the test suite fails until it is
re-recorded."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from . import build, env, shapes
from .paths import RESULTS_DIR, ROOT
from .phases import PHASES, get

SCHEMA_VERSION = 2   # 2: interleaved rounds, per-round samples, paired ratios, the Triton peer
DEFAULT_GPU = "nvidia-h100-80gb-hbm3"    # what the static book shows
TIMING_METHODS_FILE = "timing_methods.json"   # chapter 0's experiment, beside the phase records
REPEAT_DIR = RESULTS_DIR / "repeat"   # a second `record` run of every phase (`record --repeat`)
REQUIRED_KEYS = {"schema", "phase", "kernel_sha256", "tile_params", "commit", "recorded_at", "env",
                 "ptxas", "matmul_tflops", "runs"}
REQUIRED_ENV = {"gpu", "cc", "driver", "torch", "cuda", "nvcc"}
REQUIRED_PTXAS = {"registers", "smem_bytes", "spill_stores", "spill_loads"}
# What bench.bench_case adds to a run: every run has these keys, None in the runs that are only checked.
TIMING_KEYS = {"gpu_us", "gpu_us_min", "gpu_us_max", "gpu_us_rounds", "call_us", "call_us_rounds", "tflops",
               "rounds", "processes", "sm_clock_mhz", "baselines"}
REQUIRED_RUN = {"case", "shape", "causal", "dtype", "max_abs_err", "sdpa_max_abs_err", "unwritten",
                "passed"} | TIMING_KEYS
REQUIRED_BASELINE = {"gpu_us", "gpu_us_rounds", "call_us", "time_ratio", "call_ratio"}


def path_for(phase_name: str, gpu_slug: str, root: Path = RESULTS_DIR) -> Path:
    return root / gpu_slug / f"{phase_name}.json"


def current_commit() -> str:
    """The commit the measured sources belong to. The device machine gets a copy of the tree with no
    .git, so the caller passes it there through FLASHCORE_COMMIT: the full 40-digit sha, checked here so that
    a mistyped one fails before any GPU time is spent rather than landing in a record."""
    given = os.environ.get("FLASHCORE_COMMIT")
    if given:
        if not re.fullmatch(r"[0-9a-f]{40}", given):
            raise ValueError(f"FLASHCORE_COMMIT must be a full 40-digit commit sha, got {given!r}")
        return given
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def stamp() -> dict:
    """What every record (phase, experiment, timing methods) carries about where and when it was made."""
    environment = env.environment()
    return {
        "commit": current_commit(),
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "env": {key: environment[key] for key in sorted(REQUIRED_ENV | {"python"})},
    }


def make_record(phase_name: str, tile_params: dict, ptxas: build.PtxasStats, matmul_tflops: float,
                runs: list[dict]) -> dict:
    phase = get(phase_name)
    return {
        "schema": SCHEMA_VERSION,
        "phase": phase_name,
        "kernel_sha256": build.kernel_sha256(phase.kernel_file, tile_params),
        "tile_params": tile_params,
        **stamp(),
        "ptxas": {key: getattr(ptxas, key) for key in ("registers", "smem_bytes", "spill_stores",
                                                       "spill_loads", "stack_bytes")},
        "matmul_tflops": matmul_tflops,
        "runs": runs,
    }


def experiment_path(name: str, gpu_slug: str = DEFAULT_GPU, root: Path = RESULTS_DIR) -> Path:
    return root / gpu_slug / "experiments" / f"{name}.json"


def write(record: dict, root: Path = RESULTS_DIR) -> Path:
    """The one writer under results/<gpu>/: a phase record (checked against the schema first), an
    experiment (experiments.make_record) or chapter 0's timing-method record, each to its place."""
    gpu_slug = env.gpu_slug(record["env"]["gpu"])
    if "experiment" in record:
        path = experiment_path(record["experiment"], gpu_slug, root)
    elif "runs" in record:
        validate(record)
        path = path_for(record["phase"], gpu_slug, root)
    elif "us" in record:
        path = root / gpu_slug / TIMING_METHODS_FILE
    else:
        raise ValueError("not a record results/ knows: no 'experiment', 'runs' or 'us'")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def validate(record: dict) -> None:
    """Raise ValueError naming the first thing that breaks the schema."""
    def need(keys, have, where):
        missing = keys - set(have)
        if missing:
            raise ValueError(f"{where} is missing {sorted(missing)}")

    need(REQUIRED_KEYS, record, "record")
    need(REQUIRED_ENV, record["env"], "record['env']")
    need(REQUIRED_PTXAS, record["ptxas"], "record['ptxas']")
    if not record["runs"]:
        raise ValueError("record has no runs")
    for run in record["runs"]:
        need(REQUIRED_RUN, run, f"run {run.get('case')}")
        if run["gpu_us"] is None:
            continue
        for name, timing in run["baselines"].items():
            if timing is not None:
                need(REQUIRED_BASELINE, timing, f"run {run['case']}'s {name}")
    if record["schema"] != SCHEMA_VERSION:
        raise ValueError(f"schema {record['schema']} != {SCHEMA_VERSION}")


def load(phase_name: str, gpu_slug: str = DEFAULT_GPU, root: Path = RESULTS_DIR) -> dict | None:
    path = path_for(phase_name, gpu_slug, root)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    validate(record)
    return record


def all_records(root: Path = RESULTS_DIR) -> list[tuple[Path, dict]]:
    return [(path, json.loads(path.read_text())) for path in sorted(root.glob("*/*.json"))
            if path.name != TIMING_METHODS_FILE]


def resummarise(roots=(RESULTS_DIR, REPEAT_DIR)) -> list[Path]:
    """Re-derive the paired ratios of every phase record whose rounds ran in several processes from those
    rounds (bench.paired_ratio), after the way they are summarised changed: the rounds, the medians and
    everything measured stay as recorded, and the record says when and by which commit its ratios were
    re-derived. Returns the files it rewrote."""
    from .bench import with_paired_ratios
    written = []
    for root in roots:
        for path, record in all_records(root):
            if "runs" not in record:
                continue
            changed = False
            for run in record["runs"]:
                if (run.get("processes") or 1) < 2:
                    continue
                for name, timing in run["baselines"].items():
                    if timing is not None:
                        derived = with_paired_ratios(run, timing, run["processes"])
                        changed |= derived != timing
                        timing.update(derived)
            if changed:
                record["ratios_resummarised"] = {"commit": current_commit(),
                                                 "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
                written.append(write(record, root))
    return written


def is_stale(record: dict) -> bool:
    """True when the phase's kernel (or its default tile sizes) changed since the record was made."""
    phase = get(record["phase"])
    defaults = phase.tile_params_for(record["env"]["cc"])
    return record["kernel_sha256"] != build.kernel_sha256(phase.kernel_file, defaults)


def environment_line(e: dict, verb: str = "recorded on") -> str:
    """'<verb> <GPU> (sm_XX), driver …, torch …, CUDA …': the environment beside every number."""
    return (f"{verb} {e['gpu']} (sm_{e['cc']}), driver {e['driver']}, torch {e['torch']}, "
            f"CUDA {e['cuda']}")


def recorded_line(record: dict) -> str:
    """'recorded on <environment>, commit …, <date>' for any record carrying a stamp()."""
    return f"{environment_line(record['env'])}, commit {record['commit'][:10]}, {record['recorded_at'][:10]}"


def provenance(record: dict) -> str:
    """The line printed beside every recorded number of a phase record (or the timing methods)."""
    line = recorded_line(record)
    if record.get("kernel_sha256") and is_stale(record):  # the timing-method record names no kernel
        line += "  [STALE: the kernel changed since this record; re-record it]"
    return line


def history(phase_name: str, gpu_slug: str = DEFAULT_GPU, root: Path = RESULTS_DIR) -> list[dict]:
    """Earlier records of a phase (CLI outputs kept unchanged under history/ when the kernel moved on),
    oldest first, then the current record: the steps a chapter tells."""
    older = [json.loads(p.read_text()) for p in (root / gpu_slug / "history").glob(f"{phase_name}-*.json")]
    current = load(phase_name, gpu_slug, root)
    return sorted(older, key=lambda r: r["recorded_at"]) + ([current] if current else [])


# --- every phase side by side (the results chapter, the README) -------------------------------------

def recorded_phases(gpu_slug: str = DEFAULT_GPU, root: Path = RESULTS_DIR,
                    upto: str | None = None) -> tuple[dict[str, dict], list[str]]:
    """The records of the registered phases in order (up to and including `upto`), and the names of
    the phases that have none yet."""
    names = list(PHASES)
    if upto:
        names = names[: names.index(upto) + 1]
    records = {name: load(name, gpu_slug, root) for name in names}
    return ({name: r for name, r in records.items() if r is not None},
            [name for name, r in records.items() if r is None])


def timing_frame(records: dict[str, dict]) -> pd.DataFrame:
    """One row per (phase, timed case): the phase's GPU time (median over rounds), its spread, TFLOP/s
    and call latency; each baseline's GPU time, TFLOP/s, call latency and the phase's paired time
    ratio to it (`<baseline>_ratio`), from the same run (NaN where a baseline did not run); and that
    run's measured matmul rate."""
    from .bench import BASELINES
    rows = []
    for name, record in records.items():
        for run in record["runs"]:
            if run["gpu_us"] is None:
                continue
            row = {"phase": name, "case": run["case"], "gpu_us": run["gpu_us"], "gpu_us_min": run["gpu_us_min"],
                   "gpu_us_max": run["gpu_us_max"], "tflops": run["tflops"], "call_us": run["call_us"],
                   "matmul_tflops": record["matmul_tflops"]}
            for baseline in BASELINES:
                timing = (run["baselines"] or {}).get(baseline) or {}
                for key in ("gpu_us", "tflops", "call_us"):
                    row[f"{baseline}_{key.removeprefix('gpu_')}"] = timing.get(key)
                row[f"{baseline}_ratio"] = timing.get("time_ratio")
            rows.append(row)
    return pd.DataFrame(rows)


def headline(gpu_slug: str = DEFAULT_GPU, root: Path = RESULTS_DIR) -> str:
    """The fastest recorded phase at the mission shape against SDPA's default backend from the same
    run: the README's headline sentence (a test keeps the two equal)."""
    records, _ = recorded_phases(gpu_slug, root)
    frame = timing_frame(records)
    mission = frame[frame["case"] == shapes.MISSION.name]
    best = mission.loc[mission["gpu_us"].idxmin()]
    return (f"Fastest at the mission shape ({shapes.MISSION.label()} fp16) on the {records[best['phase']]['env']['gpu']}: "
            f"{best['phase']}, {best['gpu_us']:.1f} µs of GPU time per call, "
            f"{best['sdpa_default_ratio']:.2f}× the GPU time of SDPA's default backend "
            f"({best['sdpa_default_us']:.1f} µs; paired over interleaved rounds in one run). Per Python call "
            f"(call latency) it takes {best['call_us']:.0f} µs against SDPA's {best['sdpa_default_call_us']:.0f} µs.")


def readme_table(gpu_slug: str = DEFAULT_GPU, root: Path = RESULTS_DIR) -> str:
    """The README's phase table at the mission shape (a test keeps the two equal): each phase's GPU time
    beside SDPA default's and the Triton peer's from the same rounds, the paired ratios, and the call
    latency of the phase and of SDPA default."""
    records, _ = recorded_phases(gpu_slug, root)
    mission = timing_frame(records).set_index("phase").query("case == @shapes.MISSION.name")

    def us(x):
        return f"{x:.0f} µs" if x >= 100 else f"{x:.1f} µs"

    def times(x):
        return f"{x:.1f}×" if x >= 10 else f"{x:.2f}×"

    lines = ["| phase | GPU time | SDPA default | time / SDPA default | Triton peer | time / Triton "
             "| call latency | SDPA default's call latency |", "|---" * 8 + "|"]
    for name, row in mission.iterrows():
        phase = PHASES[name]
        title = phase.title.split(": ", 1)[-1]
        lines.append(f"| [{name}](notebooks/{phase.notebook}.ipynb): {title} | {us(row['gpu_us'])} "
                     f"| {us(row['sdpa_default_us'])} | {times(row['sdpa_default_ratio'])} | {us(row['triton_us'])} "
                     f"| {times(row['triton_ratio'])} | {row['call_us']:.0f} µs | {row['sdpa_default_call_us']:.0f} µs |")
    return "\n".join(lines)


def digest(records: dict[str, dict]) -> str:
    """A short fingerprint of the records a figure was drawn from, stored in the exported PNG so that
    a test can tell when the figure is older than the records."""
    text = json.dumps(records, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def agreement(gpu_slug: str = DEFAULT_GPU, root: Path = RESULTS_DIR, repeat_root: Path = REPEAT_DIR) -> pd.DataFrame:
    """Two `record` runs of each phase side by side: per timed case and baseline, the paired time
    ratio from each run and how far apart they are (%). The claim of the timing method is that this
    stays within a few percent while the absolute times move with the clock."""
    from .bench import BASELINES
    rows = []
    for name in PHASES:
        first, second = load(name, gpu_slug, root), load(name, gpu_slug, repeat_root)
        if first is None or second is None:
            continue
        again = {run["case"]: run for run in second["runs"] if run["gpu_us"] is not None}
        for run in first["runs"]:
            if run["gpu_us"] is None or run["case"] not in again:
                continue
            for baseline in BASELINES:
                a, b = (r["baselines"].get(baseline) for r in (run, again[run["case"]]))
                if a and b:
                    rows.append({"phase": name, "case": run["case"], "baseline": baseline,
                                 "GPU µs (run 1)": run["gpu_us"], "GPU µs (run 2)": again[run["case"]]["gpu_us"],
                                 "ratio (run 1)": a["time_ratio"], "ratio (run 2)": b["time_ratio"],
                                 "ratio differs %": 100.0 * abs(b["time_ratio"] / a["time_ratio"] - 1)})
    return pd.DataFrame(rows)
