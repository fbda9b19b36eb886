"""The exercises' timer, on CPU: how side_by_side turns checks and interleaved rounds into its table (the timing
itself runs in the GPU suite)."""
import json
from types import SimpleNamespace

import pytest

from flashcore_nb import bench, check
from flashcore_nb.shapes import Case


def test_side_by_side_pairs_every_build_with_the_first_and_sdpa(monkeypatch):
    rounds = {"defaults": [10.0, 12.0, 11.0], "one switch": [9.0, 12.0, 9.9], "sdpa_default": [20.0, 24.0, 22.0]}
    timed_cases = []

    def compare(fns, case, baselines, dtype, n_rounds):
        timed_cases.append((case.name, baselines))
        return {name: {"gpu_us": sorted(r)[1], "gpu_us_min": min(r), "gpu_us_max": max(r), "gpu_us_rounds": r}
                for name, r in rounds.items()}

    monkeypatch.setattr(bench, "compare", compare)
    monkeypatch.setattr(check, "check", lambda fn, case, dtype: SimpleNamespace(passed=fn == "right"))
    table = bench.side_by_side({"defaults": "right", "one switch": "wrong"}, "mission")
    assert timed_cases == [("mission", ("sdpa_default",))]
    assert list(table["build"]) == ["defaults", "one switch"]
    assert list(table["correct"]) == [True, False]
    assert list(table["GPU time / defaults"]) == [1.0, 0.9]          # median of 0.9, 1.0, 0.9
    assert list(table["GPU time / SDPA default"]) == [0.5, 0.45]
    assert table["spread µs"][1] == "9.0-12.0"
    bench.side_by_side({"defaults": "right"}, Case("mine", 2, 8, 1024, 64))
    assert timed_cases[-1] == ("mine", ("sdpa_default",))


def _process_timing(ours, sdpa, clock):
    """What bench_case returns in one process (only the keys pooling reads)."""
    return {"gpu_us_rounds": ours, "call_us_rounds": [2 * x for x in ours], "sm_clock_mhz": clock,
            "baselines": {"sdpa_default": {"gpu_us_rounds": sdpa, "call_us_rounds": [3 * x for x in sdpa]},
                          "sdpa_cudnn": None}}


def test_pooled_pairs_rounds_across_processes():
    case = Case("mine", 1, 8, 512, 64)
    parts = [_process_timing([10.0, 10.0, 10.0], [5.0, 5.0, 5.0], [1980.0, 1980.0]),
             _process_timing([12.0, 12.0, 12.0], [4.0, 4.0, 4.0], [1980.0, 1755.0]),
             _process_timing([11.0, 11.0, 11.0], [11.0, 11.0, 11.0], [1755.0, 1755.0])]
    run = bench.pooled(parts, case)
    assert run["rounds"] == 9 and run["processes"] == 3
    assert run["gpu_us_rounds"] == [10.0] * 3 + [12.0] * 3 + [11.0] * 3, "rounds kept in the order they ran"
    assert (run["gpu_us"], run["gpu_us_min"], run["gpu_us_max"], run["call_us"]) == (11.0, 10.0, 12.0, 22.0)
    assert run["sm_clock_mhz"] == [1980.0, 1980.0, 1980.0, 1755.0, 1755.0, 1755.0]
    sdpa = run["baselines"]["sdpa_default"]
    # per process 2, 3 and 1: their mean of the pairs (2), not the ratio of the medians (11 / 5)
    assert sdpa["time_ratio_processes"] == [2.0, 3.0, 1.0]
    assert sdpa["time_ratio"] == 2.0 and sdpa["call_ratio"] == pytest.approx(2.0 * 2 / 3)
    assert sdpa["tflops"] == pytest.approx(case.flops() / 5e-6 / 1e12)
    assert run["baselines"]["sdpa_cudnn"] is None


def test_paired_ratio_takes_each_process_median_then_their_mean():
    ours = {"gpu_us_rounds": [10.0, 10.0, 50.0, 10.0, 10.0, 10.0, 13.0, 13.0, 13.0]}
    theirs = {"gpu_us_rounds": [10.0] * 9}
    # an odd round inside a process (50) is dropped by its median; a process in another state (1.3) moves the mean
    assert bench.process_ratios(ours, theirs, processes=3) == [1.0, 1.0, 1.3]
    assert bench.paired_ratio(ours, theirs, processes=3) == pytest.approx(1.1)
    assert bench.paired_ratio(ours, theirs) == 1.0, "in one process: the median of the rounds"
    with pytest.raises(ValueError, match="do not split"):
        bench.paired_ratio(ours, theirs, processes=2)


def test_record_timing_runs_its_rounds_in_fresh_processes(monkeypatch):
    from flashcore_nb import processes
    case = Case("mine", 1, 8, 512, 64)
    children = []

    def run(cmd, **kwargs):
        children.append(cmd)
        phase, params, cases, rounds = cmd[-4:]
        assert cmd[1:3] == ["-m", "flashcore_nb.processes"] and phase == "p03_wmma" and kwargs["timeout"]
        assert [Case(**fields) for fields in json.loads(cases)] == [case] and json.loads(params) == {"X": 1}
        assert int(rounds) * processes.PROCESSES == bench.ROUNDS
        timing = _process_timing([10.0 + len(children)] * 3, [5.0] * 3, [1980.0, 1980.0])
        return SimpleNamespace(returncode=0, stdout="compiling ...\n" + json.dumps({case.name: timing}), stderr="")

    monkeypatch.setattr(processes.subprocess, "run", run)
    timed = processes.timed_in_processes("p03_wmma", {"X": 1}, [case])
    assert len(children) == processes.PROCESSES
    assert timed["mine"]["gpu_us_rounds"] == [11.0] * 3 + [12.0] * 3 + [13.0] * 3
    assert timed["mine"]["baselines"]["sdpa_default"]["time_ratio"] == 12.0 / 5.0
