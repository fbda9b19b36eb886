"""The fast call path: csrc/launcher.cpp, a torch-aware launcher built once and shared by every phase.

Phases stay torch-free extensions (they compile in seconds); the launcher registers the operators
torch.ops.flashcore.attention and attention_out, and each loaded phase registers the address of
its flashcore_forward with it. A call is then one operator call: C++ takes
the current stream, allocates the output through the caching allocator and launches."""
from __future__ import annotations

import hashlib
from functools import lru_cache

from . import build, env
from .paths import KERNELS_DIR
from .phases import Phase

LAUNCHER_FILE = build.BINDING_FILE.parent / "launcher.cpp"


def launcher_name() -> str:
    import torch

    digest = hashlib.sha256(LAUNCHER_FILE.read_bytes())
    digest.update((KERNELS_DIR / "common" / "params.cuh").read_bytes())
    digest.update(repr((torch.__version__, torch.version.cuda, env.nvcc_version())).encode())
    return f"flashcore_launcher_{digest.hexdigest()[:16]}"


@lru_cache(maxsize=None)
def launcher():
    """The launcher module (compiled on first use, about a minute; then loaded from the build cache)."""
    from torch.utils.cpp_extension import load

    name = launcher_name()
    directory = build.build_root() / name
    directory.mkdir(parents=True, exist_ok=True)
    log_file = directory / "build.log"
    try:
        with build.progress_ticker(f"compiling the launcher ({LAUNCHER_FILE.name}, once)", enabled=True), \
                build.capture_fd1(log_file):
            return load(name=name, sources=[str(LAUNCHER_FILE)], extra_include_paths=[str(KERNELS_DIR)],
                        extra_cflags=["-O2"], build_directory=str(directory), with_cuda=True,
                        verbose=True)
    except Exception as error:
        log = log_file.read_text() if log_file.exists() else ""
        raise build.CompileError(f"building the launcher failed: {error}\n{log[-6000:]}") from None


def register(module, phase: Phase) -> int:
    """Register one loaded phase extension; returns its handle for torch.ops.flashcore.*."""
    head_dims_mask = sum(1 << (d // 64 - 1) for d in phase.head_dims)
    return launcher().register_phase(module.forward_address(), head_dims_mask, phase.causal, phase.cross_lengths,
                                     phase.aligned_16b)
