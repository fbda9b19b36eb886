"""Each phase's Nsight Compute profile: the cases, the ncu command, parsing its raw CSV page, the recorded
counters, the "What limits it now" table, and the CLI verb."""
import csv
import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from flashcore_nb import cli, experiments, profile, sanitize, shapes, tables
from flashcore_nb.phases import PHASES

FIXTURE = Path(__file__).parent / "data" / "ncu_raw_page.csv"   # trimmed from a real H100 run
# the counters of the first records (chapter 7's), which the fixture holds
FIRST_COUNTERS = {key: profile.COUNTERS[key]
                  for key in ("duration_ns", "registers", "tensor_pipe_pct", "issue_busy_pct", "warps_per_scheduler",
                              "eligible_per_scheduler", "cycles_per_issue")}
TIMING = {case.name: case for case in shapes.TIMING}


def raw_page(kernels: list[dict]) -> str:
    """ncu's raw page for several kernels, as `--csv --page raw` prints it (metric -> value per kernel)."""
    names = list(kernels[0])
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(["ID", "Kernel Name", *names])
    writer.writerow(["", "", *("" for _ in names)])
    for i, values in enumerate(kernels):
        writer.writerow([str(i), "void attention_wgmma_kernel<__half, 64>(FlashParams)", *values.values()])
    return "==PROF== Connected to process 7\n" + out.getvalue() + "==PROF== Disconnected from process 7\n"


def kernel(**overrides) -> dict:
    metrics = {metric: "1" for metric in profile.COUNTERS.values()}
    metrics.update({
        profile.COUNTERS["registers"]: "168", profile.COUNTERS["duration_ns"]: "1,234,560",
        profile.COUNTERS["achieved_occupancy_pct"]: "24.5", profile.COUNTERS["tensor_pipe_pct"]: "61.2",
        profile.COUNTERS["smem_ld_conflicts"]: "1,000", profile.COUNTERS["smem_st_conflicts"]: "500",
        profile.COUNTERS["smem_ld_wavefronts"]: "9,000", profile.COUNTERS["smem_st_wavefronts"]: "1,000",
        "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio": "2.5",
        "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio": "1",
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "0.75",
        "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio": "0",
    })
    metrics.update(overrides)
    return metrics


# --- parsing ------------------------------------------------------------------------------------------

def test_parse_reads_the_first_counters_and_the_nonzero_stalls():
    [row] = profile.parse(FIXTURE.read_text(), FIRST_COUNTERS)
    assert row["duration_ns"] == 69056 and row["registers"] == 243
    assert row["tensor_pipe_pct"] == pytest.approx(42.01) and row["issue_busy_pct"] == pytest.approx(42.08)
    assert row["warps_per_scheduler"] == pytest.approx(1.93) and row["cycles_per_issue"] == pytest.approx(4.59)
    assert row["stalls"] == {"wait": pytest.approx(1.71), "selected": pytest.approx(1.0)}   # gmma's 0 left out


def test_parse_reads_one_row_per_kernel_with_the_new_counters():
    text = raw_page([kernel(), kernel(**{profile.COUNTERS["registers"]: "255"})])
    first, second = profile.parse(text)
    assert first["duration_ns"] == 1234560 and first["achieved_occupancy_pct"] == pytest.approx(24.5)
    assert first["tensor_pipe_pct"] == pytest.approx(61.2) and first["smem_st_wavefronts"] == 1000
    assert first["stalls"] == {"gmma": 2.5, "selected": 1.0, "barrier": 0.75}
    assert second["registers"] == 255


def test_parse_refuses_output_without_the_table_or_a_counter():
    with pytest.raises(ValueError, match="no CSV table"):
        profile.parse("==PROF== Disconnected from process 1\n")
    without_conflicts = kernel()
    del without_conflicts[profile.COUNTERS["smem_ld_conflicts"]]
    with pytest.raises(ValueError, match="bank_conflicts"):
        profile.parse(raw_page([without_conflicts]))
    # the Hopper counter is asked of a Hopper report only
    assert profile.parse(raw_page([without_conflicts]), {"registers": profile.COUNTERS["registers"]})


# --- cases and command --------------------------------------------------------------------------------

def test_every_phase_profiles_a_large_problem_at_each_head_dim():
    for name, phase in PHASES.items():
        cases = [TIMING[case] for case in phase.profile_cases]   # KeyError: not a timing case
        assert len(set(phase.profile_cases)) == len(cases), name
        large = [case for case in cases if case.batch * case.heads * case.seqlen_q >= 4 * 16 * 2048]
        assert {case.head_dim for case in large} == {64, 128}, name
        assert all(case.head_dim in phase.head_dims and (phase.causal or not case.causal) for case in cases), name
    # the small-problem phases at the mission shape too; chapter 7's four shapes first, as recorded
    assert "mission" in PHASES["p07_registers"].profile_cases and "mission" in PHASES["p10_splitkv"].profile_cases
    assert PHASES["p07_registers"].profile_cases[:4] == ("b16h16_s512", "b4h16_s2048", "b4h16_s2048_causal",
                                                         "b2h16_s4096_d128")


def test_command_profiles_every_case_in_one_process_with_the_clocks_left_alone():
    cmd = profile.command("p07_registers")
    assert cmd[0] == "ncu" and cmd[cmd.index("--clock-control") + 1] == "none"
    # only the launches the program brackets with cudaProfilerStart/Stop, and only the phase's own kernel
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:attention_registers_kernel"
    program = ["flashcore_nb.profile", "p07_registers", *PHASES["p07_registers"].profile_cases]
    assert cmd[cmd.index("-m") + 1:] == program
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert set(metrics) == set(profile.COUNTERS.values())
    assert cmd[cmd.index("--section") + 1] == "WarpStateStats"


def test_command_profiles_the_cases_the_registry_names():
    cmd = profile.command("p10_splitkv")
    assert cmd[-3:] == ["b4h16_s2048", "b2h16_s4096_d128", "mission"]


# --- records and the table ----------------------------------------------------------------------------

def record_of(rows: list[dict], phase: str = "p08_wgmma") -> dict:
    return {"phase": phase, "rows": rows}


def test_limits_reads_a_record_with_every_counter():
    [row] = profile.parse(raw_page([kernel()]))
    table = tables.limits(record_of([{"case": "b4h16_s2048", **row}]))
    first = table.iloc[0]
    assert first["registers"] == 168 and first["occupancy %"] == pytest.approx(24.5)
    assert first["tensor pipe %"] == pytest.approx(61.2)   # a wgmma phase: the GMMA side of the pipe
    assert first["bank-conflict wavefronts %"] == pytest.approx(15.0)   # 1,500 of 10,000
    # "selected" (the issue itself) is not a stall; the rest by size
    assert list(first[["stall 1", "stall 2", "stall 3"]]) == ["gmma 2.50", "barrier (__syncthreads) 0.75", ""]


def test_limits_reads_the_recorded_counters():
    recorded = experiments.load(profile.record_name("p07_registers"))
    table = tables.limits(recorded)
    assert list(table["case"]) == [row["case"] for row in recorded["rows"]]
    assert (table["tensor pipe %"] == [row["tensor_pipe_pct"] for row in recorded["rows"]]).all()
    assert table["occupancy %"].between(0, 100, inclusive="neither").all()
    first = recorded["rows"][0]
    conflicts = 100.0 * (first["smem_ld_conflicts"] + first["smem_st_conflicts"]) / (
        first["smem_ld_wavefronts"] + first["smem_st_wavefronts"])
    assert table["bank-conflict wavefronts %"].iloc[0] == pytest.approx(conflicts)
    assert table["stall 1"].str.startswith("fixed-latency wait").all()


def test_recorded_profile_covers_the_phases_cases_and_its_stalls_add_up():
    frame, provenance = profile.runs()
    cases = list(PHASES[profile.PHASE].profile_cases)
    assert list(frame["case"]) == cases[:len(frame)] and "STALE" not in provenance
    for _, row in frame.iterrows():
        stalls = sum(row[label] for label in [*profile.STALL_LABELS.values(), "other"])
        assert stalls == pytest.approx(row["cycles_per_issue"], rel=0.05), row["case"]
        assert 0 < row["tensor_pipe_pct"] < 100 and 0 < row["eligible_per_scheduler"] < row["warps_per_scheduler"]
        assert 0 < row["achieved_occupancy_pct"] < 100


def test_limits_table_says_what_to_run_where_nothing_is_recorded():
    table, line = profile.limits_table("p07_registers", gpu_slug="nvidia-t4")
    assert table is None and "python -m flashcore_nb profile --phase p07_registers" in line
    table, line = profile.limits_table("p07_registers")
    assert "recorded on NVIDIA H100" in line and "fixed-latency wait" in table.to_html()


# --- the CLI verb -------------------------------------------------------------------------------------

def test_cli_profiles_each_phase_the_gpu_runs_and_says_which_it_skips(monkeypatch, capsys):
    recorded, built = [], []
    monkeypatch.setattr(cli.env, "gpu", lambda: SimpleNamespace(cc=80))
    monkeypatch.setattr(profile, "prebuild", lambda names, cc: built.extend(names))
    monkeypatch.setattr(profile, "record", lambda name: recorded.append(name) or f"{name}.json")
    monkeypatch.setattr(profile, "record_rungs", lambda name: recorded.append(f"{name} rungs") or f"{name}.json")
    assert cli.main(["profile"]) == 0
    runnable = [name for name, phase in PHASES.items() if phase.runs_on(80)]
    # a phase with rungs (chapter 7's) gets its rungs' profile right after its own
    assert built == runnable and recorded == [entry for name in runnable for entry in
                                              (name, *([f"{name} rungs"] if PHASES[name].variants_tagged("rung") else []))]
    assert "p07_registers rungs" in recorded
    assert "p08_wgmma: skipped, it needs an sm_90 GPU" in capsys.readouterr().out
    recorded.clear()
    assert cli.main(["profile", "--phase", "p10_splitkv"]) == 0 and recorded == ["p10_splitkv"]


def test_a_rung_is_profiled_as_its_own_build_on_the_rung_cases():
    rungs = PHASES["p07_registers"].variants_tagged("rung")
    first_label, first = next(iter(rungs.items()))
    cmd = profile.command("p07_registers", first, profile.RUNG_CASES)
    target = cmd[cmd.index("flashcore_nb.profile") + 1]
    assert sanitize.parse_target(target) == ("p07_registers", first)
    assert cmd[-len(profile.RUNG_CASES):] == list(profile.RUNG_CASES)
    # the last rung is the defaults themselves: the plain phase name
    assert profile.command("p07_registers", {}, profile.RUNG_CASES)[-3] == "p07_registers"


def test_the_rungs_record_has_a_row_per_rung_and_case_and_goes_stale_with_a_rung(monkeypatch, tmp_path):
    rungs = PHASES["p07_registers"].variants_tagged("rung")
    calls = []

    def fake_profile(phase_name, defines=None, cases=None):
        calls.append((phase_name, defines, cases))
        [row] = profile.parse(raw_page([kernel()]))
        return [{"case": case, **row} for case in cases]

    written = {}
    monkeypatch.setattr(profile, "profile_phase", fake_profile)
    monkeypatch.setattr(profile.results, "write", lambda record: written.setdefault("record", record) and "x.json")
    profile.record_rungs("p07_registers")
    record = written["record"]
    assert [c[1] for c in calls] == list(rungs.values()) and all(c[2] == profile.RUNG_CASES for c in calls)
    assert [(r["build"], r["case"]) for r in record["rows"]] == \
        [(label, case) for label in rungs for case in profile.RUNG_CASES]
    assert set(record["builds"]) == set(rungs) and experiments.stale_builds(record) == []
    table = tables.limits(record)
    assert list(table.columns[:2]) == ["build", "case"] and len(table) == len(rungs) * len(profile.RUNG_CASES)
