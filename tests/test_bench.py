"""The exercises' timer, on CPU: how side_by_side turns checks and interleaved rounds into its table (the timing
itself runs in the GPU suite)."""
from types import SimpleNamespace

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
