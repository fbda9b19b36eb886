"""A measured timeline of one CTA (issue 16): what each warpgroup of CTA 0 did, and when.

    python -m flashcore_nb trace --phase p09_warpspec   # writes results/<gpu>/experiments/p09_warpspec_trace.json

The phase's variants tagged "trace" are instrumented builds (-DTRACE=1, kernels/common/trace.cuh): one thread
per warpgroup of CTA 0 stamps each step (copies issued, barrier waits, wgmmas issued and waited for, softmax,
epilogue, ping-pong turns) with the SM's clock64 into a device buffer, and %globaltimer beside it at its first and
last event, so that cycles convert to nanoseconds. Every span drawn is two stamps taken on the GPU, not a model;
but the build is instrumented, so its times are a little longer than the real kernel's, and no record of it is
ever a timing. On each of its cases (CASES, or its own in BUILD_CASES, or --shapes) each build is checked once
(which also warms it up), launched once more with the buffer reset, and the buffer is read through the
extension's own exported functions (ctypes on its shared library). The record keeps every event of CTA 0's
first RECORDED_ITEMS work items, the share of time each warpgroup spent in each kind of span over all of its
items, and any rule of a well-formed trace the events break (`problems`). plots.timeline draws a record's case
and build."""
from __future__ import annotations

import ctypes
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from . import experiments, results, shapes
from .paths import RESULTS_DIR
from .phases import PHASES, get

TAG = "trace"
TRACED = [name for name, phase in PHASES.items() if phase.variants_tagged(TAG)]
CASES = ("b4h16_s2048", "b2h16_s4096_d128")
# Builds traced on cases of their own: the one-consumer and cluster candidates where `attention` chooses them,
# problems that leave SMs idle (the mission shape: one work item per CTA or cluster, so where its time goes is one
# chain of steps; the trace sees CTA 0 of a cluster, the one that waits for the other's partial result).
BUILD_CASES = {"one consumer, 64-row work items (TRACE=1)": ("mission", "b1h16_s512_d128"),
               "two CTAs of a cluster split a 64-row item's keys (TRACE=1)": ("mission",)}
RECORDED_ITEMS = 2   # CTA 0's first work item, and the start of its next (where a persistent CTA overlaps them)
INSTRUMENTED = ("instrumented build (TRACE=1): one thread per warpgroup of CTA 0 stores a clock64 stamp per event; "
                "its times are slightly longer than the uninstrumented kernel's, and it is never a timing")

# kernels/common/trace.cuh's TraceKind, in order (kTrace<name>); a test compares the two.
KINDS = ("QIssue", "KVIssue", "EmptyWaitBegin", "EmptyWaitEnd", "QWaitBegin", "QWaitEnd", "KWaitBegin", "KWaitEnd",
         "VWaitBegin", "VWaitEnd", "ScoresIssue", "ScoresDone", "ValuesIssue", "ValuesDone", "SoftmaxBegin",
         "SoftmaxEnd", "Release", "EpilogueBegin", "EpilogueEnd", "TurnWait", "TurnTaken", "TurnHanded")
# The span each opening event starts: (the event that ends it, the span's name).
SPANS = {"EmptyWaitBegin": ("EmptyWaitEnd", "empty wait"), "QWaitBegin": ("QWaitEnd", "Q wait"),
         "KWaitBegin": ("KWaitEnd", "K wait"), "VWaitBegin": ("VWaitEnd", "V wait"),
         "ScoresIssue": ("ScoresDone", "Q·Kᵀ"), "ValuesIssue": ("ValuesDone", "P·V"),
         "SoftmaxBegin": ("SoftmaxEnd", "softmax"), "EpilogueBegin": ("EpilogueEnd", "epilogue"),
         "TurnWait": ("TurnTaken", "turn wait")}
_CLOSING = {end: begin for begin, (end, _) in SPANS.items()}

# The device buffer's records, as trace.cuh lays them out.
EVENT_DTYPE = np.dtype([("cycles", "<u8"), ("item", "<u2"), ("kind", "u1"), ("role", "u1"), ("tile", "<i4")])
CLOCK_DTYPE = np.dtype([("cycles", "<u8"), ("ns", "<u8")])


def record_name(phase_name: str) -> str:
    return f"{phase_name}_trace"


def cases_of(build: str) -> tuple[str, ...]:
    """The cases a trace build is recorded on."""
    return BUILD_CASES.get(build, CASES)


def role_name(role: int) -> str:
    return "producer" if role == 0 else f"consumer {role}"


# --- the instrumented build's buffer (on a GPU) ------------------------------------------------------------

def library(fn) -> ctypes.CDLL:
    """The loaded extension of `fn` (binding.load) as a C library, for its trace functions."""
    lib = ctypes.CDLL(fn.build.module.__file__)   # the same handle: the module is loaded already
    if not hasattr(lib, "flashcore_trace_read"):
        raise RuntimeError(f"{fn.build.name} was built without TRACE=1: it records no trace")
    lib.flashcore_trace_shape.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    lib.flashcore_trace_shape.restype = None
    lib.flashcore_trace_reset.restype = ctypes.c_int
    lib.flashcore_trace_read.argtypes = [ctypes.c_void_p] * 3
    lib.flashcore_trace_read.restype = ctypes.c_int
    return lib


def _cuda_call(code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"{what} failed with CUDA error {code}")


def reset(lib: ctypes.CDLL) -> None:
    _cuda_call(lib.flashcore_trace_reset(), "flashcore_trace_reset")


def read(lib: ctypes.CDLL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The buffer after a launch: events [roles, capacity], counts [roles], clocks [roles, 2] (first, last)."""
    roles, capacity = ctypes.c_int(), ctypes.c_int()
    lib.flashcore_trace_shape(ctypes.byref(roles), ctypes.byref(capacity))
    events = np.zeros((roles.value, capacity.value), EVENT_DTYPE)
    counts = np.zeros(roles.value, np.uint32)
    clocks = np.zeros((roles.value, 2), CLOCK_DTYPE)
    _cuda_call(lib.flashcore_trace_read(events.ctypes.data, counts.ctypes.data, clocks.ctypes.data),
               "flashcore_trace_read")
    return events, counts, clocks


def decode(events: np.ndarray, counts: np.ndarray, clocks: np.ndarray) -> dict:
    """The buffer as a trace: every stored event (cycles from the CTA's first stamp), the ns per cycle measured
    over the CTA (%globaltimer against clock64 from the earliest first stamp to the latest last one), and the
    events each role had beyond the buffer's capacity."""
    capacity = events.shape[1]
    recorded = [role for role in range(len(counts)) if counts[role] > 0]
    if not recorded:
        raise RuntimeError("the trace is empty: no role of CTA 0 recorded an event")
    first = min((clocks[role, 0] for role in recorded), key=lambda c: c["cycles"])
    last = max((clocks[role, 1] for role in recorded), key=lambda c: c["cycles"])
    cycles = int(last["cycles"]) - int(first["cycles"])
    stored = np.concatenate([events[role, :min(int(counts[role]), capacity)] for role in recorded])
    return {
        "ns_per_cycle": (int(last["ns"]) - int(first["ns"])) / cycles if cycles > 0 else float("nan"),
        "cta_cycles": cycles,
        "dropped": {role_name(role): int(counts[role]) - capacity for role in recorded if counts[role] > capacity},
        "events": {"role": stored["role"].tolist(), "kind": stored["kind"].tolist(), "item": stored["item"].tolist(),
                   "tile": stored["tile"].tolist(),
                   "cycles": (stored["cycles"].astype(np.int64) - np.int64(first["cycles"])).tolist()},
    }


def capture(fn, case: shapes.Case) -> dict:
    """One warm traced launch of `fn` (an instrumented build) on `case`: checked first, run once on the inputs the
    traced launch reads (so they are in L2, as in a timing's rounds), then launched with the buffer reset, and read."""
    import torch

    from .check import check, make_inputs
    result = check(fn, case)
    q, k, v = make_inputs(case)
    fn(q, k, v, causal=case.causal)
    lib = library(fn)
    torch.cuda.synchronize()
    reset(lib)
    fn(q, k, v, causal=case.causal)
    torch.cuda.synchronize()
    return {"passed": result.passed, "max_abs_err": result.max_abs_err, "sdpa_max_abs_err": result.sdpa_max_abs_err,
            **decode(*read(lib))}


def record(phase_name: str, cases: list[shapes.Case] | None = None, progress=print, root: Path = RESULTS_DIR) -> Path:
    """Every build tagged "trace" on its cases (`cases`, or cases_of): the record
    results/<gpu>/experiments/<phase>_trace.json."""
    from .binding import load as load_phase
    builds = get(phase_name).variants_tagged(TAG)
    rows = []
    for label, defines in builds.items():
        fn = load_phase(phase_name, **defines)
        for case in cases or shapes.select(",".join(cases_of(label))):
            captured = capture(fn, case)
            frame = events_frame(captured)
            row = {"build": label, "case": case.name, "shape": case.label(),
                   **{key: value for key, value in captured.items() if key != "events"},
                   "items": int(frame["item"].max()) + 1, "problems": problems(frame), "busy": busy(frame),
                   "events": first_items(captured["events"], RECORDED_ITEMS)}
            progress(f"{label}, {case.name}: {'correct' if row['passed'] else 'WRONG'}, CTA 0 "
                     f"{row['cta_cycles'] * row['ns_per_cycle'] / 1000:.1f} µs over {row['items']} work item(s), "
                     f"{len(frame)} events, {len(row['problems'])} problem(s)")
            rows.append(row)
    out = experiments.make_record(record_name(phase_name), phase_name, builds, rows)
    out["instrumented"] = INSTRUMENTED
    return results.write(out, root)


def first_items(events: dict, items: int) -> dict:
    """The events (columns, as decode returns them) of the first `items` work items."""
    keep = [item < items for item in events["item"]]
    return {key: [value for value, kept in zip(values, keep) if kept] for key, values in events.items()}


# --- reading a trace (anywhere) ----------------------------------------------------------------------------

def load(phase_name: str, gpu_slug: str = results.DEFAULT_GPU, root: Path = RESULTS_DIR) -> dict | None:
    return experiments.load_if_recorded(record_name(phase_name), gpu_slug, root)


def missing_message(phase_name: str, gpu_slug: str = results.DEFAULT_GPU) -> str:
    return experiments.missing_message(record_name(phase_name), f"The trace of one {phase_name} CTA",
                                       f"trace --phase {phase_name}", gpu_slug)


def row(record: dict, case: str, build: str) -> dict:
    for candidate in record["rows"]:
        if candidate["case"] == case and candidate["build"] == build:
            return candidate
    raise KeyError(f"the trace record has no case {case!r} of build {build!r}; it has "
                   f"{sorted({(r['case'], r['build']) for r in record['rows']})}")


def events_frame(trace: dict) -> pd.DataFrame:
    """A trace's (or a record row's) events, one row each: role, kind (its name), item, tile, cycles, in the order
    each role recorded them."""
    frame = pd.DataFrame(trace["events"])
    frame["kind"] = [KINDS[kind] for kind in frame["kind"]]
    return frame


def _pair(events: pd.DataFrame) -> tuple[list[dict], list[str]]:
    """Each role's opening events matched with the events that close them, in order; and what failed to match."""
    spans, broken = [], []
    for role, part in events.groupby("role", sort=True):
        opened = {}
        for kind, item, tile, cycles in part[["kind", "item", "tile", "cycles"]].itertuples(index=False):
            if kind in SPANS:
                if kind in opened:
                    broken.append(f"{role_name(role)}: {kind} of item {item} tile {tile} before the last one closed")
                opened[kind] = (item, tile, cycles)
            elif kind in _CLOSING:
                begin = _CLOSING[kind]
                start = opened.pop(begin, None)
                if start is None or start[:2] != (item, tile):
                    broken.append(f"{role_name(role)}: {kind} of item {item} tile {tile} without its {begin}")
                    continue
                spans.append({"role": role, "span": SPANS[begin][1], "item": item, "tile": tile, "start": start[2],
                              "end": cycles})
        broken += [f"{role_name(role)}: {kind} of item {item} tile {tile} never closed"
                   for kind, (item, tile, _) in opened.items()]
    return spans, broken


def spans(events: pd.DataFrame) -> pd.DataFrame:
    """Every span of the trace: role, span (its name), item, tile, start and end (cycles)."""
    return pd.DataFrame(_pair(events)[0], columns=["role", "span", "item", "tile", "start", "end"])


def problems(events: pd.DataFrame) -> list[str]:
    """The rules of a well-formed trace that these events break (none, for a correct kernel and recorder):
    each role's stamps never go back in time; every span opens and closes once, on one item and tile; every
    tile the producer issued is waited for (K and V) and released by every consumer, after it was issued;
    each consumer issues a tile's wgmmas only after waiting for its operand; a consumer waits only for tiles
    the producer issued."""
    found = [f"{role_name(role)}: its clock goes back at event {int(np.argmax(np.diff(part['cycles']) < 0)) + 1}"
             for role, part in events.groupby("role") if (np.diff(part["cycles"]) < 0).any()]
    found += _pair(events)[1]
    first = {}   # (role, kind, item, tile) -> cycles of its first occurrence
    for role, kind, item, tile, cycles in events[["role", "kind", "item", "tile", "cycles"]].itertuples(index=False):
        first.setdefault((role, kind, item, tile), cycles)
    issued = {(item, tile): cycles for (role, kind, item, tile), cycles in first.items() if kind == "KVIssue"}
    consumers = sorted(set(events["role"]) - {0})
    for (item, tile), at in issued.items():
        for role in consumers:
            for kind in ("KWaitEnd", "VWaitEnd", "Release"):
                seen = first.get((role, kind, item, tile))
                if seen is None:
                    found.append(f"{role_name(role)}: no {kind} of item {item} tile {tile}, which the producer issued")
                elif seen < at:
                    found.append(f"{role_name(role)}: {kind} of item {item} tile {tile} before the producer issued it")
    if 0 in set(events["role"]):
        found += [f"{role_name(role)}: waited for item {item} tile {tile}, which the producer never issued"
                  for (role, kind, item, tile) in first if kind == "KWaitEnd" and (item, tile) not in issued]
    for (role, kind, item, tile), at in first.items():
        operand = {"ScoresIssue": "KWaitEnd", "ValuesIssue": "VWaitEnd"}.get(kind)
        if operand and first.get((role, operand, item, tile), at + 1) > at:
            found.append(f"{role_name(role)}: {kind} of item {item} tile {tile} before its {operand}")
    return found


def busy(events: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per role, the share of its time (its first to its last stamp) spent in each kind of span."""
    table = spans(events)
    shares = defaultdict(dict)
    for role, part in events.groupby("role"):
        duration = part["cycles"].max() - part["cycles"].min()
        mine = table[table["role"] == role]
        for name, group in mine.groupby("span"):
            shares[role_name(role)][name] = round(float((group["end"] - group["start"]).sum() / duration), 4) \
                if duration > 0 else 0.0
    return dict(shares)
