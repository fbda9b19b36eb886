"""Every kernel compiles with plain nvcc (no GPU, no torch) for every arch its phase declares; the
kernels' source rules hold (no torch, each device helper once, no process-wide launch caches); the
Hopper primitives in kernels/common compile, link without libcuda, and run where there is an H100."""
import dataclasses
import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flashcore_nb import build, env
from flashcore_nb.paths import KERNELS_DIR
from flashcore_nb.phases import PHASES

FIXTURES = Path(__file__).parent / "kernels"

CASES = [(name, cc) for name, phase in PHASES.items() for cc in phase.archs]


@pytest.mark.parametrize("name,cc", CASES, ids=[f"{n}-sm_{cc}" for n, cc in CASES])
def test_compiles_with_ptxas_stats(name, cc, default_build_stats):
    phase = PHASES[name]
    stats = default_build_stats(name, cc)
    assert stats.kernels >= 1 and stats.registers > 0
    budget = phase.spill_budget_bytes
    assert stats.spill_stores <= budget and stats.spill_loads <= budget, f"{name} spills on sm_{cc}: {stats}"


# Every rung but the last (the defaults, compiled above), for every arch of its phase.
RUNG_CASES = [(name, label, defines, cc) for name, phase in PHASES.items()
              for label, defines in phase.variants_tagged("rung").items() if defines for cc in phase.archs]


@pytest.mark.parametrize("name,label,defines,cc", RUNG_CASES, ids=[f"{n}-{l}-sm_{cc}" for n, l, _, cc in RUNG_CASES])
def test_rungs_compile_within_the_spill_budget(name, label, defines, cc):
    """A chapter's rungs are measured builds: none may spill more than its phase's defaults are allowed to."""
    phase = PHASES[name]
    stats = build.compile_only(phase.kernel_file, cc, {**phase.tile_params_for(cc), **defines}, phase.arch_specific)
    budget = phase.spill_budget_bytes
    assert stats.spill_stores <= budget and stats.spill_loads <= budget, f"{label} spills on sm_{cc}: {stats}"


def test_invalid_tile_parameters_fail_with_the_reason():
    with pytest.raises(build.CompileError, match="NUM_THREADS must be a power of two"):
        build.compile_only(PHASES["p01_baseline"].kernel_file, 80, {"NUM_THREADS": 96})


def _nvcc() -> str:
    nvcc = env.nvcc_path()
    if nvcc is None:
        pytest.fail("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    return nvcc


def _kernel_files(kernels_dir: Path) -> list[Path]:
    return sorted([*kernels_dir.glob("*.cu"), *kernels_dir.glob("common/*.cuh")])


# --- torch stays out ----------------------------------------------------------------------------

_TORCH_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"](?:torch|ATen|c10)\b')


def torch_includes(kernels_dir: Path) -> list[str]:
    """`file:line` of every #include of torch, ATen or c10 in the kernel sources and common headers."""
    return [f"{path.relative_to(kernels_dir)}:{number}"
            for path in _kernel_files(kernels_dir)
            for number, line in enumerate(path.read_text().splitlines(), 1) if _TORCH_INCLUDE_RE.match(line)]


def test_kernels_include_no_torch():
    assert torch_includes(KERNELS_DIR) == []


def test_torch_include_check_catches_an_include_anywhere(kernels_copy):
    # The old check read only the text before the first "//" of a file, and every kernel opens with a comment.
    header = kernels_copy / "common" / "numeric.cuh"
    text = header.read_text()
    header.write_text(text + "  #include <ATen/ATen.h>\n")
    kernel = kernels_copy / "p05_tile64.cu"
    lines = kernel.read_text().splitlines()
    kernel.write_text("\n".join([*lines[:30], '#include "torch/extension.h"', *lines[30:]]))
    assert torch_includes(kernels_copy) == [f"common/numeric.cuh:{len(text.splitlines()) + 1}", "p05_tile64.cu:31"]


# --- each device helper once --------------------------------------------------------------------

# A __device__ function at file scope (column 0, so member functions are left out), and its name.
_DEVICE_FUNCTION_RE = re.compile(r"^(?:template\s*<[^>]*>\s*)?__device__\b[^;{]*?\b(\w+)\s*(?:<[^()]*>)?\s*\(",
                                 re.MULTILINE)
_FILE_TYPE_RE = re.compile(r"^(?:struct|class|union)\s+(\w+)|^using\s+(\w+)\s*=", re.MULTILINE)


def duplicated_device_helpers(kernels_dir: Path) -> list[str]:
    """Names of __device__ functions that a kernel file defines and common/ or another kernel file also does.

    A phase's own stages (compute_scores, accumulate_pv ...) take the phase's own types (its SharedStorage, its
    tile) and are rewritten by every phase that changes the layout: a function whose parameters name a type its
    file defines is such a stage. Everything else is a helper, and a helper lives in common/."""
    common = {match.group(1) for path in kernels_dir.glob("common/*.cuh")
              for match in _DEVICE_FUNCTION_RE.finditer(path.read_text())}
    helpers: dict[str, list[str]] = {}
    for path in sorted(kernels_dir.glob("*.cu")):
        text = path.read_text()
        own_types = {name for match in _FILE_TYPE_RE.finditer(text) for name in match.groups() if name}
        for match in _DEVICE_FUNCTION_RE.finditer(text):
            parameters = text[match.end():text.find("{", match.end())]
            if not own_types & set(re.findall(r"\w+", parameters)):
                helpers.setdefault(match.group(1), []).append(path.name)
    return sorted(f"{name}: {', '.join(files)}{' and common/' if name in common else ''}"
                  for name, files in helpers.items() if len(set(files)) > 1 or name in common)


def test_each_device_helper_is_defined_once():
    assert duplicated_device_helpers(KERNELS_DIR) == []


def test_helper_check_catches_a_copy(kernels_copy):
    kernel = kernels_copy / "p07_registers.cu"
    copy = ("__device__ __forceinline__ float quad_max(float x) {\n"
            "  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));\n}\n")
    kernel_start = "template <typename T, int kHeadDim, typename Cfg>\n__global__"
    kernel.write_text(kernel.read_text().replace(kernel_start, copy + kernel_start))
    p05 = kernels_copy / "p05_tile64.cu"
    p05.write_text(p05.read_text() + "\n__device__ float swizzled_offset(int rows, int row, int col) { return 0.f; }\n")
    assert duplicated_device_helpers(kernels_copy) == ["quad_max: p07_registers.cu and common/",
                                                       "swizzled_offset: p05_tile64.cu and common/"]


# --- launch caches are each build's own -----------------------------------------------------------

def _host_object(name: str, directory: Path) -> Path:
    """The phase compiled to an object with PTX only (the host code is what matters, and ptxas is slow)."""
    phase = PHASES[name]
    arch = "90a" if phase.arch_specific else "80"
    obj = directory / f"{name}.o"
    cmd = [_nvcc(), "-c", "-std=c++17", "-O3", f"-gencode=arch=compute_{arch},code=compute_{arch}",
           f"-I{KERNELS_DIR}", str(phase.kernel_file), "-o", str(obj)]
    compiled = subprocess.run(cmd, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    return obj


def test_launch_caches_are_local_symbols(tmp_path):
    """Builds of one file with other -D defines load into one process. A cache or counter with vague linkage
    becomes an STB_GNU_UNIQUE symbol, shared by all of them (phase 7's lesson; common/launch.cuh): none may
    exist."""
    with ThreadPoolExecutor() as pool:
        objects = dict(zip(PHASES, pool.map(lambda name: _host_object(name, tmp_path), PHASES)))
    for name, obj in objects.items():
        symbols = subprocess.run(["readelf", "-sW", "-C", str(obj)], capture_output=True, text=True, check=True).stdout
        shared = [line for line in symbols.splitlines() if " UNIQUE " in line]
        assert not shared, f"{name}: " + "\n".join(sorted(set(shared)))
    symbols = subprocess.run(["readelf", "-sW", "-C", str(objects["p07_registers"])], capture_output=True, text=True,
                             check=True).stdout
    caches = [line for line in symbols.splitlines() if "per_device_cache<" in line]
    assert caches and all(" LOCAL " in line for line in caches), caches


def test_invalid_tile_parameters_are_told_apart_from_a_broken_toolchain():
    with pytest.raises(build.InvalidTilesError) as caught:
        build.compile_only(PHASES["p05_tile64"].kernel_file, 80, {"BLOCK_M": 128, "NUM_WARPS": 2})
    assert build.compile_message(str(caught.value)).startswith("NUM_WARPS * 32 must be a multiple of BLOCK_M")
    with pytest.raises(build.CompileError) as caught:   # not a tile problem: no static_assert
        build.compile_only(PHASES["p05_tile64"].kernel_file, 80, {"BLOCK_M": "oops"})
    assert not isinstance(caught.value, build.InvalidTilesError)


def test_compile_message_is_the_static_assert_text():
    log = ('kernels/p05_tile64.cu(52): error: static assertion failed with "NUM_WARPS * 32 must be a '
           'multiple of BLOCK_M"\nkernels/p05_tile64.cu(59): error: right operand of "%" is zero\n')
    assert build.compile_message(log) == "NUM_WARPS * 32 must be a multiple of BLOCK_M"
    assert build.compile_message("x.cu(1): error: something else\n") == "x.cu(1): error: something else"


def test_registry_names_each_phases_kernel():
    """The profiler filters on it: it must be the name of a __global__ function in the phase's file."""
    for name, phase in PHASES.items():
        text = phase.kernel_file.read_text()
        assert re.search(rf"__global__[^;{{]*\b{phase.kernel_name}\(", text), name


def test_parse_ptxas_takes_the_worst_entry():
    log = """ptxas info    : Compiling entry function '_Z1aILi64EEvv' for 'sm_90'
ptxas info    : Function properties for _Z1aILi64EEvv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 34 registers, used 1 barriers, 1280 bytes smem
ptxas info    : Compiling entry function '_Z1aILi128EEvv' for 'sm_90'
ptxas info    : Function properties for _Z1aILi128EEvv
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1536 bytes smem, 400 bytes cmem[0]
"""
    stats = build.parse_ptxas(log)
    assert (stats.registers, stats.smem_bytes, stats.spill_stores, stats.spill_loads, stats.stack_bytes,
            stats.kernels) == (40, 1536, 8, 4, 16, 2)
    assert stats.entry_registers == {"_Z1aILi64EEvv": 34, "_Z1aILi128EEvv": 40}


def test_kernel_hash_covers_headers_and_defines():
    phase = PHASES["p01_baseline"]
    sources = build.kernel_sources(phase.kernel_file)
    assert {"p01_baseline.cu", "common/params.cuh", "common/dispatch.cuh", "common/numeric.cuh"} <= set(sources)
    assert build.kernel_sha256(phase.kernel_file, {"NUM_THREADS": 128}) != \
        build.kernel_sha256(phase.kernel_file, {"NUM_THREADS": 256})


def test_extension_names_differ_by_arch_and_flags():
    a = build.extension_name("p01_baseline", 80, {"NUM_THREADS": 128})
    assert a != build.extension_name("p01_baseline", 90, {"NUM_THREADS": 128})
    assert a != build.extension_name("p01_baseline", 80, {"NUM_THREADS": 256})
    assert a == build.extension_name("p01_baseline", 80, {"NUM_THREADS": 128})


# --- Hopper primitives (kernels/common/mbarrier.cuh, tma.cuh, warp_specialize.cuh) -----------------

HOPPER_FIXTURE = FIXTURES / "hopper_primitives.cu"


@pytest.fixture(scope="module")
def hopper_executable(tmp_path_factory) -> Path:
    """tests/kernels/hopper_primitives.cu for sm_90a, linked as nvcc links by default: no -lcuda."""
    exe = tmp_path_factory.mktemp("hopper") / "hopper_primitives"
    cmd = [_nvcc(), *build.NVCC_FLAGS, build.gencode(90, arch_specific=True), f"-I{KERNELS_DIR}", str(HOPPER_FIXTURE),
           "-o", str(exe)]
    compiled = subprocess.run(cmd, capture_output=True, text=True)
    assert compiled.returncode == 0, f"{' '.join(cmd)}\n{compiled.stderr}"
    return exe


def test_hopper_primitives_build_for_sm90a(hopper_executable):
    assert hopper_executable.exists()
    needed = subprocess.run(["readelf", "-d", str(hopper_executable)], capture_output=True, text=True,
                            check=True).stdout
    assert "NEEDED" in needed and "libcuda" not in needed, needed


def test_hopper_primitives_run_without_libcuda(hopper_executable):
    # Where there is no driver, the program still starts (nothing needs libcuda to load) and says so.
    ran = subprocess.run([str(hopper_executable)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith(("ok", "no CUDA device", "not an sm_90 GPU")), ran.stdout


def test_hopper_headers_compile_for_sm80(tmp_path):
    cmd = [_nvcc(), "-c", "-std=c++17", build.gencode(80), f"-I{KERNELS_DIR}", str(HOPPER_FIXTURE),
           "-o", str(tmp_path / "sm80.o")]
    compiled = subprocess.run(cmd, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr


@pytest.mark.parametrize("header,use,cc", [
    ("mbarrier.cuh", "__shared__ uint64_t bar; mbarrier_init(&bar, 1);", 80),
    ("tma.cuh", "tma_store_commit();", 80),
    ("warp_specialize.cuh", "setmaxnreg_inc<240>();", 90),   # sm_90 without the "a": no setmaxnreg
])
def test_hopper_primitive_used_where_it_does_not_exist_fails_to_compile(tmp_path, header, use, cc):
    source = tmp_path / "use.cu"
    source.write_text(f'#include "common/{header}"\n__global__ void use() {{ {use} }}\n')
    cmd = [_nvcc(), "-c", "-std=c++17", build.gencode(cc), f"-I{KERNELS_DIR}", str(source),
           "-o", str(tmp_path / "use.o")]
    compiled = subprocess.run(cmd, capture_output=True, text=True)
    name = re.match(r"(?:__shared__ uint64_t bar; )?(\w+)", use).group(1)
    assert compiled.returncode != 0 and f'identifier "{name}" is undefined' in compiled.stderr, compiled.stderr


@pytest.mark.gpu
def test_hopper_primitives_on_an_h100(hopper_executable):
    ran = subprocess.run([str(hopper_executable)], capture_output=True, text=True, timeout=120)
    if ran.stdout.startswith("not an sm_90 GPU"):
        pytest.skip(ran.stdout.strip())
    assert ran.returncode == 0 and ran.stdout.strip() == "ok", ran.stdout + ran.stderr


# --- ptxas stats are kept per build ---------------------------------------------------------------

def test_ptxas_stats_are_kept_per_build(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHCORE_BUILD_DIR", str(tmp_path))
    phase = PHASES["p02_vectorized"]
    first = build.compile_only(phase.kernel_file, 80, phase.tile_params)
    [kept] = (tmp_path / "ptxas").iterdir()
    kept.write_text(json.dumps({**dataclasses.asdict(first), "registers": 999}))   # read back, not recompiled
    assert build.compile_only(phase.kernel_file, 80, phase.tile_params).registers == 999
    assert build.compile_only(phase.kernel_file, 80, {**phase.tile_params, "AN_UNUSED_DEFINE": 1}) == first
    assert len(list((tmp_path / "ptxas").iterdir())) == 2


def test_ptxas_stats_of_a_file_outside_kernels_are_not_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHCORE_BUILD_DIR", str(tmp_path / "build"))
    example = tmp_path / "example.cu"
    example.write_text("__global__ void scale(float* x) { x[threadIdx.x] *= 2.f; }\n")
    assert build.compile_only(example, 80, {}).kernels == 1
    assert not (tmp_path / "build").exists()
