"""A record's timing, spread over fresh processes.

Interleaved rounds cancel what changes during a run (the clock above all), but not what one process
keeps for its whole life: two `record` runs showed every method's time at the mission shape shifted
by a few percent, the same in all nine rounds of a run, by a different amount for each method. So
`record` runs its rounds in PROCESSES fresh processes, one after the other, ROUNDS / PROCESSES
rounds each, and pools them (bench.pooled): the medians are then taken over all the rounds, and each
paired ratio per process, then averaged over the processes (bench.paired_ratio). Each process builds
nothing: the parent has built the phase, and the child loads it from the build cache.

    python -m flashcore_nb.processes PHASE PARAMS_JSON CASES_JSON ROUNDS   (one child's work, JSON on stdout)

fresh_process() is how every experiment that needs a new process (drift.py, process_state.py) runs one.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from .bench import ROUNDS, pooled
from .paths import ROOT
from .shapes import Case

PROCESSES = 3   # divides ROUNDS: every process times every method on each copy of the inputs once


def fresh_process(module: str, *args: str, timeout: float = 900):
    """`python -m module args` in a fresh process, from the repository root: the last line it prints, as
    JSON (what it prints before, a compile message say, is left out). A failure raises with its stderr."""
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def timed_in_processes(phase_name: str, tile_params: dict, cases: list[Case], processes: int = PROCESSES) -> dict:
    """case name -> the phase's timing with every baseline (bench.bench_case's result), its rounds spread
    over `processes` fresh processes."""
    if ROUNDS % processes:
        raise ValueError(f"{processes} processes cannot share {ROUNDS} rounds evenly")
    parts = {case.name: [] for case in cases}
    for _ in range(processes):
        timings = fresh_process(__name__, phase_name, json.dumps(tile_params),
                                json.dumps([dataclasses.asdict(case) for case in cases]), str(ROUNDS // processes))
        for name, timing in timings.items():
            parts[name].append(timing)
    return {case.name: pooled(parts[case.name], case) for case in cases}


def _child(phase_name: str, params_json: str, cases_json: str, rounds: str) -> dict:
    from .bench import bench_case
    from .binding import load
    fn = load(phase_name, **json.loads(params_json))
    cases = [Case(**fields) for fields in json.loads(cases_json)]
    return {case.name: bench_case(fn, case, rounds=int(rounds)) for case in cases}


if __name__ == "__main__":
    print(json.dumps(_child(*sys.argv[1:])))
