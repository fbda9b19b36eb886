"""Every kernel compiles with plain nvcc (no GPU, no torch) for every arch its phase declares."""
import re

import pytest

from flashcore_nb import build
from flashcore_nb.phases import PHASES

CASES = [(name, cc) for name, phase in PHASES.items() for cc in phase.archs]


@pytest.mark.parametrize("name,cc", CASES, ids=[f"{n}-sm_{cc}" for n, cc in CASES])
def test_compiles_with_ptxas_stats(name, cc, default_build_stats):
    phase = PHASES[name]
    stats = default_build_stats(name, cc)
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
