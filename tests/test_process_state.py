"""The what-one-process-keeps experiment, on CPU: its summary separates placement from process, and its
processes are fresh ones whose rows keep their process index (the timing itself needs a GPU)."""
import json
from types import SimpleNamespace

import pytest

from flashcore_nb import process_state, processes


def rows(times_by_process, subject="p02_vectorized", case="mission_causal"):
    return [{"process": p, "subject": subject, "case": case, "placement": i, "gpu_us": t}
            for p, times in enumerate(times_by_process) for i, t in enumerate(times)]


def test_summary_tells_placement_from_process():
    data = rows([[50.0, 50.5, 50.0], [52.0, 52.0, 52.5], [50.0, 50.0, 58.0]]) + \
        rows([[55.0, 55.0, 55.0], [55.0, 55.5, 55.0]], case="mission")
    table = process_state.summary(data).set_index("case")
    # each process's max / min: 1%, 0.96%, 16% (one odd sample); their median
    assert table.loc["mission_causal", "within a process %"] == pytest.approx(100 * (50.5 / 50.0 - 1))
    assert table.loc["mission_causal", "between processes %"] == pytest.approx(100 * (52.0 / 50.0 - 1))
    assert table.loc["mission_causal", "process medians µs"] == "50.0, 52.0, 50.0"
    assert table.loc["mission", "between processes %"] == 0.0
    assert table.loc["mission", "median µs"] == 55.0


def test_every_process_is_fresh_and_keeps_its_index(monkeypatch):
    launched = []

    def run(cmd, **kwargs):
        launched.append(cmd)
        row = {"subject": "sdpa_default", "case": "mission_causal", "placement": 0, "gpu_us": 9.0 + len(launched)}
        return SimpleNamespace(returncode=0, stdout="compiling ...\n" + json.dumps([row]), stderr="")

    monkeypatch.setattr(processes.subprocess, "run", run)
    got = process_state.run_all()
    assert len(launched) == process_state.PROCESSES
    assert all(cmd[1:] == ["-m", "flashcore_nb.process_state"] for cmd in launched)
    assert [row["process"] for row in got] == list(range(process_state.PROCESSES))
    assert got[-1]["gpu_us"] == 9.0 + process_state.PROCESSES


def test_a_failed_process_says_why(monkeypatch):
    monkeypatch.setattr(processes.subprocess, "run",
                        lambda cmd, **kwargs: SimpleNamespace(returncode=1, stdout="", stderr="CUDA error: out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        process_state.run_all()


def test_placements_are_distinct_buffers_at_distinct_pages():
    offsets = [process_state._offset_bytes(p) for p in range(process_state.PLACEMENTS)]
    assert len({o // 4096 for o in offsets}) == len(offsets) and len({o >> 20 for o in offsets}) == len(offsets)
