"""compute-sanitizer over FlashCore kernels: the target program, and chapter 6's recorded reports.

    compute-sanitizer --tool racecheck python -m flashcore_nb.sanitize [phase[:NAME=value,...] ...]

runs a small problem set through each target. Only FlashCore kernels and torch's input generation
run on the GPU: the float64 reference runs on the CPU, so a report speaks about our kernels alone.
Exits non-zero when an output is wrong. `python -m flashcore_nb sanitize` records the reports."""
from __future__ import annotations

import os
import subprocess
import sys

from .paths import ROOT
from .shapes import Case

CASES = [Case("s17", 1, 2, 17, 64), Case("s40_causal_d128", 1, 2, 40, 128, causal=True),
         Case("sq_lt_sk", 1, 1, 9, 64, seqlen_k=33), Case("s150_causal", 1, 1, 150, 64, causal=True)]
TOLERANCE = 2e-3  # fp16 output of values of magnitude ~1

# Beyond each phase's defaults: p05 with 16 lanes per query row and with one, where the in-place
# S -> P hand-over and the warp loops take their other shapes; p06 with 1 and 3 stages; p07's
# large-tile path (these small cases otherwise take its key-split path) with both pipelines and the
# overlap, on one persistent CTA that crosses every query tile of a case; p08 with its overlap, and
# with three warpgroups and one.
EXTRA_TARGETS = ["p05_tile64:BLOCK_M=32,BLOCK_N=128,NUM_WARPS=16", "p05_tile64:BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4",
                 "p06_async:STAGES=1", "p06_async:BLOCK_M=32,BLOCK_N=64,NUM_WARPS=16,STAGES=3",
                 "p07_registers:SMALL_PROBLEM_CTAS=0,PERSISTENT_CTAS=1",
                 "p07_registers:SMALL_PROBLEM_CTAS=0,PERSISTENT_CTAS=1,STAGES=1,BLOCK_M_D128=256,STAGES_D128=2",
                 "p07_registers:SMALL_PROBLEM_CTAS=0,PERSISTENT_CTAS=1,OVERLAP_SOFTMAX=1,BLOCK_N=32,STAGES=3,STAGES_D128=3",
                 "p08_wgmma:OVERLAP=1", "p08_wgmma:WARPGROUPS=3,BLOCK_N=192,CTAS_PER_SM=1,WARPGROUPS_D128=1,BLOCK_N_D128=64"]

# Chapter 6's recorded runs: the planted bug under memcheck, then the real kernel under each tool.
PLANTED = "p06_async:PLANTED_BUG=1"
RECORDED_RUNS = [("memcheck", PLANTED, ("--print-limit", "3", "--show-backtrace", "device")),
                 ("memcheck", "p06_async", ()), ("racecheck", "p06_async", ()), ("synccheck", "p06_async", ())]


def parse_target(target: str) -> tuple[str, dict]:
    """'phase' or 'phase:NAME=value,NAME=value' -> (phase, tile parameters)."""
    name, _, defines = target.partition(":")
    params = dict(item.split("=") for item in defines.split(",")) if defines else {}
    return name, {key: int(value) for key, value in params.items()}


def command(tool: str, targets: list[str], options=()) -> list[str]:
    return ["compute-sanitizer", f"--tool={tool}", *options, sys.executable, "-m", "flashcore_nb.sanitize", *targets]


def run(tool: str, targets: list[str], options=(), timeout: int = 900) -> dict:
    """Run the target program under one tool; the report with this checkout's path shortened to '.'."""
    cmd = command(tool, targets, options)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=environment, timeout=timeout, cwd=ROOT)
    shown = ["python" if part == sys.executable else part for part in cmd]
    report = (proc.stdout + proc.stderr).replace(str(ROOT), ".")
    return {"tool": tool, "target": " ".join(targets), "command": " ".join(shown), "returncode": proc.returncode,
            "report": report}


def record():
    from . import experiments
    runs = [run(tool, [target], options) for tool, target, options in RECORDED_RUNS]
    builds = {target: parse_target(target)[1] for _, target, _ in RECORDED_RUNS}
    return experiments.write(experiments.make_record("p06_sanitizer", "p06_async", builds, runs))


def main(targets: list[str]) -> int:
    import torch

    import flashcore_nb
    from .reference import attention_fp64
    ok = True
    for target in targets:
        name, params = parse_target(target)
        fn = flashcore_nb.load(name, **params)
        for case in CASES:
            q, k, v = (torch.randn(*case.shape[:2], s, case.head_dim, dtype=torch.float16)
                       for s in (case.seqlen_q, case.sk, case.sk))
            out = fn(q.cuda(), k.cuda(), v.cuda(), causal=case.causal).cpu()
            err = float((out.double() - attention_fp64(q, k, v, causal=case.causal)).abs().max())
            ok &= err <= TOLERANCE
            print(target, case.name, f"max error {err:.2e}", "ok" if err <= TOLERANCE else "FAILED")
    return 0 if ok else 1


def default_targets() -> list[str]:
    """Every phase this GPU can run, and the extra tile shapes."""
    from . import env
    from .phases import PHASES
    runnable = {name for name, phase in PHASES.items() if phase.runs_on(env.gpu().cc)}
    return [t for t in [*PHASES, *EXTRA_TARGETS] if parse_target(t)[0] in runnable]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or default_targets()))
