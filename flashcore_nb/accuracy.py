"""Accuracy on random problems: each phase against the float64 reference, beside SDPA's own error on
the same inputs, over seeded random problems the shape suite does not reach (any Sq and Sk, both
layouts, both dtypes, other softmax scales, inputs from 0.1 to 16) — and, for a phase with variants
tagged "accuracy", each suspect of an error larger than SDPA's turned off alone, on the same problems,
with its cost in GPU time.

`python -m flashcore_nb accuracy` records results/<gpu>/experiments/<phase>_accuracy.json: per problem
its parameters, SDPA's error and each build's error and unwritten outputs. Ratios and pass/fail are
derived from those with the book's rule (check.py), on the page as in the GPU test."""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from . import env, experiments, results, shapes
from .check import LAYOUTS, kernel_error, make_inputs, passes, reference_and_sdpa_error
from .paths import RESULTS_DIR
from .phases import PHASES, Phase, get
from .shapes import Case

TAG = "accuracy"            # the registry's variants measured beside the defaults
DEFAULTS = "defaults"
MAX_SEQLEN = 2048
# B·H·Sq·Sk·D of one problem at most (batch, then heads, shrink to fit): the float64 reference of the
# largest takes 256 MB per score matrix, and a thousand problems take seconds per build on an H100.
MAX_WORK = 1 << 31
RATIO_LINES = (1.5, 2.0)    # issue 15's target, and the book's pass line (plus its 1e-4 slack)


@dataclass(frozen=True)
class Distribution:
    """How a set of random problems is drawn: each parameter independently, per problem. Batch 1-4,
    heads 1-8, head dim, dtype and mask uniformly among those the phase supports (on this GPU);
    lengths, scale factors and magnitudes log-uniformly."""
    name: str
    title: str
    seed: int
    count: int
    seqlens: tuple[int, int] = (1, MAX_SEQLEN)
    longer_queries: bool = False            # Sq > Sk always; else Sq and Sk independent,
    equal_lengths: float = 0.2              # ... and equal with this probability
    default_scale: float = 0.5              # probability of scale=None (1/sqrt(D)); else a factor times it
    scale_factors: tuple[float, float] = (0.05, 2.0)
    magnitudes: tuple[float, float] = (0.1, 16.0)   # inputs are randn x magnitude


RANDOM = Distribution("random", "random problems", seed=0, count=1000)
# The kind of problem issue 15 found phase 7 failing on in bf16, with keys enough for several key tiles.
STRESSED = Distribution("stressed", "Sq > Sk, small scale, large inputs", seed=1, count=200, seqlens=(128, MAX_SEQLEN),
                        longer_queries=True, equal_lengths=0.0, default_scale=0.0, scale_factors=(0.05, 0.3),
                        magnitudes=(8.0, 16.0))
DISTRIBUTIONS = (RANDOM, STRESSED)


@dataclass(frozen=True)
class Problem:
    """A random problem: a Case (shape, mask, magnitude) and what the shape suite leaves at its
    defaults: dtype, softmax scale, layout, and the seed of the input values."""
    case: Case
    dtype: str
    scale: float | None     # None: 1/sqrt(D), as kernels and SDPA take it by default
    layout: str             # check.LAYOUTS
    seed: int

    def inputs(self, device="cuda"):
        import torch
        return make_inputs(self.case, getattr(torch, self.dtype), self.seed, device, self.layout)

    def as_row(self) -> dict:
        case = self.case
        return {"problem": case.name, "batch": case.batch, "heads": case.heads, "seqlen_q": case.seqlen_q,
                "seqlen_k": case.sk, "head_dim": case.head_dim, "causal": case.causal, "magnitude": case.magnitude,
                "dtype": self.dtype, "scale": self.scale, "layout": self.layout, "seed": self.seed}

    @classmethod
    def from_row(cls, row) -> "Problem":
        """The problem of a recorded row, to run it again."""
        case = Case(row["problem"], int(row["batch"]), int(row["heads"]), int(row["seqlen_q"]), int(row["head_dim"]),
                    bool(row["causal"]), int(row["seqlen_k"]), float(row["magnitude"]))
        scale = None if row["scale"] is None or pd.isna(row["scale"]) else float(row["scale"])
        return cls(case, row["dtype"], scale, row["layout"], int(row["seed"]))


def _log_uniform(u: float, low: float, high: float) -> float:
    return math.exp(math.log(low) + u * (math.log(high) - math.log(low)))


def _pick(u: float, options):
    return options[min(int(u * len(options)), len(options) - 1)]


def draw_one(phase: Phase, cc: int, distribution: Distribution, index: int) -> Problem:
    """Problem `index` of a distribution for a phase on a GPU of compute capability `cc`. Its own
    random stream, one uniform per parameter: the same problem whatever the count, and, for phases
    with the same options, the same problem for every phase."""
    seed = distribution.seed * 1_000_003 + index
    rng = random.Random(seed)
    u = [rng.random() for _ in range(12)]
    dtypes = [d for d in phase.dtypes if phase.supports_dtype_on(d, cc)]
    shortest, longest = distribution.seqlens
    if distribution.longer_queries:
        seqlen_q = round(_log_uniform(u[2], shortest + 1, longest))
        seqlen_k = round(_log_uniform(u[3], shortest, seqlen_q - 1))
    else:
        seqlen_q = round(_log_uniform(u[2], shortest, longest))
        same = not phase.cross_lengths or u[4] < distribution.equal_lengths
        seqlen_k = seqlen_q if same else round(_log_uniform(u[3], shortest, longest))
    head_dim = _pick(u[5], phase.head_dims)
    batch, heads = 1 + int(u[0] * 4), 1 + int(u[1] * 8)
    per_head = seqlen_q * seqlen_k * head_dim
    batch = max(1, min(batch, MAX_WORK // (heads * per_head)))
    heads = max(1, min(heads, MAX_WORK // (batch * per_head)))
    scale = None
    if u[8] >= distribution.default_scale:
        scale = _log_uniform(u[9], *distribution.scale_factors) / math.sqrt(head_dim)
    case = Case(f"{distribution.name}-{index}", batch, heads, seqlen_q, head_dim,
                causal=phase.causal and u[7] < 0.5, seqlen_k=seqlen_k,
                magnitude=_log_uniform(u[10], *distribution.magnitudes))
    return Problem(case, _pick(u[6], dtypes), scale, _pick(u[11], LAYOUTS), seed)


def draw(phase: Phase, cc: int, distribution: Distribution = RANDOM) -> list[Problem]:
    """The distribution's problems for a phase (none where the phase cannot take its kind: Sq > Sk
    without cross lengths)."""
    if distribution.longer_queries and not phase.cross_lengths:
        return []
    return [draw_one(phase, cc, distribution, index) for index in range(distribution.count)]


# --- measuring -------------------------------------------------------------------------------------

def run(fns: dict, problems: list[Problem], distribution: str, device="cuda") -> list[dict]:
    """Every problem through every build (label -> attention function); the reference and SDPA's
    error once per problem. One row per problem: its parameters, SDPA's error, and per build the
    error (`max_abs_err`) and the outputs left unwritten (`unwritten`)."""
    rows = []
    for problem in problems:
        q, k, v = problem.inputs(device)
        causal = problem.case.causal
        reference, sdpa_err = reference_and_sdpa_error(q, k, v, causal, problem.scale)
        errors, unwritten = {}, {}
        for label, fn in fns.items():
            errors[label], unwritten[label] = kernel_error(fn, q, k, v, causal, problem.scale, reference)
        rows.append({"distribution": distribution, **problem.as_row(), "sdpa_max_abs_err": sdpa_err,
                     "max_abs_err": errors, "unwritten": unwritten})
    return rows


def builds_of(phase_name: str) -> dict[str, dict]:
    """label -> defines of the builds an accuracy record measures: the defaults, then the variants
    tagged "accuracy"."""
    return {DEFAULTS: {}, **get(phase_name).variants_tagged(TAG)}


def measure(phase_name: str, builds: dict[str, dict]) -> tuple[dict, list[dict]]:
    """The phase's builds (label -> defines) loaded on this GPU, and their rows (run()) on every
    distribution."""
    from .binding import load
    fns = {label: load(phase_name, **defines) for label, defines in builds.items()}
    cc = env.gpu().cc
    return fns, [row for d in DISTRIBUTIONS for row in run(fns, draw(get(phase_name), cc, d), d.name)]


def time_builds(fns: dict) -> list[dict]:
    """Each build's GPU time at the timing cases (fp16), SDPA default and the defaults in the same
    interleaved rounds: the speed side of a change that buys accuracy."""
    from .bench import compare, paired_ratio
    rows = []
    for case in shapes.TIMING:
        timings = compare(fns, case, ("sdpa_default",), rounds=experiments.EXPERIMENT_ROUNDS)
        for label in fns:
            rows.append({"build": label, "case": case.name, "gpu_us": timings[label]["gpu_us"],
                         "vs_defaults": paired_ratio(timings[label], timings[DEFAULTS]),
                         "vs_sdpa": paired_ratio(timings[label], timings["sdpa_default"])})
    return rows


def record_name(phase_name: str) -> str:
    return f"{phase_name}_accuracy"


def prebuild(phase_names: list[str], cc: int) -> None:
    """Compile every build of these phases' records at once, in parallel; raise on one that fails."""
    from .build import CompileError, compile_message
    builds = [(name, {**get(name).tile_params_for(cc), **defines})
              for name in phase_names for defines in builds_of(name).values()]
    failures = [f"{name} ({experiments.config_label(params)}): {compile_message(log)}"
                for (name, params), log in zip(builds, experiments.compile_in_parallel(builds, cc)) if log]
    if failures:
        raise CompileError("\n".join(failures))


def record(phase_name: str) -> Path:
    """Measure the phase's builds on every distribution and write its record; with variants, time
    them too."""
    builds = builds_of(phase_name)
    fns, rows = measure(phase_name, builds)
    record = experiments.make_record(record_name(phase_name), phase_name, builds, rows)
    record["distributions"] = [asdict(d) for d in DISTRIBUTIONS]
    record["ptxas"] = {label: {"registers": fn.build.ptxas.registers,
                               "spill_bytes": fn.build.ptxas.spill_stores + fn.build.ptxas.spill_loads}
                       for label, fn in fns.items()}
    if len(fns) > 1:
        record["timing"] = time_builds(fns)
    return results.write(record)


# --- reading a record -------------------------------------------------------------------------------

def recorded(gpu_slug: str = results.DEFAULT_GPU, root: Path = RESULTS_DIR) -> tuple[dict[str, dict], list[str]]:
    """The accuracy records of the registered phases, in order, and the phases that have none yet."""
    found = {name: experiments.load(record_name(name), gpu_slug, root) for name in PHASES
             if results.experiment_path(record_name(name), gpu_slug, root).exists()}
    return found, [name for name in PHASES if name not in found]


def error_ratio(err: float, sdpa_err: float) -> float:
    """err / SDPA's err; 1 where both are exact (0); infinite where only SDPA is, or where the output
    holds a NaN (an element left unwritten)."""
    if math.isnan(err):
        return math.inf
    if sdpa_err > 0:
        return err / sdpa_err
    return 1.0 if err == 0 else math.inf


def build_labels(record: dict) -> list[str]:
    """The record's builds in the registry's order (a record's JSON keeps its keys sorted)."""
    labels = list(record["builds"]) if "builds" in record else list(record["rows"][0]["max_abs_err"])
    if "phase" not in record:
        return labels
    order = list(builds_of(record["phase"]))
    return sorted(labels, key=lambda label: order.index(label) if label in order else len(order))


def frame(record: dict) -> pd.DataFrame:
    """One row per (build, problem), builds in build_labels order: the problem's parameters
    (scale_factor: its softmax scale over 1/sqrt(D)), SDPA's error, the build's error and unwritten
    outputs, `ratio` (error_ratio) and `passed` (the book's rule). `record` needs only its rows."""
    rows = []
    labels = build_labels(record)
    for row in record["rows"]:
        problem = {k: v for k, v in row.items() if k not in ("max_abs_err", "unwritten")}
        problem["scale_factor"] = 1.0 if row["scale"] is None else row["scale"] * math.sqrt(row["head_dim"])
        for label in labels:
            err, unwritten = row["max_abs_err"][label], row["unwritten"][label]
            rows.append({"build": label, **problem, "max_abs_err": err, "unwritten": unwritten,
                         "ratio": error_ratio(err, row["sdpa_max_abs_err"]),
                         "passed": passes(err, row["sdpa_max_abs_err"], unwritten)})
    return pd.DataFrame(rows)


def describe(row) -> str:
    """A problem in one line, enough to find it in the record and to run it again (Problem.from_row)."""
    scale = "1/sqrt(D)" if row["scale"] is None or pd.isna(row["scale"]) else f"{row['scale_factor']:.2f}/sqrt(D)"
    return (f"{row['problem']}: {row['batch']}x{row['heads']}x{row['seqlen_q']}x{row['head_dim']} "
            f"Sk={row['seqlen_k']}{' causal' if row['causal'] else ''} {row['dtype']} {row['layout']} "
            f"scale {scale} x{row['magnitude']:.1f}")


def percentile(ratios: pd.Series, q: float) -> float:
    """The ratio that a share q of the problems do not exceed: one of them, never an interpolation
    (which an infinite ratio would turn into NaN)."""
    return ratios.quantile(q, interpolation="higher")


def summary(frame: pd.DataFrame, by=("build", "dtype")) -> pd.DataFrame:
    """Per group: problems, how many pass, the worst ratio to SDPA's error, its 99th percentile and
    median, and the worst problem (describe())."""
    groups = []
    for key, part in frame.groupby(list(by), sort=False):
        worst = part.loc[part["ratio"].idxmax()]
        groups.append({**dict(zip(by, key if isinstance(key, tuple) else (key,))), "problems": len(part),
                       "passed": int(part["passed"].sum()), "worst": worst["ratio"],
                       "99th percentile": percentile(part["ratio"], 0.99), "median": part["ratio"].median(),
                       "worst problem": describe(worst)})
    return pd.DataFrame(groups)


def defaults(frame: pd.DataFrame, distribution: str = RANDOM.name) -> pd.DataFrame:
    """The default build's rows on one distribution."""
    return frame[(frame["build"] == DEFAULTS) & (frame["distribution"] == distribution)]


def failures(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows that fail the book's rule, worst ratio first."""
    return frame[~frame["passed"]].sort_values("ratio", ascending=False)


def missing_message(gpu_slug: str = results.DEFAULT_GPU) -> str:
    return (f"Not recorded yet for {gpu_slug}: record it on that GPU with `python -m flashcore_nb accuracy` "
            f"(writes results/{gpu_slug}/experiments/<phase>_accuracy.json).")
