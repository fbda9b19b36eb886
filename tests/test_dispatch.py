"""flashcore_nb.attention's choice on the CPU: the grid, the nearest-grid-case rule, the fallback per GPU, the
tuning table from a grid record, the summary of a record, and tracing under torch.compile."""
import math
import os
import subprocess
import sys
import textwrap

import matplotlib.pyplot as plt
import pytest

from flashcore_nb import budget, dispatch, experiments, grid, plots, results, shapes, tables, tuning
from flashcore_nb.env import GpuInfo, gpu_slug
from flashcore_nb.paths import ROOT
from flashcore_nb.phases import PHASES
from flashcore_nb.shapes import GRID, MISSION, Case


def _gpu(name: str, label: str) -> GpuInfo:
    limits = budget.GPUS[name]
    return GpuInfo(label, limits.cc, limits.sm_count, limits.smem_per_block_optin, 0, "test")


T4, A100, H100 = _gpu("T4", "Tesla T4"), _gpu("A100", "NVIDIA A100-SXM4-80GB"), _gpu("H100", "NVIDIA H100 80GB HBM3")
B200 = GpuInfo("NVIDIA B200", 100, 148, 232448, 0, "test")


def problem(b, h, sq, d=64, causal=False, sk=None, dtype="float16"):
    return tuning.Problem(dtype, d, causal, b * h, sq, sq if sk is None else sk)


# --- the grid ---------------------------------------------------------------------------------------------

def test_grid_is_the_issue_grid():
    grid_cases = [c for c in GRID if c.heads == shapes.GRID_HEADS]
    assert {(c.batch, c.seqlen_q) for c in grid_cases} == {
        (b, s) for b in (1, 4, 16) for s in (128, 512, 2048, 8192) if b * s <= 32768}
    assert all(c.batch * c.seqlen_q <= shapes.GRID_MAX_TOKENS for c in grid_cases)
    assert {(c.head_dim, c.causal) for c in grid_cases} == {(64, False), (64, True), (128, False), (128, True)}
    assert len(grid_cases) == 11 * 4 and len(GRID) == 48
    assert [c for c in GRID if c.heads != shapes.GRID_HEADS] == [
        MISSION, shapes.MISSION_CAUSAL, shapes.MISSION_D128, shapes.MISSION_D128_CAUSAL]
    assert len({c.name for c in GRID}) == len(GRID)
    assert shapes.select("b4h16_s8192_d128_causal") == [Case("b4h16_s8192_d128_causal", 4, 16, 8192, 128, True)]


# --- the nearest grid case -----------------------------------------------------------------------------------

def _entries(cases=GRID, ranking=("p07_registers",)):
    return tuple(tuning.Entry(c.name, tuning.Problem.of_case(c), tuple(ranking)) for c in cases)


TABLE = tuning.Table("NVIDIA H100 80GB HBM3", 90, "synthetic table", _entries())


@pytest.mark.parametrize("case", GRID, ids=lambda c: c.name)
def test_a_grid_case_is_its_own_nearest(case):
    assert tuning.nearest(TABLE, tuning.Problem.of_case(case)).case == case.name


def test_nearest_in_log_sizes_with_ties_to_the_first_in_grid_order():
    # 2x16 heads and 1000 keys: one octave from 1x16 and from 4x16 heads at 512 keys; 1x16 comes first
    assert tuning.nearest(TABLE, problem(2, 16, 1000)).case == "b1h16_s512"
    assert tuning.nearest(TABLE, problem(2, 16, 1000, causal=True)).case == "b1h16_s512_causal"
    assert tuning.nearest(TABLE, problem(3, 16, 7000, d=128)).case == "b4h16_s8192_d128"
    assert tuning.nearest(TABLE, problem(1, 6, 500)).case == "mission"
    assert tuning.nearest(TABLE, problem(64, 32, 64)).case == "b16h16_s128"
    # Sq != Sk: all three sizes count (512 queries and 8192 keys: two octaves from 2048 in each)
    assert tuning.nearest(TABLE, problem(1, 16, 512, sk=8192)).case == "b1h16_s2048"


H100_TABLE = tuning.Table("NVIDIA H100 80GB HBM3", 90, "synthetic table", _entries(), sms=132)


def test_wave_regimes_count_64_row_items_against_the_sms():
    assert problem(1, 8, 512).wave_regime(132) == 0      # the mission shape: 64 items, two CTAs each fit
    assert problem(1, 16, 512).wave_regime(132) == 1     # 128 items: one CTA each fits
    assert problem(1, 12, 768).wave_regime(132) == 2     # 144 items
    assert problem(1, 12, 768).wave_regime(148) == 1     # the same on a B200's SMs


@pytest.mark.parametrize("case", GRID, ids=lambda c: c.name)
def test_a_grid_case_is_its_own_nearest_in_its_wave_regime(case):
    assert tuning.nearest(H100_TABLE, tuning.Problem.of_case(case), 132).case == case.name


def test_the_nearest_case_is_taken_in_the_problems_wave_regime():
    # 2x16x512: 256 items of 64 rows, more than the SMs; in sizes alone 1x16x512 (128 items) is as near as 4x16x512
    # and first in grid order, but only 4x16x512 is across no wave boundary
    assert tuning.nearest(TABLE, problem(2, 16, 512)).case == "b1h16_s512"
    assert tuning.nearest(H100_TABLE, problem(2, 16, 512), 132).case == "b4h16_s512"
    assert tuning.nearest(H100_TABLE, problem(2, 16, 512)).case == "b1h16_s512"   # no SMs given: sizes alone
    # 1x8x1024: 128 items, one CTA each fits; the mission shape (64 items) is in regime 0
    assert tuning.nearest(TABLE, problem(1, 8, 1024)).case == "mission"
    assert tuning.nearest(H100_TABLE, problem(1, 8, 1024), 132).case == "b1h16_s512"
    # a regime without a grid case takes every case: a table of S >= 2048 only serves the mission shape too
    only_large = tuning.Table("x", 90, "x", _entries([c for c in GRID if c.seqlen_q >= 2048]), sms=132)
    assert tuning.nearest(only_large, problem(1, 8, 512), 132).case == "b1h16_s2048"


def test_nearest_keeps_head_dim_and_mask_and_prefers_the_dtype():
    assert tuning.nearest(TABLE, problem(1, 8, 512, d=96)) is None
    bf16 = tuning.Entry("bf16 mission", problem(1, 8, 512, dtype="bfloat16"), ("p08_wgmma",))
    table = tuning.Table("x", 90, "x", (*TABLE.entries, bf16))
    assert tuning.nearest(table, problem(4, 16, 2048, dtype="bfloat16")).case == "bf16 mission"
    assert tuning.nearest(table, problem(1, 8, 512)).case == "mission"
    assert tuning.nearest(TABLE, problem(1, 8, 512, dtype="bfloat16")).case == "mission"   # fp16's ranking serves


def test_problem_of_shapes():
    assert tuning.Problem.of((2, 3, 100, 64), (2, 3, 40, 64), "torch.bfloat16", True) == \
        tuning.Problem("bfloat16", 64, True, 6, 100, 40)
    assert tuning.Problem.of((3, 100, 64), (3, 100, 64), "float16", False) is None
    assert tuning.Problem.of((1, 2, 0, 64), (1, 2, 5, 64), "float16", False) is None
    assert problem(1, 8, 512).waves(132) == pytest.approx(32 / 132)


# --- the choice without a table, per GPU ---------------------------------------------------------------

def test_fallback_on_a_t4_takes_a_phase_that_runs_there():
    choice = dispatch.fallback(T4, problem(1, 8, 512))
    assert PHASES[choice.phase].runs_on(75) and dispatch.can_run(choice.phase, problem(1, 8, 512), T4)
    assert not any(PHASES[name].dispatch and PHASES[name].runs_on(75) for name in PHASES), "the fallback's premise"
    assert choice.phase == [name for name in PHASES if dispatch.can_run(name, problem(1, 8, 512), T4)][-1]
    assert choice.tile_params == PHASES[choice.phase].tile_params_for(75)
    assert dispatch.fallback(T4, problem(1, 8, 512, dtype="bfloat16")) is None   # no bf16 arithmetic on sm_75


@pytest.mark.parametrize("gpu", [A100, H100, B200], ids=lambda g: g.name)
def test_fallback_takes_a_candidate_where_one_runs(gpu):
    for p in (problem(1, 8, 512), problem(16, 16, 2048, d=128, causal=True), problem(1, 8, 100, sk=300)):
        choice = dispatch.fallback(gpu, p)
        assert PHASES[choice.phase].dispatch and PHASES[choice.phase].runs_on(gpu.cc), (gpu.name, p)
        assert choice.reason.startswith("fallback")


def test_fallback_on_an_h100_by_problem_size():
    """p09 (TMA, warp specialisation) where the problem fills the GPU, another candidate where it does not."""
    small, large = problem(1, 8, 512), problem(4, 16, 2048)
    assert small.waves(H100.sms) < 1 <= large.waves(H100.sms)
    assert dispatch.fallback(H100, large).phase == "p09_warpspec"
    assert dispatch.fallback(H100, small).phase not in ("p08_wgmma", "p09_warpspec")
    assert dispatch.fallback(B200, large).phase not in ("p08_wgmma", "p09_warpspec")   # sm_90a code: not on sm_100


def test_a_phase_whose_tiles_do_not_fit_is_not_chosen():
    small_smem = GpuInfo("48 KB GPU", 80, 100, 48 * 1024, 0, "test")
    d128 = problem(1, 8, 512, d=128)
    needed = max(launch.smem_bytes for launch in budget.launches("p07_registers", PHASES["p07_registers"].tile_params)
                 if launch.head_dim == 128)
    assert needed > small_smem.smem_per_block_optin
    assert not dispatch.can_run("p07_registers", d128, small_smem)
    assert dispatch.can_run("p07_registers", d128, A100)
    choice = dispatch.fallback(small_smem, d128)
    assert choice is None or dispatch.can_run(choice.phase, d128, small_smem)


def test_nominal_phase_explains_refusals():
    assert PHASES[dispatch.nominal(T4)].runs_on(75)
    assert PHASES[dispatch.nominal(H100)].dispatch
    assert dispatch.nominal(GpuInfo("old", 60, 10, 48 * 1024, 0, "test")) is None


def test_candidates_are_the_dispatch_phases_that_run_here_each_with_its_configurations():
    assert dispatch.candidates(H100) == [name for n, p in PHASES.items() if p.dispatch
                                         for name in (n, *(f"{n}:{v.candidate}" for v in p.candidate_variants))]
    assert "p09_warpspec:192-row" in dispatch.candidates(H100)
    assert dispatch.candidates(T4) == []
    assert not [name for name in dispatch.candidates(A100) if name.startswith(("p08_wgmma", "p09_warpspec"))]


def test_a_configuration_is_its_phase_built_with_its_defines_for_its_head_dims():
    phase, params, head_dims = dispatch.configuration("p09_warpspec:192-row", 90)
    assert phase == "p09_warpspec" and head_dims == (64,)
    assert params == {**PHASES["p09_warpspec"].tile_params_for(90), "CONSUMERS": 3, "Q_IN_SHARED": 1}
    assert dispatch.configuration("p09_warpspec", 90) == ("p09_warpspec", PHASES["p09_warpspec"].tile_params_for(90),
                                                          PHASES["p09_warpspec"].head_dims)
    with pytest.raises(ValueError, match="no tile configuration 'huge'.*192-row"):
        dispatch.configuration("p09_warpspec:huge", 90)
    with pytest.raises(KeyError, match="unknown phase"):
        dispatch.configuration("p42_gone", 90)


def test_a_configuration_runs_only_at_the_head_dims_its_defines_change():
    assert dispatch.can_run("p09_warpspec:192-row", problem(1, 16, 2048), H100)
    assert not dispatch.can_run("p09_warpspec:192-row", problem(1, 16, 2048, d=128), H100)
    assert dispatch.can_run("p09_warpspec:64-key", problem(1, 16, 512, d=128), H100)
    assert not dispatch.can_run("p09_warpspec:64-key", problem(1, 16, 512), H100)
    assert not dispatch.can_run("p09_warpspec:192-row", problem(1, 16, 2048), A100)   # sm_90a only, as its phase


# --- the choice from a table ---------------------------------------------------------------------------

def test_the_table_ranking_is_followed_down_to_a_phase_that_runs():
    table = tuning.Table("NVIDIA H100 80GB HBM3", 90, "synthetic table",
                         _entries(ranking=("p42_gone", "p08_wgmma", "p07_registers")))
    choice = dispatch.choose(H100, problem(2, 16, 1000), table)
    assert choice.phase == "p08_wgmma" and "b1h16_s512" in choice.reason and "synthetic table" in choice.reason
    assert dispatch.choose(A100, problem(2, 16, 1000), table).phase == "p07_registers"   # no wgmma on sm_80
    only_wgmma = tuning.Table("NVIDIA H100 80GB HBM3", 90, "synthetic table", _entries(ranking=("p08_wgmma",)))
    assert dispatch.choose(A100, problem(2, 16, 1000), only_wgmma).reason.startswith("fallback")
    assert dispatch.choose(H100, problem(1, 8, 512, d=96), table) is None   # no phase takes D = 96


def test_a_ranked_configuration_is_chosen_with_its_tile_parameters():
    table = tuning.Table("NVIDIA H100 80GB HBM3", 90, "synthetic table",
                         _entries(ranking=("p09_warpspec:gone", "p09_warpspec:192-row", "p09_warpspec")))
    choice = dispatch.choose(H100, problem(1, 16, 2048), table)
    assert (choice.candidate, choice.phase) == ("p09_warpspec:192-row", "p09_warpspec")
    assert choice.tile_params == dispatch.configuration("p09_warpspec:192-row", 90)[1]
    at_d128 = dispatch.choose(H100, problem(1, 16, 2048, d=128), table)   # the configuration is for D = 64 only
    assert (at_d128.candidate, at_d128.tile_params) == ("p09_warpspec", PHASES["p09_warpspec"].tile_params_for(90))
    forced = dispatch._choice(H100, (1, 16, 2048, 64), (1, 16, 2048, 64), "float16", False, "p09_warpspec:192-row")
    assert (forced.candidate, forced.tile_params, forced.reason) == (choice.candidate, choice.tile_params,
                                                                     "forced by the caller")


def test_use_table_replaces_the_recorded_tables_and_forgets_choices():
    dispatch._chosen[("auto", "a signature")] = (0, 0.125)
    try:
        dispatch.use_table(TABLE)
        assert dispatch.table_for(T4) is TABLE and not dispatch._chosen
    finally:
        dispatch.use_table(None)
    assert dispatch.table_for(GpuInfo("no such GPU", 61, 10, 48 * 1024, 0, "test")) is None


# --- the table from a grid record -----------------------------------------------------------------------

CANDIDATES = ["p07_registers", "p08_wgmma"]
METHODS = [*CANDIDATES, "sdpa_default", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "triton"]


def _timing(rounds: list[float], calls: list[float] | None = None) -> dict:
    calls = calls or [r + 10 for r in rounds]
    return {"gpu_us": sorted(rounds)[len(rounds) // 2], "gpu_us_min": min(rounds), "gpu_us_max": max(rounds),
            "gpu_us_rounds": rounds, "call_us": sorted(calls)[len(calls) // 2], "call_us_rounds": calls, "tflops": 1.0}


def synthetic_rows(cases=GRID) -> list[dict]:
    """A grid record's rows as grid.record writes them, with made-up timings: p07 fastest below 1000 query tiles
    of 128 rows, p08 above; p08 absent at D = 128 causal (as if it could not run there)."""
    rows = []
    for i, case in enumerate(cases):
        big = case.batch * case.heads * math.ceil(case.seqlen_q / 128) > 1000
        race = {name: _timing([10.0 + j + i] * 3) for j, name in enumerate(METHODS)}
        race["p07_registers"], race["p08_wgmma"] = (_timing([9.0] * 3), _timing([8.0] * 3)) if big else \
            (_timing([8.0] * 3), _timing([9.0] * 3))
        if case.head_dim == 128 and case.causal:
            del race["p08_wgmma"]
        rows.append({"case": case.name, "shape": case.label(), "batch": case.batch, "heads": case.heads,
                     "seqlen_q": case.seqlen_q, "seqlen_k": case.sk, "head_dim": case.head_dim,
                     "causal": case.causal, "dtype": "float16", "sdpa_default_backend": "sdpa_cudnn", "race": race,
                     "race_sm_clock_mhz": [1980.0, 1755.0], "choice": min(CANDIDATES, key=lambda n: race.get(n, {"gpu_us": 1e9})["gpu_us"]),
                     "check": {"max_abs_err": 1e-4, "sdpa_max_abs_err": 1e-4, "unwritten": 0, "passed": True},
                     # attention 2x SDPA default's speed in every round; the Triton peer level with it
                     "dispatch": {"attention": _timing([5.0, 6.0, 7.0], [12.0, 13.0, 14.0]),
                                  "sdpa_default": _timing([10.0, 12.0, 14.0], [20.0, 20.0, 20.0]),
                                  "triton": _timing([5.0, 6.0, 7.0])},
                     "dispatch_sm_clock_mhz": [1755.0, 1755.0]})
    return rows


def synthetic_record(env: dict | None = None) -> dict:
    rows = synthetic_rows()
    record = experiments.make_record(grid.NAME, None, {n: {} for n in CANDIDATES}, rows,
                                     build_phases={n: n for n in CANDIDATES})
    record["env"] = env or {**results.load("p07_registers")["env"]}   # as recorded on the book's GPU
    record.update(candidates=CANDIDATES, tuning=tuning.derive(rows, CANDIDATES), rounds=grid.ROUNDS,
                  gpu_info={"name": record["env"]["gpu"], "cc": 90, "sms": 132, "smem_per_block_optin": 232448,
                            "total_memory": 80 << 30, "driver": record["env"]["driver"]})
    return record


def test_the_table_ranks_the_candidates_by_gpu_time():
    record = synthetic_record()
    by_case = {entry["case"]: entry for entry in record["tuning"]["entries"]}
    assert list(by_case) == [c.name for c in GRID]
    assert by_case["mission"]["ranking"] == ["p07_registers", "p08_wgmma"]
    assert by_case["b16h16_s2048"]["ranking"] == ["p08_wgmma", "p07_registers"]
    assert by_case["b16h16_s2048_d128_causal"]["ranking"] == ["p07_registers"]   # p08 did not run there
    assert by_case["b4h16_s512"]["batch_heads"] == 64
    table = tuning.from_record(record)
    assert table.cc == 90 and record["env"]["gpu"] in table.source
    assert dispatch.choose(H100, problem(16, 16, 1800), table).phase == "p08_wgmma"
    assert dispatch.choose(H100, problem(1, 8, 700), table).phase == "p07_registers"


def test_a_grid_record_is_written_loaded_and_goes_stale(tmp_path, kernels_copy):
    record = synthetic_record()
    path = results.write(record, root=tmp_path)
    assert path == results.experiment_path("grid", results.DEFAULT_GPU, tmp_path)
    assert grid.load(root=tmp_path)["tuning"] == record["tuning"]
    assert grid.load(root=tmp_path / "nowhere") is None and "python -m flashcore_nb grid" in grid.missing_message()
    assert {b["phase"] for b in record["builds"].values()} == set(CANDIDATES)
    assert experiments.stale_builds(record) == []
    source = kernels_copy / "p08_wgmma.cu"
    source.write_text(source.read_text() + "\n// an edit\n")
    assert experiments.stale_builds(record) == ["p08_wgmma"]


def test_the_table_is_found_by_slug_then_by_compute_capability(tmp_path):
    for name, cc in (("NVIDIA H100 80GB HBM3", 90), ("NVIDIA A100-SXM4-80GB", 80)):
        record = synthetic_record({**results.load("p07_registers")["env"], "gpu": name, "cc": cc})
        results.write(record, root=tmp_path)
    assert tuning.load("NVIDIA H100 80GB HBM3", 90, tmp_path).gpu == "NVIDIA H100 80GB HBM3"
    assert tuning.load("NVIDIA H100 PCIe", 90, tmp_path).gpu == "NVIDIA H100 80GB HBM3"   # same architecture
    assert tuning.load("NVIDIA A100-SXM4-40GB", 80, tmp_path).gpu == "NVIDIA A100-SXM4-80GB"
    assert tuning.load("NVIDIA L4", 89, tmp_path) is None
    assert (tmp_path / gpu_slug("NVIDIA A100-SXM4-80GB") / "experiments" / "grid.json").exists()


# --- the summary of a record -----------------------------------------------------------------------------

def test_frame_pairs_the_rounds():
    frame = grid.frame(synthetic_record()).set_index("case")
    # per round 5/10, 6/12, 7/14: attention takes half SDPA default's time, so twice its speed
    assert frame.loc["mission", "speed_vs_sdpa_default"] == pytest.approx(2.0)
    assert frame.loc["mission", "speed_vs_triton"] == pytest.approx(1.0)
    assert frame.loc["mission", "call_vs_sdpa_default"] == pytest.approx(13.0 / 20.0)
    assert frame.loc["mission", "fastest"] == "p07_registers"
    assert frame.loc["b16h16_s2048", "fastest"] == frame.loc["b16h16_s2048", "fastest_candidate"] == "p08_wgmma"
    record = synthetic_record()
    record["rows"][0]["dispatch"]["attention"] = _timing([10.0, 30.0, 31.0])
    record["rows"][0]["dispatch"]["sdpa_default"] = _timing([20.0, 60.0, 20.0])
    # per-round ratios 0.5, 0.5, 1.55: median 0.5 (the ratio of the medians, 30 / 20, would say 1.5)
    assert grid.frame(record).loc[0, "speed_vs_sdpa_default"] == pytest.approx(2.0)


def test_summary_math():
    frame = grid.frame(synthetic_record()).head(4).copy()
    frame["speed_vs_sdpa_default"] = [0.5, 1.0, 2.0, 4.0]
    frame["speed_vs_triton"] = [1.5, 0.8, math.nan, 1.2]
    frame["check_passed"] = [True, True, False, True]
    summary = grid.summary(frame)
    assert summary["shapes"] == 4 and summary["checks passed"] == 3
    assert summary["share of shapes at least as fast as SDPA default"] == 0.75
    assert summary["worst speed vs SDPA default"] == 0.5 and summary["worst case"] == frame["case"][0]
    assert summary["geometric mean speed vs SDPA default"] == pytest.approx(4 ** 0.25)
    assert summary["share of shapes faster than the Triton peer"] == pytest.approx(2 / 3)
    assert summary["mission GPU µs"] == frame.set_index("case").loc["mission", "attention_dispatch_us"]
    targets = tables.grid_targets(summary).set_index("measure")
    assert targets["met"].tolist() == [False, False, True, False, False, True]
    assert f"worst speed vs SDPA default ({frame['case'][0]})" in targets.index
    frame["speed_vs_triton"] = math.nan   # no Triton peer on this machine
    assert grid.summary(frame)["share of shapes faster than the Triton peer"] is None
    assert tables.grid_targets(grid.summary(frame))["met"].isna().sum() == 1


def test_tables_and_figures_of_a_record():
    record = synthetic_record()
    frame = grid.frame(record)
    cases = tables.grid_cases(frame)
    assert list(cases["case"]) == [c.name for c in GRID] and cases["correct"].all()
    mission = tables.grid_mission(frame)
    assert list(mission["case"]) == ["mission", "mission_causal", "mission_d128", "mission_d128_causal"]
    assert mission.loc[0, "attention GPU µs"] == 6.0 and mission.loc[0, "SDPA default call µs"] == 20.0
    figure = plots.winner_map(frame, "synthetic")
    assert len(figure.axes) == 4
    assert sum(len(ax.patches) for ax in figure.axes) == len(GRID)
    colours = {patch.get_facecolor() for ax in figure.axes for patch in ax.patches}
    assert len(colours) == frame["fastest"].nunique() == 2
    speed = plots.grid_speed(frame, "synthetic", worst_target=0.9)
    assert len(speed.axes[0].collections) == 2 and len(speed.axes[0].get_yticks()) == len(GRID)
    plt.close("all")


def test_the_recorded_grid_is_current_when_there_is_one():
    record = grid.load()
    if record is None:
        pytest.skip("the grid is not recorded yet (python -m flashcore_nb grid on the H100)")
    gpu = grid.recorded_gpu(record)
    assert record["candidates"] == dispatch.candidates(gpu), "a candidate changed: re-record the grid"
    assert [row["case"] for row in record["rows"]] == [c.name for c in GRID]
    assert record["tuning"] == tuning.derive(record["rows"], record["candidates"])
    assert all(row["check"]["passed"] for row in record["rows"])


# --- torch.compile: the choice made while tracing ------------------------------------------------------

# Run in a fresh process: it registers a CPU stand-in for the launcher's operator under the launcher's name.
TRACING = textwrap.dedent("""
    import sys
    from types import SimpleNamespace

    import torch
    import torch.nn.functional as F

    from flashcore_nb import dispatch, env, tuning
    from flashcore_nb.env import GpuInfo

    library = torch.library.Library("flashcore", "DEF")
    library.define("attention(Tensor q, Tensor k, Tensor v, bool causal, float scale, int phase) -> Tensor")
    library.impl("attention", lambda q, k, v, causal, scale, phase:
                 F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale) + phase, "CPU")
    torch.library.register_fake("flashcore::attention")(lambda q, k, v, causal, scale, phase: torch.empty_like(q))

    h100 = GpuInfo("NVIDIA H100 80GB HBM3", 90, 132, 232448, 80 << 30, "test")
    env.gpu = lambda index=None: h100
    handles = {"p07_registers": 7, "p08_wgmma": 8, "p09_warpspec": 9}
    dispatch._load = lambda choice, device_index: SimpleNamespace(handle=handles[choice.phase])
    dispatch.table_for = lambda gpu: None   # the fallback's choice, whatever grid records exist

    def block(q, k, v):
        return dispatch.attention(q * 0.5, k, v, is_causal=True) + 1

    for dynamic in (False, None, True):   # static shapes; dynamic after a recompile (the default); dynamic
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True, dynamic=dynamic)
        for shape in ((1, 8, 512, 64), (16, 16, 512, 64), (1, 8, 300, 64), (4, 16, 2048, 64)):
            q = torch.randn(*shape).half()
            phase = dispatch.choose(h100, tuning.Problem.of(q.shape, q.shape, q.dtype, True), None).phase
            launched = (compiled(q, q, q) - F.scaled_dot_product_attention(q * 0.5, q, q, is_causal=True) - 1).float()
            assert (launched - handles[phase]).abs().max() < 0.1, (dynamic, shape, phase)
            print(dynamic, shape, phase)
""")


def test_the_choice_is_made_while_tracing_without_graph_breaks():
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", TRACING], capture_output=True, text=True, env=environment,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 12 and {line.split(")")[-1].strip() for line in lines} == {"p07_registers", "p09_warpspec"}
