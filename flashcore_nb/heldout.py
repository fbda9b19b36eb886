"""Off the grid: `attention` on shapes the grid never timed (chapter "Choosing a kernel").

    python -m flashcore_nb heldout     # writes results/<gpu>/experiments/heldout.json

The tuning table ranks the candidates at the grid's cases only; `attention` serves every other shape with the
ranking of the nearest case of its wave regime (tuning.nearest). Whether that rule holds between the cases is
measured here, on the three sets of shapes.py (HELDOUT, which found the fault of the rule without regimes;
HELDOUT_CHECK, chosen after that change; HELDOUT_D128, chosen after the mission shapes at D = 128 joined the grid),
in fp16, with the grid's own steps (grid.race, grid.dispatched):
1. the race: every candidate that runs the case and every baseline, in the same interleaved rounds, so that the
   fastest candidate there is known;
2. `attention` as a user gets it, through the committed table (the grid record this GPU has), its choice checked
   against the float64 reference and timed beside SDPA default and the Triton peer.
Its regret at a case is the GPU time of the candidate it chose over the fastest candidate's, paired in the race's
rounds: 1.0 where it chose the fastest. The race also gives, from the same rounds, the regret of two choices
`attention` made before: by the rule without wave regimes, and by the table without the grid cases added for the
held-out misses (ADDED_GRID_CASES)."""
from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pandas as pd

from . import env, experiments, grid, results, shapes, tuning
from .bench import paired_ratio
from .paths import RESULTS_DIR

NAME = "heldout"
SETS = {"found the fault": shapes.HELDOUT, "checks the change": shapes.HELDOUT_CHECK,
        "checks the D = 128 cases": shapes.HELDOUT_D128}
# The grid cases added because of the first two sets' misses: the frame gives the table's choice without them too.
ADDED_GRID_CASES = (shapes.MISSION_D128.name, shapes.MISSION_D128_CAUSAL.name)


def record(progress=print) -> Path:
    """The two steps on every held-out case, then the record; a line per case as it goes."""
    from .dispatch import table_for

    gpu = env.gpu()
    table = table_for(gpu)
    if table is None:
        raise RuntimeError(f"no tuning table for the {gpu.name}: record the grid first (python -m flashcore_nb grid)")
    configurations, fns = grid.load_candidates(gpu)
    rows = []
    for set_name, case in [(name, case) for name, cases in SETS.items() for case in cases]:
        row = {"set": set_name, **grid.race(case, fns, gpu)}
        row["nearest_grid_case"] = tuning.nearest(table, tuning.Problem.of_case(case, grid.DTYPE), gpu.sms).case
        row.update(grid.dispatched(case))
        rows.append(row)
        speed = 1 / paired_ratio(row["dispatch"]["attention"], row["dispatch"]["sdpa_default"])
        progress(f"{case.name}: {row['choice']} (as at {row['nearest_grid_case']}), "
                 f"{'correct' if row['check']['passed'] else 'WRONG'}, {speed:.2f}x SDPA default's speed")
    made = grid.candidates_record(NAME, configurations, rows, gpu, table_source=table.source)
    path = results.write(made)
    recorded = frame(made)
    for set_name in SETS:
        progress(f"{set_name}:\n" + pd.Series(summary(recorded[recorded["set"] == set_name])).to_string())
    return path


# --- reading the record (anywhere) -----------------------------------------------------------------------

def load(gpu_slug: str = results.DEFAULT_GPU, root: Path = RESULTS_DIR) -> dict | None:
    return experiments.load_if_recorded(NAME, gpu_slug, root)


def missing_message(gpu_slug: str = results.DEFAULT_GPU) -> str:
    return experiments.missing_message(NAME, "The held-out shapes", "heldout", gpu_slug)


def frame(record: dict) -> pd.DataFrame:
    """grid.frame's columns for each held-out case, with its set, its wave regime on the recorded GPU, the grid case
    whose ranking `attention` used and its regret (the chosen candidate's GPU time over the fastest candidate's,
    paired in the race), and the same for the rule without wave regimes (its grid case, choice and regret) and for
    the table without ADDED_GRID_CASES (its choice and regret)."""
    from .dispatch import choose

    frame_ = grid.frame(record)
    by_case = {row["case"]: row for row in record["rows"]}
    gpu = grid.recorded_gpu(record)
    # the table `attention` read on that GPU, and the same without the SMs its wave regimes are counted on
    table = tuning.load(gpu.name, gpu.cc)
    sizes_only_table = replace(table, sms=None)
    without_added = replace(table, entries=tuple(e for e in table.entries if e.case not in ADDED_GRID_CASES))
    extra = []
    for case, choice, fastest in zip(frame_["case"], frame_["choice"], frame_["fastest_candidate"]):
        row = by_case[case]
        problem = tuning.Problem(row["dtype"], row["head_dim"], row["causal"], row["batch"] * row["heads"],
                                 row["seqlen_q"], row["seqlen_k"])
        before = choose(gpu, problem, sizes_only_table).candidate
        without = choose(gpu, problem, without_added).candidate
        extra.append({"set": row["set"], "wave regime": problem.wave_regime(gpu.sms),
                      "nearest_grid_case": row["nearest_grid_case"],
                      "regret": paired_ratio(row["race"][choice], row["race"][fastest]),
                      "sizes-only case": tuning.nearest(sizes_only_table, problem).case, "sizes-only choice": before,
                      "sizes-only regret": paired_ratio(row["race"][before], row["race"][fastest]),
                      "sizes-only speed vs SDPA default": 1 / paired_ratio(row["race"][before],
                                                                           row["race"]["sdpa_default"]),
                      "without added cases: choice": without,
                      "without added cases: regret": paired_ratio(row["race"][without], row["race"][fastest])})
    return pd.concat([frame_, pd.DataFrame(extra)], axis=1)


def summary(frame_: pd.DataFrame) -> dict:
    """Issue 17's grid measures over some held-out shapes (`attention` timed beside SDPA default and the Triton
    peer), and how often and how much its rule missed the fastest candidate of the race, beside the rule without
    wave regimes (its speed over SDPA default from the race's rounds)."""
    vs_default = frame_.set_index("case")["speed_vs_sdpa_default"]
    vs_triton = frame_["speed_vs_triton"].dropna()
    regret = frame_.set_index("case")["regret"]
    return {
        "shapes": len(frame_),
        "share of shapes at least as fast as SDPA default": float((vs_default >= 1.0).mean()),
        "worst speed vs SDPA default": float(vs_default.min()),
        "worst case": vs_default.idxmin(),
        "geometric mean speed vs SDPA default": statistics.geometric_mean(vs_default),
        "share of shapes faster than the Triton peer": float((vs_triton > 1.0).mean()) if len(vs_triton) else None,
        "checks passed": int(frame_["check_passed"].sum()),
        "chose the fastest candidate": int((frame_["choice"] == frame_["fastest_candidate"]).sum()),
        "worst regret": float(regret.max()),
        "worst regret case": regret.idxmax(),
        "sizes only: chose the fastest candidate":
            int((frame_["sizes-only choice"] == frame_["fastest_candidate"]).sum()),
        "sizes only: worst regret": float(frame_["sizes-only regret"].max()),
        "sizes only: share at least as fast as SDPA default":
            float((frame_["sizes-only speed vs SDPA default"] >= 1.0).mean()),
        "sizes only: worst speed vs SDPA default": float(frame_["sizes-only speed vs SDPA default"].min()),
        "without added cases: chose the fastest candidate":
            int((frame_["without added cases: choice"] == frame_["fastest_candidate"]).sum()),
        "without added cases: worst regret": float(frame_["without added cases: regret"].max()),
    }
