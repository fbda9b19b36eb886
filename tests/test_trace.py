"""The measured timeline of one CTA (trace.py, kernels/common/trace.cuh), without a GPU: the instrumented builds
compile, the default build is the uninstrumented kernel, a synthetic buffer decodes into spans and draws."""
import ctypes.util
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from flashcore_nb import build, env, experiments, plots, trace
from flashcore_nb.paths import KERNELS_DIR
from flashcore_nb.phases import PHASES

TRACED = [(name, label, defines) for name in trace.TRACED
          for label, defines in PHASES[name].variants_tagged(trace.TAG).items()]


def test_kinds_mirror_the_header():
    header = (KERNELS_DIR / "common" / "trace.cuh").read_text()
    assert re.findall(r"\bkTrace(\w+) = (\d+),", header) == [(kind, str(i)) for i, kind in enumerate(trace.KINDS)]
    assert re.search(r"#ifndef TRACE\n#define TRACE 0\n", header)


def test_every_traced_phase_defaults_to_the_uninstrumented_build():
    assert trace.TRACED == ["p09_warpspec"]
    for name in trace.TRACED:
        assert PHASES[name].tile_params["TRACE"] == 0
        assert all(defines["TRACE"] == 1 for _, _, defines in (t for t in TRACED if t[0] == name))


@pytest.mark.parametrize("name,label,defines", TRACED, ids=[f"{n}-{label}" for n, label, _ in TRACED])
def test_instrumented_build_compiles_without_spills(name, label, defines):
    phase = PHASES[name]
    for cc in phase.archs:
        stats = build.compile_only(phase.kernel_file, cc, {**phase.tile_params_for(cc), **defines}, phase.arch_specific)
        assert stats.spill_stores <= phase.spill_budget_bytes and stats.spill_loads <= phase.spill_budget_bytes, stats


# Every line the instrumentation adds names the recorder, a stamp or the header; without them the kernel is the
# uninstrumented one.
_TRACE_LINE = re.compile(r"\btrace\.|TraceRecorder|common/trace\.cuh")


def _cubin(kernel_file, defines: dict, out) -> bytes:
    nvcc = env.nvcc_path()
    if nvcc is None:
        pytest.fail("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    cmd = [nvcc, "-cubin", "-O3", "-std=c++17", build.gencode(90, arch_specific=True), f"-I{KERNELS_DIR}",
           *build.define_flags(defines), str(kernel_file), "-o", str(out)]
    compiled = subprocess.run(cmd, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    return out.read_bytes()


@pytest.mark.parametrize("name", trace.TRACED)
def test_default_build_is_the_uninstrumented_kernel(name, tmp_path):
    """The default build's machine code is byte for byte the kernel's with every trace line taken out."""
    phase = PHASES[name]
    text = phase.kernel_file.read_text()
    stripped = tmp_path / phase.kernel_file.name
    stripped.write_text("\n".join(line for line in text.splitlines() if not _TRACE_LINE.search(line)) + "\n")
    assert "trace" not in re.sub(r"//.*", "", stripped.read_text()).lower()
    defaults = phase.tile_params_for(90)
    without_trace = {key: value for key, value in defaults.items() if key != "TRACE"}
    with ThreadPoolExecutor(2) as pool:
        default = pool.submit(_cubin, phase.kernel_file, defaults, tmp_path / "default.cubin")
        plain = pool.submit(_cubin, stripped, without_trace, tmp_path / "plain.cubin")
        assert default.result() == plain.result()


# --- a synthetic buffer: one work item, three key tiles, a producer and two consumers ------------------------

BASE_CYCLES, BASE_NS = 1000, 5000
CAPACITY = 64


def _consumer(offset: int) -> list[tuple]:
    events = [("QWaitBegin", 0, -1, 5), ("QWaitEnd", 0, -1, 15)]
    for tile in range(3):
        at = (20 + 40 * tile if tile < 2 else 100) + offset
        events += [("KWaitBegin", 0, tile, at), ("KWaitEnd", 0, tile, at + 2), ("ScoresIssue", 0, tile, at + 3),
                   ("ScoresDone", 0, tile, at + 10), ("SoftmaxBegin", 0, tile, at + 11), ("SoftmaxEnd", 0, tile, at + 20),
                   ("VWaitBegin", 0, tile, at + 21), ("VWaitEnd", 0, tile, at + 22), ("ValuesIssue", 0, tile, at + 23),
                   ("ValuesDone", 0, tile, at + 30), ("Release", 0, tile, at + 31)]
    return events + [("EpilogueBegin", 0, -1, 140 + offset), ("EpilogueEnd", 0, -1, 150 + offset)]


PRODUCER = [("QIssue", 0, -1, 0), ("KVIssue", 0, 0, 10), ("KVIssue", 0, 1, 20), ("EmptyWaitBegin", 0, 2, 35),
            ("EmptyWaitEnd", 0, 2, 100), ("KVIssue", 0, 2, 101)]


def synthetic_buffer(roles=(PRODUCER, _consumer(0), _consumer(5)), extra_counts=(0, 0, 0)):
    """A buffer as flashcore_trace_read fills it: 4 roles of CAPACITY events, 200 cycles = 100 ns."""
    events = np.zeros((4, CAPACITY), trace.EVENT_DTYPE)
    counts = np.zeros(4, np.uint32)
    clocks = np.zeros((4, 2), trace.CLOCK_DTYPE)
    for role, recorded in enumerate(roles):
        for i, (kind, item, tile, cycles) in enumerate(recorded):
            events[role, i] = (BASE_CYCLES + cycles, item, trace.KINDS.index(kind), role, tile)
        counts[role] = len(recorded) + extra_counts[role]
        clocks[role, 0] = (BASE_CYCLES + role, BASE_NS + role // 2)
        clocks[role, 1] = (BASE_CYCLES + 200 - role, BASE_NS + 100 - role // 2)
    return events, counts, clocks


def test_decode_reads_the_buffer_as_the_kernel_lays_it_out():
    assert trace.EVENT_DTYPE.itemsize == 16 and trace.CLOCK_DTYPE.itemsize == 16
    decoded = trace.decode(*synthetic_buffer())
    assert decoded["ns_per_cycle"] == pytest.approx(0.5) and decoded["cta_cycles"] == 200
    assert decoded["dropped"] == {}
    frame = trace.events_frame(decoded)
    assert len(frame) == len(PRODUCER) + 2 * len(_consumer(0))
    assert list(frame.loc[frame["role"] == 0, "kind"]) == [kind for kind, *_ in PRODUCER]
    assert frame["cycles"].min() == 0 and list(frame.loc[frame["role"] == 2, "cycles"])[2] == 25   # its first K wait


def test_decode_counts_the_events_past_the_capacity():
    decoded = trace.decode(*synthetic_buffer(extra_counts=(0, CAPACITY, 0)))
    assert decoded["dropped"] == {"consumer 1": len(_consumer(0))}


def test_decode_refuses_an_empty_buffer():
    with pytest.raises(RuntimeError, match="empty"):
        trace.decode(*synthetic_buffer(roles=()))


def test_spans_pair_each_opening_event_with_its_close():
    frame = trace.events_frame(trace.decode(*synthetic_buffer()))
    spans = trace.spans(frame)
    consumer = spans[spans["role"] == 1]
    assert sorted(consumer["span"].value_counts().items()) == [
        ("K wait", 3), ("P·V", 3), ("Q wait", 1), ("Q·Kᵀ", 3), ("V wait", 3), ("epilogue", 1), ("softmax", 3)]
    first_scores = consumer[(consumer["span"] == "Q·Kᵀ") & (consumer["tile"] == 0)].iloc[0]
    assert (first_scores["start"], first_scores["end"]) == (23, 30)
    assert list(spans.loc[spans["role"] == 0, "span"]) == ["empty wait"]
    assert trace.problems(frame) == []
    busy = trace.busy(frame)
    assert busy["producer"]["empty wait"] == pytest.approx(65 / 101, abs=1e-4)
    assert busy["consumer 1"]["softmax"] == pytest.approx(27 / 145, abs=1e-4)


@pytest.mark.parametrize("change,found", [
    (lambda c: [e for e in c if e[:3] != ("KWaitEnd", 0, 1)], "no KWaitEnd of item 0 tile 1"),
    (lambda c: [e for e in c if e[:3] != ("Release", 0, 2)], "no Release of item 0 tile 2"),
    (lambda c: [e if e[:3] != ("KWaitEnd", 0, 2) else ("KWaitEnd", 0, 2, 90) for e in c], "before the producer issued"),
    (lambda c: [e if e[:3] != ("SoftmaxEnd", 0, 0) else ("SoftmaxEnd", 0, 0, 0) for e in c], "clock goes back"),
    (lambda c: [e for e in c if e[:3] != ("SoftmaxEnd", 0, 1)], "SoftmaxBegin of item 0 tile 2 before the last"),
    (lambda c: [e for e in c if e[:3] != ("EpilogueEnd", 0, -1)], "EpilogueBegin of item 0 tile -1 never closed"),
    (lambda c: c + [("KWaitEnd", 0, 7, 200)], "tile 7, which the producer never issued"),
    (lambda c: [e for e in c if e[:3] != ("VWaitEnd", 0, 0)], "ValuesIssue of item 0 tile 0 before its VWaitEnd"),
])
def test_problems_name_what_breaks_a_well_formed_trace(change, found):
    broken = synthetic_buffer(roles=(PRODUCER, change(_consumer(0)), _consumer(5)))
    problems = trace.problems(trace.events_frame(trace.decode(*broken)))
    assert any(found in problem and problem.startswith("consumer 1") for problem in problems), problems


def synthetic_record() -> dict:
    decoded = trace.decode(*synthetic_buffer())
    frame = trace.events_frame(decoded)
    label = next(iter(PHASES["p09_warpspec"].variants_tagged(trace.TAG)))
    row = {"build": label, "case": "b4h16_s2048", "shape": "4x16x2048x64", "passed": True, **decoded,
           "items": 1, "problems": trace.problems(frame), "busy": trace.busy(frame)}
    record = experiments.make_record(trace.record_name("p09_warpspec"), "p09_warpspec",
                                     PHASES["p09_warpspec"].variants_tagged(trace.TAG), [row])
    record["instrumented"] = trace.INSTRUMENTED
    return record


def test_timeline_draws_one_row_per_warpgroup_lane():
    record = synthetic_record()
    fig = plots.timeline(record, "b4h16_s2048", tiles=2)
    ax = fig.axes[0]
    labels = [tick.get_text() for tick in ax.get_yticklabels()]
    assert labels == ["producer: TMA", "consumer 1: warp 0", "consumer 1: Q·Kᵀ", "consumer 1: P·V",
                      "consumer 2: warp 0", "consumer 2: Q·Kᵀ", "consumer 2: P·V"]
    # up to the last span of tile 1: consumer 2 sees its P·V done at 65 + 30 cycles
    assert ax.get_xlim()[1] == pytest.approx(95 * 0.5 / 1000)
    assert "TRACE=1" in ax.get_title() and "b4h16_s2048" in ax.get_title()
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "softmax" in legend and "K and V issued (TMA)" in legend
    assert "waiting for an empty buffer" in legend and "waiting for its turn (ping-pong)" not in legend
    with pytest.raises(KeyError, match="no case 'mission'"):
        plots.timeline(record, "mission")
    plots.plt.close("all")


def test_record_keeps_every_build_and_case_and_the_first_work_items(monkeypatch, tmp_path):
    """The recorder's path, with the GPU parts (the build, the traced launch) replaced by the synthetic buffer
    and a second work item added to it."""
    from flashcore_nb import binding, results
    second = [(kind, 1, tile, cycles + 200) for kind, _, tile, cycles in PRODUCER]
    buffer = synthetic_buffer(roles=(PRODUCER + second, _consumer(0), _consumer(5)))
    loaded = []
    monkeypatch.setattr(binding, "load", lambda name, **defines: loaded.append(defines) or SimpleNamespace())
    monkeypatch.setattr(trace, "capture", lambda fn, case: {"passed": True, **trace.decode(*buffer)})
    monkeypatch.setattr(results.env, "gpu", lambda index=None: SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", cc=90, driver="test", sms=132))
    monkeypatch.setattr(trace, "RECORDED_ITEMS", 1)
    path = trace.record("p09_warpspec", progress=lambda line: None, root=tmp_path)
    assert path == tmp_path / "nvidia-h100-80gb-hbm3" / "experiments" / "p09_warpspec_trace.json"
    record = trace.load("p09_warpspec", root=tmp_path)
    builds = PHASES["p09_warpspec"].variants_tagged(trace.TAG)
    assert loaded == list(builds.values())
    assert [(row["build"], row["case"]) for row in record["rows"]] == [
        (label, case) for label in builds for case in trace.cases_of(label)]
    assert trace.cases_of("defaults (TRACE=1)") == trace.CASES
    assert all(build in builds for build in trace.BUILD_CASES)
    row = trace.row(record, "b2h16_s4096_d128", "no ping-pong (TRACE=1)")
    assert row["items"] == 2 and set(row["events"]["item"]) == {0}
    # the second item's producer events have no consumer beside them: named, not hidden
    assert row["problems"] and all("item 1" in problem for problem in row["problems"])
    assert record["builds"]["defaults (TRACE=1)"]["tile_params"]["TRACE"] == 1
    assert experiments.stale_builds(record) == [] and "TRACE=1" in record["instrumented"]


def test_first_items_keeps_the_first_work_items():
    events = {"item": [0, 1, 2, 0], "kind": [1, 2, 3, 4]}
    assert trace.first_items(events, 2) == {"item": [0, 1, 0], "kind": [1, 2, 4]}


def test_a_missing_record_says_how_to_record_it(tmp_path):
    assert trace.load("p09_warpspec", root=tmp_path) is None
    message = trace.missing_message("p09_warpspec")
    assert "not recorded" in message and "`python -m flashcore_nb trace --phase p09_warpspec`" in message
    assert "experiments/p09_warpspec_trace.json" in message


def test_a_build_without_trace_is_told_apart():
    libc = SimpleNamespace(build=SimpleNamespace(module=SimpleNamespace(__file__=ctypes.util.find_library("c")),
                                                 name="flashcore_p09_warpspec_0123"))
    with pytest.raises(RuntimeError, match="built without TRACE=1"):
        trace.library(libc)


def test_trace_spans_lists_one_work_item_in_the_order_its_spans_began():
    from flashcore_nb import tables
    record = synthetic_record()
    spans = tables.trace_spans(record, "b4h16_s2048", record["rows"][0]["build"])
    assert list(spans.columns) == ["who", "span", "key tile", "start (µs)", "length (µs)"]
    assert spans["start (µs)"].is_monotonic_increasing and (spans["length (µs)"] > 0).all()
    assert set(spans["who"]) == {"producer", "consumer 1", "consumer 2"}
    assert {"softmax", "Q·Kᵀ"} <= set(spans["span"])
    assert (spans.loc[spans["span"] == "Q·Kᵀ", "key tile"] != "").all()
    assert (spans.loc[spans["span"] == "epilogue", "key tile"] == "").all() and "epilogue" in set(spans["span"])
    # cycles at 0.5 ns each (the synthetic clock): the first consumer's first softmax, from the buffer itself
    events = trace.events_frame(record["rows"][0])
    first = events[(events["kind"] == "SoftmaxBegin") & (events["role"] == 1)]["cycles"].iloc[0]
    mine = spans[(spans["span"] == "softmax") & (spans["who"] == "consumer 1")]
    assert mine["start (µs)"].iloc[0] == pytest.approx(first * 0.5 / 1000)
