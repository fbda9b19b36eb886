"""A chapter on a GPU that cannot run its phase shows the record and says why, instead of a traceback."""
import pytest

from flashcore_nb import binding, build, env, measure, results
from flashcore_nb.env import GpuInfo

# sm_86 with 99 KB per block (an RTX 3090): no defaults of its own, so p06 gets the H100's, 177.5 KB at D = 128
RTX_3090 = GpuInfo("NVIDIA GeForce RTX 3090", 86, 82, 99 * 1024, 24 << 30, "any")


@pytest.fixture
def live_on(monkeypatch):
    def pretend(gpu: GpuInfo, load=lambda *args, **kwargs: pytest.fail("compiled a kernel")):
        monkeypatch.setattr(env, "mode", lambda: "live")
        monkeypatch.setattr(env, "gpu", lambda index=None: gpu)
        monkeypatch.setattr(binding, "load", load)
    return pretend


def test_defaults_too_big_for_this_gpu_fall_back_to_the_record(live_on):
    live_on(RTX_3090)
    m = measure.phase_runs("p06_async")
    assert m.record == results.load("p06_async")
    assert m.provenance.startswith(
        "NVIDIA GeForce RTX 3090 (sm_86) cannot run p06_async with its default tiles (p06_async with these tile "
        "sizes needs 181760 bytes of shared memory per block; NVIDIA GeForce RTX 3090 allows 101376")
    assert m.provenance.endswith(results.provenance(m.record))


def test_defaults_that_do_not_compile_here_fall_back_to_the_record(live_on):
    def invalid(*args, **kwargs):
        raise build.InvalidTilesError('p05_tile64.cu(52): error: static assertion failed with "BLOCK_M too big"')
    live_on(GpuInfo("NVIDIA A100-SXM4-40GB", 80, 108, 163 * 1024, 40 << 30, "any"), load=invalid)
    m = measure.phase_runs("p05_tile64")
    assert "cannot build p05_tile64 with its default tiles (BLOCK_M too big); showing the record" in m.provenance


def test_a_gpu_too_old_for_the_phase_is_said(live_on):
    live_on(GpuInfo("Tesla T4", 75, 40, 64 * 1024, 16 << 30, "any"))
    m = measure.phase_runs("p07_registers")
    assert m.provenance.startswith("Tesla T4 (sm_75) cannot run p07_registers (needs sm_80 or newer); showing")


def test_a_nvcc_of_another_cuda_major_is_refused_before_compiling(monkeypatch):
    monkeypatch.setattr(env.torch.version, "cuda", "12.8")
    monkeypatch.setattr(env, "nvcc_version", lambda: "13.0")
    assert "torch builds extensions only with its own CUDA major version" in env.cuda_mismatch()
    monkeypatch.setattr(build, "extension_name", lambda *args: "flashcore_test_never_built")
    with pytest.raises(build.CompileError, match="install a CUDA 12.x toolkit"):
        build.build_extension("p01_baseline", 90, {"NUM_THREADS": 128})
    monkeypatch.setattr(env, "nvcc_version", lambda: "12.4")
    assert env.cuda_mismatch() is None
    monkeypatch.setattr(env.torch.version, "cuda", None)   # a CPU torch builds nothing: nothing to match
    monkeypatch.setattr(env, "nvcc_version", lambda: "13.0")
    assert env.cuda_mismatch() is None
