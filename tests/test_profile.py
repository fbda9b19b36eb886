"""Chapter 7's profile: parsing ncu's raw CSV page, and the recorded counters."""
from pathlib import Path

import pytest

from flashcore_nb import profile

FIXTURE = Path(__file__).parent / "data" / "ncu_raw_page.csv"   # trimmed from a real H100 run


def test_parse_reads_the_counters_and_the_nonzero_stalls():
    row = profile.parse(FIXTURE.read_text())
    assert row["duration_ns"] == 69056 and row["registers"] == 243
    assert row["tensor_pipe_pct"] == pytest.approx(42.01) and row["issue_busy_pct"] == pytest.approx(42.08)
    assert row["warps_per_scheduler"] == pytest.approx(1.93) and row["cycles_per_issue"] == pytest.approx(4.59)
    assert row["stalls"] == {"wait": pytest.approx(1.71), "selected": pytest.approx(1.0)}   # gmma's 0 left out


def test_parse_refuses_output_without_the_table_or_a_counter():
    with pytest.raises(ValueError, match="no CSV table"):
        profile.parse("==PROF== Disconnected from process 1\n")
    header, units, values = FIXTURE.read_text().splitlines()[3:6]
    cut = [",".join(line.split(",")[:3]) for line in (header, units, values)]
    with pytest.raises(ValueError, match="lacks"):
        profile.parse("\n".join(cut))


def test_command_profiles_one_warm_launch_with_the_clocks_left_alone():
    cmd = profile.command("b4h16_s2048")
    assert cmd[0] == "ncu" and cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--launch-skip") + 1] == str(profile.LAUNCHES_SKIPPED)
    assert cmd[-4:] == ["-m", "flashcore_nb.profile", profile.PHASE, "b4h16_s2048"]
    # only the phase's own kernel, by the registry's name for it
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:attention_registers_kernel"
    assert profile.command("mission", "p08_wgmma")[-2:] == ["p08_wgmma", "mission"]


def test_recorded_profile_covers_the_cases_and_its_stalls_add_up():
    frame, provenance = profile.runs()
    assert list(frame["case"]) == list(profile.CASES) and "STALE" not in provenance
    for _, row in frame.iterrows():
        stalls = sum(row[label] for label in [*profile.STALL_LABELS.values(), "other"])
        assert stalls == pytest.approx(row["cycles_per_issue"], rel=0.05), row["case"]
        assert 0 < row["tensor_pipe_pct"] < 100 and 0 < row["eligible_per_scheduler"] < row["warps_per_scheduler"]
