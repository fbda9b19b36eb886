"""Recorded results: schema, provenance, and staleness against the current kernels."""
import copy
import json
import statistics

import pytest

from flashcore_nb import phases, results, shapes

RECORDS = results.all_records()


def test_every_phase_has_a_record_for_the_book_gpu():
    for name in phases.PHASES:
        assert results.load(name, results.DEFAULT_GPU) is not None, f"record {name} on an H100"


@pytest.mark.parametrize("path,record", RECORDS, ids=[str(p.relative_to(p.parents[1])) for p, _ in RECORDS])
def test_records_follow_the_schema_and_are_current(path, record):
    results.validate(record)
    assert path == results.path_for(record["phase"], results.env.gpu_slug(record["env"]["gpu"]), path.parents[1])
    assert record["commit"] != "unknown" and len(record["commit"]) == 40
    assert not results.is_stale(record), f"{path}: the kernel changed since it was recorded; re-record it"
    assert all(run["passed"] and run["unwritten"] == 0 for run in record["runs"])


def test_a_mistyped_commit_is_refused(monkeypatch):
    monkeypatch.setenv("FLASHCORE_COMMIT", "b49fe5f2")
    with pytest.raises(ValueError, match="full 40-digit commit sha"):
        results.current_commit()
    monkeypatch.setenv("FLASHCORE_COMMIT", "b49fe5f7a3f2d607dd589d231ff5f5692415e20e")
    assert results.current_commit() == "b49fe5f7a3f2d607dd589d231ff5f5692415e20e"


def test_schema_violations_are_named():
    record = copy.deepcopy(RECORDS[0][1])
    del record["env"]["driver"]
    with pytest.raises(ValueError, match=r"record\['env'\] is missing \['driver'\]"):
        results.validate(record)
    record = copy.deepcopy(RECORDS[0][1])
    del record["runs"][0]["gpu_us"]
    with pytest.raises(ValueError, match="missing \\['gpu_us'\\]"):
        results.validate(record)


def test_a_changed_kernel_makes_its_record_stale(kernels_copy):
    record = results.load("p01_baseline")
    assert not results.is_stale(record)
    header = kernels_copy / "common" / "numeric.cuh"
    header.write_text(header.read_text() + "\n// an edit to a shared header\n")
    assert results.is_stale(record)
    assert "STALE" in results.provenance(record)


def test_provenance_names_the_environment():
    line = results.provenance(results.load("p01_baseline"))
    for part in ("NVIDIA H100", "driver", "torch", "CUDA", "commit"):
        assert part in line


def test_paired_ratios_are_what_the_recorded_rounds_say():
    """Every baseline's ratio in a record is what its rounds say (nothing computed elsewhere): each process's
    median of the per-round ratios, averaged over the processes."""
    for _, record in RECORDS:
        for run in record["runs"]:
            if run["gpu_us"] is None:
                continue
            assert len(run["gpu_us_rounds"]) == run["rounds"] >= 5
            assert run["gpu_us_min"] <= run["gpu_us"] <= run["gpu_us_max"]
            for name, timing in run["baselines"].items():
                if timing:
                    ratios = [a / b for a, b in zip(run["gpu_us_rounds"], timing["gpu_us_rounds"])]
                    per = len(ratios) // run["processes"]
                    medians = [statistics.median(ratios[i:i + per]) for i in range(0, len(ratios), per)]
                    assert timing["time_ratio"] == pytest.approx(statistics.fmean(medians)), (record["phase"], name)


def test_paired_ratio_is_the_median_of_per_round_ratios():
    from flashcore_nb.bench import paired_ratio
    a = {"gpu_us_rounds": [10.0, 12.0, 11.0]}
    b = {"gpu_us_rounds": [5.0, 4.0, 11.0]}     # per round: 2, 3, 1
    assert paired_ratio(a, b) == 2.0
    assert paired_ratio(b, a) == 0.5


def test_two_record_runs_agree():
    """The timing method's claim as the methodology page states it: a second `record --repeat` run,
    its rounds spread over fresh processes like the first's, reproduces every paired ratio within 5%
    and half of them within 0.5%. The exception the page names: the
    Triton peer at the mission shapes, whose own GPU time there keeps a state for a process's life
    (6.4-6.5 µs in one of phase 10's three processes, 6.9-7.1 µs in the other two, ours within 1%
    in all three): within 8% there."""
    table = results.agreement()
    assert set(table["phase"]) == set(phases.PHASES), "record every phase twice (record --repeat)"
    small = table["case"].isin([case.name for case in shapes.TIMING if case.flops() < 1e10])
    peer_small = small & (table["baseline"] == "triton")
    differs = table["ratio differs %"]
    worst = table.sort_values("ratio differs %").tail()
    assert differs.median() <= 0.5 and differs[~peer_small].max() <= 5.0, worst
    assert differs[peer_small].max() <= 8.0, worst


def test_resummarise_rederives_ratios_from_the_rounds_alone(tmp_path, monkeypatch):
    """`summarise` recomputes each baseline's paired ratios (and their per-process values) from the rounds, in
    records whose rounds ran in several processes, and leaves every measured number as it was."""
    monkeypatch.setenv("FLASHCORE_COMMIT", "a" * 40)
    source = results.path_for("p02_vectorized", results.DEFAULT_GPU)
    record = json.loads(source.read_text())
    timed = next(run for run in record["runs"] if run["gpu_us"] is not None)
    for timing in timed["baselines"].values():
        if timing:
            timing["time_ratio"], timing["call_ratio"] = -1.0, -1.0
            timing.pop("time_ratio_processes", None)
    results.write(record, tmp_path)
    [written] = results.resummarise([tmp_path])
    again = json.loads(written.read_text())
    run = next(r for r in again["runs"] if r["case"] == timed["case"])
    sdpa = run["baselines"]["sdpa_default"]
    per_process = [statistics.median(x / y for x, y in zip(run["gpu_us_rounds"][i:i + 3], sdpa["gpu_us_rounds"][i:i + 3]))
                   for i in (0, 3, 6)]
    assert run["processes"] == 3 and sdpa["time_ratio_processes"] == pytest.approx(per_process)
    assert sdpa["time_ratio"] == pytest.approx(sum(per_process) / 3) and sdpa["call_ratio"] > 0
    assert run["gpu_us_rounds"] == timed["gpu_us_rounds"] and sdpa["gpu_us"] == timed["baselines"]["sdpa_default"]["gpu_us"]
    assert again["ratios_resummarised"]["commit"] == "a" * 40 and again["recorded_at"] == record["recorded_at"]


def test_repeat_records_are_current():
    for path, record in results.all_records(results.REPEAT_DIR):
        results.validate(record)
        assert not results.is_stale(record), f"{path}: re-record it with record --repeat"
