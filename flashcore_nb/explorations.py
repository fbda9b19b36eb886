"""Phase 9 taken apart: the exploration builds of chapter 9 and of the choosing chapter, recorded.

Each is a build of phase 9 with one thing changed, timed against a reference build in the same interleaved rounds
(bench.compare), GPU time paired round by round:
- at the mission shape (1×8×512×64), where the target asks for 4.5 µs: the cluster-keys build with one cost taken
  out at a time (the launch alone, the loads alone, no combine, no waits, no exponentials), with programmatic
  dependent launch (PDL), back to back and after another kernel, with the keys split unevenly between its two CTAs,
  with small changes (later tiles held back, the epilogue's reciprocal), and with larger key tiles;
- for chapter 9: the split-keys and cluster-keys configurations beside the 64-row one, the epilogue's stores, and
  the exponentials (taken out, or two at a time in fp16).

The switches are an exploration patch, kernels/explorations/p09_warpspec.patch, applied to phase 9's source at build
time (source_patch.py); they are never in `attention`. The builds without a switch are phase 9 as it is, through its
defines. A build marked timed-only skips work or waits, gives wrong outputs by design, and is never checked; every
other build is checked on the mission shapes first (an inexact one without having to pass), and the PDL builds also
in a CUDA graph of chained calls, where a call that read its input too early would read poison.

`python -m flashcore_nb explore` records results/<gpu>/experiments/p09_warpspec_explorations.json."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import build, dispatch, experiments, results, shapes

PHASE = "p09_warpspec"
PATCH = "explorations/p09_warpspec.patch"   # relative to kernels/, as the record names it
RECORD = f"{PHASE}_explorations"
CLUSTER, ROWS64, SPLIT = "cluster-keys", "64-row", "split-keys"   # candidates of `attention` (phases.py)


@dataclass(frozen=True)
class Build:
    base: str                          # the candidate it starts from ("" for phase 9's defaults)
    defines: dict = field(default_factory=dict)
    patched: bool = False              # built with PATCH applied
    timed_only: bool = False           # wrong outputs by design: never checked
    inexact: bool = False              # checked, and its checks recorded, but not required to pass


BUILDS = {
    "cluster-keys": Build(CLUSTER),
    "returns at once": Build(CLUSTER, {"EXP_STOP": 1}, True, True),
    "loads only": Build(CLUSTER, {"EXP_STOP": 2}, True, True),
    "loads only, Q alone": Build(CLUSTER, {"EXP_STOP": 4}, True, True),
    "no combine": Build(CLUSTER, {"EXP_STOP": 3}, True, True),
    "no wait for Q and the first K tile": Build(CLUSTER, {"EXP_NOWAIT": 1}, True, True),
    "no wait for any tile": Build(CLUSTER, {"EXP_NOWAIT": 2}, True, True),
    "no exponentials": Build(CLUSTER, {"EXP_NOEXP": 1}, True, True),
    "exponentials in fp16 pairs": Build(CLUSTER, {"EXP_HALFEXP": 1}, True, inexact=True),
    "PDL, waits only": Build(CLUSTER, {"EXP_PDL": 1}, True),
    "PDL, signal after the CTA barrier": Build(CLUSTER, {"EXP_PDL": 2}, True),
    "PDL, signal after the last copy": Build(CLUSTER, {"EXP_PDL": 3}, True),
    "cluster-keys, 128-key tiles": Build(CLUSTER, {"BLOCK_N": 128, "STAGES": 2}),
    "cluster-keys, 256-key tiles": Build(CLUSTER, {"BLOCK_N": 256, "STAGES": 2}),
    "cluster-keys, two consumers splitting again": Build(CLUSTER, {"CONSUMERS": 2, "SPLIT_KEYS": 1, "PINGPONG": 0}),
    "cluster-keys, plain stores for the send": Build(CLUSTER, {"SEND_ASYNC": 0}),
    "clusters of four": Build(CLUSTER, {"CLUSTER_KEYS": 4}),
    "uneven split, one tile": Build(CLUSTER, {"EXP_UNEVEN": 1}, True),
    "uneven split, two tiles": Build(CLUSTER, {"EXP_UNEVEN": 2}, True),
    "later tiles held back": Build(CLUSTER, {"EXP_HOLD": 1}, True),
    "epilogue reciprocal": Build(CLUSTER, {"EXP_RCP": 1}, True),
    "64-row": Build(ROWS64),
    "64-row, 192-key tiles": Build(ROWS64, {"BLOCK_N": 192, "STAGES": 2}),
    "64-row, 256-key tiles": Build(ROWS64, {"BLOCK_N": 256, "STAGES": 2}),
    "split-keys": Build(SPLIT),
    "split-keys, 128-key tiles": Build(SPLIT, {"BLOCK_N": 128, "STAGES": 3}),
    "defaults": Build(""),
    "defaults, PDL": Build("", {"EXP_PDL": 3}, True),
    "defaults, 4-byte stores": Build("", {"WIDE_STORES": 0}),
    "defaults, stores skipped": Build("", {"EXP_NOSTORE": 1}, True, True),
    "defaults, no exponentials": Build("", {"EXP_NOEXP": 1}, True, True),
    "defaults, exponentials in fp16 pairs": Build("", {"EXP_HALFEXP": 1}, True, inexact=True),
}
PDL = "PDL, signal after the last copy"   # the PDL build timed everywhere

# Problems of 16 and 32 work items at the mission shape's row count (1×H×512×64), beside the mission's 64.
FEW_HEADS = [shapes.Case(f"b1h{h}_s512", 1, h, 512, 64) for h in (2, 4)]

# Timing sets: name -> [(case, builds)], the first build of each the reference its ratios are paired with.
_MISSIONS = ("mission", "mission_causal")
SETS = {
    "one cost out": [("mission", ["cluster-keys", "returns at once", "loads only, Q alone", "loads only", "no combine",
                                  "no wait for Q and the first K tile", "no wait for any tile", "no exponentials"])],
    "PDL back to back": [("mission", ["cluster-keys", "PDL, waits only", "PDL, signal after the CTA barrier", PDL]),
                         ("mission_causal", ["cluster-keys", PDL]),
                         ("b1h16_s512", ["cluster-keys", PDL]),
                         ("b1h16_s512_causal", ["cluster-keys", PDL]),
                         ("b16h16_s512", ["defaults", "defaults, PDL"]),
                         ("b4h16_s2048", ["defaults", "defaults, PDL"]),
                         ("b2h16_s4096_d128", ["defaults", "defaults, PDL"])],
    "uneven split": [(case, ["cluster-keys", "uneven split, one tile", "uneven split, two tiles",
                             "later tiles held back", "epilogue reciprocal"])
                     for case in (*_MISSIONS, "b1h16_s512", "b1h16_s512_causal")],
    "exponentials": [("mission", ["cluster-keys", "no exponentials", "exponentials in fp16 pairs"]),
                     ("b4h16_s2048", ["defaults", "defaults, no exponentials",
                                      "defaults, exponentials in fp16 pairs"])],
    "key tiles": [(case, ["cluster-keys", "cluster-keys, 128-key tiles", "cluster-keys, 256-key tiles", "64-row",
                          "64-row, 192-key tiles", "64-row, 256-key tiles"]) for case in _MISSIONS],
    "split-keys": [(case, ["64-row", "split-keys", "split-keys, 128-key tiles"])
                   for case in (*_MISSIONS, "b1h16_s512", "b1h16_s512_causal", "b1h16_s2048", "b1h16_s128",
                                "b1h16_s128_causal", "b16h16_s128")],
    "cluster-keys": [*[(case, ["64-row", "cluster-keys", "cluster-keys, 128-key tiles",
                               "cluster-keys, two consumers splitting again", "cluster-keys, plain stores for the send",
                               "clusters of four"]) for case in _MISSIONS],
                     ("b1h16_s128", ["64-row", "cluster-keys", "clusters of four"]),
                     *[(case.name, ["cluster-keys", "64-row"]) for case in FEW_HEADS]],
    "stores": [(case, ["defaults", "defaults, 4-byte stores", "defaults, stores skipped"])
               for case in ("b16h16_s128_d128", "b16h16_s128_d128_causal", "b4h16_s512_d128", "b16h16_s512_d128",
                            "b16h16_s512_d128_causal", "b16h16_s512_causal", "b4h16_s2048", "b2h16_s4096_d128")],
}
CHECK_CASES = _MISSIONS
# More interleaved rounds than a phase record's 9 (bench.ROUNDS): these ratios are a few percent apart, one run each.
ROUNDS = 15
AFTER_A_COPY_CASES = _MISSIONS
CHAIN_CALLS = 4


def tile_params(label: str, cc: int) -> dict:
    b = BUILDS[label]
    base = dispatch.configuration(f"{PHASE}:{b.base}" if b.base else PHASE, cc)[1]
    return {**base, **b.defines}


def patch_of(label: str) -> Path | None:
    return build.KERNELS_DIR / PATCH if BUILDS[label].patched else None


# --- measuring (GPU) --------------------------------------------------------------------------------

def _load_all(cc: int) -> dict:
    from .binding import load

    failed = [log for log in experiments.compile_in_parallel(
        [(PHASE, tile_params(label, cc), patch_of(label)) for label in BUILDS], cc, workers=len(BUILDS)) if log]
    if failed:
        raise RuntimeError(f"an exploration build did not compile:\n{failed[0][-3000:]}")
    return {label: load(PHASE, patch=patch_of(label), **tile_params(label, cc)) for label in BUILDS}


def _chain_error(fn, case: shapes.Case) -> tuple[float, float]:
    """Max error vs float64 over CHAIN_CALLS chained calls replayed from one CUDA graph (each call's Q is the
    previous call's output, every output poisoned before each replay), and the check's bound for the first."""
    import torch
    import torch.nn.functional as F

    from . import check

    q, k, v = check.make_inputs(case, torch.float16, seed=7)
    bound = check.tolerance(check.reference_and_sdpa_error(q, k, v, case.causal)[1])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up outside the capture
        fn(q, k, v, causal=case.causal)
    torch.cuda.current_stream().wait_stream(side)
    graph, outs = torch.cuda.CUDAGraph(), []
    with torch.cuda.graph(graph):
        x = q
        for _ in range(CHAIN_CALLS):
            x = fn(x, k, v, causal=case.causal)
            outs.append(x)
    worst = 0.0
    for _ in range(3):
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        x = q.double()
        for out in outs:
            reference = F.scaled_dot_product_attention(x, k.double(), v.double(), is_causal=case.causal)
            err = float((out.double() - reference).abs().max())
            worst = math.inf if math.isnan(err) else max(worst, err)
            x = out.double()
    return worst, bound


def _ratio_rows(set_name: str, case: str, names: list[str], timings: dict) -> list[dict]:
    """One row per method of one interleaved run, its ratios paired with the first method's; with the SM clock
    read before and after the rounds."""
    from .bench import paired_ratio

    reference = timings[names[0]]
    rows = []
    for name in names:
        timing = timings[name]
        ratios = [a / b for a, b in zip(timing["gpu_us_rounds"], reference["gpu_us_rounds"])]
        rows.append({"kind": "timing", "set": set_name, "case": case, "build": name, "gpu_us": timing["gpu_us"],
                     "gpu_us_min": timing["gpu_us_min"], "gpu_us_max": timing["gpu_us_max"],
                     "ratio": paired_ratio(timing, reference), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "rounds": len(ratios), "sm_clock_mhz": timings["sm_clock_mhz"]})
    return rows


def _triton_copy():
    """A Triton copy kernel that signals its dependents as it starts (programmatic dependent launch), or None
    where Triton does not import or has no such call."""
    try:
        import triton
        import triton.language as tl

        launch_dependents = tl.extra.cuda.gdc_launch_dependents
    except (ImportError, AttributeError):
        return None

    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        launch_dependents()
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(dst + offsets, tl.load(src + offsets, mask=mask), mask=mask)

    def copy(src, dst):
        copy_kernel[(triton.cdiv(dst.numel(), 4096),)](src, dst, dst.numel(), BLOCK=4096)
    return copy


def _after_a_copy(fns: dict, case: shapes.Case) -> list[dict]:
    """A copy that writes Q, then the attention, captured together: the pair's GPU time with the PDL build and
    without it, after PyTorch's copy (which does not signal) and after the Triton copy (which does); and the
    PDL build's output after each copy, checked."""
    import torch

    from . import bench, check

    inputs = bench.input_copies(*check.make_inputs(case, torch.float16, seed=1))
    sources = [q.clone() * 0.5 for q, _, _ in inputs]   # Q as the copy leaves it: not what the buffer held
    copies = {"PyTorch copy": lambda src, dst: dst.copy_(src)}
    triton_copy = _triton_copy()
    if triton_copy is not None:
        copies["Triton copy, signalling"] = triton_copy
    rows, calls = [], {}
    q, k, v = inputs[0]
    reference, sdpa_err = check.reference_and_sdpa_error(sources[0], k, v, case.causal)
    bound = check.tolerance(sdpa_err)
    for copy_name, copy in copies.items():
        q.fill_(float("nan"))
        copy(sources[0], q)
        err = float((fns[PDL](q, k, v, causal=case.causal).double() - reference).abs().max())
        rows.append({"kind": "pair check", "case": case.name, "build": PDL, "copy": copy_name,
                     "max_abs_err": err, "bound": bound, "passed": bool(err <= bound)})
        calls[copy_name] = [lambda q=q, s=s, c=copy: c(s, q) for (q, _, _), s in zip(inputs, sources)]
        for label in ("cluster-keys", PDL):
            calls[f"{copy_name}, then {label}"] = [
                lambda q=q, k=k, v=v, s=s, c=copy, fn=fns[label]: (c(s, q), fn(q, k, v, causal=case.causal))
                for (q, k, v), s in zip(inputs, sources)]
    timings = bench.timed(calls, case, ROUNDS)
    for copy_name in copies:
        rows.extend(_ratio_rows("PDL after a copy", case.name,
                                [f"{copy_name}, then cluster-keys", copy_name, f"{copy_name}, then {PDL}"], timings))
    return rows


def run(progress=print) -> list[dict]:
    import torch

    from . import bench, check, env

    names = {name for timed in SETS.values() for name, _ in timed} | set(CHECK_CASES) | set(AFTER_A_COPY_CASES)
    cases = {case.name: case for case in FEW_HEADS}
    cases.update((case.name, case) for case in shapes.select(",".join(sorted(names - set(cases)))))
    fns = _load_all(env.gpu().cc)
    rows = []
    for label, b in BUILDS.items():
        if b.timed_only:
            continue
        for case in CHECK_CASES:
            for dtype in (torch.float16, torch.bfloat16):
                result = check.check(fns[label], cases[case], dtype, seed=3)
                rows.append({"kind": "check", "build": label, **result.as_dict(),
                             "bound": check.tolerance(result.sdpa_max_abs_err)})
        if b.defines.get("EXP_PDL") and b.base == CLUSTER:
            for case in CHECK_CASES:
                err, bound = _chain_error(fns[label], cases[case])
                rows.append({"kind": "chain check", "build": label, "case": case, "max_abs_err": err, "bound": bound,
                             "passed": bool(err <= bound)})
    failed = [r for r in rows if not r["passed"] and not BUILDS[r["build"]].inexact]
    if failed:
        raise RuntimeError(f"an exploration build failed its check: {failed[0]}")
    progress(f"checked {len({r['build'] for r in rows})} builds")
    for set_name, timed in SETS.items():
        for case, labels in timed:
            timings = bench.compare({label: fns[label] for label in labels}, cases[case], baselines=("sdpa_default",),
                                    rounds=ROUNDS)
            rows.extend(_ratio_rows(set_name, case, [*labels, "sdpa_default"], timings))
            progress(f"{set_name}: {case} timed")
    for case in AFTER_A_COPY_CASES:
        rows.extend(_after_a_copy(fns, cases[case]))
        progress(f"PDL after a copy: {case} timed")
    return rows


def record() -> Path:
    from . import env

    rows = run()
    cc = env.gpu().cc
    record = experiments.make_record(RECORD, PHASE, {label: tile_params(label, cc) for label in BUILDS}, rows,
                                     build_patches={label: PATCH for label, b in BUILDS.items() if b.patched})
    return results.write(record)


# --- reading the record (the choosing chapter) ------------------------------------------------------

def load(gpu_slug: str = results.DEFAULT_GPU) -> dict | None:
    return experiments.load_if_recorded(RECORD, gpu_slug)


def missing_message(gpu_slug: str = results.DEFAULT_GPU) -> str:
    return experiments.missing_message(RECORD, "The exploration builds of phase 9", "explore", gpu_slug)


def timings(record: dict, set_name: str) -> pd.DataFrame:
    """One timing set: per case and build, the median GPU time, and the GPU time paired with the set's reference
    build (its first) in the same rounds (below 1: faster), with that ratio's spread over the rounds."""
    rows = [r for r in record["rows"] if r["kind"] == "timing" and r["set"] == set_name]
    frame = pd.DataFrame(rows)[["case", "build", "gpu_us", "ratio", "ratio_min", "ratio_max"]]
    return frame.rename(columns={"gpu_us": "GPU time (µs)", "ratio": "× reference", "ratio_min": "lowest round",
                                 "ratio_max": "highest round"})


def table(record: dict, set_name: str):
    """timings() as the chapters show it."""
    return timings(record, set_name).style.format(precision=3).hide(axis="index")


def checks(record: dict) -> pd.DataFrame:
    """Every check the record made, one row each: the eager checks (fp16 and bf16), the chained calls in a CUDA
    graph (fp16) and the PDL build after each copy (fp16), with the max error vs float64 and the bound. The
    inexact builds' checks (an `inexact` column) were recorded without being required to pass."""
    frame = pd.DataFrame([r for r in record["rows"] if r["kind"] != "timing"])
    frame["dtype"] = frame["dtype"].fillna("float16")
    frame["copy"] = frame["copy"].fillna("") if "copy" in frame else ""
    frame["inexact"] = [BUILDS[label].inexact if label in BUILDS else False for label in frame["build"]]
    return frame[["kind", "build", "case", "dtype", "copy", "max_abs_err", "bound", "passed", "inexact"]]
