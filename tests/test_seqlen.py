"""Where each kernel wins (issue 15 §3) on the CPU: the sweep's cases, the phases it measures, and the frame, tables
and figure of a synthetic record built as seqlen.record writes it."""
import math

import matplotlib.pyplot as plt
import pytest

from flashcore_nb import env, experiments, plots, results, seqlen, shapes, tables
from flashcore_nb.phases import PHASES

PHASE_NAMES = ["p06_async", "p07_registers", "p08_wgmma", "p10_splitkv"]
H100 = env.GpuInfo("NVIDIA H100 80GB HBM3", 90, 132, 232448, 80 << 30, "test")
L4 = env.GpuInfo("NVIDIA L4", 89, 58, 101376, 24 << 30, "test")


# --- the sweep's definition ----------------------------------------------------------------------------------

def test_the_sweep_is_the_issue_sweep():
    cases = shapes.SEQLEN_SWEEP
    assert shapes.SEQLEN_SEQLENS == (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    assert len(cases) == 8 * 2 * 2 and len({c.name for c in cases}) == len(cases)
    assert {(c.seqlen_q, c.head_dim, c.causal) for c in cases} == {
        (s, d, causal) for s in shapes.SEQLEN_SEQLENS for d in (64, 128) for causal in (False, True)}
    assert {c.batch * c.heads for c in cases} == {16}                    # B·H fixed
    assert all(c.seqlen_k is None and c.magnitude == 1.0 for c in cases)
    # bounded: the largest call is 2.2 TFLOP, the whole sweep under 10 TFLOP per method
    assert max(c.flops() for c in cases) == pytest.approx(4 * 16 * 16384 ** 2 * 128)
    assert sum(c.flops() for c in cases) < 1e13
    assert shapes.select(None, "seqlen") == cases
    assert shapes.select("b1h16_s16384_d128_causal")[0].seqlen_q == 16384
    # a name shared with the grid is the same problem
    grid = {c.name: c for c in shapes.GRID}
    assert all(grid[c.name] == c for c in cases if c.name in grid)


def test_the_phases_swept_are_p06_and_every_later_one():
    swept = seqlen.phases_swept()
    assert swept[0] == "p06_async" and swept == list(PHASES)[list(PHASES).index("p06_async"):]
    assert {name for name, phase in PHASES.items() if phase.dispatch} <= set(swept)


def test_a_phase_is_skipped_by_the_dispatchers_checks():
    case = shapes.select("b1h16_s1024_d128")[0]
    assert all(seqlen.skip_reason(name, case, H100) is None for name in seqlen.phases_swept())
    assert "sm_90" in seqlen.skip_reason("p08_wgmma", case, L4)   # wgmma: Hopper only
    # the L4 holds p06's D = 128 tiles with its own defaults, as the dispatcher says
    from flashcore_nb import dispatch, tuning
    for name in seqlen.phases_swept():
        runs = dispatch.can_run(name, tuning.Problem.of_case(case), L4)
        assert (seqlen.skip_reason(name, case, L4) is None) == runs


# --- a synthetic record -------------------------------------------------------------------------------------

def _timing(us: float, flops: float, spread: float = 0.1) -> dict:
    rounds = [us * (1 - spread), us, us * (1 + spread)]
    return {"gpu_us": us, "gpu_us_min": min(rounds), "gpu_us_max": max(rounds), "gpu_us_rounds": rounds,
            "call_us": us + 10, "call_us_rounds": [us + 10] * 3, "tflops": flops / (us * 1e-6) / 1e12}


def synthetic_rows() -> list[dict]:
    """Rows as seqlen.measure writes them, with made-up rates: cuDNN saturates at 600 TFLOP/s from S = 4k; p10 is
    the fastest below 1k, p08 from 1k, p06 always slowest; p07 fails its check at 16k, D = 128, causal; p08 does
    not run D = 64 causal (as if it could not)."""
    rows = []
    for case in shapes.SEQLEN_SWEEP:
        s, flops = case.seqlen_q, case.flops()
        fill = min(1.0, s / 4096)
        rates = {"sdpa_default": 600 * fill, "sdpa_cudnn": 600 * fill, "sdpa_flash": 300 * fill,
                 "triton": 450 * fill, "p06_async": 60 * fill,
                 "p07_registers": 320 * fill if s >= 1024 else 700 * fill,
                 "p08_wgmma": 400 * fill if s >= 1024 else 500 * fill,
                 "p10_splitkv": 250 * fill if s >= 1024 else 800 * fill}
        if case.head_dim == 64 and case.causal:
            del rates["p08_wgmma"]
        timings = {m: _timing(flops / (rate * 1e12) * 1e6, flops) for m, rate in rates.items()}
        checks = {m: {"max_abs_err": 1e-4, "sdpa_max_abs_err": 1e-4, "unwritten": 0, "passed": True}
                  for m in rates if m.startswith("p")}
        if s == 16384 and case.head_dim == 128 and case.causal:
            checks["p07_registers"] = {"max_abs_err": 1.0, "sdpa_max_abs_err": 1e-4, "unwritten": 0, "passed": False}
        rows.append({"case": case.name, "shape": case.label(), "batch": case.batch, "heads": case.heads, "seqlen": s,
                     "head_dim": case.head_dim, "causal": case.causal, "dtype": "float16", "flops": flops,
                     "sdpa_default_backend": "sdpa_cudnn",
                     "skipped": {} if "p08_wgmma" in rates else {"p08_wgmma": "as if it could not"},
                     "checks": checks, "timings": timings, "sm_clock_mhz": [1980.0, 1755.0]})
    return rows


def synthetic_record() -> dict:
    record = experiments.make_record(seqlen.NAME, None, {n: {} for n in PHASE_NAMES}, synthetic_rows(),
                                     build_phases={n: n for n in PHASE_NAMES})
    record["env"] = {**results.load("p07_registers")["env"]}   # as recorded on the book's GPU
    record.update(phases=PHASE_NAMES, baselines=list(seqlen.BASELINES), reference=seqlen.REFERENCE,
                  rounds=seqlen.ROUNDS, dtype="float16", complete=True,
                  gpu_info={"name": record["env"]["gpu"], "cc": 90, "sms": 132, "smem_per_block_optin": 232448,
                            "total_memory": 80 << 30, "driver": record["env"]["driver"]})
    return record


def test_a_record_is_written_loaded_and_goes_stale(tmp_path, kernels_copy):
    record = synthetic_record()
    path = results.write(record, root=tmp_path)
    assert path == results.experiment_path("seqlen_sweep", results.DEFAULT_GPU, tmp_path)
    assert seqlen.load(root=tmp_path)["rows"] == record["rows"]
    assert seqlen.load(root=tmp_path / "nowhere") is None
    assert "python -m flashcore_nb seqlen" in seqlen.missing_message()
    assert experiments.stale_builds(record) == []
    source = kernels_copy / "p06_async.cu"
    source.write_text(source.read_text() + "\n// an edit\n")
    assert experiments.stale_builds(record) == ["p06_async"] and "STALE" in experiments.provenance(record)


def test_frame_rates_spreads_and_paired_speeds():
    frame = seqlen.frame(synthetic_record())
    assert len(frame) == sum(len(row["timings"]) for row in synthetic_rows())
    row = frame[(frame["case"] == "b1h16_s4096") & (frame["method"] == "p08_wgmma")].iloc[0]
    assert row["tflops"] == pytest.approx(400.0) and row["is_phase"] and row["correct"] is True
    assert row["tflops_low"] == pytest.approx(400 / 1.1) and row["tflops_high"] == pytest.approx(400 / 0.9)
    assert row["speed_vs_reference"] == pytest.approx(400 / 600) and row["reference"] == "sdpa_cudnn"
    baseline = frame[(frame["case"] == "b1h16_s4096") & (frame["method"] == "triton")].iloc[0]
    assert baseline["correct"] is None and not baseline["is_phase"] and math.isnan(baseline["err_over_sdpa"])
    assert seqlen.one_wave_seqlen(synthetic_record()) == pytest.approx(128 * 132 / 16)
    mixed = synthetic_record()
    mixed["rows"][0]["batch"] = 2
    assert seqlen.one_wave_seqlen(mixed) is None
    assert seqlen.curve_methods(frame) == [*PHASE_NAMES, "sdpa_cudnn", "sdpa_flash", "triton"]


def test_reference_falls_back_to_sdpa_default_without_cudnn():
    record = synthetic_record()
    for row in record["rows"]:
        del row["timings"]["sdpa_cudnn"]
    frame = seqlen.frame(record)
    assert set(frame["reference"]) == {"sdpa_default"}
    assert seqlen.curve_methods(frame)[len(PHASE_NAMES)] == "sdpa_default"


def test_where_each_kernel_wins():
    wins = tables.seqlen_wins(seqlen.frame(synthetic_record())).set_index(["D", "mask"])
    assert list(wins.index) == [(64, "none"), (64, "causal"), (128, "none"), (128, "causal")]
    assert (wins["cuDNN ≥ 90% of its best from S"] == "4k").all()
    assert wins.loc[(64, "none"), "fastest phase"] == "p10_splitkv 128–512, p08_wgmma 1k–16k"
    assert wins.loc[(64, "causal"), "fastest phase"] == "p10_splitkv 128–512, p07_registers 1k–16k"   # no p08
    assert wins.loc[(64, "none"), "fastest of all"] == "p10_splitkv 128–512, cuDNN 1k–16k"
    assert wins.loc[(64, "none"), "p10_splitkv ≥ 100% of cuDNN at S"] == "128–512"
    assert wins.loc[(64, "none"), "p06_async ≥ 100% of cuDNN at S"] == "—"
    assert wins.loc[(64, "causal"), "p08_wgmma ≥ 100% of cuDNN at S"] == "does not run"
    # p07 fails its check at 16k (D = 128, causal): it neither leads nor counts there
    assert wins.loc[(128, "causal"), "fastest phase"] == "p10_splitkv 128–512, p08_wgmma 1k–16k"
    half = tables.seqlen_wins(seqlen.frame(synthetic_record()), share=0.5).set_index(["D", "mask"])
    assert half.loc[(128, "none"), "p07_registers ≥ 50% of cuDNN at S"] == "128–16k"
    assert half.loc[(128, "causal"), "p07_registers ≥ 50% of cuDNN at S"] == "128–8k"


def test_tflops_table_and_spans():
    table = tables.seqlen_tflops(seqlen.frame(synthetic_record()))
    assert len(table) == len(shapes.SEQLEN_SWEEP)
    row = table[(table["D"] == 64) & (table["mask"] == "none") & (table["S"] == 8192)].iloc[0]
    assert row["cuDNN"] == pytest.approx(600.0) and row["fastest phase"] == "p08_wgmma"
    assert row["its speed / cuDNN"] == pytest.approx(400 / 600) and row["fastest of all"] == "cuDNN"
    assert table[(table["D"] == 64) & (table["mask"] == "causal")]["p08_wgmma"].isna().all()
    assert tables._spans([128, 256, 512, 1024], [128, 256, 1024]) == "128–256, 1k"
    assert tables._spans([128, 256], []) == "—"


def test_the_curves():
    record = synthetic_record()
    frame = seqlen.frame(record)
    figure = plots.seqlen_curves(frame, "synthetic", one_wave=seqlen.one_wave_seqlen(record))
    panels = [ax for ax in figure.axes if ax.get_visible()]
    assert len(panels) == 4
    for ax in panels:
        assert ax.get_xscale() == "log" and ax.get_xaxis().get_scale() == "log"
        assert ax.get_yscale() == "log"   # short and long sequences both readable
        low, _ = ax.get_ylim()
        assert 0 < low < min(line.get_ydata().min() for line in ax.lines if not line.get_label().startswith("_"))
        assert list(ax.get_xticks()) == list(shapes.SEQLEN_SEQLENS)
    assert [t.get_text() for t in panels[-1].get_xticklabels()] == ["128", "256", "512", "1k", "2k", "4k", "8k", "16k"]
    lines = {ax.get_title(): [l.get_label() for l in ax.lines if not l.get_label().startswith("_")] for ax in panels}
    assert lines["D = 64, no mask"] == [*PHASE_NAMES, "cuDNN", "FA2 (SDPA flash)", "Triton peer"]
    assert "p08_wgmma" not in lines["D = 64, causal"]
    # the failed check is marked, once: p07 at 16k, D = 128, causal
    failed = frame[frame["correct"].map(lambda c: c is False)].iloc[0]
    marked = [tuple(xy) for ax in panels for c in ax.collections for xy in c.get_offsets().tolist()
              if not isinstance(c, plt.matplotlib.collections.PolyCollection)]
    assert marked.count((16384.0, pytest.approx(failed["tflops"]))) == 1
    plt.close("all")


# --- the record, once made on the H100 ---------------------------------------------------------------------

RECORDED = seqlen.load()


@pytest.mark.skipif(RECORDED is None, reason="not recorded yet: `python -m flashcore_nb seqlen` on the H100")
def test_the_recorded_sweep_covers_every_case_and_phase_and_every_check_passes():
    assert RECORDED["complete"] and [row["case"] for row in RECORDED["rows"]] == [c.name for c in shapes.SEQLEN_SWEEP]
    gpu = env.GpuInfo(**RECORDED["gpu_info"])
    assert RECORDED["phases"] == [name for name in seqlen.phases_swept() if PHASES[name].runs_on(gpu.cc)]
    for row, case in zip(RECORDED["rows"], shapes.SEQLEN_SWEEP):
        ran = [name for name in RECORDED["phases"] if seqlen.skip_reason(name, case, gpu) is None]
        assert set(row["checks"]) == set(ran), case.name
        assert all(check["passed"] and check["unwritten"] == 0 for check in row["checks"].values()), case.name
        assert set(ran) | {"sdpa_default", "sdpa_flash"} <= set(row["timings"]), case.name
    assert experiments.stale_builds(RECORDED) == []
