"""The shared-memory budget equals each kernel's own sizeof, and the occupancy arithmetic is right."""
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from flashcore_nb import budget, build, env
from flashcore_nb.paths import KERNELS_DIR
from flashcore_nb.phases import get

# (phase, tile-parameter overrides): every layout smem_buffers knows, and the tile parameters that change it
CONFIGS = [
    ("p03_wmma", {}),
    ("p04_fp32p", {"P_FP32": 1}),
    ("p04_fp32p", {"P_FP32": 0}),
    ("p05_tile64", {}),
    ("p05_tile64", {"BLOCK_M": 32, "BLOCK_N": 32, "NUM_WARPS": 4}),
    ("p05_tile64", {"BLOCK_M": 128, "BLOCK_N": 64, "NUM_WARPS": 8}),
    ("p06_async", {}),
    ("p06_async", {"BLOCK_M": 32, "BLOCK_N": 64, "NUM_WARPS": 16, "STAGES": 3}),
    # SMALL_PROBLEM_CTAS fixed so that the tiny problem takes the key-split path without asking a GPU
    ("p07_registers", {"SMALL_PROBLEM_CTAS": 1000}),
    ("p07_registers", {"SMALL_PROBLEM_CTAS": 1000, "BLOCK_M": 64, "STAGES": 3, "BLOCK_M_D128": 256,
                       "STAGES_D128": 2, "SPLIT_BLOCK_M": 16, "SPLIT_STAGES": 1, "KV_SPLIT": 2}),
    ("p07_registers", {"SMALL_PROBLEM_CTAS": 1000, "OVERLAP_SOFTMAX": 1, "BLOCK_N": 32, "STAGES": 3,
                       "STAGES_D128": 4}),
    ("p08_wgmma", {}),
    ("p08_wgmma", {"WARPGROUPS": 3, "BLOCK_N": 192, "WARPGROUPS_D128": 1, "BLOCK_N_D128": 64}),
]
HEAD_DIMS = (64, 128)

# Calls only the host function flashcore_smem_bytes, so the program runs on a machine with no GPU.
# Two problems: a large one and a one-row one (p07 takes its key-split path for the second).
MAIN = """
#include <cstdio>
#include "common/params.cuh"
int main() {
  const int head_dims[] = {64, 128}, sizes[] = {64, 1};
  for (int size : sizes)
    for (int head_dim : head_dims) {
      FlashParams params{};
      params.head_dim = head_dim;
      params.batch = params.heads = size;
      params.seqlen_q = params.seqlen_k = size * 64;
      std::printf("%d %d %zu\\n", size == 1, head_dim, flashcore_smem_bytes(&params));
    }
}
"""


def _config_id(config):
    name, overrides = config
    return "-".join([name, *(f"{k}={v}" for k, v in overrides.items())])


@pytest.fixture(scope="module")
def kernel_sizeof(tmp_path_factory) -> dict[str, dict[int, int]]:
    """sizeof(SharedStorage) per config and head dim, as the compiled kernel reports it."""
    nvcc = env.nvcc_path()
    if nvcc is None:
        pytest.fail("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    tmp = tmp_path_factory.mktemp("smem")
    main = tmp / "main.cpp"
    main.write_text(MAIN)

    def run(config):
        name, overrides = config
        exe = tmp / _config_id(config)
        # PTX only: no SASS to assemble keeps each build to a few seconds
        arch = "90a" if get(name).arch_specific else "90"
        cmd = [nvcc, "-std=c++17", f"-I{KERNELS_DIR}", f"-gencode=arch=compute_{arch},code=compute_{arch}",
               *build.define_flags(overrides), str(KERNELS_DIR / f"{name}.cu"), str(main), "-o", str(exe)]
        compiled = subprocess.run(cmd, capture_output=True, text=True)
        assert compiled.returncode == 0, f"{' '.join(cmd)}\n{compiled.stderr}"
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
        return {(bool(int(small)), int(d)): int(n) for small, d, n in (line.split() for line in out.splitlines())}

    with ThreadPoolExecutor() as pool:
        return dict(zip(map(_config_id, CONFIGS), pool.map(run, CONFIGS)))


@pytest.mark.parametrize("config", CONFIGS, ids=[_config_id(c) for c in CONFIGS])
def test_budget_equals_the_kernels_sizeof(config, kernel_sizeof):
    name, overrides = config
    for small in (False, True):
        split = small and name == "p07_registers"
        for head_dim in HEAD_DIMS:
            assert budget.smem_bytes(name, head_dim, overrides, split) == \
                kernel_sizeof[_config_id(config)][small, head_dim], (small, head_dim)


def test_buffers_by_name():
    # p05 at 64x64, D = 64: Q, K, V 64 rows x (64 + 8) halves; S then P 64 x (64 + 4) floats; O the same
    assert [(b.name, b.bytes) for b in budget.smem_buffers("p05_tile64", 64)] == [
        ("Q tile", 9216), ("K tile", 9216), ("V tile", 9216), ("S then P (fp32 / fp16)", 17408),
        ("O accumulator (fp32)", 17408)]
    # the second P plane: 32 rows x (32 + 8) halves = 2560 bytes
    assert budget.smem_bytes("p04_fp32p", 64, {"P_FP32": 1}) - budget.smem_bytes("p04_fp32p", 64, {"P_FP32": 0}) == 2560
    assert "P lo (fp16)" not in [b.name for b in budget.smem_buffers("p03_wmma", 128)]
    with pytest.raises(ValueError, match="no shared-memory layout"):
        budget.smem_buffers("p01_baseline", 64)


def test_occupancy_register_limited():
    # H100, 256 threads (8 warps), 128 registers, 62464 B:
    #   threads:   64 warps / 8                                  = 8 blocks
    #   registers: 128 * 32 = 4096 per warp (a multiple of 256); 65536 / (4096 * 8) = 2 blocks
    #   smem:      233472 / (62464 + 1024 reserved) = 3.68        = 3 blocks
    occ = budget.occupancy(budget.GPUS["H100"], 256, 128, 62464)
    assert (occ.blocks_per_sm, occ.limiter, occ.active_warps, occ.occupancy, occ.fits) == \
        (2, "registers", 16, 0.25, True)


def test_occupancy_smem_limited_with_the_reserved_kilobyte():
    # H100, 128 threads (4 warps), 64 registers, 30 KB = 30720 B:
    #   threads:   64 / 4                                        = 16 blocks
    #   registers: 64 * 32 = 2048 per warp; 65536 / (2048 * 4)   = 8 blocks
    #   smem:      233472 / (30720 + 1024) = 7.35                = 7 blocks (8 without the reserved 1 KB)
    #   7 blocks * 4 warps = 28 of 64 warps = 43.75 %
    occ = budget.occupancy(budget.GPUS["H100"], 128, 64, 30 * 1024)
    assert (occ.blocks_per_sm, occ.limiter, occ.active_warps, occ.occupancy) == (7, "shared memory", 28, 0.4375)


def test_occupancy_rounds_registers_per_warp_up():
    # A100, 256 threads (8 warps), 33 registers: 33 * 32 = 1056 -> 1280 per warp (5 units of 256);
    # 65536 / (1280 * 8) = 6.4 -> 6 blocks (without rounding: 65536 / 8448 = 7)
    occ = budget.occupancy(budget.GPUS["A100"], 256, 33, 0)
    assert (occ.blocks_per_sm, occ.limiter) == (6, "registers")


def test_occupancy_t4():
    # T4, 256 threads, 32 registers, 62464 B: smem 65536 / 62464 (nothing reserved on sm_75) = 1 block;
    # threads 32 / 8 = 4, registers 65536 / (1024 * 8) = 8. 8 of 32 warps = 25 %
    occ = budget.occupancy(budget.GPUS["T4"], 256, 32, 62464)
    assert (occ.blocks_per_sm, occ.limiter, occ.occupancy) == (1, "shared memory", 0.25)
    # T4, 1024 threads (32 warps), 32 registers, no smem: threads 32 / 32 = 1 block;
    # registers 65536 / (1024 * 32) = 2, smem no limit, blocks 16. 32 of 32 warps = 100 %
    occ = budget.occupancy(budget.GPUS["T4"], 1024, 32, 0)
    assert (occ.blocks_per_sm, occ.limiter, occ.occupancy) == (1, "threads", 1.0)


def test_occupancy_blocks_limited():
    # L4, 32 threads (1 warp), 32 registers, 1 KB: threads 48, registers 65536 / 1024 = 64,
    # smem 102400 / (1024 + 1024) = 50, blocks 24 -> 24 blocks, 24 of 48 warps = 50 %
    occ = budget.occupancy(budget.GPUS["L4"], 32, 32, 1024)
    assert (occ.blocks_per_sm, occ.limiter, occ.occupancy) == (24, "blocks", 0.5)


def test_occupancy_does_not_fit():
    h100 = budget.GPUS["H100"]
    # 240 KB = 245760 B > 227 KB = 232448 B, the most one block may opt in to
    occ = budget.occupancy(h100, 128, 64, 240 * 1024)
    assert (occ.fits, occ.blocks_per_sm, occ.limiter) == (False, 0, "shared memory")
    assert budget.occupancy(h100, 128, 64, h100.smem_per_block_optin).fits
    assert not budget.occupancy(h100, 128, 256, 0).fits
    # p05 defaults at D = 128 need 103424 B: more than the L4 (99 KB = 101376 B) allows
    assert not budget.occupancy(budget.GPUS["L4"], 256, 128, budget.smem_bytes("p05_tile64", 128)).fits


def test_ptxas_table_adds_the_dynamic_shared_memory_ptxas_cannot_see(monkeypatch):
    from flashcore_nb import build, results, tables

    def no_nvcc(*args):
        raise build.CompileError("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    monkeypatch.setattr(build, "compile_only", no_nvcc)
    table, source = tables.ptxas("p05_tile64", results.load("p05_tile64"))
    assert source.startswith("from the record") and table["static smem bytes"].tolist() == [0]
    assert table["dynamic smem bytes (D=64)"].tolist() == [62464]
    assert table["dynamic smem bytes (D=128)"].tolist() == [103424]
    table, _ = tables.ptxas("p01_baseline", results.load("p01_baseline"))
    assert not any(column.startswith("dynamic") for column in table.columns)
