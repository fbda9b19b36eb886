"""The accuracy experiment on random problems: the seeded problem generator, the runner, and what pages
show of a record (all on the CPU; the GPU suite runs it on the kernels)."""
import json
import math
from collections import Counter

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F

from flashcore_nb import accuracy, experiments, plots, results, tables
from flashcore_nb.binding import validate_problem
from flashcore_nb.check import LAYOUTS, make_inputs
from flashcore_nb.env import GpuInfo
from flashcore_nb.phases import PHASES
from flashcore_nb.shapes import Case

ARCHS = [(name, cc) for name, phase in PHASES.items() for cc in phase.archs]


def gpu(cc: int) -> GpuInfo:
    return GpuInfo(name=f"a sm_{cc} GPU", cc=cc, sms=100, smem_per_block_optin=227 * 1024,
                   total_memory=80 << 30, driver="test")


def test_problems_are_seeded_and_each_has_its_own_stream():
    phase = PHASES["p07_registers"]
    first = accuracy.draw(phase, 90)
    assert first == accuracy.draw(phase, 90) and len(first) == accuracy.RANDOM.count
    assert accuracy.draw_one(phase, 90, accuracy.RANDOM, 417) == first[417]   # whatever the count
    assert len({p.seed for p in first}) == len(first)
    assert [p.case.shape for p in accuracy.draw(phase, 90, accuracy.STRESSED)][:20] != [p.case.shape for p in first][:20]
    # phases with the same options draw the same problems
    assert accuracy.draw(PHASES["p02_vectorized"], 90) == [
        accuracy.Problem(p.case, p.dtype, p.scale, p.layout, p.seed) for p in accuracy.draw(PHASES["p01_baseline"], 90)]


@pytest.mark.parametrize("name,cc", ARCHS, ids=[f"{n}-sm_{cc}" for n, cc in ARCHS])
def test_problems_respect_the_phase_and_its_gpu(name, cc):
    phase = PHASES[name]
    for distribution in accuracy.DISTRIBUTIONS:
        for p in accuracy.draw(phase, cc, distribution):
            case = p.case
            assert case.head_dim in phase.head_dims and phase.supports_dtype_on(p.dtype, cc)
            assert phase.causal or not case.causal
            assert phase.cross_lengths or case.seqlen_q == case.sk
            assert 1 <= case.seqlen_q <= accuracy.MAX_SEQLEN and 1 <= case.sk <= accuracy.MAX_SEQLEN
            assert 1 <= case.batch <= 4 and 1 <= case.heads <= 8
            assert case.batch * case.heads * case.seqlen_q * case.sk * case.head_dim <= accuracy.MAX_WORK
            assert p.layout in LAYOUTS


@pytest.mark.parametrize("name", list(PHASES))
def test_the_binding_accepts_every_drawn_layout_and_shape(name):
    """The inputs of small drawn problems (the tensors themselves, both layouts) pass the phase's own
    validation on a GPU it runs on."""
    phase = PHASES[name]
    cc = max(phase.archs)
    small = [p for p in accuracy.draw(phase, cc) if p.case.batch * p.case.heads * (p.case.seqlen_q + 2 * p.case.sk) < 4096]
    assert {p.layout for p in small[:30]} == set(LAYOUTS)
    for p in small[:30]:
        q, k, v = p.inputs("cpu")
        validate_problem(phase, q, k, v, p.case.causal, gpu(cc))


def test_layouts_store_the_inputs_as_named():
    case = Case("x", 2, 3, 10, 64, seqlen_k=7, magnitude=4.0)
    q, k, v = make_inputs(case, torch.bfloat16, seed=5, device="cpu", layout="bshd")
    assert q.shape == (2, 3, 10, 64) and k.shape == (2, 3, 7, 64) and q.dtype == torch.bfloat16
    assert q.stride() == (10 * 3 * 64, 64, 3 * 64, 1) and v.stride() == (7 * 3 * 64, 64, 3 * 64, 1)
    contiguous = make_inputs(case, torch.bfloat16, seed=5, device="cpu")
    assert all(t.is_contiguous() for t in contiguous)
    again = make_inputs(case, torch.bfloat16, seed=5, device="cpu", layout="bshd")
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), again))
    assert 2.0 < float(q.float().std()) < 6.0   # randn x magnitude
    with pytest.raises(ValueError, match="layout"):
        make_inputs(case, device="cpu", layout="sbhd")


def test_random_problems_cover_what_the_shape_suite_does_not():
    problems = accuracy.draw(PHASES["p07_registers"], 90)
    n = len(problems)
    seen = Counter()
    for p in problems:
        c = p.case
        seen["equal"] += c.seqlen_q == c.sk
        seen["longer queries"] += c.seqlen_q > c.sk
        seen["longer keys"] += c.seqlen_q < c.sk
        seen[p.layout] += 1
        seen[p.dtype] += 1
        seen[f"D={c.head_dim}"] += 1
        seen["causal"] += c.causal
        seen["default scale"] += p.scale is None
        factor = p.scale * math.sqrt(c.head_dim) if p.scale else 1.0
        seen["small scale"] += factor < 0.1
        seen["large scale"] += factor > 1.5
        seen["small inputs"] += c.magnitude < 0.2
        seen["large inputs"] += c.magnitude > 10
        seen["one key"] += c.sk == 1
        seen["long"] += max(c.seqlen_q, c.sk) > 1500
    for kind in ("longer queries", "longer keys", "bhsd", "bshd", "float16", "bfloat16", "D=64", "D=128", "causal",
                 "default scale"):
        assert 0.25 * n < seen[kind] < 0.75 * n, (kind, seen[kind])
    for kind in ("equal", "small scale", "large scale", "small inputs", "large inputs", "one key", "long"):
        assert 0.01 * n < seen[kind] < 0.3 * n, (kind, seen[kind])
    assert {p.case.batch for p in problems} == {1, 2, 3, 4} and {p.case.heads for p in problems} == set(range(1, 9))


def test_single_dtype_phases_and_older_gpus_draw_what_they_support():
    assert {p.dtype for p in accuracy.draw(PHASES["p03_wmma"], 90)} == {"float16"}
    assert {p.dtype for p in accuracy.draw(PHASES["p01_baseline"], 75)} == {"float16"}   # T4: no bf16


def test_stressed_problems_are_the_kind_that_failed():
    for p in accuracy.draw(PHASES["p07_registers"], 90, accuracy.STRESSED):
        assert p.case.seqlen_q > p.case.sk >= 128
        assert p.scale is not None and 0.05 <= p.scale * math.sqrt(p.case.head_dim) <= 0.3
        assert 8.0 <= p.case.magnitude <= 16.0


def test_a_recorded_row_gives_back_its_problem():
    for p in accuracy.draw(PHASES["p07_registers"], 90)[:50]:
        row = json.loads(json.dumps({**p.as_row(), "sdpa_max_abs_err": 1e-3}))
        assert accuracy.Problem.from_row(row) == p


def test_error_ratio():
    assert accuracy.error_ratio(2e-3, 1e-3) == pytest.approx(2.0)
    assert accuracy.error_ratio(0.0, 0.0) == 1.0          # both exact
    assert accuracy.error_ratio(1e-6, 0.0) == math.inf    # only SDPA exact
    assert accuracy.error_ratio(math.nan, 1e-3) == math.inf


# --- a synthetic record: real rows from stand-in kernels on the CPU --------------------------------

def _sdpa_fp32(q, k, v, causal=False, scale=None, out=None):
    out.copy_(F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=scale))


def _drops_an_element(q, k, v, causal=False, scale=None, out=None):
    out.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale))
    out[0, 0, -1, -1] = float("nan")


def _quadruples_sdpas_error(q, k, v, causal=False, scale=None, out=None):
    from flashcore_nb.reference import attention_fp64
    exact = attention_fp64(q, k, v, causal, scale)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).double()
    out.copy_(exact + 4 * (sdpa - exact))


BUILDS = {"defaults": _sdpa_fp32, "drops an element": _drops_an_element, "quadruples SDPA's error": _quadruples_sdpas_error}


@pytest.fixture(scope="module")
def record():
    """What `accuracy.record` writes, from rows run here: small problems of both distributions, three
    stand-in builds, and made-up timings (never written under results/)."""
    rows = []
    for d in accuracy.DISTRIBUTIONS:
        problems = [p for p in accuracy.draw(PHASES["p07_registers"], 90, d)
                    if p.case.batch * p.case.heads * p.case.seqlen_q * p.case.sk * p.case.head_dim < 1 << 22][:12]
        rows += accuracy.run(BUILDS, problems, d.name, device="cpu")
    record = experiments.make_record(accuracy.record_name("p07_registers"), "p07_registers",
                                     {label: {} for label in BUILDS}, rows)
    record["env"] = {**record["env"], "gpu": "NVIDIA H100 80GB HBM3", "cc": 90}
    record["ptxas"] = {label: {"registers": 255, "spill_bytes": 8 * i} for i, label in enumerate(BUILDS)}
    record["timing"] = [{"build": label, "case": case, "gpu_us": 10.0 + i, "vs_defaults": 1.0 + i / 10,
                         "vs_sdpa": 0.8 + i / 10} for case in ("mission", "b4h16_s2048") for i, label in enumerate(BUILDS)]
    return json.loads(json.dumps(record))   # as read back from the file


def test_rows_hold_each_builds_error_and_unwritten_outputs(record):
    frame = accuracy.frame(record)
    problems = len(record["rows"])
    assert len(frame) == len(BUILDS) * problems
    by_build = {label: part for label, part in frame.groupby("build")}
    assert by_build["defaults"]["passed"].all() and (by_build["defaults"]["unwritten"] == 0).all()
    assert (by_build["defaults"]["ratio"] <= 1.0 + 1e-9).all()   # fp32 with one rounding beats bf16/fp16 SDPA
    dropped = by_build["drops an element"]
    assert (dropped["unwritten"] == 1).all() and not dropped["passed"].any() and (dropped["ratio"] == math.inf).all()
    quadrupled = by_build["quadruples SDPA's error"]
    measurable = quadrupled[quadrupled["sdpa_max_abs_err"] > 1e-3]
    assert len(measurable) > 5 and measurable["ratio"].between(3.0, 5.0).all()
    assert not measurable["passed"].any()
    assert set(frame["distribution"]) == {"random", "stressed"}
    assert frame["scale_factor"].between(0.05, 2.0).all()


def test_summary_and_failures(record):
    frame = accuracy.frame(record)
    summary = accuracy.summary(frame).set_index(["build", "dtype"])
    defaults = frame[frame["build"] == "defaults"]
    for dtype, part in defaults.groupby("dtype"):
        row = summary.loc[("defaults", dtype)]
        assert row["problems"] == len(part) and row["passed"] == len(part)
        assert row["worst"] == part["ratio"].max() and row["median"] == part["ratio"].median()
        assert row["99th percentile"] in set(part["ratio"])   # a measured ratio, never interpolated
        worst = part.loc[part["ratio"].idxmax()]
        assert row["worst problem"].startswith(f"{worst['problem']}: {worst['batch']}x{worst['heads']}x")
    failing = accuracy.failures(frame)
    assert set(failing["build"]) == {"drops an element", "quadruples SDPA's error"}
    assert list(failing["ratio"]) == sorted(failing["ratio"], reverse=True)


def test_summary_percentiles_on_known_ratios():
    frame = accuracy.frame({"rows": [
        {"distribution": "random", "problem": f"random-{i}", "batch": 1, "heads": 1, "seqlen_q": 4, "seqlen_k": 4,
         "head_dim": 64, "causal": False, "magnitude": 1.0, "dtype": "float16", "scale": None, "layout": "bhsd",
         "seed": i, "sdpa_max_abs_err": 1e-3, "max_abs_err": {"defaults": (i + 1) * 1e-5}, "unwritten": {"defaults": 0}}
        for i in range(200)]})
    row = accuracy.summary(frame).iloc[0]
    assert row["worst"] == pytest.approx(2.0) and row["median"] == pytest.approx(1.005)
    assert row["99th percentile"] == pytest.approx(1.99) and row["passed"] == 200


def test_tables_of_a_record(record):
    frame = accuracy.frame(record)
    summary = tables.accuracy_summary({"p07_registers": frame, "p08_wgmma": frame})
    assert list(summary["phase"]) == ["p07_registers"] * 2 + ["p08_wgmma"] * 2
    assert set(summary["dtype"]) == {"float16", "bfloat16"}
    defaults = accuracy.defaults(frame)
    assert summary["problems"].sum() == 2 * len(defaults) and (summary["passed"] == summary["problems"]).all()
    causes = tables.accuracy_causes(record).set_index("build")
    assert list(causes.index) == list(BUILDS)
    assert causes.loc["drops an element", "problems failed"] == len(record["rows"]) and causes.loc["defaults", "problems failed"] == 0
    assert {"random float16 worst", "random bfloat16 99th pct", "stressed bfloat16 worst"} <= set(causes.columns)
    assert causes.loc["drops an element", "random float16 worst"] == math.inf
    cost = tables.accuracy_cost(record).set_index("build")
    assert cost.loc["quadruples SDPA's error", "mission / defaults"] == pytest.approx(1.2)
    assert cost.loc["drops an element", "spill bytes"] == 8 and "b4h16_s2048 / SDPA default" in cost.columns


def test_the_ratio_plot_has_a_panel_per_dtype_and_a_line_per_build(record):
    frame = accuracy.frame(record)
    fig = plots.error_ratios({label: part for label, part in frame.groupby("build", sort=False)}, "synthetic")
    assert [ax.get_title() for ax in fig.axes] == ["float16", "bfloat16"]
    for ax in fig.axes:
        assert len(ax.get_lines()) == len(BUILDS) + 1 + len(accuracy.RATIO_LINES)   # builds, 1x, the two lines
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    plt.close(fig)


def test_recorded_finds_records_and_names_the_phases_without(record, tmp_path):
    path = results.experiment_path(record["experiment"], results.DEFAULT_GPU, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    found, missing = accuracy.recorded(root=tmp_path)
    assert list(found) == ["p07_registers"] and missing == [n for n in PHASES if n != "p07_registers"]
    assert experiments.stale_builds(found["p07_registers"]) == []
    empty, every = accuracy.recorded(root=tmp_path / "none")
    assert empty == {} and every == list(PHASES)
    assert "python -m flashcore_nb accuracy" in accuracy.missing_message()


def test_accuracy_variants_are_suspects_the_phase_can_build():
    for name, phase in PHASES.items():
        builds = accuracy.builds_of(name)
        assert next(iter(builds)) == accuracy.DEFAULTS and builds[accuracy.DEFAULTS] == {}
        for variant in phase.variants:
            assert set(variant.defines) <= set(phase.tile_params), (name, variant.label)
    assert len(accuracy.builds_of("p07_registers")) > 4 and len(accuracy.builds_of("p08_wgmma")) > 2


def test_builds_keep_the_registry_order_that_json_sorts_away():
    labels = ["row sums of the rounded P", "defaults", "exp, scale not folded", "a build of no registry"]
    record = {"phase": "p07_registers", "builds": dict.fromkeys(sorted(labels), {})}
    assert accuracy.build_labels(record) == ["defaults", "exp, scale not folded", "row sums of the rounded P",
                                             "a build of no registry"]
