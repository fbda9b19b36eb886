"""Figures: speed beside SDPA, errors beside SDPA's, the ladder across phases, the roofline, shared-memory budgets,
and schedules drawn in a kernel's code order (not measured)."""
from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
import pandas as pd

from . import budget, results, shapes
from .bench import BASELINES, baseline_us, short_name
from .roofline import attainable_tflops, intensity, ridge

BASELINE_COLORS = {"sdpa_default": "#444444", "sdpa_flash": "#1f77b4", "sdpa_efficient": "#9467bd",
                   "sdpa_cudnn": "#2ca02c", "triton": "#ff7f0e"}
# One colour per shared-memory buffer, the same in every figure of the book.
BUFFER_COLORS = {"Q tile": "#1f77b4", "K tile": "#ff7f0e", "V tile": "#2ca02c", "S (fp32)": "#d62728",
                 "P (fp16)": "#9467bd", "P lo (fp16)": "#c5b0d5", "S then P (fp32 / fp16)": "#e377c2",
                 "O accumulator (fp32)": "#8c564b", "K tiles (x STAGES)": "#ffbb78", "V tiles (x STAGES)": "#98df8a",
                 "Q tiles (x STAGES)": "#aec7e8", "K tiles (x 2)": "#ffbb78", "V tiles (x 2)": "#98df8a",
                 "alignment slack": "#c7c7c7"}
# A buffer name not above (a new phase's) takes the next of these, in order of first appearance in a figure.
SPARE_BUFFER_COLORS = ("#17becf", "#bcbd22", "#9edae5", "#dbdb8d", "#f7b6d2", "#7f7f7f")


def buffer_colors(names) -> dict[str, str]:
    """name -> colour for these buffers: the book's fixed colour where there is one, else a spare;
    in BUFFER_COLORS order, then the others in the order met."""
    names = list(dict.fromkeys(names))
    spare = [name for name in names if name not in BUFFER_COLORS]
    return {**{name: color for name, color in BUFFER_COLORS.items() if name in names},
            **dict(zip(spare, itertools.cycle(SPARE_BUFFER_COLORS)))}


def speed(runs: pd.DataFrame, label: str, provenance: str):
    """Grouped bars, log scale: this phase and every baseline per timing case."""
    timed = runs[runs["gpu_us"].notna()].reset_index(drop=True)
    series = {label: timed["gpu_us"].to_numpy()}
    for name in BASELINES:
        series[name] = np.array([baseline_us(b, name) for b in timed["baselines"]], dtype=float)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / len(series)
    x = np.arange(len(timed))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + i * width, values, width, label=name, color=BASELINE_COLORS.get(name, "#d62728"))
    ax.set_xticks(x + width * (len(series) - 1) / 2, timed["case"], rotation=15, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("GPU time per call (µs, log)")
    ax.legend(fontsize=8, ncol=len(series))
    ax.set_title(provenance, fontsize=7)
    fig.tight_layout()
    return fig


def errors(runs: pd.DataFrame, provenance: str):
    """Max |error| vs float64, beside SDPA's own on the same inputs, with the pass line."""
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for dtype, marker in (("float16", "o"), ("bfloat16", "s")):
        part = runs[runs["dtype"] == dtype]
        if part.empty:
            continue
        x = np.arange(len(part))
        ax.scatter(x, part["max_abs_err"], marker=marker, color="#d62728", label=f"kernel ({dtype})")
        ax.scatter(x, part["sdpa_max_abs_err"], marker=marker, facecolors="none", edgecolors="#444444",
                   label=f"SDPA ({dtype})")
        ax.plot(x, 2 * part["sdpa_max_abs_err"] + 1e-4, ":", color="#999999", linewidth=1)
        ax.set_xticks(x, part["case"], rotation=40, fontsize=7, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("max |O - O_fp64|")
    ax.legend(fontsize=8, ncol=4)
    ax.set_title(provenance + "   (dotted: pass line 2x SDPA + 1e-4)", fontsize=7)
    fig.tight_layout()
    return fig


BASELINE_MARKERS = {"sdpa_default": "o", "sdpa_flash": "s", "sdpa_efficient": "^", "sdpa_cudnn": "D", "triton": "v"}


def _draw_ladder(ax, records: dict[str, dict], case: str, backends) -> None:
    """Bars: each phase's GPU time at `case`; markers joined by a line: SDPA backends from each phase's run."""
    runs = [next(r for r in record["runs"] if r["case"] == case and r["gpu_us"] is not None)
            for record in records.values()]
    names, ours = list(records), [run["gpu_us"] for run in runs]
    ax.barh(names, ours, color="#d62728", label="FlashCore phase")
    for backend in backends:
        sdpa = [baseline_us(run["baselines"], backend) for run in runs]
        ax.plot(np.array(sdpa, dtype=float), names, marker=BASELINE_MARKERS[backend], color=BASELINE_COLORS[backend],
                linewidth=0.8, zorder=3, label=f"{backend.replace('_', ' ')}, same run")
    for y, value in enumerate(ours):
        ax.text(value, y, f" {value:,.1f} µs", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(right=max(ours) * 4)   # room for the value labels
    ax.invert_yaxis()
    ax.set_xlabel(f"GPU time per call at '{case}' (µs, log)")


def ladder(case: str = "mission", upto: str | None = None, gpu_slug: str = results.DEFAULT_GPU,
           backends=("sdpa_default",)):
    """GPU time of every recorded phase (up to and including `upto`) at one case, log scale, with
    SDPA's from each phase's own run."""
    records, _ = results.recorded_phases(gpu_slug, upto=upto)
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(records) + 1.6))
    _draw_ladder(ax, records, case, backends)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def ladders(cases, gpu_slug: str = results.DEFAULT_GPU, backends=("sdpa_default", "sdpa_flash", "triton")):
    """The ladder at several cases side by side, one panel each (each with its own log axis)."""
    records, _ = results.recorded_phases(gpu_slug)
    fig, axes = plt.subplots(1, len(cases), figsize=(3.6 * len(cases), 0.45 * len(records) + 1.8), sharey=True)
    for ax, case in zip(np.atleast_1d(axes), cases):
        _draw_ladder(ax, records, case, backends)
        ax.set_xlabel("µs, log")
        ax.set_title(shapes.select(case)[0].label(), fontsize=8)
        ax.tick_params(labelsize=7)
    handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=len(labels), loc="lower center")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def export_ladder(path, gpu_slug: str = results.DEFAULT_GPU):
    """The README's figure: the mission-shape ladder with SDPA default and flash and the Triton peer,
    fingerprinted in the PNG's metadata with the records it was drawn from (a test compares it with
    the current records)."""
    records, _ = results.recorded_phases(gpu_slug)
    fig = ladder("mission", gpu_slug=gpu_slug, backends=("sdpa_default", "sdpa_flash", "triton"))
    gpu = next(iter(records.values()))["env"]["gpu"]
    fig.axes[0].set_title(f"FlashCore phases at {shapes.MISSION.label()} fp16, {gpu}: GPU time; baselines from each phase's run",
                          fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None, "Source": results.digest(records)})
    plt.close(fig)
    return path


def roofline(frame: pd.DataFrame, peaks, dtype: str = "float16"):
    """Achieved TFLOP/s of every phase (and of SDPA default, from the last phase's run) at each timed
    case against the case's arithmetic intensity, under the measured ceilings (peaks.Peaks)."""
    case_names = list(dict.fromkeys(frame["case"]))
    x_of = {name: intensity(shapes.select(name)[0]) for name in case_names}
    peak, bandwidth = peaks.matmul_tflops[dtype], peaks.bandwidth_gb_s
    knee = ridge(peak, bandwidth)
    xs = np.geomspace(min(*x_of.values(), knee) / 4, max(*x_of.values(), knee) * 4, 200)
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.plot(xs, [attainable_tflops(x, peak, bandwidth) for x in xs], color="black", linewidth=1.5)
    ax.text(xs[-1], peak, f"measured {dtype} matmul: {peak:.0f} TFLOP/s ", ha="right", va="bottom", fontsize=8)
    ax.text(xs[0], attainable_tflops(xs[0], peak, bandwidth) * 1.4, f" measured copy: {bandwidth / 1e3:.2f} TB/s",
            ha="left", va="bottom", fontsize=8)
    ax.axvline(knee, color="#999999", linestyle=":", linewidth=1)
    ax.text(knee, peak * 1.1, f"ridge {knee:.0f} FLOP/B", ha="center", va="bottom", fontsize=7, color="#555555")
    markers = dict(zip(case_names, "osD^v<>PX*"))
    phases = list(dict.fromkeys(frame["phase"]))
    colors = plt.get_cmap("tab10")
    for i, phase in enumerate(phases):
        for _, run in frame[frame["phase"] == phase].iterrows():
            ax.scatter(x_of[run["case"]], run["tflops"], marker=markers[run["case"]], color=colors(i), zorder=3)
    for _, run in frame[frame["phase"] == phases[-1]].iterrows():
        ax.scatter(x_of[run["case"]], run["sdpa_default_tflops"], marker=markers[run["case"]], zorder=3,
                   facecolors="none", edgecolors="black")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of minimum HBM traffic: Q, K, V read once, O written once)")
    ax.set_ylabel("achieved TFLOP/s (log)")
    handles = [Line2D([], [], marker="o", linestyle="", color=colors(i), label=p) for i, p in enumerate(phases)]
    handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none", color="black",
                          label=f"SDPA default ({phases[-1]}'s run)"))
    handles += [Line2D([], [], marker=markers[c], linestyle="", color="#999999", label=c) for c in case_names]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(peaks.provenance, fontsize=7)
    fig.tight_layout()
    return fig


def wmma_warp_map(block_m: int = 32, block_n: int = 32, head_dim: int = 64, warps: int = 4):
    """Which warp computes which 16x16 tile: S = Q·Kᵀ (left) and O += P·V (right), as in p03."""
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 2.8), gridspec_kw={"width_ratios": [block_n, head_dim]})
    for ax, cols, title, owner in (
        (left, block_n, f"S tile {block_m}x{block_n}: warp w -> (w // 2, w % 2)", lambda tm, tn: 2 * tm + tn),
        (right, head_dim, f"O tile {block_m}x{head_dim}: warp w -> row w // 2, cols (w % 2) + 2i",
         lambda tm, tn: 2 * tm + tn % 2),
    ):
        for tm in range(block_m // 16):
            for tn in range(cols // 16):
                warp = owner(tm, tn) % warps
                ax.add_patch(plt.Rectangle((tn * 16, tm * 16), 16, 16, facecolor=colors[warp], alpha=0.55,
                                           edgecolor="white", linewidth=2))
                ax.text(tn * 16 + 8, tm * 16 + 8, f"warp {warp}", ha="center", va="center", fontsize=8)
        ax.set_xlim(0, cols)
        ax.set_ylim(block_m, 0)
        ax.set_aspect("equal")
        ax.set_xticks(range(0, cols + 1, 16))
        ax.set_yticks(range(0, block_m + 1, 16))
        ax.set_title(title, fontsize=8)
    fig.tight_layout()
    return fig


def smem_budget(configs, gpus=tuple(budget.GPUS.values())):
    """Shared memory per CTA, one stacked bar per (label, phase, head_dim, tile_params) config (extra
    trailing items are ignored, so the occupancy table's configs work too), against the 48 KB static
    limit and each GPU's opt-in limit per block."""
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(configs) + 1.8))
    layouts = [budget.smem_buffers(phase_name, head_dim, tile_params)
               for _, phase_name, head_dim, tile_params, *_ in configs]
    colors = buffer_colors(buffer.name for layout in layouts for buffer in layout)
    labels, totals = [], []
    for y, ((label, *_), layout) in enumerate(zip(configs, layouts)):
        left = 0.0
        for buffer in layout:
            kb = buffer.bytes / 1024
            ax.barh(y, kb, left=left, color=colors[buffer.name], edgecolor="white")
            left += kb
        ax.text(left, y, f" {left:.1f} KB", va="center", fontsize=8)
        labels.append(label)
        totals.append(left)
    static = dict(color="#444444", linestyle="--", linewidth=1)
    ax.axvline(budget.STATIC_SMEM_LIMIT / 1024, **static)
    for gpu in gpus:
        x = gpu.smem_per_block_optin / 1024
        ax.axvline(x, color="#999999", linestyle=":", linewidth=1)
        ax.text(x, 1.01, gpu.name, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=8)
    limits = [budget.STATIC_SMEM_LIMIT / 1024, *(gpu.smem_per_block_optin / 1024 for gpu in gpus)]
    ax.set_xlim(0, 1.12 * max(*totals, *limits))
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("shared memory per CTA (KB); dotted: the most one block may opt in to on each GPU")
    # legend in the fixed buffer order, whatever order the configs met them in
    handles = [Patch(color=color, label=name) for name, color in colors.items()]
    handles.append(Line2D([], [], label="static __shared__ limit (48 KB)", **static))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


PRECISION_COLORS = {"FP16 P": "#1f77b4", "FP32 P": "#2ca02c", "padding bug (teaching)": "#d62728"}


def precision(rows: pd.DataFrame, title: str):
    """Chapter 4's experiment: max error per case for each variant (worst seed), SDPA's beside it."""
    worst = rows.groupby(["case", "variant"], sort=False)["max_abs_err"].max().unstack()
    cases = list(dict.fromkeys(rows["case"]))
    worst = worst.loc[cases]
    sdpa = rows.groupby("case", sort=False)["sdpa_max_abs_err"].max().loc[cases] if "sdpa_max_abs_err" in rows else None
    fig, ax = plt.subplots(figsize=(9, 3.8))
    x = np.arange(len(cases))
    width = 0.8 / len(worst.columns)
    for i, variant in enumerate(worst.columns):
        ax.bar(x + i * width, worst[variant].clip(lower=1e-6), width, label=variant,
               color=PRECISION_COLORS.get(variant, "#7f7f7f"))
    if sdpa is not None:
        ax.scatter(x + width * (len(worst.columns) - 1) / 2, sdpa.clip(lower=1e-6), color="#444444", zorder=3,
                   marker="_", s=200, label="SDPA fp16, same inputs")
    ax.set_xticks(x + width * (len(worst.columns) - 1) / 2, cases, rotation=40, fontsize=7, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("max |O - O_fp64| (worst seed)")
    ax.legend(fontsize=8, ncol=4)
    ax.set_title(title, fontsize=7)
    fig.tight_layout()
    return fig


def sweep_heatmap(sweep: pd.DataFrame, sdpa: dict, case: str = "mission", title: str = ""):
    """One panel per NUM_WARPS: GPU time at `case` for every BLOCK_M x BLOCK_N, as a multiple of SDPA
    (colour) and in µs (text); configurations that do not compile are marked."""
    warps = sorted(sweep["NUM_WARPS"].unique())
    rows, cols = sorted(sweep["BLOCK_M"].unique()), sorted(sweep["BLOCK_N"].unique())
    ok = sweep[sweep["status"] == "ok"]
    ratios = ok[f"{case}_vs_sdpa"]
    norm = plt.matplotlib.colors.LogNorm(vmin=ratios.min(), vmax=ratios.max())
    fig, axes = plt.subplots(1, len(warps), figsize=(2.6 * len(warps) + 1, 3.2), sharey=True)
    for ax, w in zip(np.atleast_1d(axes), warps):
        grid = np.full((len(rows), len(cols)), np.nan)
        for _, r in sweep[sweep["NUM_WARPS"] == w].iterrows():
            i, j = rows.index(r["BLOCK_M"]), cols.index(r["BLOCK_N"])
            if r["status"] == "ok":
                grid[i, j] = r[f"{case}_vs_sdpa"]
                ax.text(j, i, f"{r[f'{case}_us']:.0f} µs\n{r[f'{case}_vs_sdpa']:.1f}x", ha="center", va="center",
                        fontsize=7)
            else:
                ax.text(j, i, "does not\ncompile", ha="center", va="center", fontsize=7, color="#777777")
        image = ax.imshow(grid, cmap="RdYlGn_r", norm=norm)
        ax.set_xticks(range(len(cols)), cols)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlabel("BLOCK_N")
        ax.set_title(f"NUM_WARPS = {w}", fontsize=9)
    np.atleast_1d(axes)[0].set_ylabel("BLOCK_M")
    bar = fig.colorbar(image, ax=axes, label=f"{case}: GPU time / SDPA default (paired)", shrink=0.8)
    bar.ax.yaxis.set_major_formatter(plt.matplotlib.ticker.FormatStrFormatter("%gx"))
    bar.ax.yaxis.set_minor_formatter(plt.matplotlib.ticker.FormatStrFormatter("%gx"))
    fig.suptitle(f"{case} ({sdpa[f'sdpa_{case}_us']:.1f} µs for SDPA)   {title}", fontsize=7)
    return fig


def warp_loop_map(block_m: int, block_n: int, head_dim: int, warps: int):
    """p05's split of the work: warp w takes 16x16 tiles w, w + warps, ... in row-major order, of S
    (left) and of O (right)."""
    colors = plt.get_cmap("tab20").colors
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.06 * block_m + 1.6),
                             gridspec_kw={"width_ratios": [block_n, head_dim]})
    for ax, cols, name in ((axes[0], block_n, f"S {block_m}x{block_n}"), (axes[1], head_dim, f"O {block_m}x{head_dim}")):
        tiles_n = cols // 16
        for tm in range(block_m // 16):
            for tn in range(tiles_n):
                warp = (tm * tiles_n + tn) % warps
                ax.add_patch(plt.Rectangle((tn * 16, tm * 16), 16, 16, facecolor=colors[warp % 20], alpha=0.6,
                                           edgecolor="white", linewidth=1.5))
                ax.text(tn * 16 + 8, tm * 16 + 8, str(warp), ha="center", va="center", fontsize=7)
        ax.set_xlim(0, cols)
        ax.set_ylim(block_m, 0)
        ax.set_aspect("equal")
        ax.set_xticks(range(0, cols + 1, 16))
        ax.set_yticks(range(0, block_m + 1, 16))
        ax.tick_params(labelsize=7)
        ax.set_title(f"{name}: the number is the warp ({warps} warps)", fontsize=8)
    fig.tight_layout()
    return fig


def pipeline_schedule(stages: int, tiles: int, copy: float, math: float) -> list[tuple[int, float, float, float]]:
    """(tile, copy start, copy end, math start) for one CTA, following p06's loop: the copy of tile
    t + STAGES - 1 is issued when tile t's iteration begins (its stage was freed by tile t - 1), and
    tile t's math waits for its own copy and for tile t - 1's math. Copies share the memory system,
    so one runs at a time."""
    issue, copy_end, math_end, rows = {}, {}, [0.0], []
    for t in range(min(stages - 1, tiles)):           # the prologue
        issue[t] = copy_end.get(t - 1, 0.0)
        copy_end[t] = issue[t] + copy
    for t in range(tiles):
        nxt = t + stages - 1
        if nxt < tiles:
            issue[nxt] = max(math_end[-1], copy_end.get(nxt - 1, 0.0))
            copy_end[nxt] = issue[nxt] + copy
        start = max(copy_end[t], math_end[-1])
        rows.append((t, issue[t], copy_end[t], start))
        math_end.append(start + math)
    return rows


def pipeline_timeline(tiles: int = 5, copy: float = 1.0, math: float = 1.5, stage_counts=(1, 2, 3)):
    """What overlaps with what inside one CTA, for each stage count (from the kernel's structure)."""
    fig, axes = plt.subplots(len(stage_counts), 1, figsize=(9, 1.25 * len(stage_counts) + 0.6), sharex=True)
    for ax, stages in zip(np.atleast_1d(axes), stage_counts):
        rows = pipeline_schedule(stages, tiles, copy, math)
        for t, c0, c1, m0 in rows:
            color = plt.get_cmap("tab10")(t)
            ax.barh(1, c1 - c0, left=c0, color=color, alpha=0.45, edgecolor="white")
            ax.barh(0, math, left=m0, color=color, edgecolor="white")
            ax.text(c0 + (c1 - c0) / 2, 1, f"K/V {t}", ha="center", va="center", fontsize=7)
            ax.text(m0 + math / 2, 0, f"math {t}", ha="center", va="center", fontsize=7, color="white")
        end = rows[-1][3] + math
        ax.set_yticks([0, 1], ["warps (S, softmax, P·V)", "cp.async copies"], fontsize=7)
        ax.set_title(f"STAGES = {stages}: {tiles} tiles in {end:.1f} time units", fontsize=8, loc="left")
    np.atleast_1d(axes)[-1].set_xlabel(f"time (a tile's copy takes {copy:g}, its math {math:g})")
    fig.tight_layout()
    return fig


# The rows of the step schedule, top to bottom: what one warpgroup of p08 keeps busy.
STEP_UNITS = ("copies", "Q·Kᵀ", "softmax", "P·V")


def wgmma_step_schedule(tiles: int, overlap: bool, copy: float = 2.0, scores: float = 1.0, softmax: float = 1.5,
                        values: float = 1.0, rescale: float = 0.3):
    """One warpgroup of p08 over `tiles` key tiles, in the order its loop imposes (kernels/p08_wgmma.cu),
    with schematic durations: (slots, barriers, waits). A slot is (unit, tile, start, end, label); a
    barrier is the time of a step's cp.async wait<0> + __syncthreads; a wait is (unit, time, label), a
    wgmma_wait on that unit's group.
    Step s starts at its barrier (K(s) and V(s - 1) have landed), issues the copies of K(s + 1) and V(s),
    then: Q·Kᵀ(s) and its wait; softmax(s); P·V(s - 1) and its wait; rescale O and pack P(s). OVERLAP=1
    issues P·V(s - 1) right behind Q·Kᵀ(s) and waits only for the older group (wait<1>), so the softmax
    runs while the tensor cores do P·V. Step `tiles` does the last P·V alone. The tensor cores take a
    warpgroup's groups in issue order; copies run beside everything."""
    slots, barriers, waits = [], [], []
    slots.append(("copies", 0, 0.0, copy, "Q, K0"))   # the prologue
    copies_done, now = copy, 0.0
    for step in range(tiles + 1):
        now = max(now, copies_done)
        barriers.append(now)
        if step < tiles:
            if step + 1 < tiles:
                slots.append(("copies", step + 1, now, now + copy, f"K{step + 1}"))
            slots.append(("copies", step, now, now + copy, f"V{step}"))
            copies_done = now + copy
        if step == tiles:   # the last tile's P·V
            slots.append(("P·V", step - 1, now, now + values, f"P·V {step - 1}"))
            now += values
            waits.append(("P·V", now, "wait<0>"))
            break
        slots.append(("Q·Kᵀ", step, now, now + scores, f"S{step}"))
        scores_done = now + scores
        if step > 0 and overlap:
            slots.append(("P·V", step - 1, scores_done, scores_done + values, f"P·V {step - 1}"))
        waits.append(("Q·Kᵀ", scores_done, "wait<1>" if step > 0 and overlap else "wait<0>"))
        now = scores_done + softmax
        slots.append(("softmax", step, scores_done, now, f"softmax {step}"))
        if step > 0:
            if not overlap:
                slots.append(("P·V", step - 1, now, now + values, f"P·V {step - 1}"))
                now += values
            else:
                now = max(now, scores_done + values)
            waits.append(("P·V", now, "wait<0>"))
        slots.append(("softmax", step, now, now + rescale, ""))   # rescale O (from step 1 on), pack P(s)
        now += rescale
    return slots, barriers, waits


def step_schedule(tile_params: dict, tiles: int = 4):
    """p08's step schedule for one warpgroup (wgmma_step_schedule), OVERLAP = 0 and 1: which tile's copies,
    Q·Kᵀ, softmax and P·V run when, with the barriers (dashed) and wgmma waits (ticks). A picture of the
    order the code imposes, with schematic durations: not a measured trace."""
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.6))
    colors = plt.get_cmap("tab10")
    y_of = {unit: len(STEP_UNITS) - 1 - i for i, unit in enumerate(STEP_UNITS)}
    for ax, overlap in zip(axes, (False, True)):
        slots, barriers, waits = wgmma_step_schedule(tiles, overlap)
        for unit, tile, start, end, label in slots:
            y, height = y_of[unit], 0.7
            if unit == "copies" and label[0] in "KV":   # K above, V below: both are in flight at once
                y, height = y + (0.18 if label[0] == "K" else -0.18), 0.34
            ax.barh(y, end - start, left=start, height=height, color=colors(tile), edgecolor="white",
                    alpha=0.45 if unit == "copies" else 0.9, hatch="//" if not label else None)
            ax.text((start + end) / 2, y, label, ha="center", va="center", fontsize=7)
        for i, time in enumerate(barriers):
            ax.axvline(time, color="#444444", linestyle="--", linewidth=0.8)
            ax.text(time, len(STEP_UNITS) - 0.45, f" step {i}", fontsize=6, va="bottom", color="#444444")
        for unit, time, label in waits:
            ax.plot([time, time], [y_of[unit] - 0.4, y_of[unit] + 0.4], color="black", linewidth=2)
            ax.text(time, y_of[unit] + 0.42, label, fontsize=6, ha="center", va="bottom")
        ax.set_yticks([y_of[u] for u in STEP_UNITS],
                      ["cp.async in flight\n(all threads issue)", "Q·Kᵀ wgmma\n(tensor cores)",
                       "softmax (CUDA cores)\nhatched: rescale O, pack P", "P·V wgmma\n(tensor cores)"], fontsize=7)
        ax.set_ylim(-0.6, len(STEP_UNITS) - 0.1)
        ax.set_xlim(0, max(end for *_, end, _ in slots) + 0.2)
        ax.set_xticks([])   # schematic time: the lengths of the two panels are not to be compared
        default = " (the default)" if bool(tile_params["OVERLAP"]) == overlap else ""
        order = ("P·V(s-1) issued with Q·Kᵀ(s), waited for after softmax(s)" if overlap
                 else "P·V(s-1) issued after softmax(s)")
        ax.set_title(f"OVERLAP = {int(overlap)}{default}: {order}", fontsize=8, loc="left")
    axes[-1].set_xlabel("time →   dashed: a step's cp.async wait + __syncthreads; black ticks: wgmma waits. "
                        "The order is the kernel's; the bar lengths are illustrative, not measured", fontsize=8)
    fig.suptitle(f"p08_wgmma, D = 64 defaults: one of a CTA's {tile_params['WARPGROUPS']} warpgroups (64 query rows), "
                 f"{tile_params['BLOCK_N']}-key tiles. The order the code imposes: a schedule diagram, not a trace",
                 fontsize=9)
    fig.tight_layout()
    return fig


def fragment_owner(operand: str, row: int, col: int) -> tuple[int, int]:
    """(lane, register) holding element (row, col) of an mma.m16n8k16 operand, as the PTX ISA lays
    them out: "A" 16x16 (4 registers of two 16-bit values), "B" 16x8 (k x n, 2 registers), "C" 16x8
    (4 fp32 registers)."""
    if operand == "A":
        return 4 * (row % 8) + (col % 8) // 2, (row >= 8) + 2 * (col >= 8)
    if operand == "B":
        return 4 * col + (row % 8) // 2, int(row >= 8)
    if operand == "C":
        return 4 * (row % 8) + col // 2, 2 * (row >= 8) + col % 2
    raise ValueError(f"operand is 'A', 'B' or 'C', not {operand!r}")


def mma_fragments():
    """Who holds what in one mma.m16n8k16: lane number in each cell, colour = register index."""
    shapes_ = {"A = Q or P (16 x 16)": ("A", 16, 16), "B = Kᵀ or V (16 x 8)": ("B", 16, 8),
               "C = S or O (16 x 8, fp32)": ("C", 16, 8)}
    colors = ["#c6dbef", "#fdd0a2", "#c7e9c0", "#dadaeb"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.6), gridspec_kw={"width_ratios": [16, 8, 8]})
    for ax, (title, (operand, rows, cols)) in zip(axes, shapes_.items()):
        for r in range(rows):
            for c in range(cols):
                lane, register = fragment_owner(operand, r, c)
                ax.add_patch(plt.Rectangle((c, r), 1, 1, facecolor=colors[register], edgecolor="white"))
                ax.text(c + 0.5, r + 0.5, str(lane), ha="center", va="center", fontsize=6)
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        ax.set_aspect("equal")
        ax.set_xticks([0, cols // 2, cols])
        ax.set_yticks([0, 8, 16])
        ax.set_title(title, fontsize=9)
    prefix = {0: "a", 1: "b", 2: "c"}
    for ax, index in zip(axes, range(3)):
        count = 2 if index == 1 else 4
        ax.legend(handles=[Patch(color=colors[i], label=f"{prefix[index]}{i}") for i in range(count)],
                  fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.04), ncol=count)
    fig.suptitle("mma.m16n8k16: the lane (number) and register (colour) of every element. "
                 "C's layout for two n-tiles side by side is A's layout: S becomes P in place.", fontsize=9)
    fig.tight_layout()
    return fig


def swizzle_pattern(head_dim: int = 64):
    """Where the 16-byte chunks of 8 consecutive tile rows land, plain and XOR-swizzled; highlighted:
    the chunk an ldmatrix reads from each of the 8 rows (one 8x8 matrix, chunk 0)."""
    chunks = head_dim * 2 // 16
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, swizzled in zip(axes, (False, True)):
        for row in range(8):
            for chunk in range(chunks):
                slot = chunk ^ (row % 8) if swizzled else chunk
                read = chunk == 0
                ax.add_patch(plt.Rectangle((slot, row), 1, 1, facecolor="#d62728" if read else "#eeeeee",
                                           edgecolor="white"))
                ax.text(slot + 0.5, row + 0.5, str(chunk), ha="center", va="center", fontsize=8,
                        color="white" if read else "#444444")
        ax.set_xlim(0, chunks)
        ax.set_ylim(8, 0)
        ax.set_xticks(np.arange(chunks) + 0.5, [f"banks\n{4 * (s % 8)}-{4 * (s % 8) + 3}" for s in range(chunks)],
                      fontsize=6)
        ax.set_ylabel("tile row")
        used = len({(c ^ r if swizzled else c) % 8 for r in range(8) for c in [0]})
        ax.set_title(f"{'XOR-swizzled: chunk ^ (row % 8)' if swizzled else 'plain row-major'} — the red reads "
                     f"hit {used} bank group{'s' if used > 1 else ''}", fontsize=9)
    fig.suptitle(f"Rows of {head_dim} halves = {chunks} chunks of 16 bytes; the number is the logical chunk", fontsize=9)
    fig.tight_layout()
    return fig


def ablation(table: pd.DataFrame, cases: list[str], title: str):
    """Each variant's time over the defaults' (tables.ablation), per case, on a log scale."""
    fig, ax = plt.subplots(figsize=(9, 4.2))
    variants = table.iloc[1:]
    x = np.arange(len(variants))
    width = 0.8 / len(cases)
    for i, case in enumerate(cases):
        ax.bar(x + i * width, variants[f"{case} vs defaults"], width, label=case)
    ax.axhline(1.0, color="#444444", linewidth=1)
    ax.set_xticks(x + 0.4 - width / 2, variants["variant"], rotation=25, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("time / defaults (log; > 1: the defaults win)")
    ax.legend(fontsize=7, ncol=3)
    ax.set_title(title, fontsize=7)
    fig.tight_layout()
    return fig


def _microseconds(us: float) -> str:
    return f"{us:.0f}" if us >= 100 else f"{us:.1f}"


def rungs(frame: pd.DataFrame, title: str):
    """Chapter 7's rungs (experiments.rung_frame): one panel per case, one bar per rung with its GPU time
    (the whisker: its spread over the rounds), and SDPA default's GPU time as a dashed line (its median
    over the rungs' rounds)."""
    cases = list(frame["case"].unique())
    columns = 3
    rows_ = -(-len(cases) // columns)
    fig, axes = plt.subplots(rows_, columns, figsize=(11, 3.1 * rows_), squeeze=False)
    colors = plt.get_cmap("viridis")(np.linspace(0.15, 0.85, frame["rung"].nunique()))
    for ax, case in zip(axes.flat, cases):
        part = frame[frame["case"] == case]
        errors = [part["gpu_us"] - part["gpu_us_min"], part["gpu_us_max"] - part["gpu_us"]]
        ax.bar(part["rung"], part["gpu_us"], color=colors, yerr=errors, capsize=2, ecolor="#555555")
        for x, us in zip(part["rung"], part["gpu_us"]):
            if np.isfinite(us):
                ax.text(x, us, _microseconds(us), ha="center", va="bottom", fontsize=6)
        sdpa = part["sdpa_us"].median()
        ax.axhline(sdpa, color=BASELINE_COLORS["sdpa_default"], linestyle="--", linewidth=1,
                   label=f"SDPA default {_microseconds(sdpa)} µs")
        ax.set_xticks(part["rung"])
        ax.set_title(case, fontsize=8)
        ax.set_ylabel("GPU µs", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="upper right")
    for ax in axes.flat[len(cases):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("rung", fontsize=7)
    fig.suptitle(title, fontsize=7)
    fig.tight_layout()
    return fig


def key_split(rows: pd.DataFrame, title: str):
    """Chapter 7's crossover (experiments.key_split_runs): the key split's GPU time over the large tiles'
    (paired, log) against the large-tile grid's CTAs as a share of the SMs, one marker per sequence length
    and head dim (hollow: causal); the defaults' threshold, and the bound of a split that cost nothing."""
    fig, ax = plt.subplots(figsize=(9, 4.2))
    colors = plt.get_cmap("tab10").colors
    for i, ((seqlen, head_dim), group) in enumerate(rows.groupby(["seqlen", "head_dim"])):
        for causal, part in group.groupby("causal"):
            # causal markers hollow and larger, so that one at the same spot as a filled one rings it
            ax.scatter(100.0 * part["fill"], part["split_over_large"], marker="osD^v<>"[i % 7], zorder=3,
                       s=110 if causal else 45, linewidths=1.5, facecolors="none" if causal else colors[i],
                       edgecolors=colors[i],
                       label=f"S = {seqlen}, D = {head_dim}" + (", causal" if causal else ""))
    x = np.linspace(0.0, 100.0 * rows["fill"].max() * 1.05, 200)
    ax.plot(x, np.clip(x / 100.0, 0.25, 1.0), ":", color="#777777", label="no-cost split: max(1/4, CTAs / SMs)")
    ax.axhline(1.0, color="#444444", linewidth=1)
    threshold = 100.0 * (rows["threshold_ctas"] / rows["sms"]).iloc[0]
    ax.axvline(threshold, color="#d62728", linestyle="--", linewidth=1)
    ax.text(threshold, 0.98, f" key split below {threshold:.0f}% (SMALL_PROBLEM_FILL)", color="#d62728",
            transform=ax.get_xaxis_transform(), ha="left", va="top", fontsize=7)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(plt.matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.yaxis.set_minor_formatter(plt.matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel("large-tile grid: CTAs as % of the SMs")
    ax.set_ylabel("key split / large tiles, GPU time\n(paired; < 1: the split wins)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=7)
    fig.tight_layout()
    return fig


def stall_breakdown(frame: pd.DataFrame, stall_labels, provenance: str):
    """Chapter 7's profile: the cycles between two instructions of one warp, split by what it waited for
    (stacked per case), with the tensor pipe's and the issue slots' busy share beside each bar."""
    labels = [*stall_labels, "other"]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    y = np.arange(len(frame))
    left = np.zeros(len(frame))
    colors = plt.get_cmap("tab10").colors
    for i, label in enumerate(labels):
        values = frame[label].to_numpy(dtype=float)
        ax.barh(y, values, left=left, color=colors[i % len(colors)], label=label)
        left += values
    for yi, total, tensor, issue in zip(y, left, frame["tensor_pipe_pct"], frame["issue_busy_pct"]):
        ax.text(total + 0.05, yi, f"tensor pipe {tensor:.0f}%\nissue slots {issue:.0f}%", va="center", fontsize=7)
    ax.set_yticks(y, frame["case"], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, left.max() * 1.3)
    ax.set_xlabel("cycles per issued instruction, one warp (Nsight Compute)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(provenance, fontsize=7)
    fig.tight_layout()
    return fig


RATIO_RANGE = (1 / 8, 8.0)   # error ratios drawn inside this range (beyond it, at its edge)
RATIO_TICKS = (0.125, 0.25, 0.5, 1, 2, 4, 8)


def error_ratios(frames: dict[str, pd.DataFrame], title: str):
    """The distribution of error / SDPA's error, one line per label (accuracy.frame rows), one panel per
    dtype: the share of problems whose ratio is at least x, both axes log, so that the tail shows; with
    SDPA's own level (1x), issue 15's target (1.5x) and the book's pass line (2x, plus 1e-4)."""
    from .accuracy import RATIO_LINES
    dtypes = [d for d in ("float16", "bfloat16") if any((f["dtype"] == d).any() for f in frames.values())]
    fig, axes = plt.subplots(1, len(dtypes), figsize=(4.6 * len(dtypes) + 0.6, 3.8), sharey=True, squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, dtype in zip(axes[0], dtypes):
        for i, (label, frame) in enumerate(frames.items()):
            ratios = np.sort(frame.loc[frame["dtype"] == dtype, "ratio"].clip(*RATIO_RANGE).to_numpy())
            if len(ratios):
                share = 1.0 - np.arange(len(ratios)) / len(ratios)   # of problems with a ratio >= this one
                ax.step(ratios, share, where="post", color=colors[i % len(colors)], label=label, linewidth=1.2)
        ax.axvline(1.0, color="#444444", linewidth=0.8)
        for line, style in zip(RATIO_LINES, ("--", ":")):
            ax.axvline(line, color="#d62728", linestyle=style, linewidth=1)
            ax.text(line, 1.0, f" {line:g}x", color="#d62728", transform=ax.get_xaxis_transform(), va="top",
                    fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(*RATIO_RANGE)
        ax.set_xticks(RATIO_TICKS, [f"{tick:g}x" for tick in RATIO_TICKS])
        ax.xaxis.set_minor_formatter(plt.matplotlib.ticker.NullFormatter())
        ax.set_xlabel("max error / SDPA's on the same inputs (log)")
        ax.set_title(dtype, fontsize=9)
    axes[0][0].set_ylabel("share of problems with a ratio >= x (log)")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.suptitle(title, fontsize=7)
    fig.tight_layout()
    return fig


# --- the grid: which method is fastest where, and what flashcore_nb.attention achieves (grid.frame) ----------

# Phases take these in the order a figure meets them; the baselines keep BASELINE_COLORS.
PHASE_COLORS = ("#d62728", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#7f7f7f")


def method_colors(names) -> dict[str, str]:
    names = list(dict.fromkeys(names))
    phases = [name for name in names if name not in BASELINE_COLORS]
    return {**dict(zip(phases, itertools.cycle(PHASE_COLORS))),
            **{name: BASELINE_COLORS[name] for name in names if name in BASELINE_COLORS}}


def winner_map(frame: pd.DataFrame, title: str):
    """One panel per head dim and mask, one cell per batch x heads (rows) and sequence length (columns),
    coloured by the fastest method of the race (every candidate phase, SDPA backend and the Triton peer in the
    same rounds); in each cell, the phase `attention` runs there and its speed over SDPA default (paired)."""
    sizes = sorted({(b, h) for b, h in zip(frame["batch"], frame["heads"])}, key=lambda bh: (bh[0] * bh[1], bh))
    seqlens = sorted(frame["seqlen_q"].unique())
    panels = [(d, causal) for d in sorted(frame["head_dim"].unique()) for causal in (False, True)]
    colors = method_colors([*frame["choice"], *frame["fastest"]])
    fig, axes = plt.subplots(len(panels) // 2, 2, figsize=(11, 3.2 * len(panels) // 2 + 1), sharex=True, sharey=True,
                             squeeze=False)
    for ax, (head_dim, causal) in zip(axes.flat, panels):
        part = frame[(frame["head_dim"] == head_dim) & (frame["causal"] == causal)]
        for _, row in part.iterrows():
            x, y = seqlens.index(row["seqlen_q"]), sizes.index((row["batch"], row["heads"]))
            ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colors[row["fastest"]], alpha=0.8,
                                       edgecolor="white", linewidth=2))
            ax.text(x, y, f"{short_name(row['fastest'])}\nattention: {short_name(row['choice'])}\n"
                          f"{row['speed_vs_sdpa_default']:.2f}x default", ha="center", va="center", fontsize=7)
        ax.set_facecolor("#f2f2f2")
        ax.set_xlim(-0.5, len(seqlens) - 0.5)
        ax.set_ylim(len(sizes) - 0.5, -0.5)
        ax.set_xticks(range(len(seqlens)), seqlens)
        ax.set_yticks(range(len(sizes)), [f"{b}x{h}" for b, h in sizes])
        ax.set_title(f"D = {head_dim}, {'causal' if causal else 'no mask'}", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("sequence length")
    for ax in axes[:, 0]:
        ax.set_ylabel("batch x heads")
    handles = [Patch(color=color, alpha=0.8, label=name) for name, color in colors.items() if name in set(frame["fastest"])]
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(handles), title="fastest in the race")
    fig.suptitle(title, fontsize=7)
    fig.tight_layout(rect=(0, 0.08, 1, 0.97))
    return fig


def grid_speed(frame: pd.DataFrame, title: str, worst_target: float | None = None):
    """`attention`'s speed over SDPA default and over the Triton peer at every grid case (paired GPU time, log
    scale, sorted), with the line of parity and, if given, the target it must never fall below."""
    order = frame.sort_values("speed_vs_sdpa_default").reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(8, 0.17 * len(order) + 1.6))
    y = np.arange(len(order))
    for baseline, marker in (("sdpa_default", "o"), ("triton", "v")):
        ax.scatter(order[f"speed_vs_{baseline}"], y, marker=marker, color=BASELINE_COLORS[baseline], zorder=3,
                   label=f"over {baseline.replace('_', ' ')}")
    ax.axvline(1.0, color="#444444", linewidth=1)
    if worst_target is not None:
        ax.axvline(worst_target, color="#d62728", linestyle=":", linewidth=1, label=f"target: never below {worst_target:g}x")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(plt.matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.xaxis.set_minor_formatter(plt.matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_yticks(y, order["case"], fontsize=6)
    ax.set_xlabel("attention's speed over the baseline (paired GPU time; > 1: attention is faster)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=7)
    fig.tight_layout()
    return fig


# --- where each kernel wins: TFLOP/s against the sequence length (seqlen.frame) ------------------------------

CURVE_MARKERS = {"sdpa_default": "o", "sdpa_cudnn": "D", "sdpa_flash": "s", "triton": "v"}
STRIP_BAND = 0.14   # the share of a panel's height under its curves that the strip of the fastest methods takes


def seqlen_curves(frame: pd.DataFrame, title: str, one_wave: float | None = None):
    """TFLOP/s (log) against the sequence length (log2 axis), one panel per head dim and mask, one line per method
    (every phase, cuDNN, FA2 and the Triton peer), its spread over the rounds shaded; a cross marks a phase's point
    whose check failed. Under each panel a strip names the fastest method at each S (a phase only where its check
    passed): where its colour changes, a curve crossed another. `one_wave`: the S at which the problem makes one
    128-row query tile per SM (seqlen.one_wave_seqlen), drawn dotted."""
    from .seqlen import curve_methods, label
    from .tables import _fastest, _panels, _seqlen
    methods = curve_methods(frame)
    colors = method_colors(methods)
    panels = list(_panels(frame))
    head_dims = sorted({d for d, _, _ in panels})
    fig, axes = plt.subplots(len(head_dims), 2, figsize=(11, 3.6 * len(head_dims) + 1.2), squeeze=False, sharex=True)
    seqlens = sorted(int(s) for s in frame["seqlen"].unique())
    for head_dim, causal, part in panels:
        ax = axes[head_dims.index(head_dim), int(causal)]
        for method in methods:
            line = part[part["method"] == method].sort_values("seqlen")
            if line.empty:
                continue
            phase = bool(line["is_phase"].iloc[0])
            ax.plot(line["seqlen"], line["tflops"], color=colors[method], marker=CURVE_MARKERS.get(method, "o"),
                    markersize=4, linewidth=2.0 if phase else 1.2, linestyle="-" if phase else "--", label=label(method))
            ax.fill_between(line["seqlen"], line["tflops_low"], line["tflops_high"], color=colors[method], alpha=0.15,
                            linewidth=0)
            wrong = line[line["correct"].map(lambda c: c is False)]
            ax.scatter(wrong["seqlen"], wrong["tflops"], marker="x", s=60, color="black", zorder=4)
        strip = ax.get_xaxis_transform()   # x in data, y in axes coordinates: the strip's own band at the bottom
        for s, method in _fastest(part, False).items():
            ax.scatter([s], [0.035], marker="s", s=60, color=colors.get(method, "#7f7f7f"), transform=strip, zorder=4)
            ax.text(s, 0.07, short_name(method), transform=strip, ha="center", fontsize=7)
        if one_wave is not None:   # labelled low, just over the strip, clear of the curves that have climbed by then
            ax.axvline(one_wave, color="#444444", linestyle=":", linewidth=1)
            ax.text(one_wave, STRIP_BAND + 0.03, " one wave of\n 128-row tiles", transform=strip, fontsize=7,
                    va="bottom")
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqlens, [_seqlen(s) for s in seqlens])
        ax.xaxis.set_minor_locator(plt.matplotlib.ticker.NullLocator())
        # Log TFLOP/s: short sequences run at a few TFLOP/s and long ones at hundreds, and both ends matter (who
        # leads where the GPU is not full, and who where it is). The strip takes the band below the lowest point.
        low, high = max(part["tflops_low"].min(), 1e-3), max(part["tflops_high"].max(), 1e-3) * 1.25
        bottom = low / (high / low) ** (STRIP_BAND / (1 - STRIP_BAND))
        ax.set_yscale("log")
        ax.set_ylim(bottom=bottom, top=high)
        ax.axhline(low / (high / low) ** (0.02 / (1 - STRIP_BAND)), color="#bbbbbb", linewidth=0.8)
        ticks = [m * 10.0 ** e for e in range(-3, 6) for m in (1, 2, 5) if low / 1.5 <= m * 10.0 ** e <= high]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.yaxis.set_minor_locator(plt.matplotlib.ticker.NullLocator())
        ax.set_ylabel("TFLOP/s (log)")
        ax.set_title(f"D = {head_dim}, {'causal' if causal else 'no mask'}", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("sequence length S (log2)")
    for ax in axes.flat:
        if not ax.lines:
            ax.set_visible(False)
    phases = set(frame.loc[frame["is_phase"], "method"])
    handles = [Line2D([], [], color=colors[m], marker=CURVE_MARKERS.get(m, "o"), markersize=4,
                      linestyle="-" if m in phases else "--", label=label(m)) for m in methods]
    handles.append(Line2D([], [], color="black", marker="x", linestyle="", label="check failed"))
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(handles))
    fig.suptitle(title, fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    return fig


# --- one CTA's measured timeline (trace.py) -----------------------------------------------------------------

# (legend, colour) of each kind of span: the three full barriers share one.
TRACE_SPANS = {"Q wait": ("waiting for a full barrier (Q, K, V)", "#d62728"),
               "K wait": ("waiting for a full barrier (Q, K, V)", "#d62728"),
               "V wait": ("waiting for a full barrier (Q, K, V)", "#d62728"),
               "empty wait": ("waiting for an empty buffer", "#ff9896"),
               "turn wait": ("waiting for its turn (ping-pong)", "#c7c7c7"),
               "Q·Kᵀ": ("Q·Kᵀ in flight (issued to seen done)", "#1f77b4"),
               "P·V": ("P·V in flight (issued to seen done)", "#2ca02c"),
               "softmax": ("softmax", "#ff7f0e"), "epilogue": ("epilogue", "#8c564b")}
TRACE_MARKERS = {"QIssue": ("v", "Q issued (TMA)"), "KVIssue": ("|", "K and V issued (TMA)")}


def timeline(record: dict, case: str, build: str | None = None, tiles: int = 6):
    """One CTA's measured timeline from a trace record (trace.py): a row per warpgroup (the producer; per
    consumer the recording warp, and its Q·Kᵀ and P·V wgmmas from issue to the wait that saw them done), time in
    µs from the CTA's first stamp, up to the end of the first `tiles` key tiles of its first work item; the
    producer's TMA issues as markers, numbered by key tile. `build`: a label of the record's builds (default: its
    first)."""
    from . import experiments, trace
    build = build or record["rows"][0]["build"]
    row = trace.row(record, case, build)
    events = trace.events_frame(row)
    spans = trace.spans(events)
    us = row["ns_per_cycle"] / 1000
    end = spans.loc[(spans["item"] == 0) & spans["tile"].between(0, tiles - 1), "end"].max()
    lanes = [(role, lane) for role in sorted(events["role"].unique())
             for lane in (("TMA",) if role == 0 else ("warp 0", "Q·Kᵀ", "P·V"))]
    y = {lane: len(lanes) - 1 - i for i, lane in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(lanes) + 2.0))
    shown = spans[spans["start"] < end]
    for (role, name), group in shown.groupby(["role", "span"]):
        lane = (role, "TMA" if role == 0 else name if name in ("Q·Kᵀ", "P·V") else "warp 0")
        height = 0.8 if lane[1] in ("TMA", "warp 0") else 0.6
        ax.broken_barh([(start * us, (min(stop, end) - start) * us) for start, stop in zip(group["start"], group["end"])],
                       (y[lane] - height / 2, height), color=TRACE_SPANS[name][1])
    issues = events[(events["role"] == 0) & (events["cycles"] <= end) & events["kind"].isin(list(TRACE_MARKERS))]
    for kind, group in issues.groupby("kind"):
        ax.scatter(group["cycles"] * us, [y[(0, "TMA")]] * len(group), marker=TRACE_MARKERS[kind][0], s=90,
                   color="black", zorder=3)
    for cycles, tile in issues.loc[issues["kind"] == "KVIssue", ["cycles", "tile"]].itertuples(index=False):
        ax.text(cycles * us, y[(0, "TMA")] + 0.45, str(tile), ha="center", fontsize=7)
    ax.set_yticks(list(y.values()), [f"{trace.role_name(role)}: {lane}" for role, lane in y])
    ax.set_xlim(-0.01 * end * us, end * us)   # the first marker whole
    ax.set_ylim(-0.6, len(lanes) - 0.2)
    ax.set_xlabel("time since the CTA's first stamp (µs)")
    ax.grid(axis="x", alpha=0.3)
    legend = dict.fromkeys(TRACE_SPANS[name] for name in shown["span"])
    handles = [Patch(color=color, label=label) for label, color in legend]
    handles += [Line2D([], [], marker=marker, color="black", linestyle="", label=label)
                for marker, label in TRACE_MARKERS.values()]
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4)
    ax.set_title(f"{build}, {case}: CTA 0, the first {tiles} key tiles of its first work item\n"
                 f"instrumented build (TRACE=1): clock64 stamps of one thread per warpgroup, never a timing\n"
                 f"{experiments.provenance(record)}", fontsize=7)
    fig.tight_layout()
    return fig
