"""python -m flashcore_nb {info,build,check,bench,record,stats,methods,precision,sweep,sanitize,ablate,rungs,profile,peaks,drift,procstate,split,accuracy,grid,seqlen,trace,explore,clusters,heldout,figures,summarise} [--phase NAME|all] [--shapes a,b]

info: this machine; build: compile (cold/cached time); check: errors on the shape suite; bench: timings beside
SDPA; record: check + bench (its rounds spread over three fresh processes) + ptxas into results/<gpu>/<phase>.json;
stats: ptxas per arch with plain nvcc (no GPU needed); methods: the timing-method experiment of chapter 0;
precision: chapter 4's FP16 P / FP32 P / padding-bug experiment; sweep: every tile configuration of a phase
(--phase p05_tile64 or p06_async), checked and timed; sanitize: chapter 6's compute-sanitizer reports (the planted
bug, the real kernel clean); ablate: chapters 7 and 8's techniques changed one at a time (--phase p07_registers,
p08_wgmma, or all); rungs: chapter 7's kernel built up in cumulative rungs, each checked and timed beside SDPA
default, the defaults and the rung before (--phase p07_registers); profile: each phase's Nsight Compute counters
(--phase, or all this GPU runs; needs ncu), every chapter's "What limits it now", and chapter 7's rungs' counters;
peaks: this GPU's measured fp16/bf16 matmul rate and copy bandwidth, the roofline's ceilings; drift: why SDPA's FA2
time moved between records (the methodology page's experiment); procstate: phase 2's GPU time at the mission shape,
causal, in six fresh processes on eight placements each, beside controls (what one process keeps: chapter 0);
split: where p07's key-split path pays, on small problems (chapter 7); accuracy: each phase (--phase, or all this
GPU runs) on 1,000 seeded random problems and 200 of a stressed kind, beside SDPA's error, with the variants tagged
"accuracy" (one suspect of a larger error changed each) on the same problems and timed (the results chapter); grid:
every candidate phase and SDPA backend over the grid of shapes, the tuning table flashcore_nb.attention reads, and
attention timed through it (chapter "Choosing a kernel"); heldout: attention, through the committed table, on
shapes the grid never timed, beside the fastest candidate raced there (the same chapter); seqlen: where each kernel
wins, as curves: p06 and every later phase, cuDNN, FA2 and the Triton peer over S = 128 ... 16384, D 64 and 128,
causal or not, 16 heads, checked and timed in the same rounds (the results chapter; --shapes for a subset of
shapes.SEQLEN_SWEEP); trace: a measured timeline of one CTA (--phase p09_warpspec): its instrumented builds
(TRACE=1, the variants tagged "trace") stamp every step of CTA 0's warpgroups on a couple of cases (--shapes to
choose), for the chapter's timeline figure; explore: phase 9's exploration builds (kernels/explorations/): the
cluster-keys build at the mission shape with one cost taken out at a time, with programmatic dependent launch and
with other key splits and tiles (the choosing chapter), and chapter 9's configurations, stores and exponentials;
clusters: how many thread-block clusters of each size the cluster builds of phases 9 and 10 fit on this GPU at once
(the driver's occupancy API, chapters 9 and 10). From precision on, each writes results/<gpu>/experiments/.
figures: the README's ladder figure from the recorded results (no GPU needed; --out, default
book/_static/ladder.png); summarise: re-derive the recorded phase records' paired ratios from their rounds after
the way they are summarised changed (no GPU needed; the rounds stay as recorded).
"""
from __future__ import annotations

import argparse
import json
import sys

import pandas as pd

from . import (accuracy, binding, build, clusters, drift, env, experiments, explorations, grid, heldout, peaks,
               plots, process_state, profile, results, sanitize, seqlen, shapes, trace)
from .measure import collect_runs, dtypes_for, record_timing_methods
from .paths import README_FIGURE
from .phases import PHASES, get
from .processes import PROCESSES

# Verbs that record a phase's tagged variants (experiments.VARIANTS): verb -> tag.
VARIANT_VERBS = {"ablate": "ablation", "rungs": "rung"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashcore_nb", description=__doc__)
    parser.add_argument("command", choices=["info", "build", "check", "bench", "record", "stats", "methods",
                                            "precision", "sweep", "sanitize", "ablate", "rungs", "profile", "peaks",
                                            "drift", "procstate", "split", "accuracy", "grid", "seqlen", "trace",
                                            "explore", "clusters", "heldout", "figures", "summarise"])
    parser.add_argument("--phase", default="all", help="phase name, or 'all' (default)")
    parser.add_argument("--shapes", default=None, help="comma-separated case names (see shapes.py)")
    parser.add_argument("--arch", type=int, action="append",
                        help="stats: compute capability to compile for (repeatable; default: the phase's archs)")
    parser.add_argument("--out", default=str(README_FIGURE), help="figures: where to write the PNG")
    parser.add_argument("--repeat", action="store_true",
                        help="record: write to results/repeat/ (a second run, to show that two runs agree)")
    args = parser.parse_args(argv)
    results.current_commit()  # a mistyped FLASHCORE_COMMIT stops here, before any GPU time is spent
    names = list(PHASES) if args.phase == "all" else [get(args.phase).name]

    if args.command == "info":
        print(env.describe())
        print("phases:", ", ".join(PHASES))
        return 0
    if args.command == "stats":
        rows = [{"phase": n, "arch": get(n).arch_name(cc),
                 **build.compile_only(get(n).kernel_file, cc, get(n).tile_params_for(cc), get(n).arch_specific).columns()}
                for n in names for cc in (args.arch or get(n).archs)]
        print(pd.DataFrame(rows).to_string(index=False))
        return 0
    if args.command == "figures":
        print("wrote", plots.export_ladder(args.out))
        return 0
    if args.command == "summarise":
        for path in results.resummarise():
            print("wrote", path)
        return 0

    if args.command in VARIANT_VERBS:
        recorded = experiments.VARIANTS[VARIANT_VERBS[args.command]]
        chosen = [n for n in names if n in recorded]
        if not chosen:
            print(f"{args.command} needs --phase one of {sorted(recorded)} (or all)", file=sys.stderr)
            return 2
    if args.command == "trace" and not set(names) & set(trace.TRACED):
        print(f"trace needs --phase one of {trace.TRACED} (or all)", file=sys.stderr)
        return 2

    if env.gpu() is None:
        print(f"'{args.command}' needs a CUDA GPU", file=sys.stderr)
        return 2
    # Recorded runs that take no phase: each writes one JSON record under results/<gpu>/.
    recorders = {"methods": record_timing_methods,
                 "precision": lambda: experiments.record_precision(shapes.select(args.shapes, "correctness")),
                 "sanitize": sanitize.record,
                 "peaks": peaks.record, "drift": drift.record, "procstate": process_state.record,
                 "split": experiments.record_key_split, "grid": grid.record, "explore": explorations.record,
                 "clusters": clusters.record, "heldout": heldout.record,
                 "seqlen": lambda: seqlen.record(cases=shapes.select(args.shapes, "seqlen"))}
    if args.command in recorders:
        print("wrote", recorders[args.command]())
        return 0
    if args.command in VARIANT_VERBS:
        for name in chosen:
            print("wrote", experiments.record_variants(name, VARIANT_VERBS[args.command]))
        return 0
    if args.command == "profile":
        cc = env.gpu().cc
        runnable = _runnable(names, cc)
        profile.prebuild(runnable, cc)
        for name in runnable:
            print(f"{name}: {', '.join(get(name).profile_cases)} under ncu", flush=True)
            print("wrote", profile.record(name), flush=True)
            if get(name).variants_tagged("rung"):
                print(f"{name}: its rungs on {', '.join(profile.RUNG_CASES)} under ncu", flush=True)
                print("wrote", profile.record_rungs(name), flush=True)
        return 0
    if args.command == "trace":
        for name in (n for n in names if n in trace.TRACED):
            print("wrote", trace.record(name, shapes.select(args.shapes) if args.shapes else None), flush=True)
        return 0
    if args.command == "accuracy":
        cc = env.gpu().cc
        runnable = _runnable(names, cc)
        accuracy.prebuild(runnable, cc)
        for name in runnable:
            print(f"{name}: {len(accuracy.builds_of(name))} build(s) on "
                  f"{sum(d.count for d in accuracy.DISTRIBUTIONS)} problems", flush=True)
            path = accuracy.record(name)
            summary = accuracy.summary(accuracy.frame(json.loads(path.read_text())), by=("build", "distribution", "dtype"))
            print("wrote", path, flush=True)
            print(summary.to_string(index=False), flush=True)
        return 0
    if args.command == "sweep":
        if len(names) != 1 or names[0] not in experiments.SWEEP_GRIDS:
            print(f"sweep needs --phase one of {sorted(experiments.SWEEP_GRIDS)}", file=sys.stderr)
            return 2
        print("wrote", experiments.record_sweep(names[0]))
        return 0
    failed = False
    for name in names:
        fn = binding.load(name)
        print(f"{name}: {fn.build.name} ({'cache' if fn.build.cached else 'compiled'}, "
              f"{fn.build.seconds:.1f} s)", flush=True)
        if args.command == "build":
            continue
        correctness = shapes.select(args.shapes, "correctness")
        timing = shapes.select(args.shapes, "timing")
        if args.command == "check":
            rows = [row for case in correctness for row in _check_rows(fn, case)]
        elif args.command == "bench":
            rows = [_bench_row(fn, case) for case in timing]
        else:
            rows = _record(fn, correctness, timing, results.REPEAT_DIR if args.repeat else results.RESULTS_DIR)
        failed |= any(not row.get("passed", True) for row in rows)
        print(pd.DataFrame([_flat(row) for row in rows]).to_string(index=False), flush=True)
    return 1 if failed else 0


def _runnable(names: list[str], cc: int) -> list[str]:
    """The phases this GPU runs, saying which it skips."""
    runnable = [n for n in names if get(n).runs_on(cc)]
    for name in sorted(set(names) - set(runnable), key=names.index):
        print(f"{name}: skipped, it needs an {get(name).requirement} GPU", flush=True)
    return runnable


def _check_rows(fn, case):
    from .check import check
    return [check(fn, case, dtype).as_dict() for dtype in dtypes_for(fn.phase)]


def _bench_row(fn, case):
    from .bench import bench_case
    return {"case": case.name, **bench_case(fn, case)}


def _record(fn, correctness, timing, root):
    from .bench import matmul_tflops
    peak = matmul_tflops()
    runs = collect_runs(fn, correctness, timing, processes=PROCESSES)
    record = results.make_record(fn.phase.name, fn.tile_params, fn.build.ptxas, peak, runs)
    print("wrote", results.write(record, root), f"(matmul peak {peak:.0f} TFLOP/s)", flush=True)
    return runs


def _flat(row: dict) -> dict:
    """Baselines as one column each (GPU time), for printing; per-round lists left out."""
    flat = {k: v for k, v in row.items() if k not in ("baselines", "shape") and not k.endswith("_rounds")}
    for name, timing in (row.get("baselines") or {}).items():
        flat[name] = timing["gpu_us"] if timing else None
    return flat


if __name__ == "__main__":
    sys.exit(main())
