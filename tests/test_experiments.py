"""Recorded experiments (chapter 4's precision experiment, chapter 5's tile sweep) and the CPU model."""
import pandas as pd
import pytest
import torch

from flashcore_nb import budget, env, experiments, results, sanitize, shapes, simulate, tables
from flashcore_nb.env import GpuInfo
from flashcore_nb.phases import PHASES
from flashcore_nb.shapes import MISSION

RECORDS = experiments.all_records()


def test_the_book_gpu_has_every_experiment():
    names = {record["experiment"] for _, record in RECORDS}
    assert {"p04_precision", "p05_tile64_sweep", "p06_async_sweep", "p06_sanitizer", "p07_registers_ablations",
            "p07_registers_profile", "p07_registers_key_split", "p08_wgmma_ablations", "p09_warpspec_explorations",
            "cluster_occupancy", "peaks", "fa2_drift"} <= names


@pytest.mark.parametrize("path,record", RECORDS, ids=[p.name for p, _ in RECORDS])
def test_experiment_records_are_current_and_complete(path, record):
    assert path == results.experiment_path(record["experiment"], results.env.gpu_slug(record["env"]["gpu"]),
                                        path.parents[2])
    assert len(record["commit"]) == 40 and results.REQUIRED_ENV <= set(record["env"])
    assert experiments.stale_builds(record) == [], f"{path}: re-record it, the kernel changed"
    assert record["rows"]


def test_precision_record_supports_one_hypothesis():
    rows = experiments.load("p04_precision")["rows"]
    by_variant = {label: [r for r in rows if r["variant"] == label] for label in experiments.PRECISION_VARIANTS}
    assert all(r["passed"] for r in by_variant["FP16 P"] + by_variant["FP32 P"])
    mission_bug = [r["max_abs_err"] for r in by_variant["padding bug (teaching)"] if r["case"] == "mission"]
    assert mission_bug and all(0.3 <= e <= 0.7 for e in mission_bug)


@pytest.mark.parametrize("phase_name", list(experiments.SWEEP_GRIDS))
def test_sweep_record_covers_the_grid(phase_name):
    record = experiments.load(experiments.sweep_name(phase_name))
    grid = experiments.SWEEP_GRIDS[phase_name]
    assert [{k: r[k] for k in grid} for r in record["rows"]] == experiments.grid_configs(phase_name)
    for row in record["rows"]:
        if row["status"] == "ok":
            assert row["mission_us"] > 0 and row["b4h16_s2048_us"] > 0
        else:
            assert row["status"] == "does not compile" and "NUM_WARPS" in row["message"]
    assert record["sdpa"]["sdpa_mission_us"] > 0


def test_a_changed_kernel_makes_an_experiment_stale(kernels_copy):
    record = experiments.load("p04_precision")
    assert experiments.stale_builds(record) == []
    source = kernels_copy / "p04_fp32p.cu"
    source.write_text(source.read_text() + "\n// an edit\n")
    assert sorted(experiments.stale_builds(record)) == sorted(experiments.PRECISION_VARIANTS)
    assert "STALE" in experiments.provenance(record)


def test_wrong_stride_pad_mask_hits_real_rows():
    mask = simulate.wrong_stride_pad_mask(32, 64)   # pitch 72: zeroes from flat index 2048 = row 28, col 32
    assert not mask[:28].any() and not mask[28, :32].any() and mask[28, 32:].all() and mask[29:].all()
    one_row = simulate.wrong_stride_pad_mask(1, 64)          # S = 1: only rows past the data are hit
    assert not one_row[0].any() and one_row[1:].all()
    assert mask.shape == (32, 64)


def test_model_reproduces_both_outcomes():
    table = simulate.precision_table([MISSION], seeds=(0,))
    err = dict(zip(table.variant, table.max_abs_err))
    assert err["FP16 P"] < 5e-4 and err["FP32 P"] < 5e-4
    assert 0.3 <= err["padding bug (teaching)"] <= 0.7


def test_model_without_bug_matches_exact_attention_on_ragged_lengths():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, s, 64, generator=gen).half() for s in (45, 70, 70))
    expected = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8, -1) @ v.double()
    out = simulate.tiled_attention(q, k, v, p_fp32=True)
    assert out.shape == q.shape and (out.double() - expected).abs().max() < 2e-3


def test_sanitizer_record_finds_the_planted_bug_and_clears_the_kernel():
    record = experiments.load("p06_sanitizer")
    planted, *clean = record["rows"]
    assert planted["target"] == sanitize.PLANTED and planted["returncode"] != 0
    assert "Invalid __shared__ write of size 16 bytes" in planted["report"]
    assert "unspecified launch failure" in planted["report"]
    assert {run["tool"] for run in clean} == {"memcheck", "racecheck", "synccheck"}
    for run in clean:
        assert run["returncode"] == 0 and run["target"] == "p06_async"
        assert "ERROR SUMMARY: 0 errors" in run["report"] or "RACECHECK SUMMARY: 0 hazards" in run["report"]


def test_a_page_shows_the_report_without_compile_progress_and_with_the_exception():
    planted = experiments.load("p06_sanitizer")["rows"][0]
    shown = sanitize.shown_report(planted["report"])
    assert "compiling p06_async" in planted["report"] and "compiling" not in shown
    assert "Traceback" not in shown and "File " not in shown
    assert shown.index("ERROR SUMMARY: 66 errors") < shown.index("CUDA error: unspecified launch failure")
    assert "Invalid __shared__ write of size 16 bytes" in shown


def test_sanitizer_targets_parse():
    assert sanitize.parse_target("p06_async") == ("p06_async", {})
    assert sanitize.parse_target("p05_tile64:BLOCK_M=32,NUM_WARPS=16") == ("p05_tile64", {"BLOCK_M": 32, "NUM_WARPS": 16})
    for target in ("p06_async", "p05_tile64:BLOCK_M=32,NUM_WARPS=16"):
        assert sanitize.format_target(*sanitize.parse_target(target)) == target
    assert sanitize.command("racecheck", ["p06_async"])[:2] == ["compute-sanitizer", "--tool=racecheck"]


def test_sanitizer_targets_are_those_this_gpu_can_hold(monkeypatch):
    l4 = GpuInfo("NVIDIA L4", 89, 58, budget.GPUS["L4"].smem_per_block_optin, 24 << 30, "any")
    monkeypatch.setattr(env, "gpu", lambda index=None: l4)
    targets = sanitize.default_targets()
    assert [t for t in targets if ":" not in t] == [name for name, p in PHASES.items() if p.runs_on(89)]
    assert "p06_async:STAGES=1" in targets
    # 168 KB at D = 128 with the L4's p05 defaults, 99 KB allowed
    assert "p05_tile64:BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4" not in targets


def test_racecheck_leaves_out_only_the_cluster_handoff_builds(monkeypatch):
    h100 = GpuInfo("NVIDIA H100 80GB HBM3", 90, 132, budget.GPUS["H100"].smem_per_block_optin, 80 << 30, "any")
    monkeypatch.setattr(env, "gpu", lambda index=None: h100)
    everywhere, racecheck = sanitize.default_targets("memcheck"), sanitize.default_targets("racecheck")
    left_out = [t for t in everywhere if t not in racecheck]
    assert set(racecheck) <= set(everywhere) and "p10_splitkv" in racecheck and "p09_warpspec" in racecheck
    assert left_out and all(sanitize.parse_target(t)[1].get("CLUSTER_KEYS", 1) > 1 for t in left_out)
    assert everywhere == sanitize.default_targets()


@pytest.mark.parametrize("phase_name", list(experiments.ABLATIONS))
def test_ablation_record_covers_every_variant(phase_name):
    record = experiments.load(f"{phase_name}_ablations")
    assert [row["variant"] for row in record["rows"]] == list(experiments.ABLATIONS[phase_name])
    assert all(row["status"] == "ok" for row in record["rows"])
    cases = [c.name for c in shapes.TIMING]
    table = tables.ablation(pd.DataFrame(record["rows"]), cases)
    # the defaults timed against themselves in the same rounds: 1 up to the noise of the method
    for case in cases:
        ratio = table[f"{case} vs defaults"].iloc[0]
        assert abs(ratio - 1.0) < 0.05, (case, ratio)
    # the phase's own ablation cases are in no phase record: the Triton peer is timed beside every variant there
    for row in record["rows"]:
        for case in experiments.PHASES[phase_name].ablation_cases:
            assert row[f"{case}_triton_us"] > 0 and row[f"{case}_vs_triton"] > 0, (row["variant"], case)


def test_key_split_record_supports_chapter_7():
    """Every small problem, both paths and the defaults; the defaults take the path their threshold names, and
    the record says what chapter 7 reads from it: the split wins while the large-tile grid fills at most a
    quarter of the SMs, loses from 70% on (where the old rule, below the SM count, still took it), and loses at
    8x8x128x64, just under the threshold."""
    import matplotlib.pyplot as plt

    from flashcore_nb import plots
    rows, line = experiments.key_split_runs()
    assert "NVIDIA H100" in line and "STALE" not in line
    assert list(rows["case"]) == [case.name for case in shapes.SMALL]
    assert (rows["threshold_ctas"] == rows["sms"] * PHASES["p07_registers"].tile_params["SMALL_PROBLEM_FILL"] // 100).all()
    chosen = rows["key split_us"].where(rows["defaults take"] == "key split", rows["large tiles_us"])
    assert ((rows["defaults_us"] / chosen - 1).abs() < 0.02).all()
    assert (rows.loc[rows["fill"] <= 0.25, "split_over_large"] < 1).all()
    assert (rows.loc[rows["fill"] >= 0.7, "split_over_large"] > 1).all()
    short_keys = rows.set_index("case").loc["b8h8_s128"]
    assert short_keys["defaults take"] == "key split" and short_keys["split_over_large"] > 1
    table = tables.key_split(rows)
    assert len(table) == len(rows) and table["CTAs"].is_monotonic_increasing
    figure = plots.key_split(rows, line)
    assert len(figure.axes[0].collections) == rows.groupby(["seqlen", "head_dim", "causal"]).ngroups
    plt.close(figure)


def test_fa2_drift_record_supports_the_methodology_page():
    """Paired FA2/cuDNN ratios stay within a few percent across every condition, while times and the
    SM clock move (the page's reading); one-at-a-time, the only unpaired condition, is there too."""
    from flashcore_nb import drift
    table, line = drift.table()
    assert "NVIDIA H100" in line and "STALE" not in line
    assert {c.split(" +")[0] for c in table["condition"]} == set(drift.conditions())
    paired = table[table["paired"]]
    for case, ratios in paired.groupby("case")["FA2 / cuDNN"]:
        assert ratios.max() / ratios.min() < 1.1, case
    assert (paired["SM MHz after"] < paired["SM MHz before"]).mean() > 0.5


# --- chapter 7's rungs: the registry, the pairing, and a synthetic record --------------------------------

H100 = GpuInfo("NVIDIA H100 80GB HBM3", 90, 132, 232448, 80 << 30, "test")


@pytest.mark.parametrize("phase_name", list(experiments.RUNGS))
def test_rungs_are_cumulative_and_end_at_the_defaults(phase_name):
    phase = PHASES[phase_name]
    rungs = list(experiments.RUNGS[phase_name].values())
    first = rungs[0]
    assert set(first) <= set(phase.tile_params) and all(first[k] != phase.tile_params[k] for k in first)
    for before, after in zip(rungs, rungs[1:]):
        # each rung gives some of the first rung's switches back to the defaults, and keeps the others
        assert after.items() < before.items(), (before, after)
    assert rungs[-1] == {}


def _fake_sweep(monkeypatch):
    """run_sweep with nothing compiled or timed: each configuration's references as the row records them."""
    from flashcore_nb import binding
    monkeypatch.setattr(env, "gpu", lambda index=None: H100)
    monkeypatch.setattr(experiments, "prebuild_all", lambda phase_name, configs, cc: {})
    monkeypatch.setattr(binding, "load", lambda phase_name, **defines: dict(defines))

    def config(phase_name, params, check_cases, timing_cases, references, peer_cases=()):
        return {**params, "status": "ok", "references": references, "peer_cases": peer_cases,
                **{f"{case.name}_sdpa_us": 1.0 for case in timing_cases}}
    monkeypatch.setattr(experiments, "run_sweep_config", config)


def test_each_rung_is_timed_against_the_defaults_and_the_rung_before(monkeypatch):
    _fake_sweep(monkeypatch)
    configs = list(experiments.RUNGS["p07_registers"].values())
    rows, _ = experiments.run_sweep("p07_registers", configs, progress=lambda line: None, against_defaults=True,
                                    against_previous=True)
    assert rows[0]["references"] == {"defaults": {}}
    for previous, row in zip(configs, rows[1:]):
        assert row["references"] == {"defaults": {}, "previous": previous}
    ablations, _ = experiments.run_sweep("p07_registers", configs, progress=lambda line: None, against_defaults=True,
                                         peer_names=("mission",))
    assert all(row["references"] == {"defaults": {}} and row["peer_cases"] == ("mission",) for row in ablations)
    assert all(row["peer_cases"] == () for row in rows)


def synthetic_rung_rows() -> list[dict]:
    """Rows as record_variants writes them for the rungs, with made-up times: each rung 1.6x faster than the
    one before, in every case."""
    variants = experiments.RUNGS["p07_registers"]
    rows = []
    for i, (label, defines) in enumerate(variants.items()):
        row = {**defines, "variant": label, "status": "ok", "message": "", "registers": 160 + 15 * i,
               "spill_bytes": 8 if i >= 3 else 0}
        for case in shapes.TIMING:
            slower, sdpa = 1.6 ** (len(variants) - 1 - i), case.flops() / 1.2e8
            us = case.flops() / 1e8 * slower
            row.update({f"{case.name}_us": us, f"{case.name}_spread_us": [0.98 * us, 1.03 * us],
                        f"{case.name}_sdpa_us": sdpa, f"{case.name}_vs_sdpa": us / sdpa,
                        f"{case.name}_vs_defaults": slower, f"{case.name}_sm_clock_mhz": [1980.0, 1980.0]})
            if i:
                row[f"{case.name}_vs_previous"] = 1 / 1.6
        rows.append(row)
    return rows


def synthetic_rungs_record() -> dict:
    record = experiments.make_record(experiments.variants_name("p07_registers", "rung"), "p07_registers",
                                     experiments.RUNGS["p07_registers"], synthetic_rung_rows())
    record["env"] = {**results.load("p07_registers")["env"]}   # as recorded on the book's GPU
    record["sdpa"] = {}
    return record


def test_a_rungs_record_is_written_loaded_and_goes_stale(tmp_path, kernels_copy):
    record = synthetic_rungs_record()
    path = results.write(record, root=tmp_path)
    assert path == results.experiment_path("p07_registers_rungs", results.DEFAULT_GPU, tmp_path)
    assert experiments.load_rungs("p07_registers", root=tmp_path)["rows"] == record["rows"]
    assert experiments.load_rungs("p07_registers", root=tmp_path / "nowhere") is None
    assert "python -m flashcore_nb rungs --phase p07_registers" in experiments.rungs_missing_message("p07_registers")
    assert experiments.stale_builds(record) == []
    source = kernels_copy / "p07_registers.cu"
    source.write_text(source.read_text() + "\n// an edit\n")
    assert experiments.stale_builds(record) == list(experiments.RUNGS["p07_registers"])


def test_the_rungs_frame_tables_and_figure_read_a_record():
    import matplotlib.pyplot as plt

    from flashcore_nb import display, plots
    record = synthetic_rungs_record()
    frame = experiments.rung_frame(record)
    rungs, cases = len(experiments.RUNGS["p07_registers"]), [case.name for case in shapes.TIMING]
    assert len(frame) == rungs * len(cases) and list(frame["case"].unique()) == cases
    assert frame.loc[frame["rung"] == 1, "speedup"].isna().all()
    assert (frame.loc[frame["rung"] > 1, "speedup"] - 1.6).abs().max() < 1e-9
    summary = tables.rungs(frame)
    assert list(summary["rung"]) == list(range(1, rungs + 1))
    assert list(summary["adds"]) == list(experiments.RUNGS["p07_registers"])
    assert [f"{case} µs" for case in cases] == list(summary.columns[-len(cases):])
    assert "speed-up over rung 0" not in tables.rung(frame, 1).columns
    last = tables.rung(frame, rungs)
    assert list(last["case"]) == cases and (last["time / defaults"] == 1.0).all()
    assert f"speed-up over rung {rungs - 1}" in last.columns
    assert "Rung 2: + swizzled shared memory" in display.rung(frame, 2).data
    assert "not measured on this GPU yet" in display.rung(None, 2).data
    figure = plots.rungs(frame, experiments.provenance(record))
    assert sum(ax.get_visible() for ax in figure.axes) == len(cases)
    plt.close(figure)
