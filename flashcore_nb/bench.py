"""Speed: ours and every baseline timed in interleaved rounds, in one process, on the same inputs.

Each method is captured as a CUDA graph of back-to-back calls (launch overhead excluded: GPU
time), once per copy of the inputs. In every round the methods' replays alternate (A B C A B C …,
the starting method rotated from round to round), so that whatever drifts during a run (clocks,
temperature, a neighbour on the GPU) touches every method alike. The rounds cycle through three
copies of the inputs at different addresses, so that no one placement decides a median. A round
also times back-to-back Python calls (call latency: what a user's loop sees; every method allocates
its output). `record` spreads the rounds over fresh processes (processes.py, pooled() here). The
methodology page tells what each of these changed in the records. Per method the record keeps the
median and the spread over rounds; a ratio between two methods is the median of their per-round
ratios (paired), never a ratio of medians taken at different times."""
from __future__ import annotations

import statistics
import subprocess
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .check import make_inputs
from .shapes import Case

SDPA_BACKENDS = {
    "sdpa_default": None,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
}
TRITON = "triton"                        # the project's own Triton kernel (triton_peer.py)
BASELINES = (*SDPA_BACKENDS, TRITON)     # every method a phase is timed beside
ROUNDS = 9                               # odd, so the median of a ratio is the inverse of the inverse's
COPY_OFFSETS_KB = (1028, 3140)           # the rounds cycle through the inputs and copies placed at these
GRAPH_TARGET_MS = 5.0                    # one graph replay lasts about this long
REPLAYS_PER_ROUND = 3                    # a round's sample is the median of this many replays
LATENCY_TARGET_MS = 20.0                 # back-to-back calls per round: about this long, 3 at least
CLOCK_PROBE_MS = 300.0                   # GPU work queued while nvidia-smi reads the SM clock


def short_name(method: str) -> str:
    """A timed method's name for a crowded table or figure: 'p07_registers' -> 'p07', 'p09_warpspec:192-row' ->
    'p09:192-row', 'sdpa_cudnn' -> 'cudnn'."""
    if method.startswith("sdpa_"):
        return method.removeprefix("sdpa_")
    phase, _, configuration = method.partition(":")
    return phase.split("_")[0] + (f":{configuration}" if configuration else "")


def event_time_us(call, iterations: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iterations


class _Graph:
    """`call` captured `calls` times back to back; `call` must launch on the current stream."""

    def __init__(self, call):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # warm-up (and any autotuning) outside the capture
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(side)
        self.estimate_us = event_time_us(call, 3)
        self.calls = max(1, min(200, round(GRAPH_TARGET_MS * 1e3 / max(self.estimate_us, 1e-3))))
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for _ in range(self.calls):
                call()
        self.graph.replay()
        torch.cuda.synchronize()

    def replay_us(self) -> float:
        """GPU time of one call, from one replay."""
        return event_time_us(self.graph.replay, 1) / self.calls


def gpu_time_us(call, repeats: int = 15) -> dict:
    """One method alone (chapter 0's timing-method experiment): median and minimum over replays."""
    graph = _Graph(call)
    times = [graph.replay_us() for _ in range(repeats)]
    return {"gpu_us": statistics.median(times), "gpu_us_min": min(times), "gpu_us_all": times}


def call_latency_us(call, calls: int = 50) -> float:
    """Wall time per call for back-to-back Python calls (what a user's loop sees)."""
    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / calls


def sm_clock_mhz(busy: _Graph) -> float | None:
    """The SM clock nvidia-smi reads while `busy` keeps the GPU working (None without nvidia-smi)."""
    for _ in range(max(1, round(CLOCK_PROBE_MS * 1e3 / (busy.replay_us() * busy.calls)))):
        busy.graph.replay()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
                              f"--id={torch.cuda.current_device()}"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        return float(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    finally:
        torch.cuda.synchronize()


def interleaved(calls: dict, latency_calls: int, rounds: int = ROUNDS) -> dict:
    """Time every method in interleaved rounds. `calls`: name -> one call per copy of the inputs (the
    same number for every method); round r runs every method on copy r mod copies. Returns name ->
    {gpu_us (median), gpu_us_min, gpu_us_max, gpu_us_rounds, call_us (median), call_us_rounds}, plus
    "sm_clock_mhz": [before, after]."""
    copies = {len(per_copy) for per_copy in calls.values()}
    if len(copies) != 1:
        raise ValueError(f"every method needs one call per copy of the inputs; got {copies} calls")
    graphs = {name: [_Graph(call) for call in per_copy] for name, per_copy in calls.items()}
    names = list(graphs)
    # A slow method's call latency is its GPU time: a few calls tell it.
    per_method_calls = {name: max(3, min(latency_calls, round(LATENCY_TARGET_MS * 1e3 / (g[0].estimate_us + 1e-3))))
                        for name, g in graphs.items()}
    samples = {name: {"gpu": [], "call": []} for name in names}
    first = graphs[names[0]][0]
    clock_before = sm_clock_mhz(first)
    for r in range(rounds + 1):          # round 0 warms every method up and is not kept
        copy = r % len(graphs[names[0]])
        order = names[r % len(names):] + names[:r % len(names)]
        # The replays of all methods alternate (A B C A B C …): a round's samples share one stretch of clock.
        replays = {name: [] for name in names}
        for _ in range(REPLAYS_PER_ROUND):
            for name in order:
                replays[name].append(graphs[name][copy].replay_us())
        for name in order:
            call = call_latency_us(calls[name][copy], per_method_calls[name])
            if r:
                samples[name]["gpu"].append(statistics.median(replays[name]))
                samples[name]["call"].append(call)
    timings = {name: summary(s["gpu"], s["call"]) for name, s in samples.items()}
    timings["sm_clock_mhz"] = [clock_before, sm_clock_mhz(first)]
    return timings


def summary(gpu_rounds: list[float], call_rounds: list[float]) -> dict:
    """One method's samples, a GPU time and a call latency per round, as the record keeps them."""
    return {"gpu_us": statistics.median(gpu_rounds), "gpu_us_min": min(gpu_rounds), "gpu_us_max": max(gpu_rounds),
            "gpu_us_rounds": gpu_rounds, "call_us": statistics.median(call_rounds), "call_us_rounds": call_rounds}


def placed(tensors, offset_bytes: int) -> list:
    """Contiguous copies of `tensors`, laid out one after another from `offset_bytes` into one new buffer."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    buffer = torch.empty(offset_bytes + sum(sizes), dtype=torch.uint8, device=tensors[0].device)
    copies, at = [], offset_bytes
    for t, size in zip(tensors, sizes):
        view = buffer[at:at + size].view(t.dtype).view(t.shape)
        view.copy_(t)
        copies.append(view)
        at += size
    return copies


def input_copies(q, k, v) -> list[tuple]:
    """The inputs, and copies of them in buffers of their own at other offsets (other pages, other L2 sets)."""
    return [(q, k, v)] + [tuple(placed((q, k, v), kb * 1024)) for kb in COPY_OFFSETS_KB]


def process_ratios(a: dict, b: dict, key: str = "gpu_us", processes: int = 1) -> list[float]:
    """a's time / b's time in the same round (below 1: a is faster), the median over each process's rounds:
    rounds run in `processes` consecutive equal groups, one per process (processes.py)."""
    ratios = [x / y for x, y in zip(a[f"{key}_rounds"], b[f"{key}_rounds"])]
    if len(ratios) % processes:
        raise ValueError(f"{len(ratios)} rounds do not split into {processes} processes")
    per = len(ratios) // processes
    return [statistics.median(ratios[i * per:(i + 1) * per]) for i in range(processes)]


def paired_ratio(a: dict, b: dict, key: str = "gpu_us", processes: int = 1) -> float:
    """The paired ratio a / b: the median over a process's rounds, averaged over processes. Within a process
    the median drops an odd round. Between processes it is a mean because what differs there is a state a
    process keeps all its life (chapter 0's process table): a median of rounds pooled over processes lands
    on one state or another (python -m flashcore_nb procstate), a mean weighs each process the same."""
    return statistics.fmean(process_ratios(a, b, key, processes))


def sdpa_call(backend, q, k, v, causal: bool):
    """SDPA with one backend (None: PyTorch's own choice), or None where it cannot run these inputs."""
    def call():
        with sdpa_kernel(backend) if backend is not None else nullcontext():   # a context is single-use
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    try:
        call()
        torch.cuda.synchronize()
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    return call


def triton_call(q, k, v, causal: bool):
    """The Triton peer, or None where triton does not import."""
    try:
        from . import triton_peer
    except ImportError:
        return None
    return lambda: triton_peer.attention(q, k, v, causal=causal)


def baseline_calls(names, inputs: list[tuple], causal: bool) -> dict:
    """name -> one call per copy of the inputs, for each baseline that runs here (absent ones are left out)."""
    def calls_for(name):
        make = (lambda q, k, v: triton_call(q, k, v, causal)) if name == TRITON else \
            (lambda q, k, v: sdpa_call(SDPA_BACKENDS[name], q, k, v, causal))
        per_copy = [make(*qkv) for qkv in inputs]
        return None if any(call is None for call in per_copy) else per_copy

    calls = {name: calls_for(name) for name in names}
    return {name: per_copy for name, per_copy in calls.items() if per_copy is not None}


def latency_calls(case: Case) -> int:
    return 50 if case.flops() < 1e10 else 5


def compare(fns: dict, case: Case, baselines=BASELINES, dtype=torch.float16, rounds: int = ROUNDS) -> dict:
    """FlashCore functions (label -> fn) and baselines timed in the same interleaved rounds on the same
    inputs: label/baseline -> timing (interleaved()) with its TFLOP/s, and "sm_clock_mhz"."""
    inputs = input_copies(*make_inputs(case, dtype, seed=1))

    def phase_call(fn, q, k, v):   # allocates its output, as SDPA does
        return lambda: fn(q, k, v, causal=case.causal)

    calls = {label: [phase_call(fn, *qkv) for qkv in inputs] for label, fn in fns.items()}
    calls.update(baseline_calls(baselines, inputs, case.causal))
    return timed(calls, case, rounds)


def timed(calls: dict, case: Case, rounds: int = ROUNDS) -> dict:
    """interleaved() over `calls` (name -> one call per copy of the inputs) on a case, with each method's TFLOP/s."""
    timings = interleaved(calls, latency_calls(case), rounds)
    for name in calls:
        timings[name]["tflops"] = tflops(case, timings[name]["gpu_us"])
    return timings


def tflops(case: Case, gpu_us: float) -> float:
    return case.flops() / (gpu_us * 1e-6) / 1e12


def bench_case(fn, case: Case, dtype=torch.float16, rounds: int = ROUNDS) -> dict:
    """One phase and every baseline: the phase's timing, with "baselines": name -> timing plus
    "time_ratio" (the phase's GPU time / the baseline's, paired over rounds) and "call_ratio" (the
    same for call latency); None for a baseline that cannot run here."""
    timings = compare({"ours": fn}, case, BASELINES, dtype, rounds)
    ours = timings.pop("ours")
    ours["sm_clock_mhz"] = timings.pop("sm_clock_mhz")
    ours["rounds"], ours["processes"] = rounds, 1
    ours["baselines"] = {name: None for name in BASELINES}
    for name, timing in timings.items():
        ours["baselines"][name] = with_paired_ratios(ours, timing)
    return ours


def with_paired_ratios(ours: dict, timing: dict, processes: int = 1) -> dict:
    """A baseline's timing with its paired ratios to ours (paired_ratio), and their per-process values where
    the rounds ran in several processes."""
    paired = {**timing, "time_ratio": paired_ratio(ours, timing, processes=processes),
              "call_ratio": paired_ratio(ours, timing, "call_us", processes)}
    if processes > 1:
        paired["time_ratio_processes"] = process_ratios(ours, timing, processes=processes)
    return paired


def pooled(parts: list[dict], case: Case) -> dict:
    """bench_case results of the same case from several processes (processes.py) as one: their rounds
    joined in the order they ran, the medians and spread taken over all of them, the paired ratios per
    process and averaged (paired_ratio), and the SM clock read before and after each process's rounds."""
    def joined(timings):
        timing = summary([x for t in timings for x in t["gpu_us_rounds"]],
                         [x for t in timings for x in t["call_us_rounds"]])
        timing["tflops"] = tflops(case, timing["gpu_us"])
        return timing

    ours = joined(parts)
    ours.update(rounds=len(ours["gpu_us_rounds"]), processes=len(parts),
                sm_clock_mhz=[mhz for part in parts for mhz in part["sm_clock_mhz"]], baselines={})
    for name in parts[0]["baselines"]:
        per_process = [part["baselines"][name] for part in parts]
        ours["baselines"][name] = (None if None in per_process
                                   else with_paired_ratios(ours, joined(per_process), len(parts)))
    return ours


def side_by_side(fns: dict, case: str | Case, dtype=torch.float16, rounds: int = ROUNDS):
    """The "Try this" exercises' timer: builds of a phase (label -> function, e.g. flashcore_nb.load(name) and the
    same with one switch changed), each checked once on a case (a name from shapes.py, or a shapes.Case of your
    own), then timed with SDPA default in the same interleaved rounds. A table, one row per build: the check,
    the median GPU time and its spread over the rounds, and the GPU time paired with the first build's and
    with SDPA default's."""
    import pandas as pd

    from .check import check
    from .shapes import select
    case = select(case)[0] if isinstance(case, str) else case
    checks = {label: check(fn, case, dtype) for label, fn in fns.items()}
    timings = compare(fns, case, ("sdpa_default",), dtype, rounds)
    first = next(iter(fns))
    return pd.DataFrame([{"build": label, "correct": checks[label].passed, "GPU µs": timings[label]["gpu_us"],
                          "spread µs": f"{timings[label]['gpu_us_min']:.1f}-{timings[label]['gpu_us_max']:.1f}",
                          f"GPU time / {first}": paired_ratio(timings[label], timings[first]),
                          "GPU time / SDPA default": paired_ratio(timings[label], timings["sdpa_default"])}
                         for label in fns])


def baseline_us(baselines: dict | None, name: str) -> float | None:
    """GPU time of one baseline from a run's `baselines` (None where it did not run)."""
    timing = (baselines or {}).get(name)
    return timing["gpu_us"] if timing else None


def time_ratio(baselines: dict | None, name: str) -> float | None:
    """The phase's GPU time over one baseline's, paired over rounds (None where it did not run)."""
    timing = (baselines or {}).get(name)
    return timing["time_ratio"] if timing else None


def matmul_tflops(n: int = 8192, dtype=torch.float16) -> float:
    """This GPU's measured dense matmul rate (fp32 accumulate): the "100%" of % of peak."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    us = event_time_us(lambda: a @ b, 10)
    return 2.0 * n ** 3 / (us * 1e-6) / 1e12
