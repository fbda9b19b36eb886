"""Recorded experiments that build a phase with other -D defines: chapter 4's precision experiment,
the tile-size sweeps (chapter 5's heatmap and widget), chapters 7 and 8's ablations, chapter 7's rungs
and its key split; peaks.py records the GPU's ceilings with the same machinery.

Each is written by the CLI on a real GPU to results/<gpu>/experiments/<name>.json with the same
provenance as a phase record, and the sha256 of every kernel build it measured, so that a record
whose kernel changed since reads as stale."""
from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path

import pandas as pd

from . import budget, build, env, results, shapes, source_patch
from .paths import RESULTS_DIR
from .phases import PHASES, get, p07_tiles

SCHEMA_VERSION = 1

# Chapter 4: one kernel file, one variable changed at a time (the variants its phase tags "precision").
PRECISION_PHASE = next(name for name, phase in PHASES.items() if phase.variants_tagged("precision"))
PRECISION_VARIANTS = get(PRECISION_PHASE).variants_tagged("precision")
PRECISION_RECORD = "p04_precision"
PRECISION_SEEDS = (0, 1)

# Chapters 5 and 6: each phase's tile-size grid, and the problems every configuration is checked and timed on.
SWEEP_GRIDS = {name: phase.sweep_grid for name, phase in PHASES.items() if phase.sweep_grid}
# Head dim 64 only: the sweep answers "which tiles for the mission shape"; budget.py says where D = 128 fits.
SWEEP_CHECK_CASES = ("mission", "s17", "s1000", "mission_causal", "sq_gt_sk_causal")
SWEEP_TIMING_CASES = ("mission", "b4h16_s2048")

# Chapters 7 and 8: the variants a phase tags "ablation" (each technique changed alone from the defaults)
# and "rung" (chapter 7's kernel built up a step at a time, the last rung the defaults), checked (p07's
# small cases take its key-split path, the large ones its large-tile path) and timed on every timing case
# against the defaults in the same rounds; each rung also against the rung before it.
VARIANT_RECORDS = {"ablation": "ablations", "rung": "rungs"}   # tag -> the record's name, <phase>_<name>
VARIANTS = {tag: {name: phase.variants_tagged(tag) for name, phase in PHASES.items() if phase.variants_tagged(tag)}
            for tag in VARIANT_RECORDS}
ABLATIONS, RUNGS = VARIANTS["ablation"], VARIANTS["rung"]
VARIANT_CHECK_CASES = (*SWEEP_CHECK_CASES, "d128", "b16h16_s512", "b4h16_s2048_causal")
VARIANT_TIMING_CASES = tuple(case.name for case in shapes.TIMING)


def sweep_name(phase_name: str) -> str:
    return f"{phase_name}_sweep"


def variants_name(phase_name: str, tag: str) -> str:
    """The record of a phase's variants with this tag (VARIANT_RECORDS)."""
    return f"{phase_name}_{VARIANT_RECORDS[tag]}"


def make_record(name: str, phase_name: str | None, builds: dict[str, dict], rows: list[dict],
                build_phases: dict[str, str] | None = None, build_patches: dict[str, str] | None = None) -> dict:
    """`builds`: label -> tile parameters (over the phase's defaults) of every kernel build the rows measured;
    `build_phases`: label -> phase, for a record that measured several phases (`phase_name` None);
    `build_patches`: label -> the exploration patch (relative to kernels/) a build applied to its phase's source.
    A measurement of the GPU alone (peaks.py) names no phase and no builds, so it never goes stale."""
    stamp = results.stamp()
    phase_of = {label: (build_phases or {}).get(label, phase_name) for label in builds}
    # the defaults load() merged in on the GPU the record is made on
    params_of = {label: {**get(phase_of[label]).tile_params_for(stamp["env"]["cc"]), **params}
                 for label, params in builds.items()}
    patch_of = build_patches or {}
    return {
        "schema": SCHEMA_VERSION,
        "experiment": name,
        "phase": phase_name,
        "builds": {label: {"phase": phase_of[label], "tile_params": params,
                           **({"patch": patch_of[label]} if label in patch_of else {}),
                           "kernel_sha256": build_sha256(phase_of[label], params, patch_of.get(label))}
                   for label, params in params_of.items()},
        **stamp,
        "rows": rows,
    }


def load(name: str, gpu_slug: str = results.DEFAULT_GPU, root: Path = RESULTS_DIR) -> dict:
    path = results.experiment_path(name, gpu_slug, root)
    if not path.exists():
        raise FileNotFoundError(f"no recorded experiment {name!r} for {gpu_slug}; record it on a GPU with the "
                                f"CLI (`python -m flashcore_nb --help` lists precision, sweep, sanitize and peaks)")
    return json.loads(path.read_text())


def load_if_recorded(name: str, gpu_slug: str = results.DEFAULT_GPU, root: Path = RESULTS_DIR) -> dict | None:
    """An experiment's record of a GPU, or None where it was never recorded (pages then say so)."""
    path = results.experiment_path(name, gpu_slug, root)
    return json.loads(path.read_text()) if path.exists() else None


def missing_message(name: str, what: str, verb: str, gpu_slug: str = results.DEFAULT_GPU) -> str:
    """What a page says where `what` (recorded by `python -m flashcore_nb <verb>`) has no record yet."""
    return (f"{what} is not recorded for {gpu_slug} yet: record it on that GPU with `python -m flashcore_nb {verb}` "
            f"(writes {results.experiment_path(name, gpu_slug).relative_to(RESULTS_DIR.parent)}).")


def all_records(root: Path = RESULTS_DIR) -> list[tuple[Path, dict]]:
    return [(path, json.loads(path.read_text())) for path in sorted(root.glob("*/experiments/*.json"))]


def build_sha256(phase_name: str, tile_params: dict, patch: str | None = None) -> str:
    """A recorded build's kernel hash as the sources read now; an exploration patch that no longer applies to
    its phase's source raises source_patch.PatchError."""
    return build.kernel_sha256(get(phase_name).kernel_file, tile_params, build.KERNELS_DIR / patch if patch else None)


def _is_stale(recorded: dict, phase_name: str) -> bool:
    try:
        return recorded["kernel_sha256"] != build_sha256(phase_name, recorded["tile_params"], recorded.get("patch"))
    except (source_patch.PatchError, FileNotFoundError):   # the phase changed under the patch, or it is gone
        return True


def stale_builds(record: dict) -> list[str]:
    """Labels of the builds whose kernel source (patched, for an exploration build), headers or defines
    changed since the record (records made before builds named their phase measured the record's one phase)."""
    return [label for label, b in record["builds"].items() if _is_stale(b, b.get("phase", record["phase"]))]


def provenance(record: dict) -> str:
    line = results.recorded_line(record)
    if stale_builds(record):
        line += "  [STALE: a kernel changed since this record; re-record it]"
    return line


# --- chapter 4: FP16 P / FP32 P / the padding bug, measured -----------------------------------------

def run_precision(cases: list[shapes.Case]) -> list[dict]:
    """Max error vs float64 of every variant on every case and seed, SDPA's beside it (fp16)."""
    import torch

    from .binding import load as load_phase
    from .check import check
    rows = []
    for label, defines in PRECISION_VARIANTS.items():
        fn = load_phase(PRECISION_PHASE, **defines)
        for case in cases:
            for seed in PRECISION_SEEDS:
                result = check(fn, case, torch.float16, seed=seed)
                rows.append({"variant": label, "case": case.name, "shape": case.label(), "seed": seed,
                             "max_abs_err": result.max_abs_err, "sdpa_max_abs_err": result.sdpa_max_abs_err,
                             "unwritten": result.unwritten, "passed": result.passed})
    return rows


def record_precision(cases: list[shapes.Case]) -> Path:
    rows = run_precision(cases)
    return results.write(make_record(PRECISION_RECORD, PRECISION_PHASE, PRECISION_VARIANTS, rows))


def precision_runs(gpu_slug: str = results.DEFAULT_GPU) -> tuple[pd.DataFrame, str]:
    """Live on a GPU (the correctness suite), else the record."""
    if env.mode() == "live":
        rows = run_precision(shapes.CORRECTNESS)
        return pd.DataFrame(rows), results.environment_line(env.environment(), "measured live on")
    record = load(PRECISION_RECORD, gpu_slug)
    return pd.DataFrame(record["rows"]), provenance(record)


# --- tile-size sweeps --------------------------------------------------------------------------------

def grid_configs(phase_name: str) -> list[dict]:
    grid = SWEEP_GRIDS[phase_name]
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def config_label(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _prebuild(args) -> str | None:
    phase_name, cc, params, patch = args
    try:
        build.build_extension(phase_name, cc, params, progress=False, patch=patch)
    except build.CompileError as error:
        return str(error)
    return None


def compile_in_parallel(builds: list[tuple], cc: int, meanwhile=None, workers: int | None = None) -> list[str | None]:
    """Compile (phase, tile parameters) builds, or (phase, tile parameters, exploration patch) ones, in parallel
    worker processes (the compiler is single-threaded; by default one per two CPUs); `meanwhile` runs in this
    process while they compile. Per build, in order, the compiler's output where it failed, else None."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    builds = [(*b, None)[:3] for b in builds]   # (phase, tile parameters, patch or None)

    def key(name, params, patch):
        return name, config_label(params), str(patch)

    # one worker per distinct build: two compiling the same extension would share its directory
    distinct = {key(*b): b for b in builds}
    workers = max(1, min(len(distinct), workers or (os.cpu_count() or 2) // 2, os.cpu_count() or 1))
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {k: pool.submit(_prebuild, (name, cc, params, patch))
                   for k, (name, params, patch) in distinct.items()}
        if meanwhile is not None:
            meanwhile()
        outcomes = {k: future.result() for k, future in futures.items()}
    return [outcomes[key(*b)] for b in builds]


def prebuild_all(phase_name: str, configs: list[dict], cc: int) -> dict[str, str]:
    """Compile every configuration in parallel; returns label -> compiler message for those that do not compile."""
    defaults = get(phase_name).tile_params_for(cc)   # load() builds with these merged in: same cache entry
    outcomes = compile_in_parallel([(phase_name, {**defaults, **params}) for params in configs], cc)
    return {config_label(params): build.compile_message(log) for params, log in zip(configs, outcomes) if log}


EXPERIMENT_ROUNDS = 5   # interleaved rounds per configuration and case (bench.py)


def run_sweep_config(phase_name: str, params: dict, check_cases, timing_cases, references: dict | None = None,
                     peer_cases: tuple[str, ...] = ()) -> dict:
    """Check and time one configuration already known to compile, SDPA default beside it in the same
    interleaved rounds, and the `references` (label -> built fn: an ablation's defaults, a rung's previous
    rung), each with its paired ratio `<case>_vs_<label>`; at `peer_cases` the Triton peer too
    (`<case>_triton_us`, `<case>_vs_triton`)."""
    import torch

    from .bench import TRITON, compare, paired_ratio
    from .binding import SharedMemoryError, load as load_phase
    from .check import check
    fn = load_phase(phase_name, **params)
    row = {**params, "status": "ok", "message": "", "registers": fn.build.ptxas.registers,
           "spill_bytes": fn.build.ptxas.spill_stores + fn.build.ptxas.spill_loads}
    try:
        failed = [case.name for case in check_cases if not check(fn, case, torch.float16).passed]
    except SharedMemoryError as error:
        return {**row, "status": "too much shared memory", "message": str(error)}
    if failed:
        return {**row, "status": "incorrect", "message": f"failed on {', '.join(failed)}"}
    references = references or {}
    for case in timing_cases:
        baselines = ("sdpa_default", TRITON) if case.name in peer_cases else ("sdpa_default",)
        timings = compare({"config": fn, **references}, case, baselines, rounds=EXPERIMENT_ROUNDS)
        ours, sdpa = timings["config"], timings["sdpa_default"]
        row[f"{case.name}_us"] = ours["gpu_us"]
        row[f"{case.name}_spread_us"] = [ours["gpu_us_min"], ours["gpu_us_max"]]
        row[f"{case.name}_sdpa_us"] = sdpa["gpu_us"]
        row[f"{case.name}_vs_sdpa"] = paired_ratio(ours, sdpa)
        for label in references:
            row[f"{case.name}_vs_{label}"] = paired_ratio(ours, timings[label])
        if TRITON in timings:
            row[f"{case.name}_triton_us"] = timings[TRITON]["gpu_us"]
            row[f"{case.name}_vs_triton"] = paired_ratio(ours, timings[TRITON])
        row[f"{case.name}_sm_clock_mhz"] = timings["sm_clock_mhz"]
    return row


def run_sweep(phase_name: str, configs: list[dict] | None = None, progress=print, check_names=SWEEP_CHECK_CASES,
              timing_names=SWEEP_TIMING_CASES, against_defaults: bool = False,
              against_previous: bool = False, peer_names: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    """Every configuration checked and timed (see run_sweep_config), against the phase's defaults and
    against the configuration before it (where that one ran) if asked, and beside the Triton peer at
    `peer_names`; also returns SDPA default's median GPU time per case over all of the configurations'
    rounds, for labels."""
    import statistics

    from .binding import load as load_phase
    configs = configs or grid_configs(phase_name)
    check_cases = shapes.select(",".join(check_names))
    timing_cases = shapes.select(",".join(timing_names))
    failures = prebuild_all(phase_name, configs, env.gpu().cc)
    defaults = {"defaults": load_phase(phase_name)} if against_defaults else {}
    rows = []
    for i, params in enumerate(configs):
        label = config_label(params)
        references = dict(defaults)
        if against_previous and i > 0 and rows[-1]["status"] == "ok":
            references["previous"] = load_phase(phase_name, **configs[i - 1])
        if label in failures:
            row = {**params, "status": "does not compile", "message": failures[label]}
        else:
            row = run_sweep_config(phase_name, params, check_cases, timing_cases, references, peer_names)
        progress(f"{label}: {row['status']}" + (f", mission {row['mission_us']:.1f} µs" if "mission_us" in row else ""))
        rows.append(row)
    sdpa = {f"sdpa_{case.name}_us": statistics.median(row[f"{case.name}_sdpa_us"] for row in rows if row["status"] == "ok")
            for case in timing_cases if any(row["status"] == "ok" for row in rows)}
    return rows, sdpa


def record_sweep(phase_name: str) -> Path:
    configs = grid_configs(phase_name)
    rows, sdpa = run_sweep(phase_name, configs)
    record = make_record(sweep_name(phase_name), phase_name, {config_label(p): p for p in configs}, rows)
    record["sdpa"] = sdpa
    return results.write(record)


def variant_timing_cases(phase_name: str, tag: str) -> tuple[str, ...]:
    """The cases a phase's variants with this tag are timed on: the timing suite, and for its ablation the
    phase's own ablation_cases after it."""
    return VARIANT_TIMING_CASES + (PHASES[phase_name].ablation_cases if tag == "ablation" else ())


def record_variants(phase_name: str, tag: str, root: Path = RESULTS_DIR) -> Path:
    """The phase's variants with this tag (VARIANTS), in registry order, each checked and timed against the
    defaults, and each rung against the rung before it too. The ablation's own cases are in no phase record,
    so there the Triton peer is timed beside each variant too."""
    variants = VARIANTS[tag][phase_name]
    rows, sdpa = run_sweep(phase_name, list(variants.values()), check_names=VARIANT_CHECK_CASES,
                           timing_names=variant_timing_cases(phase_name, tag), against_defaults=True,
                           against_previous=tag == "rung",
                           peer_names=PHASES[phase_name].ablation_cases if tag == "ablation" else ())
    for variant, row in zip(variants, rows):
        row["variant"] = variant
    record = make_record(variants_name(phase_name, tag), phase_name, variants, rows)
    record["sdpa"] = sdpa
    return results.write(record, root)


# --- where the key split pays (chapter 7) -----------------------------------------------------------

KEY_SPLIT_PHASE = next(name for name, phase in PHASES.items() if phase.key_split)
KEY_SPLIT_RECORD = f"{KEY_SPLIT_PHASE}_key_split"
KEY_SPLIT_PATHS = {"large tiles": {"SMALL_PROBLEM_CTAS": 0}, "key split": {"SMALL_PROBLEM_CTAS": 1 << 30}}


def large_tile_ctas(case: shapes.Case, cc: int) -> int:
    """CTAs of the large-tile grid (one per query tile, before the persistent cap)."""
    return budget.query_tiles(case, p07_tiles(case.head_dim, get(KEY_SPLIT_PHASE).tile_params_for(cc), split=False)[0])


def record_key_split() -> Path:
    """Both paths forced, and the defaults' choice, timed beside SDPA default on every small problem
    (each checked first on that problem)."""
    import torch

    from .bench import compare, paired_ratio
    from .binding import load as load_phase
    from .check import check
    gpu = env.gpu()
    fns = {label: load_phase(KEY_SPLIT_PHASE, **defines) for label, defines in KEY_SPLIT_PATHS.items()}
    fns["defaults"] = load_phase(KEY_SPLIT_PHASE)
    rows = []
    for case in shapes.SMALL:
        for label, fn in fns.items():
            result = check(fn, case, torch.float16)
            if not result.passed:
                raise AssertionError(f"{label} is wrong on {case.name}: {result}")
        timings = compare(fns, case, ("sdpa_default",), rounds=EXPERIMENT_ROUNDS)
        row = {"case": case.name, "shape": case.label(), "ctas": large_tile_ctas(case, gpu.cc), "sms": gpu.sms,
               "sdpa_default_us": timings["sdpa_default"]["gpu_us"], "sm_clock_mhz": timings["sm_clock_mhz"]}
        for label in fns:
            row[f"{label}_us"] = timings[label]["gpu_us"]
            row[f"{label}_spread_us"] = [timings[label]["gpu_us_min"], timings[label]["gpu_us_max"]]
            row[f"{label}_vs_sdpa"] = paired_ratio(timings[label], timings["sdpa_default"])
        row["split_over_large"] = paired_ratio(timings["key split"], timings["large tiles"])
        rows.append(row)
    return results.write(make_record(KEY_SPLIT_RECORD, KEY_SPLIT_PHASE, {**KEY_SPLIT_PATHS, "defaults": {}}, rows))


def key_split_runs(gpu_slug: str = results.DEFAULT_GPU) -> tuple[pd.DataFrame, str]:
    """The recorded key-split crossover, one row per small problem: its sequence length, head dim and mask,
    the large-tile grid's CTAs and their share of the SMs (`fill`), both paths forced and the defaults beside
    SDPA default, `split_over_large` (paired), and the path the defaults take: the key split below
    `threshold_ctas`, the recorded defaults' SMALL_PROBLEM_FILL percent of the SMs."""
    record = load(KEY_SPLIT_RECORD, gpu_slug)
    rows = pd.DataFrame(record["rows"])
    cases = [shapes.select(name)[0] for name in rows["case"]]
    rows["seqlen"] = [case.seqlen_q for case in cases]
    rows["head_dim"] = [case.head_dim for case in cases]
    rows["causal"] = [case.causal for case in cases]
    rows["fill"] = rows["ctas"] / rows["sms"]
    rows["threshold_ctas"] = rows["sms"] * record["builds"]["defaults"]["tile_params"]["SMALL_PROBLEM_FILL"] // 100
    rows["defaults take"] = ["key split" if ctas < threshold else "large tiles"
                             for ctas, threshold in zip(rows["ctas"], rows["threshold_ctas"])]
    return rows, provenance(record)


def ablation_runs(phase_name: str, gpu_slug: str = results.DEFAULT_GPU) -> tuple[pd.DataFrame, dict, str]:
    record = load(variants_name(phase_name, "ablation"), gpu_slug)
    return pd.DataFrame(record["rows"]), record["sdpa"], provenance(record)


# --- the rungs (chapter 7) ----------------------------------------------------------------------------

def load_rungs(phase_name: str, gpu_slug: str = results.DEFAULT_GPU, root: Path = RESULTS_DIR) -> dict | None:
    return load_if_recorded(variants_name(phase_name, "rung"), gpu_slug, root)


def rungs_missing_message(phase_name: str, gpu_slug: str = results.DEFAULT_GPU) -> str:
    return missing_message(variants_name(phase_name, "rung"), f"The rungs experiment of {phase_name}",
                           f"rungs --phase {phase_name}", gpu_slug)


def rung_frame(record: dict) -> pd.DataFrame:
    """A rungs record, one row per rung and timing case: the rung (1, 2, ...) and its label, its status,
    ptxas registers and spill bytes (the worst kernel of the build), its GPU time (median over the rounds)
    and spread, SDPA default's from the same rounds, and its paired time ratios to SDPA default, to the
    defaults and to the rung before (NaN for the first rung); `speedup` is the previous rung's GPU time
    over this one's, the inverse of that paired ratio."""
    cases = [name for name in VARIANT_TIMING_CASES if any(f"{name}_us" in row for row in record["rows"])]
    rows = []
    for number, row in enumerate(record["rows"], start=1):
        for case in cases:
            spread = row.get(f"{case}_spread_us", [math.nan, math.nan])
            rows.append({"rung": number, "variant": row["variant"], "case": case, "status": row["status"],
                         "registers": row.get("registers"), "spill_bytes": row.get("spill_bytes"),
                         "gpu_us": row.get(f"{case}_us", math.nan), "gpu_us_min": spread[0], "gpu_us_max": spread[1],
                         "sdpa_us": row.get(f"{case}_sdpa_us", math.nan),
                         "vs_sdpa": row.get(f"{case}_vs_sdpa", math.nan),
                         "vs_defaults": row.get(f"{case}_vs_defaults", math.nan),
                         "vs_previous": row.get(f"{case}_vs_previous", math.nan)})
    frame = pd.DataFrame(rows)
    frame["speedup"] = 1.0 / frame["vs_previous"]
    return frame


def sweep_runs(phase_name: str, gpu_slug: str = results.DEFAULT_GPU) -> tuple[pd.DataFrame, dict, str]:
    """The recorded sweep (sweeps are minutes of compiling, so chapters replay them even on a GPU;
    the widget measures single configurations live)."""
    record = load(sweep_name(phase_name), gpu_slug)
    return pd.DataFrame(record["rows"]), record["sdpa"], provenance(record)
