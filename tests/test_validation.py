"""The binding's input checks, exercised on the CPU with a stand-in GPU description."""
import pytest
import torch

import flashcore_nb
from flashcore_nb.binding import SharedMemoryError, check_device, check_shared_memory, validate_problem
from flashcore_nb.env import GpuInfo
from flashcore_nb.phases import PHASES, Phase

H100 = GpuInfo("NVIDIA H100 80GB HBM3", 90, 132, 232448, 80 << 30, "test")
T4 = GpuInfo("Tesla T4", 75, 40, 65536, 16 << 30, "test")
P01 = PHASES["p01_baseline"]


def t(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


def test_valid_problem_passes():
    q = t(1, 8, 64, 64)
    validate_problem(P01, q, t(1, 8, 100, 64), t(1, 8, 100, 64), True, H100)


@pytest.mark.parametrize("args,causal,error,message", [
    ((t(1, 8, 64, 64, dtype=torch.float32),) * 3, False, TypeError, "supports dtypes float16, bfloat16; got float32"),
    ((t(1, 8, 64, 64), t(1, 8, 64, 64, dtype=torch.bfloat16), t(1, 8, 64, 64)), False, TypeError, "share a dtype"),
    ((t(8, 64, 64),) * 3, False, ValueError, r"rank 4 \(batch, heads, seq_len, head_dim\)"),
    ((t(1, 8, 64, 64), t(1, 4, 64, 64), t(1, 4, 64, 64)), False, ValueError, "disagree"),
    ((t(1, 8, 64, 64), t(1, 8, 64, 64), t(1, 8, 32, 64)), False, ValueError, "k and v must have the same shape"),
    ((t(1, 8, 64, 80),) * 3, False, ValueError, "supports head_dim 64 or 128; got 80"),
    ((t(1, 8, 0, 64),) * 3, False, ValueError, "empty input"),
    ((t(1, 8, 64, 128)[..., ::2],) * 3, False, ValueError, "last dimension must be contiguous"),
    ((t(1, 65536, 1, 64),) * 3, False, ValueError, "heads must each be <= 65535"),
])
def test_bad_problems_are_named(args, causal, error, message):
    with pytest.raises(error, match=message):
        validate_problem(P01, *args, causal, H100)


def test_strided_but_inner_contiguous_is_accepted():
    q = t(1, 64, 8, 64).transpose(1, 2)  # (B, S, H, D) storage seen as (B, H, S, D)
    validate_problem(P01, q, q, q, False, H100)


def test_phase_features_are_enforced():
    narrow = Phase(name="p99_narrow", title="narrow", notebook="99_narrow", kernel_name="narrow_kernel",
                   archs=(80,), min_cc=80, dtypes=("float16",), head_dims=(64,), causal=False, cross_lengths=False,
                   threads=lambda params, head_dim, split: 128)
    q = t(1, 2, 16, 64)
    with pytest.raises(ValueError, match="does not support causal"):
        validate_problem(narrow, q, q, q, True, H100)
    with pytest.raises(ValueError, match="equal query and key lengths"):
        validate_problem(narrow, q, t(1, 2, 32, 64), t(1, 2, 32, 64), False, H100)
    with pytest.raises(RuntimeError, match="needs an sm_80 or newer GPU; this GPU \\(Tesla T4\\) is sm_75"):
        validate_problem(narrow, q, q, q, False, T4)


def test_an_arch_specific_phase_runs_on_its_arch_only():
    wgmma = PHASES["p08_wgmma"]
    q = t(1, 2, 16, 64)
    validate_problem(wgmma, q, q, q, False, H100)
    blackwell = GpuInfo("NVIDIA B200", 100, 148, 232448, 180 << 30, "test")
    for gpu in (blackwell, GpuInfo("NVIDIA A100-SXM4-80GB", 80, 108, 166912, 80 << 30, "test")):
        with pytest.raises(RuntimeError, match=f"p08_wgmma needs an sm_90 GPU \\(it uses instructions that exist on "
                                               f"that architecture only\\); this GPU \\({gpu.name}\\) is sm_{gpu.cc}"):
            validate_problem(wgmma, q, q, q, False, gpu)


def test_bf16_refused_on_t4():
    q = t(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 needs compute capability 8.0"):
        validate_problem(P01, q, q, q, False, T4)


def test_cpu_tensors_and_non_tensors_are_refused():
    q = t(1, 2, 16, 64)
    with pytest.raises(ValueError, match=r"q is on cpu; FlashCore kernels need CUDA tensors \(move it with q.cuda\(\)\)"):
        check_device(q, q, q)
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got list"):
        check_device(q, [1.0], q)


def test_shared_memory_limit_is_checked_before_launch():
    check_shared_memory(P01, 64 * 1024, H100)
    with pytest.raises(SharedMemoryError, match="needs 100000 bytes of shared memory per block; Tesla T4 allows 65536"):
        check_shared_memory(P01, 100_000, T4)


def test_load_without_gpu_says_why(monkeypatch):
    monkeypatch.setattr(flashcore_nb.env, "gpu", lambda index=None: None)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        flashcore_nb.load("p01_baseline")


def test_unknown_phase_lists_known_ones():
    with pytest.raises(KeyError, match="known phases: p01_baseline"):
        flashcore_nb.load("p42_magic")


def test_vector_phases_refuse_misaligned_rows():
    p02 = PHASES["p02_vectorized"]
    q = t(1, 2, 16, 64)
    validate_problem(p02, q, q, q, False, H100)
    misaligned = t(1, 2, 16, 68)[..., 2:66]   # inner dim contiguous, base 4 bytes off and row stride 68
    with pytest.raises(ValueError, match="16-byte aligned"):
        validate_problem(p02, misaligned, misaligned, misaligned, False, H100)
    validate_problem(P01, misaligned, misaligned, misaligned, False, H100)  # scalar loads: fine


def test_the_alignment_error_names_the_fix_that_works():
    """.contiguous() fixes misaligned strides, not a misaligned base (a contiguous view returns itself): each
    message names the call that fixes its case, and that call does."""
    p02 = PHASES["p02_vectorized"]
    strided = t(1, 2, 16, 68)[..., :64]                                 # base aligned, row stride 68
    offset = t(2 * 16 * 64 + 1).view(-1)[1:].view(1, 2, 16, 64)         # contiguous, base 2 bytes off
    for tensor, fix in ((strided, "contiguous"), (offset, "clone")):
        with pytest.raises(ValueError, match=rf"16-byte aligned.*q\.{fix}\(\)"):
            validate_problem(p02, tensor, tensor, tensor, False, H100)
        fixed = getattr(tensor, fix)()
        validate_problem(p02, fixed, fixed, fixed, False, H100)
    assert offset.contiguous().data_ptr() == offset.data_ptr()   # why .contiguous() is not the fix there


def test_a_gpu_too_old_for_a_phase_gets_the_record_with_the_reason(monkeypatch):
    from flashcore_nb import measure
    monkeypatch.setattr(flashcore_nb.env, "mode", lambda: "live")
    monkeypatch.setattr(flashcore_nb.env, "gpu", lambda index=None: T4)
    m = measure.phase_runs("p06_async")
    assert m.record is not None and len(m.runs) == len(m.record["runs"])
    assert m.provenance.startswith("Tesla T4 (sm_75) cannot run p06_async (needs sm_80 or newer); showing the record: "
                                   "recorded on")
    monkeypatch.setattr(flashcore_nb.env, "gpu", lambda index=None: GpuInfo("NVIDIA B200", 100, 148, 232448, 0, "t"))
    m = measure.phase_runs("p08_wgmma")
    assert m.record is not None and m.provenance.startswith(
        "NVIDIA B200 (sm_100) cannot run p08_wgmma (needs sm_90); showing the record: recorded on")


def test_the_validation_cache_key_changes_with_everything_validation_reads():
    """binding.load's function validates once per key: any input validation would judge differently
    must give another key."""
    from flashcore_nb.binding import signature
    buffer = torch.randn(2 * 8 * 64 + 1, dtype=torch.float16)
    q, misaligned = buffer[:-1].view(1, 2, 8, 64), buffer[1:].view(1, 2, 8, 64)   # same shape, 2 bytes apart
    base = signature(q, q, q, False, None)
    others = {
        "dtype": signature(q.bfloat16(), q, q, False, None),
        "k's dtype": signature(q, q.float(), q, False, None),
        "shape": signature(q[:, :, :4], q, q, False, None),
        "strides": signature(q.transpose(2, 3), q, q, False, None),
        "causal": signature(q, q, q, True, None),
        "alignment": signature(misaligned, q, q, False, None),
        "k's device": signature(q, q.to("meta"), q, False, None),
        "out": signature(q, q, q, False, q.clone()),
    }
    assert signature(q, q, q, False, misaligned) != signature(q, q, q, False, q.clone()), "out's alignment"
    for what, key in others.items():
        assert key != base, what
    assert signature(q, q, q, False, None) == base
    assert signature([1], q, q, False, None) is None


def test_a_configuration_known_wrong_is_refused_before_it_is_built(tmp_path, monkeypatch):
    """p09 without OVERLAP, with 64-key tiles or with the wide wgmmas, gave wrong outputs on the H100: the build
    refuses it with the reason (before any compiler runs), and no variant the registry builds is one it refuses."""
    from flashcore_nb import build
    monkeypatch.setenv("FLASHCORE_BUILD_DIR", str(tmp_path))
    p09 = PHASES["p09_warpspec"]
    wrong = {**p09.tile_params, "OVERLAP": 0, "PINGPONG": 0, "BLOCK_N": 64}
    with pytest.raises(ValueError, match="OVERLAP=0 with 64-key tiles .* known phase 9 bug"):
        build.build_extension("p09_warpspec", 90, wrong)
    assert not any(tmp_path.iterdir())
    assert "OVERLAP=0 with WIDE_WGMMA=1 gives wrong results at D=128" in p09.refuses(
        {**p09.tile_params, "OVERLAP": 0, "PINGPONG": 0, "SPECULATE": 0})
    no_overlap = {**p09.tile_params, "OVERLAP": 0, "PINGPONG": 0, "SPECULATE": 0, "WIDE_WGMMA": 0, "CARRY_OVER": 0}
    assert p09.refuses(no_overlap) is None
    assert "SPECULATE=1 changes the overlapped step" in p09.refuses({**no_overlap, "SPECULATE": 1})
    assert "CARRY_OVER=1 moves the overlapped steps' last P·V" in p09.refuses({**no_overlap, "CARRY_OVER": 1})
    assert p09.refuses({**p09.tile_params, "BLOCK_N": 64, "BLOCK_N_D128": 64}) is None
    # the kernel's static_asserts on the work counter and the key split, said before a compile
    assert "DYNAMIC: 0 (a fixed round robin)" in p09.refuses({**p09.tile_params, "DYNAMIC": 3})
    assert "SPLIT_KEYS=1 splits the overlapped steps" in p09.refuses({**p09.tile_params, "SPLIT_KEYS": 1, "CARRY_OVER": 1})
    split3 = {**p09.tile_params, "SPLIT_KEYS": 1, "CONSUMERS": 3, "BLOCK_N": 64, "STAGES": 3}
    assert "SPLIT_KEYS=1 needs STAGES >= CONSUMERS + 1" in p09.refuses(split3)
    assert "with SPECULATE=1 and three consumers missed the accuracy tolerance" in p09.refuses({**split3, "STAGES": 4})
    assert p09.refuses({**split3, "STAGES": 4, "SPECULATE": 0, "CONSUMERS_D128": 2}) is None
    assert "CLUSTER_KEYS: 1 (no cluster), 2 or 4" in p09.refuses({**p09.tile_params, "CLUSTER_KEYS": 3})
    cluster = {**p09.tile_params, "CLUSTER_KEYS": 2, "DYNAMIC": 0}
    assert p09.refuses(cluster) is None
    for wrong in ({"DYNAMIC": 2}, {"CARRY_OVER": 1}, {"OVERLAP": 0, "PINGPONG": 0, "SPECULATE": 0, "WIDE_WGMMA": 0}):
        assert "CLUSTER_KEYS=2 or 4 splits the overlapped steps' key tiles" in p09.refuses({**cluster, **wrong})
    for phase in PHASES.values():
        for v in phase.variants:
            assert phase.refuses({**phase.tile_params, **v.defines}) is None, (phase.name, v.label)
