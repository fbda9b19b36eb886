"""compute-sanitizer over FlashCore kernels: the target program, and chapter 6's recorded reports.

    compute-sanitizer --tool racecheck python -m flashcore_nb.sanitize [phase[:NAME=value,...] ...]

runs a small problem set through each target (none named: every default target, those racecheck cannot
follow included; sanitize.run passes default_targets(tool)). Only FlashCore kernels and torch's input generation
run on the GPU: the float64 reference runs on the CPU, so a report speaks about our kernels alone.
Exits non-zero when an output is wrong. `python -m flashcore_nb sanitize` records the reports."""
from __future__ import annotations

import os
import subprocess
import sys

from . import build
from .paths import ROOT
from .shapes import Case

CASES = [Case("s17", 1, 2, 17, 64), Case("s40_causal_d128", 1, 2, 40, 128, causal=True),
         Case("sq_lt_sk", 1, 1, 9, 64, seqlen_k=33), Case("s150_causal", 1, 1, 150, 64, causal=True),
         Case("s300_d128_rising_keys", 1, 2, 300, 128)]
# Keys scaled up along the sequence (x1 to x8): each key tile's scores rise well above the last one's, so the row
# maxima move by more than 2^8 and phase 9's speculative softmax takes its exact path (the mma.sync recompute).
RISING_KEYS = {"s300_d128_rising_keys"}
TOLERANCE = 2e-3  # fp16 output of values of magnitude ~1

# Chapter 6's recorded runs: the planted bug under memcheck, then the real kernel under each tool.
PLANTED = "p06_async:PLANTED_BUG=1"
RECORDED_RUNS = [("memcheck", PLANTED, ("--print-limit", "3", "--show-backtrace", "device")),
                 ("memcheck", "p06_async", ()), ("racecheck", "p06_async", ()), ("synccheck", "p06_async", ())]


def format_target(phase_name: str, defines: dict) -> str:
    """(phase, tile parameters) -> 'phase' or 'phase:NAME=value,NAME=value' (parse_target's inverse)."""
    if not defines:
        return phase_name
    return f"{phase_name}:" + ",".join(f"{key}={value}" for key, value in defines.items())


def parse_target(target: str) -> tuple[str, dict]:
    """'phase' or 'phase:NAME=value,NAME=value' -> (phase, tile parameters)."""
    name, _, defines = target.partition(":")
    params = dict(item.split("=") for item in defines.split(",")) if defines else {}
    return name, {key: int(value) for key, value in params.items()}


def command(tool: str, targets: list[str], options=()) -> list[str]:
    return ["compute-sanitizer", f"--tool={tool}", *options, sys.executable, "-m", "flashcore_nb.sanitize", *targets]


def run(tool: str, targets: list[str], options=(), timeout: int = 900) -> dict:
    """Run the target program under one tool (no targets: default_targets(tool)); the report with this
    checkout's path shortened to '.'."""
    cmd = command(tool, targets or default_targets(tool), options)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=environment, timeout=timeout, cwd=ROOT)
    shown = ["python" if part == sys.executable else part for part in cmd]
    report = (proc.stdout + proc.stderr).replace(str(ROOT), ".")
    return {"tool": tool, "target": " ".join(targets), "command": " ".join(shown), "returncode": proc.returncode,
            "report": report}


def shown_report(report: str) -> str:
    """A recorded report as a page shows it: without the compile-progress lines of the target program's
    first build, and with a Python traceback cut to the exception it ends in."""
    shown, in_traceback = [], False
    for line in report.splitlines():
        if build.TICKER_LINE.match(line):
            continue
        if line.startswith("Traceback (most recent call last):"):
            in_traceback = True
        elif in_traceback and not line.startswith(" "):
            shown.append(line)        # the exception; torch's advice after it is left out
            break
        elif not in_traceback:
            shown.append(line)
    return "\n".join(shown).strip() + "\n"


def record():
    from . import experiments, results
    runs = [run(tool, [target], options) for tool, target, options in RECORDED_RUNS]
    builds = {target: parse_target(target)[1] for _, target, _ in RECORDED_RUNS}
    return results.write(experiments.make_record("p06_sanitizer", "p06_async", builds, runs))


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
            if case.name in RISING_KEYS:
                k = (k.float() * torch.linspace(1, 8, case.sk)[:, None]).half()
                v = v / 2   # sharp rows output one value row: kept below 4, where fp16 rounds within TOLERANCE
            out = fn(q.cuda(), k.cuda(), v.cuda(), causal=case.causal).cpu()
            err = float((out.double() - attention_fp64(q, k, v, causal=case.causal)).abs().max())
            ok &= err <= TOLERANCE
            print(target, case.name, f"max error {err:.2e}", "ok" if err <= TOLERANCE else "FAILED")
    return 0 if ok else 1


def default_targets(tool: str | None = None) -> list[str]:
    """Every phase this GPU can run, with its defaults and then each variant tagged "sanitize", those
    whose shared memory this GPU allows at every head dim (and, for racecheck, those the registry says it
    can follow: Phase.racecheck_follows)."""
    from . import budget, env
    from .phases import PHASES
    gpu = env.gpu()
    targets = []
    for name, phase in PHASES.items():
        if not phase.runs_on(gpu.cc):
            continue
        for defines in ({}, *phase.variants_tagged("sanitize").values()):
            params = {**phase.tile_params_for(gpu.cc), **defines}
            if budget.smem_needed(name, params) <= gpu.smem_per_block_optin and (
                    tool != "racecheck" or phase.racecheck_follows(params)):
                targets.append(format_target(name, defines))
    return targets


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or default_targets()))
