"""GPU suite (`pytest -m gpu`): every phase on the shape suite, bad inputs, compute-sanitizer."""
import pytest
import torch

import flashcore_nb
from flashcore_nb import accuracy, budget, env, sanitize
from flashcore_nb.binding import SharedMemoryError
from flashcore_nb.check import check, make_inputs
from flashcore_nb.reference import attention_fp64
from flashcore_nb.sanitize import format_target
from flashcore_nb.shapes import CORRECTNESS, MISSION, Case

pytestmark = pytest.mark.gpu
PHASE_NAMES = list(flashcore_nb.PHASES)


def _supported(phase, case, dtype):
    return (case.head_dim in phase.head_dims and (phase.causal or not case.causal)
            and (phase.cross_lengths or case.sk == case.seqlen_q) and dtype in phase.dtypes)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CORRECTNESS, ids=lambda c: c.name)
@pytest.mark.parametrize("name", PHASE_NAMES)
def test_correct_on_shape_suite(cuda, name, case, dtype):
    phase = flashcore_nb.PHASES[name]
    if not _supported(phase, case, dtype):
        with pytest.raises((ValueError, TypeError)):
            flashcore_nb.load(name)(*make_inputs(case, getattr(torch, dtype)), causal=case.causal)
        return
    for seed in (0, 1):  # fresh inputs: the same function on any valid input
        result = check(flashcore_nb.load(name), case, getattr(torch, dtype), seed=seed)
        assert result.unwritten == 0, f"{result.unwritten} output elements never written"
        assert result.passed, result


@pytest.mark.parametrize("name", PHASE_NAMES)
def test_correct_on_random_problems(cuda, name):
    """1,000 seeded random problems (any Sq and Sk, both layouts and dtypes, other scales, inputs from 0.1
    to 16) and 200 of the stressed kind (Sq > Sk, small scale, large inputs): every one passes the book's rule,
    and none has more than 1.5x SDPA's error."""
    phase, gpu = flashcore_nb.PHASES[name], env.gpu()
    if not phase.runs_on(gpu.cc):
        with pytest.raises(RuntimeError, match=f"needs an {phase.requirement} GPU"):
            flashcore_nb.load(name)(*make_inputs(MISSION))
        return
    _, rows = accuracy.measure(name, {accuracy.DEFAULTS: {}})
    frame = accuracy.frame({"rows": rows})
    assert (frame["distribution"] == accuracy.RANDOM.name).sum() >= 1000
    failing = accuracy.failures(frame)
    assert failing.empty, f"{len(failing)} of {len(frame)} problems fail; the worst:\n" + "\n".join(
        f"{accuracy.describe(row)}: {row['ratio']:.2f}x SDPA's error, {row['unwritten']} unwritten"
        for _, row in failing.head(5).iterrows())
    worst = frame.loc[frame["ratio"].idxmax()]
    assert worst["ratio"] <= accuracy.TARGET_RATIO, f"{accuracy.describe(worst)}: {worst['ratio']:.2f}x SDPA's error"


@pytest.mark.parametrize("name", PHASE_NAMES)
def test_strided_inputs(cuda, name):
    """(B, S, H, D) storage viewed as (B, H, S, D): strides are honoured, not assumed."""
    fn = flashcore_nb.load(name)
    q, k, v = (torch.randn(2, 100, 4, 64, device=cuda, dtype=torch.float16).transpose(1, 2) for _ in range(3))
    out = fn(q, k, v)
    assert (out.double() - attention_fp64(q, k, v)).abs().max() < 2e-3


def _bad_inputs(cuda):
    good = lambda *shape, **kw: torch.randn(*shape, device=cuda, dtype=torch.float16, **kw)  # noqa: E731
    q = good(1, 2, 64, 64)
    return {
        "cpu tensor": ((q.cpu(), q, q), {}, ValueError, "CUDA tensors"),
        "float32": ((q.float(), q.float(), q.float()), {}, TypeError, "dtypes"),
        "mixed dtypes": ((q, q.bfloat16(), q), {}, TypeError, "share a dtype"),
        "rank 3": ((q[0], q[0], q[0]), {}, ValueError, "rank 4"),
        "heads differ": ((q, good(1, 3, 64, 64), good(1, 3, 64, 64)), {}, ValueError, "disagree"),
        "k v differ": ((q, q, good(1, 2, 32, 64)), {}, ValueError, "same shape"),
        "head dim 80": ((good(1, 2, 64, 80),) * 3, {}, ValueError, "head_dim"),
        "empty": ((good(1, 2, 0, 64),) * 3, {}, ValueError, "empty"),
        "last dim strided": ((good(1, 2, 64, 128)[..., ::2],) * 3, {}, ValueError, "contiguous"),
        "not a tensor": (([1.0], q, q), {}, TypeError, "torch.Tensor"),
        "bad out": ((q, q, q), {"out": good(1, 2, 64, 32)}, ValueError, "out must match"),
    }


@pytest.mark.parametrize("name", PHASE_NAMES)
def test_bad_inputs_raise_clear_errors_and_leave_cuda_usable(cuda, name):
    fn = flashcore_nb.load(name)
    for label, (args, kwargs, error, message) in _bad_inputs(cuda).items():
        with pytest.raises(error, match=message):
            fn(*args, **kwargs)
        torch.cuda.synchronize()  # a sticky CUDA error would surface here
    assert check(fn, Case("after", 1, 2, 33, 64), torch.float16).passed, "a good call after bad ones failed"


def _correct_on_shape_suite(name: str, params: dict) -> None:
    """The phase built with `params` is correct on every supported case, in every dtype this GPU has; a case
    the binding refuses for its shared memory must be one budget.py says this GPU cannot hold."""
    phase, gpu = flashcore_nb.PHASES[name], env.gpu()
    if not phase.runs_on(gpu.cc):
        with pytest.raises(RuntimeError, match=f"needs an {phase.requirement} GPU"):
            flashcore_nb.load(name, **params)(*make_inputs(MISSION))
        return
    fn = flashcore_nb.load(name, **params)
    too_big = {launch.head_dim for launch in budget.launches(name, fn.tile_params)
               if launch.smem_bytes > gpu.smem_per_block_optin}
    for case in CORRECTNESS:
        for dtype in phase.dtypes:
            if not (_supported(phase, case, dtype) and phase.supports_dtype_on(dtype, gpu.cc)):
                continue
            try:
                result = check(fn, case, getattr(torch, dtype), seed=2)
            except SharedMemoryError:
                assert case.head_dim in too_big, case.name
                continue
            assert result.unwritten == 0 and result.passed, result


# Every variant the registry tags "test": other tile shapes and switches, which must change the speed,
# never the result.
TESTED = [(name, v) for name, phase in flashcore_nb.PHASES.items() for v in phase.variants if "test" in v.tags]


@pytest.mark.parametrize("name,variant", TESTED, ids=[format_target(n, v.defines) for n, v in TESTED])
def test_tagged_variants_are_correct(cuda, name, variant):
    _correct_on_shape_suite(name, variant.defines)


# The defaults of the other GPUs (Phase.arch_tile_params) are valid configurations here too.
OTHER_DEFAULTS = [(name, cc) for name, phase in flashcore_nb.PHASES.items() for cc in phase.arch_tile_params]


@pytest.mark.parametrize("name,cc", OTHER_DEFAULTS, ids=[f"{n}-sm_{cc}" for n, cc in OTHER_DEFAULTS])
def test_other_gpus_defaults_are_correct_here(cuda, name, cc):
    _correct_on_shape_suite(name, flashcore_nb.PHASES[name].tile_params_for(cc))


# Every instrumented build (the variants tagged "trace", TRACE=1) on problems where CTA 0 walks several work items
# (two persistent CTAs): one with a ragged last tile, one causal (consumers skip the tiles right of their rows).
TRACE_BUILDS = [(name, v) for name, phase in flashcore_nb.PHASES.items() for v in phase.variants if "trace" in v.tags]
TRACE_CASES = [Case("trace_ragged", 1, 3, 1000, 64), Case("trace_causal_d128", 1, 2, 777, 128, causal=True)]


@pytest.mark.parametrize("name,variant", TRACE_BUILDS, ids=[format_target(n, v.defines) for n, v in TRACE_BUILDS])
def test_instrumented_build_is_correct_and_its_trace_well_formed(cuda, name, variant):
    """Still correct; and its trace is whole (nothing dropped, every warpgroup recorded, every work item seen by
    every role) and well-formed (trace.problems: clocks monotonic per role, every span closed, every tile the
    producer issued waited for and released by every consumer after the issue, wgmmas after their operands)."""
    from flashcore_nb import trace
    phase = flashcore_nb.PHASES[name]
    if not phase.runs_on(env.gpu().cc):
        pytest.skip(f"{name} needs an {phase.requirement} GPU")
    fn = flashcore_nb.load(name, **{**variant.defines, "PERSISTENT_CTAS": 2})
    for case in TRACE_CASES:
        captured = trace.capture(fn, case)
        assert captured["passed"], (case.name, captured["max_abs_err"], captured["sdpa_max_abs_err"])
        assert captured["dropped"] == {}
        assert 0.3 < 1 / captured["ns_per_cycle"] < 3.0, "clock64 against %globaltimer: not an SM clock in GHz"
        events = trace.events_frame(captured)
        assert trace.problems(events) == [], case.name
        warpgroups = budget.threads_per_block(name, fn.tile_params, case.head_dim) // 128
        assert sorted(events["role"].unique()) == list(range(warpgroups))
        items = set(events.loc[events["kind"] == "QIssue", "item"])
        assert len(items) > 1 and items == set(range(len(items)))
        # with the work counter (p09's DYNAMIC: 1 always, 2 under a causal mask) the consumers wait once more, for
        # the word that no item is left
        dynamic = fn.tile_params.get("DYNAMIC", 0)
        last_word = {len(items)} if dynamic == 1 or (dynamic == 2 and case.causal) else set()
        for role in range(1, warpgroups):
            mine = events[events["role"] == role]
            assert set(mine.loc[mine["kind"] == "QWaitEnd", "item"]) == items | last_word
            assert set(mine.loc[mine["kind"] == "EpilogueEnd", "item"]) == items


def test_p05_config_too_big_for_the_gpu_is_refused_before_launch(cuda):
    from flashcore_nb.binding import SharedMemoryError
    fn = flashcore_nb.load("p05_tile64", BLOCK_M=128, BLOCK_N=128, NUM_WARPS=8)
    q = torch.randn(1, 2, 256, 128, device=cuda, dtype=torch.float16)
    with pytest.raises(SharedMemoryError, match="bytes of shared memory per block"):
        fn(q, q, q)
    torch.cuda.synchronize()


def test_p04_teaching_variant_is_caught(cuda):
    """The reproduced padding bug is wrong, and the check says so (FP16 P itself is a tested variant)."""
    buggy = check(flashcore_nb.load("p04_fp32p", P_FP32=0, PADDING_BUG=1), MISSION)
    assert not buggy.passed and buggy.max_abs_err > 0.1, buggy


def test_tile_explorer_measures_live(cuda):
    from flashcore_nb import widgets
    text, registers = widgets.measure_live("p05_tile64", {"BLOCK_M": 32, "BLOCK_N": 64, "NUM_WARPS": 8})
    assert text.startswith("measured live") and "(correct)" in text and registers > 0, text
    text, registers = widgets.measure_live("p05_tile64", {"BLOCK_M": 128, "BLOCK_N": 64, "NUM_WARPS": 2})
    assert registers is None and "NUM_WARPS * 32 must be a multiple of BLOCK_M" in text


def test_unknown_tile_parameter_is_refused(cuda):
    with pytest.raises(ValueError, match="no tile parameter"):
        flashcore_nb.load("p01_baseline", BLOCK_Q=64)


def test_invalid_tile_parameter_fails_at_compile_time(cuda):
    from flashcore_nb.build import CompileError
    with pytest.raises(CompileError, match="NUM_THREADS must be a power of two"):
        flashcore_nb.load("p01_baseline", NUM_THREADS=96)


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_compute_sanitizer_clean(cuda, tool):
    """Every phase this GPU can run, and its variants tagged "sanitize", under each tool."""
    result = sanitize.run(tool, [], ("--error-exitcode=3",))
    report = result["report"]
    assert result["returncode"] == 0, report[-4000:]
    assert "ERROR SUMMARY: 0 errors" in report or "RACECHECK SUMMARY: 0 hazards" in report, report[-4000:]


def test_memcheck_finds_the_planted_bug(cuda):
    result = sanitize.run("memcheck", [sanitize.PLANTED], ("--error-exitcode=3", "--print-limit", "3"))
    assert result["returncode"] != 0
    assert "Invalid __shared__ write of size 16 bytes" in result["report"], result["report"][-4000:]


def test_peaks_measures_matmul_and_copy_bandwidth(cuda):
    from flashcore_nb import peaks
    copy = peaks.copy_bandwidth(nbytes=256 << 20, repeats=3)
    matmul = peaks.matmul("bfloat16", repeats=2)
    assert copy["measure"] == "copy" and copy["gb_s"] > 100 and len(copy["gb_s_all"]) == 3
    assert matmul["dtype"] == "bfloat16" and matmul["tflops"] > 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_triton_peer_is_correct(cuda, dtype):
    """The Triton baseline computes what the phases compute, on the whole shape suite."""
    from flashcore_nb import triton_peer
    for case in CORRECTNESS:
        for seed in (0, 1):
            result = check(triton_peer.attention, case, dtype, seed=seed)
            assert result.unwritten == 0 and result.passed, result


def test_side_by_side_checks_and_pairs_builds(cuda):
    from flashcore_nb.bench import side_by_side
    table = side_by_side({"defaults": flashcore_nb.load("p03_wmma"), "again": flashcore_nb.load("p03_wmma"),
                          "phase 1": flashcore_nb.load("p01_baseline")}, "mission")
    assert list(table["build"]) == ["defaults", "again", "phase 1"] and table["correct"].all()
    ratios = table["GPU time / defaults"]
    assert ratios[0] == 1.0 and 0.8 < ratios[1] < 1.25, "the same build, paired with itself"
    assert ratios[2] > 3, "phase 1 is many times slower than phase 3 at the mission shape"


def test_bench_times_every_baseline_in_interleaved_rounds(cuda):
    from flashcore_nb import bench
    run = bench.bench_case(flashcore_nb.load("p01_baseline"), Case("small", 1, 2, 128, 64), rounds=3)
    assert run["rounds"] == 3 and len(run["gpu_us_rounds"]) == 3 and run["gpu_us_min"] <= run["gpu_us"] <= run["gpu_us_max"]
    for name in ("sdpa_default", "sdpa_flash", "triton"):
        timing = run["baselines"][name]
        assert len(timing["gpu_us_rounds"]) == 3 and timing["call_us"] > 0
        ratios = sorted(a / b for a, b in zip(run["gpu_us_rounds"], timing["gpu_us_rounds"]))
        assert timing["time_ratio"] == pytest.approx(ratios[1])


# --- the call path: one operator call per launch (csrc/launcher.cpp) ---------------------------------

def test_inputs_are_validated_once_persignature(cuda, monkeypatch):
    from flashcore_nb import binding
    fn = flashcore_nb.load("p07_registers")
    q, k, v = make_inputs(Case("sig", 1, 2, 70, 64), seed=3)
    calls = []
    real = binding.validate
    monkeypatch.setattr(binding, "validate", lambda *args: calls.append(args) or real(*args))
    first = fn(q, k, v)
    for _ in range(3):
        torch.testing.assert_close(fn(q, k, v), first, rtol=0, atol=0)
    assert len(calls) == 1
    fn(q, k, v, causal=True)
    fn(q[:, :, :64], k, v)
    assert len(calls) == 3, "a new signature (causal, shape) is validated again"
    with pytest.raises(ValueError, match="must have rank 4"):
        fn(q[0], k, v)


@pytest.mark.parametrize("name", ["p01_baseline", "p07_registers"])
def test_inputs_that_require_grad_are_refused_at_the_call(cuda, name):
    fn = flashcore_nb.load(name)
    q, k, v = make_inputs(MISSION)
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="forward only"):
        fn(q, k, v)
    with torch.no_grad():
        fn(q, k, v)
    torch.cuda.synchronize()


def test_torch_compile_fullgraph_matches_eager(cuda):
    fn = flashcore_nb.load("p07_registers")
    q, k, v = make_inputs(Case("compiled", 2, 4, 200, 64), seed=4)

    def block(q, k, v):
        return fn(q * 0.5, k, v, causal=True) + 1

    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v), rtol=0, atol=0)
    bad = torch.randn(2, 4, 200, 96, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="does not support head_dim 96"):
        torch.compile(lambda q: fn(q, q, q), fullgraph=True)(bad)
    torch.cuda.synchronize()


def test_the_operator_checks_what_keeps_a_launch_safe(cuda):
    """The C++ checks behind torch.compile, where Python's validation does not run."""
    fn = flashcore_nb.load("p07_registers")
    q, k, v = make_inputs(Case("op", 1, 2, 64, 64))
    op = torch.ops.flashcore.attention
    bad = {"rank 4": (q[0], k, v), "same shape": (q, k, v[:, :, :32]), "contiguous": (q.transpose(2, 3), k, v),
           "16-byte aligned": (q.view(-1)[1:1 + 2 * 63 * 64].view(1, 2, 63, 64), k, v),
           "float16 or bfloat16": (q.float(), k.float(), v.float()), "CUDA tensors": (q.cpu(), k, v)}
    for message, args in bad.items():
        with pytest.raises(RuntimeError, match=message):
            op(*args, False, 0.125, fn.handle)
    with pytest.raises(RuntimeError, match="unknown FlashCore phase handle"):
        op(q, k, v, False, 0.125, 10 ** 6)
    torch.cuda.synchronize()
    torch.testing.assert_close(op(q, k, v, False, 0.125, fn.handle), fn(q, k, v), rtol=0, atol=0)


def test_a_misaligned_out_is_refused_before_the_16_byte_stores(cuda):
    """p08's, p09's and p10's epilogues store 16 bytes per lane: an `out` whose rows are not 16-byte aligned gets a
    clear error, from Python's validation and from the operator's C++ checks (behind torch.compile), never a fault."""
    fn = flashcore_nb.load("p09_warpspec")
    q, k, v = make_inputs(Case("out", 1, 2, 64, 64))
    buffer = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)
    misaligned = buffer[1:].view(q.shape)   # 2 bytes off
    with pytest.raises(ValueError, match="out must be 16-byte aligned"):
        fn(q, k, v, out=misaligned)
    with pytest.raises(RuntimeError, match="out must be 16-byte aligned"):
        torch.ops.flashcore.attention_out(q, k, v, misaligned, False, 0.125, fn.handle)
    torch.cuda.synchronize()
    aligned = torch.empty_like(q)
    torch.testing.assert_close(fn(q, k, v, out=aligned), fn(q, k, v), rtol=0, atol=0)


def test_cuda_graph_replays_with_new_inputs(cuda):
    fn = flashcore_nb.load("p07_registers")
    case = Case("graph", 1, 8, 512, 64)
    q, k, v = make_inputs(case, seed=5)
    fn(q, k, v)   # validated and warm before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(q, k, v)
    for seed in (6, 7):
        for dst, src in zip((q, k, v), make_inputs(case, seed=seed)):
            dst.copy_(src)
        graph.replay()
        torch.testing.assert_close(out, fn(q, k, v), rtol=0, atol=0)


# --- flashcore_nb.attention: the phase chosen per GPU and shape (dispatch.py) --------------------------------

ATTENTION_CASES = [MISSION, Case("attention_causal_d128", 2, 4, 200, 128, causal=True),
                   Case("attention_sq_lt_sk", 1, 8, 100, 64, seqlen_k=300), Case("attention_large", 4, 16, 1024, 64)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: c.name)
def test_attention_matches_the_reference(cuda, case, dtype):
    """The phase auto picks is correct on the case (its output poisoned first), and attention returns what
    that phase returns."""
    from flashcore_nb import dispatch
    q, k, v = make_inputs(case, dtype, seed=8)
    if dtype == torch.bfloat16 and env.gpu().cc < 80:
        with pytest.raises(TypeError, match="bfloat16 needs compute capability 8.0"):
            flashcore_nb.attention(q, k, v, is_causal=case.causal)
        return
    fn = dispatch.chosen(q, k, v, is_causal=case.causal)
    assert fn.candidate in dispatch.candidates(env.gpu()) or not dispatch.candidates(env.gpu())
    result = check(fn, case, dtype, seed=8)
    assert result.unwritten == 0 and result.passed, result
    out = flashcore_nb.attention(q, k, v, is_causal=case.causal)
    torch.testing.assert_close(out, fn(q, k, v, causal=case.causal), rtol=0, atol=0)


def test_attention_honours_scale(cuda):
    import torch.nn.functional as F
    q, k, v = make_inputs(MISSION, seed=10)
    reference = attention_fp64(q, k, v, causal=True, scale=0.3)
    sdpa_err = (F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3).double() - reference).abs().max()
    err = (flashcore_nb.attention(q, k, v, is_causal=True, scale=0.3).double() - reference).abs().max()
    assert err <= 2 * sdpa_err + 1e-4, (err, sdpa_err)


def test_attention_chooses_once_per_signature(cuda, monkeypatch):
    from flashcore_nb import dispatch
    calls = []
    real = dispatch.chosen
    monkeypatch.setattr(dispatch, "chosen", lambda *args, **kwargs: calls.append(args) or real(*args, **kwargs))
    q, k, v = make_inputs(Case("signature", 1, 2, 71, 64), seed=3)
    first = flashcore_nb.attention(q, k, v)
    for _ in range(3):
        torch.testing.assert_close(flashcore_nb.attention(q, k, v), first, rtol=0, atol=0)
    assert len(calls) == 1
    flashcore_nb.attention(q, k, v, is_causal=True)
    flashcore_nb.attention(q, k, v, phase="p01_baseline")
    assert len(calls) == 3, "a new signature (mask, phase argument) is chosen and validated again"


def test_a_forced_phase_runs_that_phase(cuda):
    from flashcore_nb import dispatch
    q, k, v = make_inputs(Case("forced", 1, 4, 100, 64), seed=9)
    for name in ("p01_baseline", *dispatch.candidates(env.gpu())):
        phase, tile_params, _ = dispatch.configuration(name, env.gpu().cc)
        fn = dispatch.chosen(q, k, v, phase=name)
        assert (fn.candidate, fn.phase.name, fn.tile_params) == (name, phase, tile_params)
        torch.testing.assert_close(flashcore_nb.attention(q, k, v, phase=name),
                                   flashcore_nb.load(phase, **tile_params)(q, k, v), rtol=0, atol=0)
    with pytest.raises(KeyError, match="known phases: p01_baseline"):
        flashcore_nb.attention(q, k, v, phase="p42_magic")
    with pytest.raises(TypeError, match="p03_wmma supports dtypes float16; got bfloat16"):
        flashcore_nb.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), phase="p03_wmma")


def test_attention_refuses_bad_inputs_clearly_and_leaves_cuda_usable(cuda):
    from flashcore_nb import dispatch
    for label, (args, kwargs, error, message) in _bad_inputs(cuda).items():
        if kwargs:   # `out` is load()'s; attention allocates its output, as SDPA does
            continue
        with pytest.raises(error, match=message):
            flashcore_nb.attention(*args)
        torch.cuda.synchronize()  # a sticky CUDA error would surface here
    misaligned = torch.randn(1, 2, 16, 68, device=cuda, dtype=torch.float16)[..., 2:66]
    with pytest.raises(ValueError, match="16-byte aligned"):
        flashcore_nb.attention(misaligned, misaligned, misaligned)
    case = Case("after", 1, 2, 33, 64)
    assert check(dispatch.chosen(*make_inputs(case)), case, torch.float16).passed, "a good call after bad ones failed"


def test_attention_refuses_inputs_that_require_grad(cuda):
    q, k, v = make_inputs(MISSION)
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="forward only"):
        flashcore_nb.attention(q, k, v)
    with torch.no_grad():
        flashcore_nb.attention(q, k, v)
    torch.cuda.synchronize()


def test_attention_under_torch_compile_matches_eager(cuda):
    """fullgraph=True: the choice is made while tracing; a second shape traces again (dynamic after a
    recompile, torch.compile's default) and chooses again."""
    def block(q, k, v):
        return flashcore_nb.attention(q * 0.5, k, v, is_causal=True) + 1

    compiled = torch.compile(block, fullgraph=True)
    for case in (Case("compiled", 2, 4, 200, 64), Case("compiled_large", 4, 16, 1024, 64),
                 Case("compiled_d128", 1, 8, 300, 128)):
        q, k, v = make_inputs(case, seed=4)
        torch.testing.assert_close(compiled(q, k, v), block(q, k, v), rtol=0, atol=0)
    bad = torch.randn(2, 4, 200, 96, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="does not support head_dim 96"):
        torch.compile(lambda q: flashcore_nb.attention(q, q, q), fullgraph=True)(bad)
    torch.cuda.synchronize()


def test_attention_in_a_cuda_graph_replays_with_new_inputs(cuda):
    case = Case("graph_attention", 2, 8, 384, 64)
    q, k, v = make_inputs(case, seed=5)
    flashcore_nb.attention(q, k, v, is_causal=True)   # chosen, validated and warm before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashcore_nb.attention(q, k, v, is_causal=True)
    for seed in (6, 7):
        for dst, src in zip((q, k, v), make_inputs(case, seed=seed)):
            dst.copy_(src)
        graph.replay()
        torch.testing.assert_close(out, flashcore_nb.attention(q, k, v, is_causal=True), rtol=0, atol=0)
        reference = attention_fp64(q, k, v, causal=True)
        assert (out.double() - reference).abs().max() < 2e-3


def test_the_grid_steps_on_one_case(cuda, monkeypatch):
    """What `python -m flashcore_nb grid` does per case, on the mission shape with one round: the race, the
    table from it, and attention checked and timed through that table."""
    from flashcore_nb import dispatch, grid, tuning
    monkeypatch.setattr(grid, "ROUNDS", 1)
    gpu = env.gpu()
    names = dispatch.candidates(gpu)
    configurations = {name: dispatch.configuration(name, gpu.cc)[:2] for name in names}
    fns = {name: flashcore_nb.load(phase, **params) for name, (phase, params) in configurations.items()}
    row = grid.race(MISSION, fns, gpu)
    running = {name for name in names if dispatch.can_run(name, tuning.Problem.of_case(MISSION), gpu)}
    assert "p09_warpspec:64-key" not in running, "a configuration for D = 128 only"
    assert running | {"sdpa_default", "sdpa_flash"} <= set(row["race"]) and row["sdpa_default_backend"]
    table = tuning.derive([row], names)
    dispatch.use_table(tuning.from_json(table, gpu.name, gpu.cc, "test table"))
    try:
        row.update(grid.dispatched(MISSION))
    finally:
        dispatch.use_table(None)
    assert row["choice"] == table["entries"][0]["ranking"][0] and row["check"]["passed"]
    assert {"attention", "sdpa_default"} <= set(row["dispatch"])
    frame = grid.frame({"candidates": names, "rows": [row]})
    assert frame.loc[0, "speed_vs_sdpa_default"] > 0 and frame.loc[0, "attention_call_us"] > 0



def test_the_seqlen_sweep_steps_on_one_case(cuda, monkeypatch, tmp_path):
    """What `python -m flashcore_nb seqlen` does, on the sweep's smallest case with one round: every phase swept
    that runs here checked and timed beside the baselines, the record written with its builds, and its frame,
    tables and figure."""
    import matplotlib.pyplot as plt

    from flashcore_nb import experiments, plots, results, seqlen, shapes, tables
    monkeypatch.setattr(seqlen, "ROUNDS", 1)
    case, gpu, lines = shapes.SEQLEN_SWEEP[0], env.gpu(), []
    path = seqlen.record(progress=lines.append, cases=[case], root=tmp_path)
    assert path == results.experiment_path(seqlen.NAME, env.gpu_slug(gpu.name), tmp_path)
    assert any(case.name in line for line in lines)
    record = seqlen.load(env.gpu_slug(gpu.name), root=tmp_path)
    assert record["complete"]
    ran = [name for name in seqlen.phases_swept() if seqlen.skip_reason(name, case, gpu) is None]
    assert ran and record["phases"] == [n for n in seqlen.phases_swept() if flashcore_nb.PHASES[n].runs_on(gpu.cc)]
    row = record["rows"][0]
    assert set(row["checks"]) == set(ran) and all(c["passed"] for c in row["checks"].values())
    assert set(ran) | {"sdpa_default", "sdpa_flash"} <= set(row["timings"])
    assert all(len(t["gpu_us_rounds"]) == 1 and t["tflops"] > 0 for t in row["timings"].values())
    assert experiments.stale_builds(record) == []
    frame = seqlen.frame(record)
    assert len(tables.seqlen_wins(frame)) == 1 and len(tables.seqlen_tflops(frame)) == 1
    plots.seqlen_curves(frame, "one case", one_wave=seqlen.one_wave_seqlen(record))
    plt.close("all")


def test_the_rungs_step_on_one_case(cuda, monkeypatch, tmp_path):
    """What `python -m flashcore_nb rungs` does, on two check cases and the mission shape with one round: every
    rung compiled, checked and timed beside SDPA default, the defaults and the rung before, the record written
    with its builds, and the frame the chapter reads from it."""
    from flashcore_nb import experiments
    monkeypatch.setattr(experiments, "EXPERIMENT_ROUNDS", 1)
    monkeypatch.setattr(experiments, "VARIANT_CHECK_CASES", ("mission", "s17"))
    monkeypatch.setattr(experiments, "VARIANT_TIMING_CASES", ("mission",))
    for name, rungs in experiments.RUNGS.items():
        experiments.record_variants(name, "rung", root=tmp_path)
        record = experiments.load_rungs(name, env.gpu_slug(env.gpu().name), root=tmp_path)
        assert [row["variant"] for row in record["rows"]] == list(rungs)
        assert all(row["status"] == "ok" for row in record["rows"]), [row["message"] for row in record["rows"]]
        assert experiments.stale_builds(record) == []
        frame = experiments.rung_frame(record)
        assert len(frame) == len(rungs) and (frame["gpu_us"] > 0).all()
        assert frame["speedup"].iloc[1:].notna().all() and frame["vs_defaults"].notna().all()
