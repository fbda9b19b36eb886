"""The tile explorer: pick BLOCK_M, BLOCK_N and NUM_WARPS for a phase and see what they cost.

Everywhere: shared memory, occupancy and waves per GPU (budget.py, pure arithmetic). On a GPU
(live mode) the button compiles that configuration (cached per configuration, with compile
progress), checks it and times it beside SDPA in the same run. Without one it shows the
configuration's row of the recorded sweep. A static page, which cannot run the widget, shows
static_view in its place: the same calculator as tables."""
from __future__ import annotations

import html

import pandas as pd

from . import budget, env, experiments, shapes
from .phases import get

CASE = shapes.MISSION


def calculator(phase_name: str, params: dict, registers: int, head_dim: int = CASE.head_dim,
               case: shapes.Case = CASE) -> pd.DataFrame:
    """Per GPU: does the CTA fit, how many are resident per SM, and how many waves `case` takes, for one
    tile configuration on every GPU (chapters 5 and 6: one CTA per BLOCK_M-row query tile)."""
    threads = budget.threads_per_block(phase_name, params, head_dim)
    smem = budget.cta_smem_bytes(phase_name, head_dim, params)
    rows = []
    for gpu in budget.GPUS.values():
        grid = budget.grid(phase_name, case, params, gpu)
        rows.append({"GPU": gpu.name, **_cost(gpu, grid, threads, registers, smem, case)})
    return pd.DataFrame(rows)


def _cost(gpu: budget.GpuLimits, grid: budget.Grid, threads: int, registers: int, smem: int,
          case: shapes.Case) -> dict:
    occ = budget.occupancy(gpu, threads, registers, smem)
    return {"smem KB": smem / 1024, "fits": occ.fits, "CTAs/SM": occ.blocks_per_sm,
            "occupancy %": 100 * occ.occupancy, "limiter": occ.limiter,
            f"CTAs ({case.name})": grid.ctas(gpu, occ), "waves": grid.waves(gpu, occ)}


def kernel_registers(phase_name: str, head_dim: int, kernel: str = "") -> tuple[int, str]:
    """Registers per thread of the phase's default build, for the kernel that runs at `head_dim` on the
    launch path `kernel` (budget.Grid.kernel), and where the number comes from. The Nsight Compute record
    (profile.py) measured each kernel it launched, one per profiled case: the first case whose head dim and
    path (on the H100, where it was recorded) match gives it. Otherwise the phase record's ptxas count,
    the most any of the build's kernels uses."""
    from . import profile, results
    record = experiments.load_if_recorded(profile.record_name(phase_name))
    h100 = budget.GPUS["H100"]
    for row in (record or {}).get("rows", []):
        case = shapes.select(row["case"])[0]
        if case.head_dim == head_dim and budget.grid(phase_name, case, None, h100).kernel == kernel:
            return int(row["registers"]), f"measured by Nsight Compute at {case.name}"
    return results.load(phase_name)["ptxas"]["registers"], "ptxas, the build's largest kernel"


def phase_calculator(phase_name: str, case: shapes.Case = CASE, params: dict | None = None,
                     registers: int | None = None) -> pd.DataFrame:
    """The calculator for any phase with tile parameters, per GPU: the grid `case` launches by the
    kernel's own rules (budget.grid: a key-split path, warpgroups of 64 rows, persistent CTAs walking work
    items, keys split over a cluster), the shared memory and threads of that CTA, how many are resident
    per SM and why, the CTAs launched and the waves of work items. `params`: over the defaults; None:
    each GPU's own defaults. `registers`: None reads them per kernel from the records (kernel_registers:
    the H100's build, on every GPU). A GPU that cannot run the phase gets a row that says so."""
    phase = get(phase_name)
    rows = []
    for gpu in budget.GPUS.values():
        row = {"GPU": gpu.name}
        if not phase.runs_on(gpu.cc):
            rows.append({**row, "configuration": f"does not run here: needs {phase.requirement}"})
            continue
        tiles = {**phase.tile_params_for(gpu.cc), **(params or {})}
        grid = budget.grid(phase_name, case, tiles, gpu)
        threads = budget.threads_per_block(phase_name, tiles, case.head_dim, grid.split)
        smem = budget.cta_smem_bytes(phase_name, case.head_dim, tiles, grid.split)
        regs = registers if registers is not None else kernel_registers(phase_name, case.head_dim, grid.kernel)[0]
        rows.append({**row, "configuration": grid.configuration, "threads": threads, "registers": regs,
                     f"work items ({case.name})": grid.work_items,
                     **_cost(gpu, grid, threads, regs, smem, case)})
    frame = pd.DataFrame(rows)
    return frame.astype({column: "Int64" for column in ("threads", "registers", f"work items ({case.name})",
                                                        "CTAs/SM", f"CTAs ({case.name})") if column in frame})


CASES = (shapes.MISSION, shapes.select("b4h16_s2048")[0])   # the chapters' calculator: small and large


def phase_calculators(phase_name: str, cases=CASES) -> pd.DataFrame:
    """phase_calculator for the phase's defaults at each case, one table: a row per case and GPU."""
    frames = []
    for case in cases:
        frame = phase_calculator(phase_name, case)
        frame = frame.rename(columns={f"work items ({case.name})": "work items", f"CTAs ({case.name})": "CTAs"})
        frame.insert(0, "case", case.label())
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def recorded_row(sweep: pd.DataFrame, params: dict) -> pd.Series:
    match = sweep
    for key, value in params.items():
        match = match[match[key] == value]
    return match.iloc[0]


def recorded_summary(sweep: pd.DataFrame, sdpa: dict, params: dict) -> str:
    """One configuration's row of the recorded sweep, in words."""
    row = recorded_row(sweep, params)
    if row["status"] != "ok":
        return f"{row['status']}: {row['message']}"
    return (f"recorded: {CASE.name} {row['mission_us']:.1f} µs of GPU time = {row['mission_vs_sdpa']:.2f}x SDPA "
            f"({sdpa['sdpa_mission_us']:.1f} µs); b4h16_s2048 {row['b4h16_s2048_us']:.0f} µs = "
            f"{row['b4h16_s2048_vs_sdpa']:.2f}x SDPA; {row['registers']:.0f} registers")


def sweep_calculator(phase_name: str, sweep: pd.DataFrame, gpu: str = "H100") -> pd.DataFrame:
    """The calculator on one GPU for every configuration of a recorded sweep, beside its recorded time at
    the mission shape; configurations that do not build or fail their checks keep only their status."""
    keys = list(get(phase_name).sweep_grid)
    rows = []
    for _, row in sweep.iterrows():
        params = {key: int(row[key]) for key in keys}
        entry = {**params, "status": row["status"]}
        if row["status"] == "ok":
            cost = calculator(phase_name, params, int(row["registers"])).set_index("GPU").loc[gpu]
            entry.update({"registers": int(row["registers"]), "smem KB": cost["smem KB"], "CTAs/SM": cost["CTAs/SM"],
                          "limiter": cost["limiter"], "waves": cost["waves"], "mission µs": row["mission_us"],
                          "mission / SDPA": row["mission_vs_sdpa"]})
        rows.append(entry)
    return pd.DataFrame(rows).astype({"registers": "Int64", "CTAs/SM": "Int64"})


def static_view(phase_name: str, sweep: pd.DataFrame, sdpa: dict, provenance: str, params: dict) -> str:
    """HTML for a page without a kernel behind it: the starting configuration's recorded row and its
    calculator on every GPU, then, folded, the calculator on the H100 for every configuration of the sweep."""
    row = recorded_row(sweep, params)
    start = (calculator(phase_name, params, int(row["registers"])).style.format(precision=2).hide(axis="index").to_html()
             if row["status"] == "ok" else "")
    every = sweep_calculator(phase_name, sweep).style.format(precision=2, na_rep="").hide(axis="index").to_html()
    return (f"<p>{html.escape(experiments.config_label(params))}: {html.escape(recorded_summary(sweep, sdpa, params))}<br>"
            f"<small>{html.escape(provenance)}</small></p>{start}"
            f"<details><summary>every configuration of the sweep on the H100 ({len(sweep)})</summary>{every}</details>"
            f"<p><small>In Jupyter or Colab this is a widget: pick the tile sizes, and on a GPU compile, check and "
            f"time them.</small></p>")


def measure_live(phase_name: str, params: dict) -> tuple[str, int | None]:
    """Compile (or load from cache) one configuration, check it and time it beside SDPA on this GPU.
    Returns the summary and its register count; a configuration that does not compile, or needs more
    shared memory than this GPU allows, returns why and None."""
    from .bench import compare, paired_ratio
    from .binding import SharedMemoryError, check_shared_memory, load
    from .build import CompileError, compile_message
    from .check import check
    phase, gpu = get(phase_name), env.gpu()
    try:
        # refused before compiling a kernel that could not launch here (the binding would refuse it after)
        built_with = {**phase.tile_params_for(gpu.cc), **params}
        check_shared_memory(phase, budget.smem_bytes(phase_name, CASE.head_dim, built_with), gpu)
        fn = load(phase_name, **params)   # prints compile progress on a cold build
    except SharedMemoryError as error:
        return str(error), None
    except CompileError as error:
        return compile_message(str(error)), None
    result = check(fn, CASE)
    timings = compare({"ours": fn}, CASE, ("sdpa_default",), rounds=5)
    ours, sdpa = timings["ours"], timings["sdpa_default"]
    return (f"measured live: {CASE.name} {ours['gpu_us']:.1f} µs of GPU time = {paired_ratio(ours, sdpa):.2f}x SDPA's "
            f"({sdpa['gpu_us']:.1f} µs); "
            f"max error {result.max_abs_err:.1e} ({'correct' if result.passed else 'WRONG'}); "
            f"{fn.build.ptxas.registers} registers"), fn.build.ptxas.registers


def tile_explorer(phase_name: str):
    """Pickers over the phase's sweep grid, a button that measures the choice live, and what it costs."""
    import ipywidgets as widgets
    from IPython.display import display

    phase = get(phase_name)
    grid = phase.sweep_grid
    sweep, sdpa, provenance = experiments.sweep_runs(phase_name)
    live = env.mode() == "live"
    defaults = phase.tile_params_for(env.gpu().cc) if live else phase.tile_params   # start on this GPU's defaults
    pickers = {key: widgets.Dropdown(options=values, description=key,
                                     value=defaults[key] if defaults[key] in values else values[len(values) // 2])
               for key, values in grid.items()}
    runnable = live and phase.runs_on(env.gpu().cc)
    button = widgets.Button(description="compile, check and time" if runnable or not live
                            else f"this GPU cannot run it (needs {phase.requirement})", disabled=not runnable)
    output = widgets.Output()

    def params():
        return {key: picker.value for key, picker in pickers.items()}

    def show_recorded(_=None):
        output.clear_output()
        with output:
            print(recorded_summary(sweep, sdpa, params()))
            print(provenance)
            row = recorded_row(sweep, params())
            if row["status"] == "ok":
                display(calculator(phase_name, params(), int(row["registers"])).round(2))

    def measure(_):
        output.clear_output()
        with output:
            text, registers = measure_live(phase_name, params())
            print(text)
            if registers is not None:
                display(calculator(phase_name, params(), registers).round(2))

    static = static_view(phase_name, sweep, sdpa, provenance, params())

    class Explorer(widgets.VBox):
        def _repr_mimebundle_(self, **kwargs):
            # Jupyter renders the widget; a static page (the book, whose build ranks HTML first) this
            return {**super()._repr_mimebundle_(**kwargs), "text/html": static}

    for picker in pickers.values():
        picker.observe(show_recorded, names="value")
    button.on_click(measure)
    show_recorded()
    return Explorer([widgets.HBox(list(pickers.values())), button, output])
