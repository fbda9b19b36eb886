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
