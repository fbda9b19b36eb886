import pytest
import torch


@pytest.fixture(scope="session")
def cuda():
    """GPU tests fail loudly (never skip) when run where there is no GPU."""
    if not torch.cuda.is_available():
        pytest.fail("this test needs a CUDA GPU: run `pytest -m gpu` on a GPU machine")
    return torch.device("cuda")


@pytest.fixture
def kernels_copy(tmp_path, monkeypatch):
    """A copy of kernels/ that the package reads instead, for tests that edit a kernel."""
    import shutil

    from flashcore_nb import build, phases
    from flashcore_nb.paths import KERNELS_DIR
    kernels = tmp_path / "kernels"
    shutil.copytree(KERNELS_DIR, kernels)
    monkeypatch.setattr(phases, "KERNELS_DIR", kernels)
    monkeypatch.setattr(build, "KERNELS_DIR", kernels)
    return kernels


@pytest.fixture(scope="session")
def default_build_stats():
    """ptxas stats of a phase's default build for one arch (nvcc -c, no GPU), compiled once per session
    however many tests ask: stats(phase_name, cc) -> build.PtxasStats."""
    from functools import lru_cache

    from flashcore_nb import build
    from flashcore_nb.phases import PHASES

    @lru_cache(maxsize=None)
    def stats(name: str, cc: int):
        phase = PHASES[name]
        return build.compile_only(phase.kernel_file, cc, phase.tile_params_for(cc), phase.arch_specific)
    return stats
