"""The results chapter's machinery: every phase side by side, the roofline, the measured peaks, and the
README's headline and figure, which must match the records."""
import copy
import json
import shutil

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from PIL import Image

from flashcore_nb import experiments, peaks, plots, results, roofline, shapes, tables
from flashcore_nb.paths import README_FIGURE, ROOT
from flashcore_nb.shapes import MISSION, Case

RECORDS, MISSING = results.recorded_phases()
FRAME = results.timing_frame(RECORDS)
SYNTHETIC_PEAKS = peaks.Peaks(matmul_tflops={"float16": 800.0, "bfloat16": 810.0}, bandwidth_gb_s=3200.0,
                              provenance="synthetic peaks, for the test")


def test_minimum_traffic_and_intensity_of_known_cases():
    # mission: Q, K, V, O of 1*8*512*64 fp16 values each; 4*8*512*512*64 FLOPs
    assert roofline.min_hbm_bytes(MISSION) == 4 * 8 * 512 * 64 * 2
    assert roofline.intensity(MISSION) == 256.0                      # S / 2
    assert roofline.intensity(Case("c", 1, 8, 512, 64, causal=True)) == 128.0
    assert roofline.intensity(Case("d", 2, 16, 4096, 128)) == 2048.0   # D cancels
    # Sq != Sk: 4*100*300*64 FLOPs over (2*100 + 2*300)*64*2 bytes
    assert roofline.intensity(Case("x", 1, 1, 100, 64, seqlen_k=300)) == pytest.approx(75.0)


def test_roofline_ceilings():
    assert roofline.attainable_tflops(100.0, 800.0, 3000.0) == pytest.approx(300.0)   # memory bound
    assert roofline.attainable_tflops(1000.0, 800.0, 3000.0) == 800.0                 # compute bound
    assert roofline.ridge(800.0, 3200.0) == pytest.approx(250.0)
    table = tables.intensity([MISSION, shapes.TIMING[1]], SYNTHETIC_PEAKS)
    assert list(table["bound by"]) == ["compute", "memory"]


def test_every_recorded_phase_at_every_timed_case():
    assert list(RECORDS) and not MISSING
    speed = tables.phases_speed(FRAME)
    assert len(speed) == len(RECORDS) * len(shapes.TIMING)
    row = speed.loc[("mission", "p01_baseline")]
    run = next(r for r in RECORDS["p01_baseline"]["runs"] if r["case"] == "mission" and r["gpu_us"] is not None)
    assert row["phase / default"] == run["baselines"]["sdpa_default"]["time_ratio"]   # paired, not µs / µs
    steps = tables.phase_steps(FRAME)
    first, second = list(RECORDS)[:2]
    assert steps.loc[first].isna().all()
    by_run = FRAME.set_index(["phase", "case"])["sdpa_default_ratio"]   # through SDPA default, timed in both
    assert steps.loc[second, "mission"] == pytest.approx(by_run[(first, "mission")] / by_run[(second, "mission")])
    throughput = tables.phases_throughput(FRAME)
    assert throughput.index[-1].startswith("SDPA default") and len(throughput) == len(RECORDS) + 1
    assert (throughput["% of matmul peak"] < 100).all().all()


def test_correctness_summary():
    summary = tables.phases_correctness(RECORDS)
    assert list(summary["phase"]) == list(RECORDS)
    assert summary["all passed"].all() and (summary["unwritten"] == 0).all()
    p01 = tables.correctness(pd.DataFrame(RECORDS["p01_baseline"]["runs"]))
    assert summary.loc[0, "worst err / sdpa err"] == p01["err / sdpa err"].max()
    assert summary.loc[0, "checks"] == len(p01)


def test_phases_without_a_record_are_left_out_and_named(tmp_path):
    gpu = tmp_path / results.DEFAULT_GPU
    gpu.mkdir()
    for name in ("p01_baseline", "p02_vectorized"):
        shutil.copy(results.path_for(name, results.DEFAULT_GPU), gpu)
    records, missing = results.recorded_phases(root=tmp_path)
    assert list(records) == ["p01_baseline", "p02_vectorized"]
    assert "p03_wmma" in missing and "p01_baseline" not in missing
    assert "p02_vectorized" in results.headline(root=tmp_path)


def test_headline_names_the_fastest_phase_at_the_mission_shape():
    mission = FRAME[FRAME["case"] == "mission"]
    best = mission.loc[mission["gpu_us"].idxmin()]
    line = results.headline()
    assert f"{best['phase']}, {best['gpu_us']:.1f} µs" in line
    assert f"{best['gpu_us'] / best['sdpa_default_us']:.2f}×" in line


def test_readme_headline_matches_the_records():
    assert results.headline() in (ROOT / "README.md").read_text(), \
        "README's headline is out of date: paste results.headline() into it"


def test_readme_table_matches_the_records():
    table = results.readme_table()
    assert table.count("\n") == len(RECORDS) + 1 and "p07_registers" in table
    assert table in (ROOT / "README.md").read_text(), \
        "README's phase table is out of date: paste results.readme_table() into it"


def test_versus_phase_steps_through_sdpa_default():
    first, second = list(RECORDS)[:2]
    table = tables.versus_phase(first, second).set_index("case")
    steps = tables.phase_steps(FRAME)
    assert list(table.index) == list(steps.columns)
    assert table["step (× faster)"].to_numpy() == pytest.approx(steps.loc[second].to_numpy())


def test_readme_figure_matches_the_records():
    assert "book/_static/ladder.png" in (ROOT / "README.md").read_text()
    assert Image.open(README_FIGURE).text["Source"] == results.digest(RECORDS), \
        "the README figure is older than the records: run `python -m flashcore_nb figures`"


def test_digest_changes_with_the_records():
    changed = copy.deepcopy(RECORDS)
    changed["p01_baseline"]["runs"][0]["gpu_us"] += 1.0
    assert results.digest(changed) != results.digest(RECORDS)


def test_figures():
    ladder = plots.ladder("mission", backends=("sdpa_default", "sdpa_flash"))
    assert len(ladder.axes[0].lines) == 2 and len(ladder.axes[0].patches) == len(RECORDS)
    cases = ["mission", "b4h16_s2048"]
    assert len(plots.ladders(cases).axes) == len(cases)
    figure = plots.roofline(FRAME, SYNTHETIC_PEAKS)
    ax = figure.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    roof = ax.lines[0].get_ydata()
    assert max(roof) == pytest.approx(800.0) and min(roof) < 800.0
    # one point per phase and case, and SDPA default's at each case
    assert len(ax.collections) == len(FRAME) + len(shapes.TIMING)
    plt.close("all")


def test_missing_peaks_are_said_not_invented(tmp_path):
    assert peaks.load(root=tmp_path) is None
    assert "python -m flashcore_nb peaks" in peaks.missing_message()


def test_a_peaks_record_loads_and_never_goes_stale(tmp_path, kernels_copy):
    rows = [{"measure": "matmul", "dtype": "float16", "n": 8192, "tflops": 700.0, "tflops_all": [700.0]},
            {"measure": "matmul", "dtype": "bfloat16", "n": 8192, "tflops": 710.0, "tflops_all": [710.0]},
            {"measure": "copy", "bytes_each_way": 1 << 30, "gb_s": 3000.0, "gb_s_all": [3000.0]}]
    record = experiments.make_record(peaks.NAME, None, {}, rows)
    record["env"] = results.load("p01_baseline")["env"]   # as recorded on the book's GPU
    path = results.write(record, root=tmp_path)
    assert path == results.experiment_path("peaks", results.DEFAULT_GPU, tmp_path)
    loaded = peaks.load(root=tmp_path)
    assert loaded.matmul_tflops == {"float16": 700.0, "bfloat16": 710.0} and loaded.bandwidth_gb_s == 3000.0
    header = kernels_copy / "common" / "numeric.cuh"
    header.write_text(header.read_text() + "\n// an edit\n")   # kernels change; the GPU's peaks do not
    assert experiments.stale_builds(json.loads(path.read_text())) == []
    assert "STALE" not in peaks.load(root=tmp_path).provenance
