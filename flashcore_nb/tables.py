"""Tables a chapter prints: correctness, speed beside SDPA, ptxas stats per arch, occupancy per GPU, what
limits a phase (its Nsight Compute profile), every phase side by side (the results chapter), and
flashcore_nb.attention over the grid (the chapter "Choosing a kernel")."""
from __future__ import annotations

import math

import pandas as pd

from . import accuracy, budget, build, profile, results, roofline, shapes
from .bench import BASELINES, TRITON, baseline_us, short_name, time_ratio
from .phases import get
from .shapes import Case


def correctness(runs: pd.DataFrame) -> pd.DataFrame:
    table = runs[["case", "shape", "causal", "dtype", "max_abs_err", "sdpa_max_abs_err", "unwritten", "passed"]].copy()
    table["shape"] = table["shape"].map(lambda s: "x".join(map(str, s)))
    table["err / sdpa err"] = table["max_abs_err"] / table["sdpa_max_abs_err"].where(table["sdpa_max_abs_err"] > 0)
    return table.reset_index(drop=True)


def speed(runs: pd.DataFrame, matmul_tflops: float | None = None) -> pd.DataFrame:
    """GPU time (µs, median over interleaved rounds) of the phase and of every baseline from the same
    run, the phase's spread over the rounds, its paired time ratio to SDPA default and to the Triton
    peer, its throughput, and the call latency of the phase and of SDPA default side by side."""
    timed = runs[runs["gpu_us"].notna()]
    rows = []
    for _, run in timed.iterrows():
        row = {"case": run["case"], "GPU µs": run["gpu_us"],
               "spread %": 100.0 * (run["gpu_us_max"] - run["gpu_us_min"]) / run["gpu_us"]}
        for name in BASELINES:
            row[f"{name.removeprefix('sdpa_')} µs"] = baseline_us(run["baselines"], name)
        row["time / default"] = time_ratio(run["baselines"], "sdpa_default")
        row["time / triton"] = time_ratio(run["baselines"], TRITON)
        row["TFLOP/s"] = run["tflops"]
        if matmul_tflops:
            row["% of matmul peak"] = 100.0 * run["tflops"] / matmul_tflops
        row["call µs"] = run["call_us"]
        row["default call µs"] = (run["baselines"].get("sdpa_default") or {}).get("call_us")
        rows.append(row)
    return pd.DataFrame(rows)


def versus_sdpa(runs: pd.DataFrame, label: str) -> pd.DataFrame:
    """The phase against SDPA's FlashAttention-2 backend, its default (cuDNN on an H100) and the Triton
    peer: GPU times from the same run, and paired ratios over its interleaved rounds."""
    timed = runs[runs["gpu_us"].notna()]
    table = pd.DataFrame({
        "case": timed["case"],
        f"{label} µs": timed["gpu_us"],
        "SDPA flash (FA2) µs": [baseline_us(b, "sdpa_flash") for b in timed["baselines"]],
        "SDPA default (cuDNN) µs": [baseline_us(b, "sdpa_default") for b in timed["baselines"]],
        "Triton peer µs": [baseline_us(b, TRITON) for b in timed["baselines"]],
        "speed-up over FA2": [1.0 / time_ratio(b, "sdpa_flash") for b in timed["baselines"]],
        "time / SDPA default": [time_ratio(b, "sdpa_default") for b in timed["baselines"]],
        "time / Triton": [time_ratio(b, TRITON) for b in timed["baselines"]],
    })
    return table.reset_index(drop=True)


def ablation(rows: pd.DataFrame, cases: list[str]) -> pd.DataFrame:
    """An ablation record's variants: ptxas registers and spill bytes, each case's GPU time and its time
    ratio to the defaults, paired over the rounds in which both were timed (the defaults' own row
    reads about 1: the noise)."""
    table = rows[["variant", "status", "registers", "spill_bytes"] + [f"{c}_us" for c in cases]].copy()
    for c in cases:
        table[f"{c} vs defaults"] = rows[f"{c}_vs_defaults"]
    return table


def rungs(frame: pd.DataFrame) -> pd.DataFrame:
    """A rungs record (experiments.rung_frame) one rung per row: what it adds, its status, ptxas registers
    and spill bytes, and each case's GPU time (median over the rounds)."""
    first = frame.drop_duplicates("rung").set_index("rung")
    table = pd.DataFrame({"rung": first.index, "adds": first["variant"].to_numpy(),
                          "status": first["status"].to_numpy(), "registers": first["registers"].to_numpy(),
                          "spill bytes": first["spill_bytes"].to_numpy()})
    times = frame.pivot(index="rung", columns="case", values="gpu_us")
    for case in frame["case"].unique():
        table[f"{case} µs"] = times[case].to_numpy()
    return table


def rung(frame: pd.DataFrame, number: int) -> pd.DataFrame:
    """One rung of experiments.rung_frame, one row per case: GPU time and spread over the rounds, and three
    ratios paired over the rounds in which both were timed: the speed-up over the rung before (its GPU time
    over this one's; none for the first rung), and this rung's GPU time over SDPA default's and over the
    defaults' (the last rung)."""
    part = frame[frame["rung"] == number]
    table = pd.DataFrame({"case": part["case"], "GPU µs": part["gpu_us"],
                          "spread %": 100.0 * (part["gpu_us_max"] - part["gpu_us_min"]) / part["gpu_us"]})
    if number > 1:
        table[f"speed-up over rung {number - 1}"] = part["speedup"]
    table["time / SDPA default"] = part["vs_sdpa"]
    table["time / defaults"] = part["vs_defaults"]
    return table.reset_index(drop=True)


def key_split(rows: pd.DataFrame) -> pd.DataFrame:
    """experiments.key_split_runs by the large-tile grid's size: its CTAs and share of the SMs, both paths'
    GPU time, the key split's over the large tiles' (paired), the path the defaults take, and their GPU
    time beside SDPA default's with the paired ratio."""
    table = pd.DataFrame({
        "problem": rows["shape"], "CTAs": rows["ctas"], "% of SMs": 100.0 * rows["fill"],
        "large tiles µs": rows["large tiles_us"], "key split µs": rows["key split_us"],
        "split / large": rows["split_over_large"], "defaults take": rows["defaults take"],
        "defaults µs": rows["defaults_us"], "SDPA default µs": rows["sdpa_default_us"],
        "defaults / SDPA default": rows["defaults_vs_sdpa"]})
    return table.sort_values("CTAs", kind="stable").reset_index(drop=True)


def accuracy_summary(frames: dict[str, pd.DataFrame], distribution: str = accuracy.RANDOM.name) -> pd.DataFrame:
    """Per phase and dtype, the default build on one distribution's random problems (accuracy.frame per
    phase): problems, how many pass the book's rule, the error as a multiple of SDPA's on the same
    inputs (worst, 99th percentile, median) and the worst problem."""
    parts = [accuracy.summary(accuracy.defaults(frame, distribution), by=("dtype",)).assign(phase=name)
             for name, frame in frames.items()]
    table = pd.concat(parts, ignore_index=True)
    return table[["phase", "dtype", "problems", "passed", "worst", "99th percentile", "median", "worst problem"]]


def accuracy_causes(record: dict) -> pd.DataFrame:
    """An accuracy record's builds (the defaults, then one suspect changed each) on the same problems:
    per distribution and dtype the worst error as a multiple of SDPA's, on the random problems its
    99th percentile too, and the problems each build fails."""
    frame = accuracy.frame(record)
    table = pd.DataFrame(index=pd.Index(accuracy.build_labels(record), name="build"))
    for (distribution, dtype), part in frame.groupby(["distribution", "dtype"], sort=False):
        ratios = part.groupby("build", sort=False)["ratio"]
        table[f"{distribution} {dtype} worst"] = ratios.max()
        if distribution == accuracy.RANDOM.name:
            table[f"{distribution} {dtype} 99th pct"] = ratios.apply(accuracy.percentile, q=0.99)
    table["problems failed"] = (~frame["passed"]).groupby(frame["build"]).sum()
    return table.reset_index()


def accuracy_cost(record: dict) -> pd.DataFrame:
    """What each build of an accuracy record costs: ptxas registers and spill bytes, and at each timing
    case its GPU time over the defaults' and over SDPA default's, paired over interleaved rounds."""
    timing = pd.DataFrame(record["timing"])
    table = pd.DataFrame({"build": accuracy.build_labels(record)}).set_index("build")
    table["registers"] = pd.Series({label: p["registers"] for label, p in record["ptxas"].items()})
    table["spill bytes"] = pd.Series({label: p["spill_bytes"] for label, p in record["ptxas"].items()})
    for key, name in (("vs_defaults", "/ defaults"), ("vs_sdpa", "/ SDPA default")):
        by_case = timing.pivot(index="build", columns="case", values=key)
        for case in dict.fromkeys(timing["case"]):
            table[f"{case} {name}"] = by_case[case]
    return table.reset_index()


TOP_STALLS = 3


def limits(record: dict) -> pd.DataFrame:
    """A phase's recorded profile (profile.py), a row per case (per build and case for the rungs' profile,
    the build first): registers, achieved occupancy, warps per scheduler and how many of them can issue,
    tensor-pipe and issue-slot busy shares, the share of shared-memory wavefronts that bank conflicts add,
    the cycles between two instructions of a warp, and the largest stall reasons in them."""
    rows = []
    for run in record["rows"]:
        wavefronts = run["smem_ld_wavefronts"] + run["smem_st_wavefronts"]
        conflicts = run["smem_ld_conflicts"] + run["smem_st_conflicts"]
        row = {**({"build": run["build"]} if "build" in run else {}), "case": run["case"],
               "registers": int(run["registers"]),
               "occupancy %": run["achieved_occupancy_pct"], "warps / scheduler": run["warps_per_scheduler"],
               "eligible / scheduler": run["eligible_per_scheduler"], "tensor pipe %": run["tensor_pipe_pct"],
               "issue busy %": run["issue_busy_pct"],
               "bank-conflict wavefronts %": 100.0 * conflicts / wavefronts if wavefronts else math.nan,
               "cycles / issue": run["cycles_per_issue"]}
        # "selected" is the issue itself, one cycle per instruction: not a wait
        stalls = sorted(((cycles, reason) for reason, cycles in run["stalls"].items() if reason != "selected"),
                        reverse=True)
        for i in range(TOP_STALLS):
            row[f"stall {i + 1}"] = (f"{profile.stall_label(stalls[i][1])} {stalls[i][0]:.2f}"
                                     if i < len(stalls) else "")
        rows.append(row)
    return pd.DataFrame(rows)


def ptxas(phase_name: str, record: dict | None = None) -> tuple[pd.DataFrame, str]:
    """Per-arch stats compiled now with nvcc when it is here (any machine), else the record's. ptxas
    sees only static shared memory; for phases that ask for theirs at launch, the dynamic size is
    added from budget.py (which a CPU test checks against the kernels' own sizeof)."""
    phase = get(phase_name)
    try:
        ccs = list(phase.archs)
        rows = [build.compile_only(phase.kernel_file, cc, phase.tile_params_for(cc), phase.arch_specific).columns()
                for cc in ccs]
        source = "compiled just now with nvcc " + (build.env.nvcc_version() or "")
    except build.CompileError as error:
        if record is None or "nvcc not found" not in str(error):
            raise
        ccs, rows = [record["env"]["cc"]], [record["ptxas"]]
        source = "from the record (no nvcc on this machine): " + results.provenance(record)
    table = pd.DataFrame([{"arch": phase.arch_name(cc), **row} for cc, row in zip(ccs, rows)])
    table = table.rename(columns={"smem_bytes": "static smem bytes"})
    if phase.smem_layout:
        for head_dim in phase.head_dims:
            table[f"dynamic smem bytes (D={head_dim})"] = [
                budget.smem_bytes(phase_name, head_dim, phase.tile_params_for(cc)) for cc in ccs]
    return table, source


def ptxas_builds(phase_name: str, builds: dict[str, dict], cc: int = 90) -> pd.DataFrame:
    """ptxas stats compiled now with nvcc (no GPU needed) of several builds of one phase, label -> defines
    over its defaults on a GPU of compute capability `cc`: per build, its worst kernel's registers, spills
    and stack (the build holds every head dim, dtype and launch path)."""
    from concurrent.futures import ThreadPoolExecutor
    phase = get(phase_name)

    def stats(defines: dict) -> build.PtxasStats:
        return build.compile_only(phase.kernel_file, cc, {**phase.tile_params_for(cc), **defines}, phase.arch_specific)
    with ThreadPoolExecutor() as pool:   # nvcc runs in its own process: threads compile in parallel
        compiled = list(pool.map(stats, builds.values()))
    table = pd.DataFrame([{"build": label, "arch": phase.arch_name(cc), **vars(row)} for label, row in zip(builds, compiled)])
    return table.drop(columns=["smem_bytes", "kernels"])


def steps(records: list[dict], cases=("mission", "b16h16_s512"), labels: list[str] | None = None) -> pd.DataFrame:
    """GPU time per case across successive records of one phase (see results.history), each with its
    paired ratio to SDPA default from its own run."""
    rows = []
    for i, record in enumerate(records):
        timed = {run["case"]: run for run in record["runs"] if run["gpu_us"] is not None}
        row = {"step": labels[i] if labels else record["commit"][:7], "commit": record["commit"][:7]}
        for case in cases:
            row[f"{case} µs"] = timed[case]["gpu_us"]
            row[f"{case} / SDPA default"] = _ratio_to_default(timed[case])
        rows.append(row)
    return pd.DataFrame(rows)


def _ratio_to_default(run: dict) -> float:
    """The paired ratio where the record has one; records made before interleaved rounds (schema 1,
    kept in history/) only have the ratio of the two medians."""
    timing = run["baselines"]["sdpa_default"]
    return timing.get("time_ratio") or run["gpu_us"] / timing["gpu_us"]


def occupancy(configs, gpus=tuple(budget.GPUS.values())) -> pd.DataFrame:
    """Blocks per SM, occupancy and its limiter on each GPU, one row per (label, phase, head_dim,
    tile_params, registers) config; registers per thread come from the caller (ptxas records)."""
    rows = []
    for label, phase_name, head_dim, tile_params, registers in configs:
        threads = budget.threads_per_block(phase_name, tile_params, head_dim)
        smem = budget.cta_smem_bytes(phase_name, head_dim, tile_params)
        row = {"config": label, "threads": threads, "registers": registers, "smem KB": smem / 1024}
        for gpu in gpus:
            occ = budget.occupancy(gpu, threads, registers, smem)
            row[f"{gpu.name} blocks/SM"] = occ.blocks_per_sm
            row[f"{gpu.name} occupancy %"] = 100.0 * occ.occupancy
            row[f"{gpu.name} limiter"] = occ.limiter if occ.fits else f"does not fit ({occ.limiter})"
        rows.append(row)
    return pd.DataFrame(rows)


# --- small problems across CTAs (chapter 10): arithmetic from the registry's tile parameters ------------

def small_problem_grids(case: Case, cc: int = 90, sms: int = budget.GPUS["H100"].sm_count) -> pd.DataFrame:
    """How many CTAs phase 7 and phase 10 give `case` on a GPU of compute capability `cc` with `sms` SMs,
    and how many keys each CTA streams: phase 7's large tiles, phase 7's own choice, phase 10 with no split,
    and phase 10's defaults (clusters from sm_90 on)."""
    p07, p10 = get("p07_registers").tile_params_for(cc), get("p10_splitkv").tile_params_for(cc)
    rows = [budget.p07_launch(case, {**p07, "SMALL_PROBLEM_FILL": 0}, sms), budget.p07_launch(case, p07, sms),
            budget.p10_launch(case, {**p10, "SPLITS": 1}, sms), budget.p10_launch(case, p10, sms, clusters=cc >= 90)]
    table = pd.DataFrame(rows).drop_duplicates(subset="configuration")
    table["% of SMs"] = 100.0 * table["CTAs"] / sms
    table["keys per CTA, % of the head's"] = 100.0 * table["keys per CTA"] / case.sk
    table["K and V copied per CTA (KB)"] = table["keys per CTA"] * case.head_dim * 2 * 2 / 1024   # fp16 K and V
    table["query rows x keys per CTA"] = table["rows per CTA"] * table["keys per CTA"]
    return table.reset_index(drop=True)


def p10_split_choices(cases: list[Case], variants: dict[str, dict], cc: int = 90,
                      sms: int = budget.GPUS["H100"].sm_count) -> pd.DataFrame:
    """variant x case: the CTAs per query tile (cluster size) phase 10 launches with each variant's defines
    over its defaults (1: no split), and its grid's CTAs per SM."""
    defaults = get("p10_splitkv").tile_params_for(cc)
    rows = []
    for label, defines in variants.items():
        row = {"variant": label}
        for case in cases:
            launch = budget.p10_launch(case, {**defaults, **defines}, sms, clusters=cc >= 90)
            row[f"{case.name} splits"] = launch["CTAs per query tile"]
            row[f"{case.name} CTAs / SMs"] = launch["CTAs"] / sms
        rows.append(row)
    return pd.DataFrame(rows)


# --- every phase side by side: frames from results.timing_frame ------------------------------------

def phases_correctness(records: dict[str, dict]) -> pd.DataFrame:
    """One row per phase: its checks (case x dtype), whether all passed, outputs left unwritten, and the
    worst error as a multiple of SDPA's on the same inputs (1 = as accurate as SDPA)."""
    rows = []
    for name, record in records.items():
        runs = correctness(pd.DataFrame(record["runs"]))
        worst = runs.loc[runs["err / sdpa err"].idxmax()]
        rows.append({"phase": name, "checks": len(runs), "dtypes": ", ".join(dict.fromkeys(runs["dtype"])),
                     "all passed": bool(runs["passed"].all()), "unwritten": int(runs["unwritten"].sum()),
                     "max |error|": runs["max_abs_err"].max(), "worst err / sdpa err": worst["err / sdpa err"],
                     "worst case": f"{worst['case']} ({worst['dtype']})"})
    return pd.DataFrame(rows)


def phases_speed(frame: pd.DataFrame) -> pd.DataFrame:
    """GPU time of every phase at every timed case, each baseline from the same run beside it, the
    paired time ratio to SDPA default and to the Triton peer, and the call latency of the phase and of
    SDPA default."""
    table = frame[["case", "phase", "gpu_us", *(f"{b}_us" for b in BASELINES), "sdpa_default_ratio",
                   f"{TRITON}_ratio", "call_us", "sdpa_default_call_us"]].copy()
    table.columns = ["case", "phase", "phase µs", *(f"{b.removeprefix('sdpa_')} µs" for b in BASELINES),
                     "phase / default", "phase / triton", "call µs", "default call µs"]
    case_order = {case: i for i, case in enumerate(dict.fromkeys(frame["case"]))}
    return table.sort_values("case", key=lambda c: c.map(case_order), kind="stable").set_index(["case", "phase"])


def _by_phase(frame: pd.DataFrame, values: pd.Series) -> pd.DataFrame:
    """phase x case, both in recorded order."""
    table = frame.assign(value=values).pivot(index="phase", columns="case", values="value")
    return table.loc[list(dict.fromkeys(frame["phase"])), list(dict.fromkeys(frame["case"]))]


def phases_vs_sdpa(frame: pd.DataFrame, baseline: str = "sdpa_default") -> pd.DataFrame:
    """phase x case: GPU time / a baseline's (SDPA default, or e.g. "triton"), paired over the rounds of
    one run (below 1 beats it)."""
    return _by_phase(frame, frame[f"{baseline}_ratio"])


def phase_steps(frame: pd.DataFrame) -> pd.DataFrame:
    """phase x case: how many times faster than the phase before (below 1: slower). Two phases are
    recorded in different runs, so the step goes through SDPA default, timed in both: the ratio of
    their paired ratios to it, which cancels what moved between the runs (clocks, above all)."""
    ratios = _by_phase(frame, frame["sdpa_default_ratio"])
    return ratios.shift(1) / ratios


def versus_phase(earlier: str, later: str, gpu_slug: str = results.DEFAULT_GPU) -> pd.DataFrame:
    """Two phases per timed case, each from its own record: GPU time, paired ratio to SDPA default, and
    the step between them through SDPA default (above 1: `later` is that many times faster)."""
    records = {name: results.load(name, gpu_slug) for name in (earlier, later)}
    ratios = results.timing_frame(records).pivot(index="case", columns="phase")
    a, b = (name.split("_")[0] for name in (earlier, later))
    table = pd.DataFrame({f"{a} µs": ratios["gpu_us"][earlier], f"{b} µs": ratios["gpu_us"][later],
                          f"{a} / default": ratios["sdpa_default_ratio"][earlier],
                          f"{b} / default": ratios["sdpa_default_ratio"][later]})
    table["step (× faster)"] = table[f"{a} / default"] / table[f"{b} / default"]
    order = [run["case"] for run in records[later]["runs"] if run["gpu_us"] is not None]
    return table.loc[order].reset_index()


def phases_throughput(frame: pd.DataFrame) -> pd.DataFrame:
    """phase x case: TFLOP/s, and % of the dense fp16 matmul rate measured in the same run. The last
    rows are SDPA's default backend from the last phase's run."""
    last = frame[frame["phase"] == frame["phase"].iloc[-1]]
    sdpa = last.assign(phase=f"SDPA default ({last['phase'].iloc[0]}'s run)", gpu_us=last["sdpa_default_us"],
                       tflops=last["sdpa_default_tflops"])
    both = pd.concat([frame, sdpa], ignore_index=True)
    return pd.concat({"TFLOP/s": _by_phase(both, both["tflops"]),
                      "% of matmul peak": _by_phase(both, 100.0 * both["tflops"] / both["matmul_tflops"])}, axis=1)


def intensity(cases: list[Case], peaks=None) -> pd.DataFrame:
    """FLOPs, minimum HBM traffic and arithmetic intensity per case; with measured peaks (peaks.Peaks),
    the roofline's attainable fp16 TFLOP/s and which ceiling sets it."""
    rows = []
    for case in cases:
        flop_per_byte = roofline.intensity(case)
        row = {"case": case.name, "shape": case.label(), "GFLOP": case.flops() / 1e9,
               "min HBM MB": roofline.min_hbm_bytes(case) / 1e6, "FLOP / byte": flop_per_byte}
        if peaks is not None:
            peak, bandwidth = peaks.matmul_tflops["float16"], peaks.bandwidth_gb_s
            row["roofline TFLOP/s"] = roofline.attainable_tflops(flop_per_byte, peak, bandwidth)
            row["bound by"] = "memory" if flop_per_byte < roofline.ridge(peak, bandwidth) else "compute"
        rows.append(row)
    return pd.DataFrame(rows)


# --- the grid: flashcore_nb.attention against SDPA (grid.frame) ---------------------------------------------

def grid_targets(summary: dict) -> pd.DataFrame:
    """grid.summary against issue 17's targets: each measure, its value in the record, the target, and whether
    the record meets it."""
    from .grid import MISSION_CALL_TARGET, MISSION_TARGET_US, TARGETS
    rows = []
    for measure, target in TARGETS.items():
        value = summary[measure]
        label = f"{measure} ({summary['worst case']})" if measure.startswith("worst") else measure
        rows.append({"measure": label, "recorded": value, "target": f"≥ {target:g}",
                     "met": None if value is None else value >= target})
    for measure, target in (("mission GPU µs", MISSION_TARGET_US),
                            ("mission call latency / SDPA default's", MISSION_CALL_TARGET)):
        rows.append({"measure": measure, "recorded": summary[measure], "target": f"≤ {target:g}",
                     "met": summary[measure] <= target})
    return pd.DataFrame(rows)


def _grid_view(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "case": frame["case"], "shape": frame["shape"], "SDPA default runs": frame["sdpa_default_backend"],
        "fastest": frame["fastest"], "attention runs": frame["choice"],
        "attention GPU µs": frame["attention_dispatch_us"], "SDPA default GPU µs": frame["sdpa_default_dispatch_us"],
        "Triton peer GPU µs": frame[f"{TRITON}_dispatch_us"],
        "speed vs SDPA default": frame["speed_vs_sdpa_default"], "speed vs Triton": frame[f"speed_vs_{TRITON}"],
        "attention call µs": frame["attention_call_us"], "SDPA default call µs": frame["sdpa_default_call_us"],
        "correct": frame["check_passed"]})


def grid_cases(frame: pd.DataFrame) -> pd.DataFrame:
    """Every grid case: the backend SDPA picks, the fastest method of the race, the phase `attention` runs,
    `attention`'s GPU time beside SDPA default's and the Triton peer's from the same rounds with its speed
    over each (paired; above 1 faster), both call latencies, and its check."""
    return _grid_view(frame).reset_index(drop=True)


def grid_mission(frame: pd.DataFrame) -> pd.DataFrame:
    """grid_cases at the mission shapes (both head dims): GPU time and call latency of `attention` beside SDPA's."""
    view = _grid_view(frame)
    names = [shapes.MISSION.name, shapes.MISSION_CAUSAL.name, shapes.MISSION_D128.name, shapes.MISSION_D128_CAUSAL.name]
    mission = view[view["case"].isin(names)]
    return mission.drop(columns=["shape", "fastest", "correct"]).reset_index(drop=True)


def heldout_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """heldout.summary for each set of held-out shapes, a column each: the grid's measures for `attention`, then
    how often and how far its rule and the rule without wave regimes missed the fastest candidate."""
    from .heldout import SETS, summary
    return pd.DataFrame({name: summary(frame[frame["set"] == name]) for name in SETS}).rename_axis("measure")


def heldout_cases(frame: pd.DataFrame, set_name: str) -> pd.DataFrame:
    """The held-out shapes of one set: each one's wave regime, the grid case whose ranking `attention` took and what
    it ran, the fastest candidate of the race, the regret (GPU time over the fastest candidate's, paired),
    `attention`'s speed over SDPA default and the Triton peer, and the choices made without wave regimes and without
    the grid cases added for the held-out misses (heldout.ADDED_GRID_CASES); candidates by their phase's number
    ('p09:64-row')."""
    part = frame[frame["set"] == set_name]
    return pd.DataFrame({
        "shape": part["shape"], "regime": part["wave regime"], "nearest grid case": part["nearest_grid_case"],
        "attention runs": part["choice"].map(short_name),
        "fastest candidate": part["fastest_candidate"].map(short_name), "regret": part["regret"],
        "speed vs SDPA default": part["speed_vs_sdpa_default"], "speed vs Triton": part["speed_vs_triton"],
        "sizes only: grid case": part["sizes-only case"], "sizes only: runs": part["sizes-only choice"].map(short_name),
        "sizes only: regret": part["sizes-only regret"],
        "without added cases: runs": part["without added cases: choice"].map(short_name),
        "without added cases: regret": part["without added cases: regret"],
    }).reset_index(drop=True)


# --- how flashcore_nb.attention chooses (dispatch.py, tuning.py) --------------------------------------------

def dispatch_candidates() -> pd.DataFrame:
    """What `attention` chooses among: the phases marked `dispatch` (phases.Phase.dispatch), each with what it
    declares, and after each the tile configurations it offers as candidates (phases.Variant.candidate), with
    the defines they change and the head dims they are for."""
    from .phases import PHASES
    rows = []
    for name, phase in PHASES.items():
        if not phase.dispatch:
            continue
        declared = {"runs on": phase.requirement, "dtypes": ", ".join(phase.dtypes), "causal": phase.causal,
                    "Sq ≠ Sk": phase.cross_lengths}
        rows.append({"candidate": name, "tiles": "defaults", **declared,
                     "head dims": ", ".join(map(str, phase.head_dims)),
                     "fallback: waves from": phase.fallback_waves[0], "fallback: waves below": phase.fallback_waves[1]})
        for v in phase.candidate_variants:
            tiles = ", ".join(f"{key}={value}" for key, value in v.defines.items())
            rows.append({"candidate": f"{name}:{v.candidate}", "tiles": tiles,
                         **declared, "head dims": ", ".join(map(str, v.head_dims or phase.head_dims)),
                         "fallback: waves from": None, "fallback: waves below": None})
    return pd.DataFrame(rows)


def dispatch_fallback(cases: list[Case], gpus=tuple(budget.GPUS.values())) -> pd.DataFrame:
    """case x GPU: the phase `attention` takes without a tuning table (dispatch.fallback), in fp16; the GPUs
    described by their limits in budget.py."""
    from .dispatch import fallback
    from .tuning import Problem
    rows = []
    for case in cases:
        row = {"case": case.label()}
        for limits in gpus:
            choice = fallback(budget.gpu_info(limits), Problem.of_case(case))
            row[f"{limits.name} (sm_{limits.cc})"] = choice.phase if choice else "none runs it"
        rows.append(row)
    return pd.DataFrame(rows)


def dispatch_choices(cases: list[Case], gpu, table) -> pd.DataFrame:
    """What `attention` runs for each problem on a GPU (env.GpuInfo) with a tuning table (or None): the
    problem's size in waves of 128-row query tiles, its wave regime (tuning.py), the nearest grid case of that regime,
    the phase, and why."""
    from .dispatch import choose
    from .tuning import Problem, nearest
    rows = []
    for case in cases:
        problem = Problem.of_case(case)
        entry = nearest(table, problem, gpu.sms) if table is not None else None
        choice = choose(gpu, problem, table)
        rows.append({"problem": case.label(), "waves": problem.waves(gpu.sms),
                     "wave regime": problem.wave_regime(gpu.sms),
                     "nearest grid case": entry.case if entry else None,
                     "attention runs": choice.candidate if choice else None, "why": choice.reason if choice else None})
    return pd.DataFrame(rows)


# --- where each kernel wins: the sequence-length sweep (seqlen.frame) -----------------------------------------

def _seqlen(s: int) -> str:
    """16384 -> '16k', 512 -> '512'."""
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def _spans(seqlens: list[int], chosen) -> str:
    """The chosen sequence lengths as runs of neighbours in the sweep: '128–1k, 16k'; '—' for none."""
    chosen, spans, run = set(chosen), [], []
    for s in seqlens:
        if s in chosen:
            run.append(s)
        elif run:
            spans.append(run)
            run = []
    spans += [run] if run else []
    return ", ".join(_seqlen(r[0]) if len(r) == 1 else f"{_seqlen(r[0])}–{_seqlen(r[-1])}" for r in spans) or "—"


def _leaders(seqlens: list[int], leader: dict) -> str:
    """Who leads where, in order of S: 'p10 128–512, p08 1k–16k' (leader: S -> method)."""
    parts = []
    for s in seqlens:
        name = leader.get(s)
        if parts and parts[-1][0] == name:
            parts[-1][1].append(s)
        else:
            parts.append((name, [s]))
    from .seqlen import label
    return ", ".join(f"{label(name) if name else 'none'} {_spans(run, run)}" for name, run in parts)


def _panels(frame: pd.DataFrame):
    for head_dim in sorted(frame["head_dim"].unique()):
        for causal in (False, True):
            part = frame[(frame["head_dim"] == head_dim) & (frame["causal"] == causal)]
            if len(part):
                yield int(head_dim), causal, part


def _fastest(part: pd.DataFrame, phases_only: bool) -> dict:
    """S -> the method of most TFLOP/s there (a phase only where its check passed; SDPA default left out where
    cuDNN is timed: it runs one of the backends, on the H100 that one)."""
    usable = part[part["correct"].map(lambda c: c is not False)]
    if (usable["method"] == "sdpa_cudnn").any():
        usable = usable[usable["method"] != "sdpa_default"]
    if phases_only:
        usable = usable[usable["is_phase"]]
    return {int(s): rows.loc[rows["tflops"].idxmax(), "method"] for s, rows in usable.groupby("seqlen")}


def seqlen_tflops(frame: pd.DataFrame) -> pd.DataFrame:
    """TFLOP/s of every method at every case of the sweep (rows: head dim, mask, S; phases first, then the
    baselines), with the fastest phase and its speed over the reference (cuDNN; paired over the rounds), and the
    fastest method of all. A phase whose check failed is never called fastest."""
    from .seqlen import label
    methods = list(dict.fromkeys([*frame.loc[frame["is_phase"], "method"], *frame.loc[~frame["is_phase"], "method"]]))
    rows = []
    for head_dim, causal, part in _panels(frame):
        best_phase, best = _fastest(part, True), _fastest(part, False)
        for s, at in part.groupby("seqlen"):
            by_method = at.set_index("method")
            row = {"D": head_dim, "mask": "causal" if causal else "none", "S": int(s)}
            row.update({label(m): by_method["tflops"].get(m, float("nan")) for m in methods})
            phase = best_phase.get(int(s))
            row["fastest phase"] = phase or "—"
            row[f"its speed / {label(at['reference'].iloc[0])}"] = (by_method.loc[phase, "speed_vs_reference"]
                                                                   if phase else float("nan"))
            row["fastest of all"] = label(best[int(s)]) if int(s) in best else "—"
            rows.append(row)
    return pd.DataFrame(rows)


def seqlen_wins(frame: pd.DataFrame, share: float = 1.0, saturation: float | None = None) -> pd.DataFrame:
    """Where each kernel wins, one row per head dim and mask: from which S the reference (cuDNN) reaches
    `saturation` of its best TFLOP/s in the sweep (below it the problem is too small to fill the GPU), the fastest
    phase and the fastest method as runs of S, and for each phase the S where it reaches `share` of the reference's
    speed (paired over the rounds; 1.0: at least as fast) with its check passed."""
    from .seqlen import SATURATION, label
    saturation = SATURATION if saturation is None else saturation
    phases = list(dict.fromkeys(frame.loc[frame["is_phase"], "method"]))
    rows = []
    for head_dim, causal, part in _panels(frame):
        seqlens = sorted(int(s) for s in part["seqlen"].unique())
        reference = part["reference"].iloc[0]
        ref = part[part["method"] == reference].set_index("seqlen")["tflops"]
        filled = [int(s) for s, value in ref.items() if value >= saturation * ref.max()]
        row = {"D": head_dim, "mask": "causal" if causal else "none",
               f"{label(reference)} ≥ {saturation:.0%} of its best from S": _seqlen(min(filled)) if filled else "—",
               "fastest phase": _leaders(seqlens, _fastest(part, True)),
               "fastest of all": _leaders(seqlens, _fastest(part, False))}
        for phase in phases:
            mine = part[(part["method"] == phase) & part["correct"].map(lambda c: c is True)]
            column = f"{phase} ≥ {share:.0%} of {label(reference)} at S"
            row[column] = _spans(seqlens, mine.loc[mine["speed_vs_reference"] >= share, "seqlen"].astype(int)) \
                if (part["method"] == phase).any() else "does not run"
        rows.append(row)
    return pd.DataFrame(rows)


def trace_spans(record: dict, case: str, build: str, item: int = 0) -> pd.DataFrame:
    """One work item of CTA 0 from a trace record (trace.py), span by span in the order they began: who (the
    producer or a consumer warpgroup), the span, its key tile (blank for Q and the epilogue), and its start and
    length in µs from the CTA's first stamp. GEMM spans run from issue to the wait that saw them done."""
    from . import trace
    row = trace.row(record, case, build)
    spans = trace.spans(trace.events_frame(row))
    spans = spans[spans["item"] == item].sort_values("start")
    us = row["ns_per_cycle"] / 1000
    return pd.DataFrame({"who": [trace.role_name(role) for role in spans["role"]], "span": spans["span"].to_numpy(),
                         "key tile": [str(tile) if tile >= 0 else "" for tile in spans["tile"]],
                         "start (µs)": spans["start"].to_numpy() * us,
                         "length (µs)": (spans["end"] - spans["start"]).to_numpy() * us})
