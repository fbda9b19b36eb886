"""Every kernel compiles with plain nvcc (no GPU, no torch) for every arch its phase declares."""
import pytest

from flashcore_nb import build
from flashcore_nb.phases import PHASES

CASES = [(name, cc) for name, phase in PHASES.items() for cc in phase.archs]


@pytest.mark.parametrize("name,cc", CASES, ids=[f"{n}-sm_{cc}" for n, cc in CASES])
def test_compiles_with_ptxas_stats(name, cc):
    phase = PHASES[name]
    stats = build.compile_only(phase.kernel_file, cc, phase.tile_params_for(cc), phase.arch_specific)
    assert stats.kernels >= 1 and stats.registers > 0
    budget = phase.spill_budget_bytes
    assert stats.spill_stores <= budget and stats.spill_loads <= budget, f"{name} spills on sm_{cc}: {stats}"


def test_invalid_tile_parameters_fail_with_the_reason():
    with pytest.raises(build.CompileError, match="NUM_THREADS must be a power of two"):
        build.compile_only(PHASES["p01_baseline"].kernel_file, 80, {"NUM_THREADS": 96})


def test_kernels_include_no_torch():
    for name, phase in PHASES.items():
        for rel, text in build.kernel_sources(phase.kernel_file).items():
            assert "torch" not in text.split("//")[0] and "#include <torch" not in text, rel


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
