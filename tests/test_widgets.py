"""The tile explorer and its calculator, in replay mode (no GPU)."""
import pandas as pd
import pytest

from flashcore_nb import binding, budget, env, experiments, shapes, widgets
from flashcore_nb.env import GpuInfo
from flashcore_nb.phases import get


@pytest.fixture
def replay(monkeypatch):
    monkeypatch.setenv("FLASHCORE_MODE", "replay")


def _pretend_gpu(monkeypatch, name: str, gpu_name: str) -> GpuInfo:
    """Live mode on one of budget.GPUS, as far as the package can tell; compiling fails the test."""
    limits = budget.GPUS[name]
    info = GpuInfo(gpu_name, limits.cc, limits.sm_count, limits.smem_per_block_optin, 16 << 30, "any")
    monkeypatch.setattr(env, "mode", lambda: "live")
    monkeypatch.setattr(env, "gpu", lambda index=None: info)
    monkeypatch.setattr(binding, "load", lambda *args, **kwargs: pytest.fail("compiled a kernel"))
    return info


def test_calculator_counts_waves_of_the_mission_grid():
    frame = widgets.calculator("p05_tile64", {"BLOCK_M": 64, "BLOCK_N": 64, "NUM_WARPS": 8}, registers=126)
    l4 = frame.set_index("GPU").loc["L4"]
    # 61 KB + 1 KB reserved: one CTA per 100 KB SM; 8 heads x 512/64 = 64 CTAs on 58 SMs
    assert l4["CTAs/SM"] == 1 and l4["CTAs (mission)"] == 64
    assert l4["waves"] == pytest.approx(64 / 58)
    h100 = frame.set_index("GPU").loc["H100"]
    # 126 registers -> 4096 per warp, 8 warps -> 32768 per CTA: two CTAs in 64 K registers
    assert h100["CTAs/SM"] == 2 and h100["limiter"] == "registers"


def test_a_cta_that_does_not_fit_takes_infinite_waves():
    occ = budget.occupancy(budget.GPUS["T4"], 256, 128, 104 * 1024)
    assert not occ.fits and budget.Grid("32 tiles", False, "", 32).waves(budget.GPUS["T4"], occ) == float("inf")


def test_recorded_summary_reads_the_sweep():
    sweep, sdpa, _ = experiments.sweep_runs("p05_tile64")
    fast = widgets.recorded_summary(sweep, sdpa, {"BLOCK_M": 32, "BLOCK_N": 128, "NUM_WARPS": 16})
    row = widgets.recorded_row(sweep, {"BLOCK_M": 32, "BLOCK_N": 128, "NUM_WARPS": 16})
    assert f"mission {row['mission_us']:.1f} µs" in fast and f"{row['registers']:.0f} registers" in fast
    invalid = widgets.recorded_summary(sweep, sdpa, {"BLOCK_M": 128, "BLOCK_N": 32, "NUM_WARPS": 2})
    assert invalid.startswith("does not compile: NUM_WARPS * 32 must be a multiple of BLOCK_M")


def test_explorer_builds_and_follows_every_choice_in_replay(replay):
    explorer = widgets.tile_explorer("p05_tile64")
    pickers, button, _ = explorer.children
    assert button.disabled                      # nothing to compile without a GPU
    assert [p.value for p in pickers.children] == [64, 64, 8]   # the phase's defaults
    assert [p.value for p in widgets.tile_explorer("p06_async").children[0].children] == [32, 128, 8, 2]
    for values in ((32, 128, 16), (128, 32, 2), (64, 64, 8)):   # each change re-renders; errors would raise
        for picker, value in zip(pickers.children, values):
            picker.value = value


def test_a_static_page_gets_the_calculator_in_place_of_the_widget(replay):
    bundle = widgets.tile_explorer("p05_tile64")._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle     # Jupyter still gets the widget
    page = bundle["text/html"]
    assert page.startswith("<p>BLOCK_M=64 BLOCK_N=64 NUM_WARPS=8: recorded: mission")
    assert all(f">{gpu}<" in page for gpu in budget.GPUS) and "every configuration of the sweep" in page
    sweep, _, _ = experiments.sweep_runs("p05_tile64")
    table = widgets.sweep_calculator("p05_tile64", sweep)
    assert len(table) == len(sweep) and page.count("<tr>") == len(budget.GPUS) + len(sweep) + 2
    ok = table[table["status"] == "ok"]
    assert ok["waves"].notna().all() and table.loc[table["status"] != "ok", "waves"].isna().all()
    mission = ok.set_index(["BLOCK_M", "BLOCK_N", "NUM_WARPS"]).loc[(32, 128, 16)]
    assert mission["waves"] == pytest.approx(128 / 132 / mission["CTAs/SM"])


def test_explorer_starts_on_this_gpus_defaults(monkeypatch):
    _pretend_gpu(monkeypatch, "L4", "NVIDIA L4")
    pickers, button, _ = widgets.tile_explorer("p05_tile64").children
    assert [p.value for p in pickers.children] == [32, 64, 16] and not button.disabled


def test_a_configuration_this_gpu_cannot_hold_is_refused_before_compiling(monkeypatch):
    _pretend_gpu(monkeypatch, "T4", "Tesla T4")
    text, registers = widgets.measure_live("p05_tile64", {"BLOCK_M": 128, "BLOCK_N": 128, "NUM_WARPS": 8})
    assert registers is None
    assert text == ("p05_tile64 with these tile sizes needs 157696 bytes of shared memory per block; "
                    "Tesla T4 allows 65536 (choose smaller tiles)")


# --- the calculator for phases 1, 2 and 7-10: their grids are not one BLOCK_M-row CTA per query tile -------

BIG = shapes.Case("b4h16_s2048", 4, 16, 2048, 64)
H100_SLOTS = 132   # SMs


def _h100(phase_name, case):
    return widgets.phase_calculator(phase_name, case).set_index("GPU").loc["H100"]


def _occupancy_by_hand(registers: int, warps: int) -> int:
    """CTAs per SM that 64 K registers allow, registers given to a warp in chunks of 256."""
    per_warp = -(-registers * 32 // 256) * 256
    return 65536 // (per_warp * warps)


def test_p07_at_the_mission_shape_takes_the_key_split_one_cta_per_query_tile():
    row = _h100("p07_registers", shapes.MISSION)
    # 128-row tiles: 4 x 8 heads = 32 CTAs < 50% of 132 SMs -> the key split, 32 rows (2 warps) x KV_SPLIT 4 = 8 warps
    assert row["configuration"].startswith("p07 key split") and row["threads"] == 256
    # Q, K and V, two stages: 2 x 32 x 64 x 2 B + 2 x (2 x 128 x 64 x 2 B) = 72 KB, unpadded (swizzled)
    assert row["smem KB"] == 72
    # the key-split kernel measured at the mission shape (Nsight Compute): 143 registers -> 4608 per warp x 8
    assert row["registers"] == 143 and _occupancy_by_hand(143, 8) == 1
    assert row["CTAs/SM"] == 1 and row["limiter"] == "registers"
    # not persistent on this path: one CTA per 32-row query tile
    assert row["work items (mission)"] == row["CTAs (mission)"] == 512 // 32 * 8 == 128
    assert row["waves"] == pytest.approx(128 / 132)


def test_p07_at_4x16x2048_is_persistent_over_its_large_tiles():
    row = _h100("p07_registers", BIG)
    assert row["configuration"].startswith("p07 large tiles") and row["threads"] == 128   # 128 rows / 32 per warp
    assert row["smem KB"] == 64           # 2 x 128 Q rows + 2 x 64 K + 2 x 64 V rows, 128 B each
    assert row["registers"] == 243 and _occupancy_by_hand(243, 4) == 2   # 64 KB + 1 KB allows 3: registers limit
    assert row["CTAs/SM"] == 2 and row["limiter"] == "registers"
    items = 2048 // 128 * 16 * 4
    assert row["work items (b4h16_s2048)"] == items == 1024
    assert row["CTAs (b4h16_s2048)"] == 2 * 132          # no more CTAs than are resident
    assert row["waves"] == pytest.approx(1024 / 264)


@pytest.mark.parametrize("case, items", [(shapes.MISSION, 512 // 128 * 8), (BIG, 2048 // 128 * 16 * 4)])
def test_p08_launches_one_cta_per_two_warpgroups_of_query_rows(case, items):
    row = _h100("p08_wgmma", case)
    assert row["configuration"] == "128 rows per CTA" and row["threads"] == 2 * 128
    # Q 128 rows, K and V two 64-key buffers each, 128 B per row, + 1 KB alignment slack
    assert row["smem KB"] == (128 + 4 * 64) * 128 / 1024 + 1
    assert row["registers"] == 122 and _occupancy_by_hand(122, 8) == 2   # what CTAS_PER_SM=2 asks ptxas for
    assert row["CTAs/SM"] == 2 and row["limiter"] == "registers"
    assert row[f"work items ({case.name})"] == row[f"CTAs ({case.name})"] == items
    assert row["waves"] == pytest.approx(items / (2 * 132))


@pytest.mark.parametrize("case, items", [(shapes.MISSION, 32), (BIG, 1024)])
def test_p09_walks_its_work_items_with_one_cta_per_sm(case, items):
    row = _h100("p09_warpspec", case)
    assert row["threads"] == 3 * 128      # a producer warpgroup and CONSUMERS = 2 (D = 64)
    # Q 128 rows, a ring of 3 x 128 keys for K and V, 128 B per row; the ones of the row sums (SPECULATE), 16 rows of
    # 128 B that P·V's wgmmas read as their last 8 columns (SUMS_IN_VALUES, D = 64); 2 + 3 x 3 mbarriers and the work
    # item's slot; 1 KB slack
    assert row["smem KB"] == pytest.approx(((128 + 2 * 3 * 128) * 128 + 2048 + 12 * 8 + 1024) / 1024)
    assert row["registers"] == 168 and row["CTAs/SM"] == 1 and row["limiter"] == "registers"
    # work items: query tiles of CONSUMERS x 64 rows; CTAs: one per SM, never more than the items
    assert row[f"work items ({case.name})"] == -(-case.seqlen_q // 128) * case.heads * case.batch == items
    assert row[f"CTAs ({case.name})"] == min(items, 132)
    assert row["waves"] == pytest.approx(items / 132)


def test_p10_splits_the_mission_shape_over_two_ctas_and_not_the_large_one():
    params = get("p10_splitkv").tile_params_for(90)
    row = _h100("p10_splitkv", shapes.MISSION)
    # 64 query tiles of 64 rows; two each fill 128 of 132 SMs (MAX_SPLITS = 2): 128 CTAs, as p10_launch says
    assert row["CTAs (mission)"] == budget.p10_launch(shapes.MISSION, params, 132)["CTAs"] == 64 * 2
    assert row["configuration"] == "p10, split over 2 CTAs" and row["threads"] == 128
    # Q 64 rows + 2 stages of 128 K and V rows (128 B each), the fp32 inbox 64 x 72 and 2 x 64
    assert row["smem KB"] == (64 * 128 + 4 * 128 * 128 + 64 * 72 * 4 + 2 * 64 * 4) / 1024
    assert row["registers"] == 175 and _occupancy_by_hand(175, 4) == 2
    assert row["CTAs/SM"] == 2 and row["waves"] == pytest.approx(128 / 264)
    big = _h100("p10_splitkv", BIG)
    assert big["configuration"] == "p10, split over 1 CTA" and big["registers"] == 171
    assert big["CTAs (b4h16_s2048)"] == 2048 and big["waves"] == pytest.approx(2048 / 264)


def test_p01_launches_one_cta_per_query_row():
    row = _h100("p01_baseline", shapes.MISSION)
    assert row["configuration"] == "one query row per CTA" and row["threads"] == 128
    # static __shared__ only: the query row and 2 x 128 floats, (64 + 2 x 128) x 4 B
    assert row["smem KB"] == 1280 / 1024
    # measured at 4x16x2048x64 (Nsight Compute): 34 registers -> 1280 per warp x 4 warps; 12 CTAs = 48 of 64 warps
    assert row["registers"] == 34 and _occupancy_by_hand(34, 4) == 12
    assert row["CTAs/SM"] == 12 and row["limiter"] == "registers" and row["occupancy %"] == 75
    assert row["work items (mission)"] == row["CTAs (mission)"] == 512 * 8
    assert row["waves"] == pytest.approx(4096 / (12 * 132))


def test_p02_launches_one_cta_per_num_warps_query_rows():
    row = _h100("p02_vectorized", shapes.MISSION)
    assert row["configuration"] == "8 query rows per CTA, one per warp" and row["threads"] == 256
    # static __shared__ only: K and V tiles of 32 x (64 + 8) halves, 8 query rows of 64 floats
    assert row["smem KB"] == (2 * 32 * 72 * 2 + 8 * 64 * 4) / 1024
    assert row["registers"] == 40 and _occupancy_by_hand(40, 8) == 6
    assert row["CTAs/SM"] == 6 and row["limiter"] == "registers"
    assert row["work items (mission)"] == row["CTAs (mission)"] == 512 // 8 * 8
    assert row["waves"] == pytest.approx(512 / (6 * 132))
    # the last CTA of a head may hold fewer rows: 100 rows in CTAs of 16 take 7 per head
    odd = shapes.Case("odd", 1, 2, 100, 64)
    assert budget.grid("p02_vectorized", odd, {"NUM_WARPS": 16}, budget.GPUS["H100"]).work_items == 7 * 2


@pytest.mark.parametrize("phase_name", ["p08_wgmma", "p09_warpspec"])
@pytest.mark.parametrize("gpu", ["T4", "L4", "A100"])
def test_an_sm90_phase_says_it_does_not_run_before_hopper(phase_name, gpu):
    row = widgets.phase_calculator(phase_name).set_index("GPU").loc[gpu]
    assert row["configuration"] == "does not run here: needs sm_90"
    assert pd.isna(row["CTAs/SM"]) and pd.isna(row["waves"]) and pd.isna(row["CTAs (mission)"])


def test_p10_runs_without_clusters_before_hopper_and_p07_not_on_the_t4():
    frame = widgets.phase_calculator("p10_splitkv").set_index("GPU")
    assert frame.loc["A100", "configuration"] == "p10, split over 1 CTA (no clusters before sm_90)"
    assert frame.loc["A100", "CTAs (mission)"] == 64          # one CTA per 64-row query tile
    assert frame.loc["L4", "smem KB"] == (64 * 128 + 4 * 32 * 128 + 64 * 72 * 4 + 2 * 64 * 4) / 1024   # BLOCK_N 32 on sm_89
    assert "does not run here" in frame.loc["T4", "configuration"]
    assert "does not run here" in widgets.phase_calculator("p07_registers").set_index("GPU").loc["T4", "configuration"]


def test_a_fixed_persistent_grid_launches_that_many_ctas():
    h100 = budget.GPUS["H100"]
    grid = budget.grid("p09_warpspec", BIG, {"PERSISTENT_CTAS": 3}, h100)
    occ = budget.occupancy(h100, 384, 168, 115800)
    items = -(-BIG.seqlen_q // 128) * BIG.heads * BIG.batch   # 128-row query tiles (two consumers)
    assert grid.ctas(h100, occ) == 3 and grid.waves(h100, occ) == pytest.approx(items / 3)
    assert budget.grid("p09_warpspec", BIG, {"PERSISTENT": 0}, h100).ctas(h100, occ) == items == 1024


def test_the_general_calculator_gives_chapter_5s_numbers():
    params = {"BLOCK_M": 64, "BLOCK_N": 64, "NUM_WARPS": 8}
    old = widgets.calculator("p05_tile64", params, registers=126).set_index("GPU")
    new = widgets.phase_calculator("p05_tile64", params=params, registers=126).set_index("GPU")
    for column in ("smem KB", "fits", "CTAs/SM", "occupancy %", "limiter", "CTAs (mission)", "waves"):
        assert list(new[column]) == list(old[column])
