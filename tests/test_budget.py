"""The shared-memory budget equals each kernel's own sizeof (its static arrays: ptxas's count), every
phase's defaults fit every GPU that runs it, and the occupancy arithmetic is right."""
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from flashcore_nb import budget, build, env
from flashcore_nb.paths import KERNELS_DIR
from flashcore_nb.phases import PHASES, get

HEAD_DIMS = (64, 128)   # the ones MAIN below asks the kernels about


def _layout_configs() -> list[tuple[str, dict]]:
    """(phase, tile parameters): each phase's defaults on each arch and every variant the GPU suite or the
    sanitizer builds, once per distinct budget (sizes and buffers over head dims and paths). A key-split
    phase's split_defines make a small problem take that path on a machine with no GPU."""
    configs = []
    for name, phase in PHASES.items():
        if phase.smem_layout is None:
            continue
        seen = set()
        run_on_gpus = [v.defines for v in phase.variants if v.tags & {"test", "sanitize"}]
        for params in [*(phase.tile_params_for(cc) for cc in phase.archs),
                       *({**phase.tile_params, **defines} for defines in run_on_gpus)]:
            params = {**params, **phase.split_defines}
            layout = tuple((head_dim, split, tuple(budget.smem_buffers(name, head_dim, params, split)))
                           for head_dim in HEAD_DIMS for split in phase.splits)
            if layout not in seen:
                seen.add(layout)
                configs.append((name, params))
    return configs


CONFIGS = _layout_configs()

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
    name, params = config
    defaults = get(name).tile_params
    return "-".join([name, *(f"{k}={v}" for k, v in params.items() if defaults.get(k) != v)])


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
        name, params = config
        exe = tmp / _config_id(config)
        # PTX only and unoptimised (a struct's size does not depend on it): a few seconds per build
        arch = "90a" if get(name).arch_specific else "90"
        cmd = [nvcc, "-std=c++17", "-Xcicc", "-O0", f"-I{KERNELS_DIR}",
               f"-gencode=arch=compute_{arch},code=compute_{arch}", *build.define_flags(params),
               str(KERNELS_DIR / f"{name}.cu"), str(main), "-o", str(exe)]
        compiled = subprocess.run(cmd, capture_output=True, text=True)
        assert compiled.returncode == 0, f"{' '.join(cmd)}\n{compiled.stderr}"
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
        return {(bool(int(small)), int(d)): int(n) for small, d, n in (line.split() for line in out.splitlines())}

    with ThreadPoolExecutor() as pool:
        return dict(zip(map(_config_id, CONFIGS), pool.map(run, CONFIGS)))


@pytest.mark.parametrize("config", CONFIGS, ids=[_config_id(c) for c in CONFIGS])
def test_budget_equals_the_kernels_sizeof(config, kernel_sizeof):
    name, params = config
    for small in (False, True):
        split = small and get(name).key_split
        for head_dim in HEAD_DIMS:
            assert budget.smem_bytes(name, head_dim, params, split) == \
                kernel_sizeof[_config_id(config)][small, head_dim], (small, head_dim)


# Each phase with static __shared__ arrays, at its defaults and at another launch size
OTHER_LAUNCH = {"p01_baseline": {"NUM_THREADS": 256}, "p02_vectorized": {"NUM_WARPS": 4}}
STATIC_CONFIGS = [(name, {**get(name).tile_params, **defines}) for name, other in OTHER_LAUNCH.items()
                  for defines in ({}, other)]


@pytest.fixture(scope="module")
def ptxas_smem(tmp_path_factory) -> dict[str, dict[int, set[int]]]:
    """ptxas's smem count per config, by head dim (the kHeadDim template argument in each kernel's mangled
    name): a set, one count per kernel of that head dim (fp16 and bf16)."""
    nvcc = env.nvcc_path()
    if nvcc is None:
        pytest.fail("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    tmp = tmp_path_factory.mktemp("static_smem")

    def run(config):
        name, params = config
        cmd = [nvcc, "-c", *build.NVCC_FLAGS, build.gencode(90), f"-I{KERNELS_DIR}", *build.define_flags(params),
               str(get(name).kernel_file), "-o", str(tmp / f"{_config_id(config)}.o")]
        compiled = subprocess.run(cmd, capture_output=True, text=True)
        assert compiled.returncode == 0, f"{' '.join(cmd)}\n{compiled.stderr}"
        counts: dict[int, set[int]] = {}
        # build.parse_ptxas reads one kernel at a time: the log cut before each entry function
        for entry in re.split(r"(?=ptxas info\s*: Compiling entry function)", compiled.stdout + compiled.stderr)[1:]:
            head_dim = int(re.search(r"Li(\d+)EEv", entry).group(1))
            counts.setdefault(head_dim, set()).add(build.parse_ptxas(entry).smem_bytes)
        return counts

    with ThreadPoolExecutor() as pool:
        return dict(zip(map(_config_id, STATIC_CONFIGS), pool.map(run, STATIC_CONFIGS)))


def test_every_phase_with_static_shared_memory_is_checked():
    assert set(OTHER_LAUNCH) == {name for name, phase in PHASES.items() if phase.static_smem}


@pytest.mark.parametrize("config", STATIC_CONFIGS, ids=[_config_id(c) for c in STATIC_CONFIGS])
def test_static_smem_equals_ptxas(config, ptxas_smem):
    name, params = config
    assert ptxas_smem[_config_id(config)] == {head_dim: {budget.static_smem_bytes(name, head_dim, params)}
                                              for head_dim in HEAD_DIMS}


@pytest.mark.parametrize("name", [name for name, phase in PHASES.items() if not phase.static_smem])
def test_a_phase_without_static_smem_has_none(name, default_build_stats):
    """cta_smem_bytes counts a phase's static arrays from the registry: one it does not list must not exist."""
    assert default_build_stats(name, 90).smem_bytes == budget.static_smem_bytes(name, 64) == 0


def test_static_smem_by_hand():
    # p01, D = 64: the query row and 2 x 128 floats; p02, D = 128: K and V 32 x (128 + 8) halves, 8 rows of 128 floats
    assert budget.static_smem_bytes("p01_baseline", 64) == (64 + 2 * 128) * 4 == 1280
    assert budget.static_smem_bytes("p02_vectorized", 128) == 2 * 32 * 136 * 2 + 8 * 128 * 4 == 21504
    # no dynamic shared memory beside it
    assert budget.cta_smem_bytes("p02_vectorized", 128) == 21504 and budget.smem_needed("p02_vectorized") == 0


# Every (phase, GPU) where the GPU's compute capability runs the phase, with the defaults it gets there.
ON_GPUS = [(name, gpu) for name, phase in PHASES.items() for gpu in budget.GPUS.values() if phase.runs_on(gpu.cc)]


@pytest.mark.parametrize("name,gpu", ON_GPUS, ids=[f"{name}-{gpu.name}" for name, gpu in ON_GPUS])
def test_defaults_fit_every_gpu_that_runs_the_phase(name, gpu, default_build_stats):
    """Each block the defaults launch (every head dim, every path) fits: shared memory is what can fail,
    since __launch_bounds__ keeps ptxas's register count launchable; the registers, and the static shared
    memory of phases without a layout, come from the same ptxas run as test_kernels_compile's."""
    stats = default_build_stats(name, gpu.cc)
    for launch in budget.launches(name, get(name).tile_params_for(gpu.cc)):
        smem = stats.smem_bytes + launch.smem_bytes
        # the head dim's own instantiations where the entry names tell them (phase 9 launches 384 or 512 threads)
        registers = max((r for entry, r in stats.entry_registers.items() if f"Li{launch.head_dim}E" in entry),
                        default=stats.registers)
        occ = budget.occupancy(gpu, launch.threads, registers, smem)
        assert occ.fits, (f"{name}'s defaults for sm_{gpu.cc} at D={launch.head_dim}{' (key split)' * launch.split}: "
                          f"{smem} B of shared memory, {launch.threads} threads x {registers} registers; "
                          f"{gpu.name} allows {gpu.smem_per_block_optin} B per block: {occ.limiter}")


def test_smem_needed_is_the_largest_launch():
    # p07 on the H100: the key-split path at D = 128, 2 stages of 128 K and V rows + 2 x 32 Q rows, 256 B each
    assert budget.smem_needed("p07_registers") == (2 * 32 + 2 * 2 * 128) * 128 * 2 == 147456
    assert budget.smem_needed("p07_registers", {"SPLIT_STAGES": 1}) == 73728   # the L4's
    assert budget.smem_needed("p01_baseline") == 0                             # static __shared__ only


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
    # 1024 threads x 255 registers (8192 per warp once rounded) = 262144 > 65536 per SM: no block at all
    occ = budget.occupancy(h100, 1024, 255, 0)
    assert (occ.fits, occ.blocks_per_sm, occ.limiter) == (False, 0, "registers")
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


def test_p10_splits_mirror_the_kernels_heuristic():
    """budget.p10_splits follows choose_splits in p10_splitkv.cu: double while one wave holds, within
    MAX_SPLITS, with a key tile per CTA; 1 without clusters; SPLITS when forced."""
    from flashcore_nb import shapes
    params, sms = get("p10_splitkv").tile_params, budget.GPUS["H100"].sm_count
    assert budget.p10_splits(shapes.MISSION, params, sms) == 2               # 64 tiles x 2 = 128 <= 132
    assert budget.p10_splits(shapes.MISSION, {**params, "MAX_SPLITS": 8}, sms) == 2   # 256 would pass one wave
    assert budget.p10_splits(shapes.MISSION, {**params, "MAX_SPLITS": 8, "WAVE_CTAS_PER_SM": 2}, sms) == 4
    assert budget.p10_splits(shapes.MISSION, params, sms, clusters=False) == 1
    assert budget.p10_splits(shapes.MISSION, {**params, "SPLITS": 8, "MAX_SPLITS": 8}, sms) == 8
    assert budget.p10_splits(shapes.Case("big", 16, 16, 512, 64), params, sms) == 1
    assert budget.p10_splits(shapes.Case("one_tile", 1, 1, 128, 64), {**params, "MAX_SPLITS": 8}, sms) == 1
    launch = budget.p10_launch(shapes.MISSION, params, sms)
    assert (launch["CTAs"], launch["keys per CTA"]) == (128, 256)


def test_p07_launch_takes_the_key_split_below_the_fill_threshold():
    from flashcore_nb import shapes
    params, sms = get("p07_registers").tile_params, budget.GPUS["H100"].sm_count
    assert budget.p07_launch(shapes.MISSION, params, sms)["CTAs"] == 128          # 32 large tiles < 66
    assert budget.p07_launch(shapes.MISSION, {**params, "SMALL_PROBLEM_FILL": 0}, sms)["CTAs"] == 32
    assert budget.p07_launch(shapes.Case("big", 16, 16, 512, 64), params, sms)["CTAs"] == 1024


def test_a_key_tiles_cycle_budget_on_hopper():
    d64, d128 = budget.tile_cycles(64, 128, 128), budget.tile_cycles(128, 128, 128)
    tensor, exp2, fp32 = list(d64)
    assert d64[tensor] == d64[exp2] == 1024 and d128[tensor] == 2048 and d128[exp2] == 1024   # FA3's point at D = 64
    assert d64[fp32] == d128[fp32] == 384
