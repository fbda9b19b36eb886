"""Recorded results: schema, provenance, and staleness against the current kernels."""
import copy

import pytest

from flashcore_nb import phases, results

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
