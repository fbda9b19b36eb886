"""Shared memory per CTA, buffer by buffer, and the occupancy it allows: arithmetic, no GPU needed.

`smem_buffers` mirrors each kernel's `SharedStorage` struct field by field; tests/test_budget.py
compiles the kernels and checks the sum against their own sizeof (flashcore_smem_bytes).
"""
from __future__ import annotations

from dataclasses import dataclass

from .phases import get

PHASES_WITH_LAYOUT = ("p03_wmma", "p04_fp32p", "p05_tile64", "p06_async", "p07_registers",
                      "p08_wgmma")   # the dynamic-shared-memory phases
STATIC_SMEM_LIMIT = 48 * 1024  # static __shared__ arrays stop here; past it, dynamic smem and opt-in
WARP = 32


@dataclass(frozen=True)
class GpuLimits:
    name: str
    cc: int                             # compute capability as one number: 9.0 -> 90
    sm_count: int
    smem_per_sm: int                    # bytes all resident blocks of one SM can share
    smem_per_block_optin: int           # the most one block may ask for, after opting in past 48 KB
    smem_reserved_per_block: int        # taken by the CUDA runtime from every block, on top of its own
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int = 64 * 1024
    max_registers_per_thread: int = 255
    register_alloc_unit: int = 256      # registers are given to a warp in chunks of this many

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // WARP


# Limits per compute capability from the CUDA C++ Programming Guide's compute-capability tables
# (KB = 1024 bytes), the 1 KB reserved per block on sm_80+ as CCCL's cuda::arch_traits encodes it,
# the register allocation unit from NVIDIA's occupancy calculator; SM counts are per product.
GPUS: dict[str, GpuLimits] = {
    gpu.name: gpu
    for gpu in (
        GpuLimits("T4", 75, sm_count=40, smem_per_sm=64 * 1024, smem_per_block_optin=64 * 1024,
                  smem_reserved_per_block=0, max_threads_per_sm=1024, max_blocks_per_sm=16),
        GpuLimits("L4", 89, sm_count=58, smem_per_sm=100 * 1024, smem_per_block_optin=99 * 1024,
                  smem_reserved_per_block=1024, max_threads_per_sm=1536, max_blocks_per_sm=24),
        GpuLimits("A100", 80, sm_count=108, smem_per_sm=164 * 1024, smem_per_block_optin=163 * 1024,
                  smem_reserved_per_block=1024, max_threads_per_sm=2048, max_blocks_per_sm=32),
        GpuLimits("H100", 90, sm_count=132, smem_per_sm=228 * 1024, smem_per_block_optin=227 * 1024,
                  smem_reserved_per_block=1024, max_threads_per_sm=2048, max_blocks_per_sm=32),
    )
}


# --- occupancy ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    limiter: str            # "threads", "registers", "shared memory" or "blocks"; if not fits, what does not fit
    active_warps: int
    occupancy: float        # active warps / the SM's maximum
    fits: bool              # False: the block cannot be launched on this GPU at all


def occupancy(gpu: GpuLimits, threads_per_block: int, registers_per_thread: int, smem_bytes: int) -> Occupancy:
    """Resident blocks per SM, by the occupancy calculator's rules (per SM, not per SM partition).

    On a tie the limiter named is the first of threads, registers, shared memory, blocks."""
    if not 0 < threads_per_block <= 1024 or registers_per_thread < 1 or smem_bytes < 0:
        raise ValueError(f"invalid block: {threads_per_block} threads, {registers_per_thread} registers, "
                         f"{smem_bytes} B shared memory")
    if registers_per_thread > gpu.max_registers_per_thread:
        return Occupancy(0, "registers", 0, 0.0, fits=False)
    if smem_bytes > gpu.smem_per_block_optin:
        return Occupancy(0, "shared memory", 0, 0.0, fits=False)
    warps = -(-threads_per_block // WARP)
    unit = gpu.register_alloc_unit
    registers_per_warp = -(-registers_per_thread * WARP // unit) * unit
    smem_per_block = smem_bytes + gpu.smem_reserved_per_block
    limits = {
        "threads": gpu.max_warps_per_sm // warps,
        "registers": gpu.registers_per_sm // (registers_per_warp * warps),
        # 0 bytes on a GPU that reserves none: shared memory sets no limit
        "shared memory": gpu.smem_per_sm // smem_per_block if smem_per_block else gpu.max_blocks_per_sm,
        "blocks": gpu.max_blocks_per_sm,
    }
    limiter = min(limits, key=limits.get)
    blocks = limits[limiter]
    return Occupancy(blocks, limiter, blocks * warps, blocks * warps / gpu.max_warps_per_sm, fits=True)


# --- the shared-memory budget of each phase -----------------------------------------------------

@dataclass(frozen=True)
class Buffer:
    name: str
    rows: int
    pitch: int              # elements per row, padding included
    element_bytes: int

    @property
    def bytes(self) -> int:
        return self.rows * self.pitch * self.element_bytes


def _pitch(cols: int, element_bytes: int) -> int:
    # Every kernel pads each row by 16 bytes against bank conflicts: kPitch<kCols, T> = kCols + 16 / sizeof(T)
    return cols + 16 // element_bytes


def _tiles(block_m: int, block_n: int, head_dim: int) -> list[Buffer]:
    return [Buffer(name, rows, _pitch(head_dim, 2), 2)
            for name, rows in (("Q tile", block_m), ("K tile", block_n), ("V tile", block_n))]


def _accumulator(block_m: int, head_dim: int) -> Buffer:
    return Buffer("O accumulator (fp32)", block_m, _pitch(head_dim, 4), 4)


def _params(phase_name: str, tile_params: dict | None) -> dict:
    return {**get(phase_name).tile_params, **(tile_params or {})}


def p07_tiles(head_dim: int, params: dict, split: bool) -> tuple[int, int, int, int]:
    """p07's (BLOCK_M, BLOCK_N, STAGES, warps) for a head dim: the large-problem configuration, or
    the key-split one small problems take (16 rows per warp, KV_SPLIT warps per row group)."""
    if split:
        return (params["SPLIT_BLOCK_M"], params["SPLIT_BLOCK_N"], params["SPLIT_STAGES"],
                params["SPLIT_BLOCK_M"] // 16 * params["KV_SPLIT"])
    wide = head_dim == 128
    m = params["BLOCK_M_D128"] if wide else params["BLOCK_M"]
    return m, params["BLOCK_N"], params["STAGES_D128"] if wide else params["STAGES"], m // params["WARP_ROWS"]


def p08_tiles(head_dim: int, params: dict) -> tuple[int, int, int]:
    """p08's (warpgroups, BLOCK_N, CTAs per SM) for a head dim: D = 128 has its own defines."""
    suffix = "_D128" if head_dim == 128 else ""
    return params[f"WARPGROUPS{suffix}"], params[f"BLOCK_N{suffix}"], params[f"CTAS_PER_SM{suffix}"]


def smem_buffers(phase_name: str, head_dim: int, tile_params: dict | None = None, split: bool = False) -> list[Buffer]:
    """The phase's SharedStorage, field by field in declaration order; tile_params override the
    registry defaults. `split`: p07's key-split configuration (small problems)."""
    params = _params(phase_name, tile_params)
    if phase_name in ("p03_wmma", "p04_fp32p"):
        m = n = 32
        # p04 with P_FP32=1 keeps P as two fp16 planes, hi (P itself) and lo (the rounding error)
        two_planes = phase_name == "p04_fp32p" and params["P_FP32"]
        planes = ("P (fp16)", "P lo (fp16)") if two_planes else ("P (fp16)",)
        return [*_tiles(m, n, head_dim), Buffer("S (fp32)", m, _pitch(n, 4), 4),
                *(Buffer(name, m, _pitch(n, 2), 2) for name in planes), _accumulator(m, head_dim)]
    if phase_name == "p05_tile64":
        m, n = params["BLOCK_M"], params["BLOCK_N"]
        # P (fp16) is written over S (fp32) in the same bytes: one buffer with two lives
        return [*_tiles(m, n, head_dim), Buffer("S then P (fp32 / fp16)", m, _pitch(n, 4), 4),
                _accumulator(m, head_dim)]
    if phase_name == "p06_async":
        m, n, stages = params["BLOCK_M"], params["BLOCK_N"], params["STAGES"]
        # K and V have one buffer per pipeline stage, and come last (see the kernel's PLANTED_BUG)
        return [Buffer("Q tile", m, _pitch(head_dim, 2), 2), Buffer("S then P (fp32 / fp16)", m, _pitch(n, 4), 4),
                _accumulator(m, head_dim), Buffer("K tiles (x STAGES)", stages * n, _pitch(head_dim, 2), 2),
                Buffer("V tiles (x STAGES)", stages * n, _pitch(head_dim, 2), 2)]
    if phase_name == "p07_registers":
        m, n, stages, _ = p07_tiles(head_dim, params, split)
        # S, P and O live in registers; rows are swizzled instead of padded. One Q buffer per stage:
        # the next query tile's Q is copied while the last key tiles of this one are computed. The
        # key-split merge reuses the K/V buffers (the kernel static_asserts that it fits).
        # With OVERLAP_SOFTMAX the copies run one tile less ahead, and Q needs one buffer fewer.
        q_buffers = stages - 1 if params["OVERLAP_SOFTMAX"] and not split else stages
        return [Buffer("Q tiles (x STAGES)", q_buffers * m, head_dim, 2),
                Buffer("K tiles (x STAGES)", stages * n, head_dim, 2),
                Buffer("V tiles (x STAGES)", stages * n, head_dim, 2)]
    if phase_name == "p08_wgmma":
        warpgroups, n, _ = p08_tiles(head_dim, params)
        # 64 query rows per warpgroup, two buffers each for K and V, rows swizzled, not padded. The
        # kernel asks for 1 KB more and rounds its base up: wgmma's 128-byte swizzle needs 1024-byte tiles.
        return [Buffer("Q tile", 64 * warpgroups, head_dim, 2), Buffer("K tiles (x 2)", 2 * n, head_dim, 2),
                Buffer("V tiles (x 2)", 2 * n, head_dim, 2), Buffer("alignment slack", 1, 1024, 1)]
    raise ValueError(f"no shared-memory layout for {phase_name!r} here (known: {', '.join(PHASES_WITH_LAYOUT)})")


def smem_bytes(phase_name: str, head_dim: int, tile_params: dict | None = None, split: bool = False) -> int:
    # A plain sum equals sizeof(SharedStorage): every field is a multiple of 4 bytes long, the
    # struct's alignment, so there is no padding between fields or at the end.
    return sum(buffer.bytes for buffer in smem_buffers(phase_name, head_dim, tile_params, split))


def threads_per_block(phase_name: str, tile_params: dict | None = None, head_dim: int = 64, split: bool = False) -> int:
    params = _params(phase_name, tile_params)
    if phase_name in ("p03_wmma", "p04_fp32p"):
        return 4 * WARP
    if phase_name in ("p05_tile64", "p06_async"):
        return params["NUM_WARPS"] * WARP
    if phase_name == "p07_registers":
        return p07_tiles(head_dim, params, split)[3] * WARP
    if phase_name == "p08_wgmma":
        return p08_tiles(head_dim, params)[0] * 4 * WARP
    raise ValueError(f"no block size for {phase_name!r} here (known: {', '.join(PHASES_WITH_LAYOUT)})")


def waves(gpu: GpuLimits, occ: Occupancy, ctas: int) -> float:
    """How many rounds of resident CTAs the grid needs: below 1 part of the GPU idles, and just
    above a whole number the last round runs a few CTAs on an otherwise empty GPU."""
    return ctas / (occ.blocks_per_sm * gpu.sm_count) if occ.fits else float("inf")
