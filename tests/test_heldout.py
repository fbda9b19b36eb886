"""The held-out shapes: off the grid by construction, and their record (attention through the committed table)."""
import pytest

from flashcore_nb import grid, heldout, results, shapes, tables, tuning
from flashcore_nb.env import GpuInfo
from flashcore_nb.paths import RESULTS_DIR


def test_the_held_out_shapes_are_off_the_grid_and_have_a_nearest_case():
    table = tuning.from_record(grid.load())
    on_grid = {tuning.Problem.of_case(case) for case in shapes.GRID}
    held_out = shapes.HELDOUT + shapes.HELDOUT_CHECK + shapes.HELDOUT_D128
    # all off the grid when chosen; one of the second set is the problem of a case added since (B·H = 8 as 1x8x512)
    on_the_grid = [case.name for case in held_out if tuning.Problem.of_case(case) in on_grid]
    assert on_the_grid == ["check_b2h4_s512_d128_causal"]
    assert tuning.Problem.of_case(shapes.select("check_b2h4_s512_d128_causal")[0]) == tuning.Problem.of_case(
        shapes.MISSION_D128_CAUSAL)
    for case in held_out:
        problem = tuning.Problem.of_case(case)
        assert tuning.nearest(table, problem) is not None, case.name
        assert case.batch * max(case.seqlen_q, case.sk) <= shapes.GRID_MAX_TOKENS, case.name
    items = [case.batch * case.heads * -(-case.seqlen_q // 128) for case in shapes.HELDOUT]
    assert any(64 < n < 256 for n in items)   # the gap chapter 9 names
    regimes = [tuning.Problem.of_case(case).wave_regime(132) for case in shapes.HELDOUT_CHECK]
    assert all(regimes.count(regime) >= 4 for regime in (0, 1, 2))
    third = [tuning.Problem.of_case(case) for case in shapes.HELDOUT_D128]
    assert all(p.head_dim == 128 and p.wave_regime(132) == 0 and p.seqlen_k >= 256 for p in third)
    assert {p.causal for p in third} == {False, True} and any(p.seqlen_q != p.seqlen_k for p in third)


def test_the_table_without_the_added_cases_is_the_table_before_them():
    record = grid.load()
    table = tuning.from_record(record)
    assert set(heldout.ADDED_GRID_CASES) <= {entry.case for entry in table.entries}
    frame = heldout.frame(heldout.load())
    added = frame["nearest_grid_case"].isin(heldout.ADDED_GRID_CASES)
    # where the rule took another case, the table without the added ones chooses the same
    assert (frame.loc[~added, "without added cases: choice"] == frame.loc[~added, "choice"]).all()
    assert added.any()


HELDOUT_GPUS = sorted(path.parents[1].name for path in RESULTS_DIR.glob(f"*/experiments/{heldout.NAME}.json"))


def test_the_book_gpu_has_a_held_out_record():
    assert results.DEFAULT_GPU in HELDOUT_GPUS


@pytest.mark.parametrize("gpu_slug", HELDOUT_GPUS)
def test_the_held_out_record_covers_every_set_through_the_committed_table(gpu_slug):
    record = heldout.load(gpu_slug)
    gpu = grid.recorded_gpu(record)
    table = tuning.load(gpu.name, gpu.cc)   # what `attention` reads on that GPU (another's of its cc where it has none)
    # made with the table the repository holds now: a new grid record means a new held-out record
    assert record["table_source"] == table.source
    frame = heldout.frame(record)
    assert list(zip(frame["set"], frame["case"])) == [(name, case.name) for name, cases in heldout.SETS.items()
                                                      for case in cases]
    assert frame["check_passed"].all()
    for case, nearest in zip([case for cases in heldout.SETS.values() for case in cases], frame["nearest_grid_case"]):
        assert tuning.nearest(table, tuning.Problem.of_case(case), gpu.sms).case == nearest
    chose_fastest = frame["choice"] == frame["fastest_candidate"]
    assert (frame.loc[chose_fastest, "regret"] == 1.0).all() and (frame["regret"] > 0).all()
    assert (frame["sizes-only regret"] > 0).all()


def test_a_candidates_record_names_every_raced_build_and_the_gpu():
    gpu = GpuInfo("NVIDIA H100 80GB HBM3", 90, 132, 232448, 0, "test")
    configurations = {"p09_warpspec": ("p09_warpspec", {}), "p09_warpspec:64-row": ("p09_warpspec", {"CONSUMERS": 1})}
    record = grid.candidates_record(heldout.NAME, configurations, [], gpu, table_source="a table")
    assert record["candidates"] == list(configurations) and record["table_source"] == "a table"
    assert record["gpu_info"]["sms"] == 132 and record["rounds"] == grid.ROUNDS
    assert {label: b["phase"] for label, b in record["builds"].items()} == {
        "p09_warpspec": "p09_warpspec", "p09_warpspec:64-row": "p09_warpspec"}
    assert record["builds"]["p09_warpspec:64-row"]["tile_params"]["CONSUMERS"] == 1


def test_the_held_out_tables_have_a_row_per_shape_and_a_column_per_set():
    frame = heldout.frame(heldout.load())
    summary = tables.heldout_summary(frame)
    assert list(summary.columns) == list(heldout.SETS)
    assert summary.loc["shapes"].tolist() == [len(cases) for cases in heldout.SETS.values()]
    for set_name, cases in heldout.SETS.items():
        part = tables.heldout_cases(frame, set_name)
        assert list(part["shape"]) == [case.label() for case in cases]
        fastest = part["without added cases: runs"] == part["fastest candidate"]
        assert (part.loc[fastest, "without added cases: regret"] == 1.0).all()
