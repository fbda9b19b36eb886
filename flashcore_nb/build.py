"""Compiling a phase.

Two paths share one set of flags:
- `build_extension` runs the kernel: `load_inline` with the light pybind11 binding in csrc/, one
  extension per (sources, flags, arch, toolchain) hash in a persistent build directory.
- `compile_only` runs plain `nvcc -c` for any arch on a machine with no GPU, for ptxas stats.

ptxas `-v` stats come from both. With verbose=True, torch's ninja writes the compiler output to file
descriptor 1, which Jupyter's Python-level capture never sees, so the build redirects fd 1 into a
log file and parses it.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import env, source_patch
from .paths import KERNELS_DIR
from .phases import get

BINDING_FILE = Path(__file__).parent / "csrc" / "binding.cpp"
_INCLUDE_RE = re.compile(r'^\s*#include\s+"(common/[^"]+)"', re.MULTILINE)
# Common to every compile. -lineinfo keeps source lines in compute-sanitizer reports at no cost.
NVCC_FLAGS = ("-O3", "-std=c++17", "-lineinfo", "-Xptxas=-v")


class CompileError(RuntimeError):
    """nvcc or ptxas rejected a kernel, or this toolchain cannot build one for this torch."""


class InvalidTilesError(CompileError):
    """A static_assert rejected the tile parameters: the configuration is invalid, not the toolchain."""


def compile_message(log: str) -> str:
    """The static_assert text the compiler printed, or the first error line."""
    found = re.search(r'static assertion failed with "([^"]+)"', log)
    if found:
        return found.group(1)
    errors = [line.strip() for line in log.splitlines() if "error" in line]
    return errors[0] if errors else log.strip().splitlines()[-1]


def _compile_error(message: str, log: str) -> CompileError:
    kind = InvalidTilesError if "static assertion failed" in log else CompileError
    return kind(f"{message}\n{log}")


# --- sources and hashes -------------------------------------------------------------------------

def kernel_text(kernel_file: Path, patch: Path | None = None) -> str:
    """The source a build compiles: the kernel file, or (an exploration build) the file with the patch applied."""
    return Path(kernel_file).read_text() if patch is None else source_patch.patched_source(kernel_file, patch)


def kernel_sources(kernel_file: Path, patch: Path | None = None) -> dict[str, str]:
    """The kernel file (patched, where a patch is named) and every kernels/common header it includes,
    transitively, by relative path."""
    kernel_rel = Path(kernel_file).resolve().relative_to(KERNELS_DIR).as_posix()
    sources: dict[str, str] = {}
    pending = [kernel_rel]
    while pending:
        rel = pending.pop()
        if rel in sources:
            continue
        text = kernel_text(kernel_file, patch) if rel == kernel_rel else (KERNELS_DIR / rel).read_text()
        sources[rel] = text
        pending.extend(_INCLUDE_RE.findall(text))
    return dict(sorted(sources.items()))


def define_flags(tile_params: dict) -> list[str]:
    return [f"-D{key}={value}" for key, value in sorted(tile_params.items())]


def kernel_sha256(kernel_file: Path, tile_params: dict, patch: Path | None = None) -> str:
    """Identity of a kernel build: its source (patched, for an exploration build), the common headers it uses
    and its defines.

    A recorded result carries this hash; when the kernel changes, the record is stale."""
    digest = hashlib.sha256()
    for rel, text in kernel_sources(kernel_file, patch).items():
        digest.update(rel.encode() + b"\0" + text.encode() + b"\0")
    digest.update(" ".join(define_flags(tile_params)).encode())
    return digest.hexdigest()


def gencode(cc: int, arch_specific: bool = False) -> str:
    # Naming the arch ourselves is deliberate: torch then adds no arch flags of its own. The "a" targets
    # (sm_90a) enable one arch's own instructions, and run on that arch only.
    arch = f"{cc}a" if arch_specific else str(cc)
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


# --- ptxas stats --------------------------------------------------------------------------------

@dataclass
class PtxasStats:
    registers: int
    smem_bytes: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    kernels: int        # entry points compiled (template instantiations)
    # registers of each entry point (mangled name): where head dims launch different thread counts (phase 9),
    # each instantiation's own count is what decides whether it launches
    entry_registers: dict = field(default_factory=dict)

    def columns(self) -> dict:
        """The build as one table row: the worst entry point's numbers (each entry's registers left out)."""
        return {key: value for key, value in vars(self).items() if key != "entry_registers"}


_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log: str) -> PtxasStats:
    """Worst case over the kernel's entry points: max registers, smem, spills and stack."""
    entries = _ENTRY_RE.findall(log)
    frames = [tuple(map(int, m)) for m in _FRAME_RE.findall(log)]
    used = [(int(r), int(s or 0)) for r, s in _USED_RE.findall(log)]
    if not entries or not used:
        raise ValueError("no ptxas -v report in the compiler output")
    return PtxasStats(
        registers=max(r for r, _ in used),
        entry_registers=dict(zip(entries, (r for r, _ in used))) if len(entries) == len(used) else {},
        smem_bytes=max(s for _, s in used),
        spill_stores=max((f[1] for f in frames), default=0),
        spill_loads=max((f[2] for f in frames), default=0),
        stack_bytes=max((f[0] for f in frames), default=0),
        kernels=len(entries),
    )


def compile_only(kernel_file: Path, cc: int, tile_params: dict, arch_specific: bool = False,
                 patch: Path | None = None) -> PtxasStats:
    """`nvcc -c` for one arch, no GPU needed; raises CompileError with the compiler's message.

    The stats of a kernel under kernels/ are kept under the build directory by the build's identity (its
    sources and defines, the arch, the flags and nvcc's version): a page or test that shows them compiles
    once per machine. A file elsewhere (a chapter's own example) is compiled every time."""
    cached = None
    if Path(kernel_file).resolve().is_relative_to(KERNELS_DIR):
        identity = _identity(kernel_file, cc, tile_params, arch_specific, patch,
                             sorted(PtxasStats.__dataclass_fields__))   # what a stats file holds
        cached = build_root() / "ptxas" / f"{identity}.json"
        if cached.exists():
            return PtxasStats(**json.loads(cached.read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        log = _nvcc(kernel_file, cc, tile_params, arch_specific, patch, "-c", Path(tmp) / "kernel.o")
    stats = parse_ptxas(log)
    if cached is not None:
        _write_whole(cached, json.dumps(asdict(stats)).encode())
    return stats


def cubin(kernel_file: Path, cc: int, tile_params: dict, arch_specific: bool = False,
          patch: Path | None = None) -> bytes:
    """The kernel's machine code for one arch as a cubin (`nvcc -cubin`, the flags of every build), for the driver
    API to load beside the extension (clusters.py); kept under the build directory by the build's identity."""
    cached = build_root() / "cubin" / f"{_identity(kernel_file, cc, tile_params, arch_specific, patch)}.cubin"
    if not cached.exists():
        with tempfile.TemporaryDirectory() as tmp:
            _nvcc(kernel_file, cc, tile_params, arch_specific, patch, "-cubin", Path(tmp) / "kernel.cubin")
            _write_whole(cached, (Path(tmp) / "kernel.cubin").read_bytes())
    return cached.read_bytes()


def _identity(kernel_file, cc, tile_params, arch_specific, patch, *extra) -> str:
    """A build's identity: its sources and defines, the arch, the flags and nvcc's version."""
    identity = json.dumps([kernel_sha256(kernel_file, tile_params, patch), cc, arch_specific, NVCC_FLAGS,
                           env.nvcc_version(), *extra])
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


def _nvcc(kernel_file, cc, tile_params, arch_specific, patch, mode: str, output: Path) -> str:
    """nvcc in `mode` (-c, -cubin) on the kernel (patched where a patch is named) into `output`; its log."""
    nvcc = env.nvcc_path()
    if nvcc is None:
        raise CompileError("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    source = Path(kernel_file)
    if patch is not None:   # the patched text, compiled from a copy (its includes resolve through -I)
        source = output.parent / Path(kernel_file).name
        source.write_text(kernel_text(kernel_file, patch))
    cmd = [nvcc, mode, *NVCC_FLAGS, gencode(cc, arch_specific), f"-I{KERNELS_DIR}", *define_flags(tile_params),
           str(source), "-o", str(output)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise _compile_error(f"nvcc failed for sm_{cc}:", log)
    return log


def _write_whole(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}")
    partial.write_bytes(data)
    partial.replace(path)   # readers see a whole file or none


# --- load_inline --------------------------------------------------------------------------------

def build_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flashcore" / "build"
    return Path(os.environ.get("FLASHCORE_BUILD_DIR", default))


def extension_name(phase_name: str, cc: int, tile_params: dict, patch: Path | None = None) -> str:
    import torch

    digest = hashlib.sha256()
    digest.update(kernel_sha256(KERNELS_DIR / f"{phase_name}.cu", tile_params, patch).encode())
    digest.update(BINDING_FILE.read_bytes())
    toolchain = (cc, NVCC_FLAGS, torch.__version__, torch.version.cuda, env.nvcc_version())
    digest.update(repr(toolchain).encode())
    return f"flashcore_{phase_name}_{digest.hexdigest()[:16]}"


@dataclass
class Built:
    module: object          # .forward(...) and .smem_bytes(...), see csrc/binding.cpp
    name: str
    ptxas: PtxasStats
    seconds: float          # wall time of this call (compile, or load from cache)
    cached: bool


_loaded: dict[str, Built] = {}


def build_extension(phase_name: str, cc: int, tile_params: dict, progress: bool = True,
                    patch: Path | None = None) -> Built:
    """Compile (or load from the persistent cache) one phase for one arch and tile configuration, with an
    exploration patch applied where one is named; a configuration the registry refuses (Phase.refuses) raises
    ValueError with its reason."""
    refusal = get(phase_name).refuses(tile_params)
    if refusal:
        raise ValueError(f"{phase_name}: {refusal}")
    name = extension_name(phase_name, cc, tile_params, patch)
    if name in _loaded:
        return _loaded[name]
    start = time.perf_counter()
    directory = build_root() / name
    library = directory / f"{name}.so"
    stats_file = directory / "ptxas.json"
    if library.exists() and stats_file.exists():
        module = _import_library(name, library)
        stats = PtxasStats(**json.loads(stats_file.read_text()))
        built = Built(module, name, stats, time.perf_counter() - start, cached=True)
    else:
        # torch's JIT builder does not compare the two itself: a mismatch would fail late and obscurely
        mismatch = env.cuda_mismatch()
        if mismatch:
            raise CompileError(mismatch)
        # A build interrupted before its stats were written: start clean, or ninja would find the
        # objects up to date and print no ptxas report.
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        module, log = _compile(phase_name, name, directory, cc, tile_params, progress, patch)
        stats = parse_ptxas(log)
        stats_file.write_text(json.dumps(asdict(stats)))
        built = Built(module, name, stats, time.perf_counter() - start, cached=False)
    _loaded[name] = built
    return built


def _import_library(name: str, library: Path):
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(phase_name, name, directory, cc, tile_params, progress, patch=None):
    from torch.utils.cpp_extension import load_inline

    kernel_file = KERNELS_DIR / f"{phase_name}.cu"
    log_file = directory / "build.log"
    label = f"compiling {phase_name} for sm_{cc}"
    try:
        with progress_ticker(label, enabled=progress), capture_fd1(log_file):
            module = load_inline(
                name=name,
                cpp_sources=BINDING_FILE.read_text(),
                cuda_sources=kernel_text(kernel_file, patch),
                extra_include_paths=[str(KERNELS_DIR)],
                extra_cflags=["-O2", "-std=c++17"],
                extra_cuda_cflags=[*NVCC_FLAGS, gencode(cc, get(phase_name).arch_specific), *define_flags(tile_params)],
                build_directory=str(directory),
                with_cuda=True,
                no_implicit_headers=True,   # the sources include what they need; torch's headers cost ~10 s
                verbose=True,               # so the ptxas report reaches fd 1 (and our log)
            )
    except Exception as error:
        log = log_file.read_text() if log_file.exists() else ""
        raise _compile_error(f"{label} failed: {error}", log[-6000:]) from None
    return module, log_file.read_text()


@contextlib.contextmanager
def capture_fd1(path: Path):
    """Send file descriptor 1 (where ninja and nvcc write) to `path` for the duration."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(path, "wb") as sink:
            os.dup2(sink.fileno(), 1)
            try:
                yield
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
    finally:
        os.close(saved)


# A line of the ticker below once captured (every label starts "compiling"): what pages filter out.
TICKER_LINE = re.compile(r"^compiling .+ \.\.\. ")


@contextlib.contextmanager
def progress_ticker(label: str, enabled: bool):
    """A one-line elapsed-time ticker on stderr while a compile runs (stdout is redirected)."""
    if not enabled:
        yield
        return
    done = threading.Event()
    start = time.perf_counter()

    def tick():
        while not done.wait(1.0):
            print(f"\r{label} ... {time.perf_counter() - start:4.0f} s", end="", file=sys.stderr, flush=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        print(f"\r{label} ... done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
