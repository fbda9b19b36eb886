"""What machine this is: the visible GPU (or none), the software around it, and the mode.

Mode `live` means CUDA is here, so notebooks compile and measure on this GPU; `replay` means no
CUDA, so notebooks show results recorded on a real GPU. `FLASHCORE_MODE=live|replay` overrides.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

import torch

MODES = ("live", "replay")


@dataclass(frozen=True)
class GpuInfo:
    name: str
    cc: int                      # compute capability as one number: 9.0 -> 90
    sms: int
    smem_per_block_optin: int    # bytes a CTA may use after opting in to > 48 KB
    total_memory: int
    driver: str

    @property
    def arch(self) -> str:
        return f"sm_{self.cc}"


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (the results/ folder name)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@lru_cache(maxsize=None)
def gpu(index: int | None = None) -> GpuInfo | None:
    """The visible CUDA device (the current one unless `index` is given), or None."""
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    optin = getattr(props, "shared_memory_per_block_optin", None) or 48 * 1024
    return GpuInfo(
        name=props.name,
        cc=props.major * 10 + props.minor,
        sms=props.multi_processor_count,
        smem_per_block_optin=int(optin),
        total_memory=int(props.total_memory),
        driver=driver_version(),
    )


def mode() -> str:
    forced = os.environ.get("FLASHCORE_MODE", "").strip().lower()
    if forced:
        if forced not in MODES:
            raise ValueError(f"FLASHCORE_MODE={forced!r}: expected one of {MODES}")
        if forced == "live" and not torch.cuda.is_available():
            raise RuntimeError("FLASHCORE_MODE=live but PyTorch sees no CUDA device")
        return forced
    return "live" if torch.cuda.is_available() else "replay"


@lru_cache(maxsize=None)
def driver_version() -> str:
    if not shutil.which("nvidia-smi"):
        return "unknown"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


@lru_cache(maxsize=None)
def nvcc_version() -> str | None:
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def nvcc_path() -> str | None:
    """The nvcc torch's extension builder uses: $CUDA_HOME's (or $CUDA_PATH's), else the one on PATH,
    else /usr/local/cuda's; any of them, in that order, for compile-only builds."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [os.path.join(home, "bin", "nvcc") if home else None, shutil.which("nvcc"),
                  "/usr/local/cuda/bin/nvcc"]
    return next((path for path in candidates if path and os.path.exists(path)), None)


def cuda_mismatch() -> str | None:
    """Why nvcc cannot build kernels that this torch loads (none, or another CUDA major version), or
    None when it can. A CPU-only torch builds nothing, so compile-only use of nvcc never mismatches."""
    if torch.version.cuda is None:
        return None
    wanted = torch.version.cuda.split(".")[0]
    fix = (f"install a CUDA {wanted}.x toolkit and put its nvcc first on PATH or set CUDA_HOME to it "
           f"(or install a torch built for the CUDA you have)")
    found = nvcc_version()
    if found is None:
        return f"nvcc not found: torch {torch.__version__} compiles the kernels with nvcc; {fix}"
    if found.split(".")[0] != wanted:
        return (f"nvcc {found} ({nvcc_path()}) is CUDA {found.split('.')[0]}, but torch {torch.__version__} was built "
                f"with CUDA {torch.version.cuda}, and torch builds extensions only with its own CUDA major version; "
                f"{fix}")
    return None


def environment() -> dict:
    """The environment line stored beside every measurement."""
    info = gpu()
    return {
        "gpu": info.name if info else None,
        "cc": info.cc if info else None,
        "driver": info.driver if info else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nvcc": nvcc_version(),
        "python": platform.python_version(),
    }


def describe() -> str:
    """One paragraph for the top of a notebook: what is here and which mode we are in."""
    info = gpu()
    lines = [f"mode: {mode()}", f"torch {torch.__version__} (CUDA {torch.version.cuda})"]
    if info:
        lines.append(
            f"GPU: {info.name}, {info.arch}, {info.sms} SMs, "
            f"{info.smem_per_block_optin // 1024} KB smem/block (opt-in), driver {info.driver}"
        )
    else:
        lines.append("GPU: none visible; pages show results recorded on a real GPU")
    nvcc = nvcc_version()
    lines.append(f"nvcc: {nvcc}" if nvcc else "nvcc: not found (ptxas stats come from the records)")
    mismatch = cuda_mismatch() if info else None
    if mismatch:
        lines.append(f"cannot compile live: {mismatch}")
    return "\n".join(lines)
