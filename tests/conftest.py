import pytest
import torch


@pytest.fixture(scope="session")
def cuda():
    """GPU tests fail loudly (never skip) when run where there is no GPU."""
    if not torch.cuda.is_available():
        pytest.fail("this test needs a CUDA GPU: run `pytest -m gpu` on a GPU machine")
    return torch.device("cuda")
