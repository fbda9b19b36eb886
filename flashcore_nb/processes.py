"""A record's timing, spread over fresh processes.

Interleaved rounds cancel what changes during a run (the clock above all), but not what one process
keeps for its whole life: two `record` runs showed every method's time at the mission shape shifted
by a few percent, the same in all nine rounds of a run, by a different amount for each method. So
`record` runs its rounds in PROCESSES fresh processes, one after the other, ROUNDS / PROCESSES
rounds each, and pools them (bench.pooled): the medians and paired ratios are then taken over
processes as well as rounds. Each process builds nothing: the parent has built the phase, and the
child loads it from the build cache.

    python -m flashcore_nb.processes PHASE PARAMS_JSON CASES_JSON ROUNDS OUT_JSON   (one child's work)
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from .bench import ROUNDS, pooled
from .shapes import Case

PROCESSES = 3   # divides ROUNDS: every process times every method on each copy of the inputs once


def timed_in_processes(phase_name: str, tile_params: dict, cases: list[Case], processes: int = PROCESSES) -> dict:
    """case name -> the phase's timing with every baseline (bench.bench_case's result), its rounds spread
    over `processes` fresh processes."""
    if ROUNDS % processes:
        raise ValueError(f"{processes} processes cannot share {ROUNDS} rounds evenly")
    parts = {case.name: [] for case in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(processes):
            out = Path(tmp) / f"process{index}.json"
            subprocess.run([sys.executable, "-m", __name__, phase_name, json.dumps(tile_params),
                            json.dumps([dataclasses.asdict(case) for case in cases]), str(ROUNDS // processes),
                            str(out)], check=True)
            for name, timing in json.loads(out.read_text()).items():
                parts[name].append(timing)
    return {case.name: pooled(parts[case.name], case) for case in cases}


def _child(phase_name: str, params_json: str, cases_json: str, rounds: str, out: str) -> None:
    from .bench import bench_case
    from .binding import load
    fn = load(phase_name, **json.loads(params_json))
    cases = [Case(**fields) for fields in json.loads(cases_json)]
    Path(out).write_text(json.dumps({case.name: bench_case(fn, case, rounds=int(rounds)) for case in cases}))


if __name__ == "__main__":
    _child(*sys.argv[1:])
