"""The tile explorer and its calculator, in replay mode (no GPU)."""
import pytest

from flashcore_nb import binding, budget, env, experiments, widgets
from flashcore_nb.env import GpuInfo


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
    assert not occ.fits and budget.waves(budget.GPUS["T4"], occ, 32) == float("inf")


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
