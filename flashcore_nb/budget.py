"""Shared memory per CTA, buffer by buffer, and the occupancy it allows: arithmetic, no GPU needed.

Each phase's layout (phases.py) mirrors its kernel's `SharedStorage` struct field by field;
tests/test_budget.py compiles the kernels and checks the sum against their own sizeof
(flashcore_smem_bytes), and that every phase's defaults fit every GPU below that runs it. Phases 1
and 2 declare theirs as a static __shared__ variable instead: the registry's static_smem, which
the same file checks against ptxas's count.
"""
from __future__ import annotations

from dataclasses import dataclass

# Buffer and the p07-p10 tile helpers are the registry's; chapters read them here, beside the budget they explain.
from .phases import PHASES, WARP, Buffer, get, p07_tiles, p08_tiles, p09_tiles, p10_block_m  # noqa: F401

STATIC_SMEM_LIMIT = 48 * 1024  # static __shared__ arrays stop here; past it, dynamic smem and opt-in


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


def gpu_info(limits: GpuLimits):
    """The GPU as env.gpu() describes a visible one (what dispatch.choose takes), from its limits here."""
    from .env import GpuInfo
    return GpuInfo(limits.name, limits.cc, limits.sm_count, limits.smem_per_block_optin, 0, "")


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
    if limits["registers"] == 0:   # one block needs more registers than the SM has: it cannot launch
        return Occupancy(0, "registers", 0, 0.0, fits=False)
    limiter = min(limits, key=limits.get)
    blocks = limits[limiter]
    return Occupancy(blocks, limiter, blocks * warps, blocks * warps / gpu.max_warps_per_sm, fits=True)


# --- the shared-memory budget of each phase -----------------------------------------------------

def _params(phase_name: str, tile_params: dict | None) -> dict:
    return {**get(phase_name).tile_params, **(tile_params or {})}


def smem_buffers(phase_name: str, head_dim: int, tile_params: dict | None = None, split: bool = False) -> list[Buffer]:
    """The phase's SharedStorage, field by field in declaration order; tile_params override the
    registry defaults (the H100's). `split`: the key-split configuration of a phase that has one."""
    phase = get(phase_name)
    if phase.smem_layout is None:
        known = ", ".join(name for name, p in PHASES.items() if p.smem_layout)
        raise ValueError(f"no shared-memory layout for {phase_name!r}: its __shared__ arrays are static, and "
                         f"ptxas reports them (static_smem_bytes counts them; phases with a layout: {known})")
    return phase.smem_layout(head_dim, _params(phase_name, tile_params), split)


def smem_bytes(phase_name: str, head_dim: int, tile_params: dict | None = None, split: bool = False) -> int:
    # A plain sum equals sizeof(SharedStorage): every field is a multiple of 4 bytes long, the
    # struct's alignment, so there is no padding between fields or at the end.
    return sum(buffer.bytes for buffer in smem_buffers(phase_name, head_dim, tile_params, split))


def static_smem_bytes(phase_name: str, head_dim: int, tile_params: dict | None = None, split: bool = False) -> int:
    """The phase's static __shared__ arrays, ptxas's smem count: 0 for a phase whose shared memory is all
    dynamic."""
    layout = get(phase_name).static_smem
    if layout is None:
        return 0
    return sum(buffer.bytes for buffer in layout(head_dim, _params(phase_name, tile_params), split))


def cta_smem_bytes(phase_name: str, head_dim: int, tile_params: dict | None = None, split: bool = False) -> int:
    """All the shared memory one CTA holds, static and dynamic: what occupancy counts."""
    dynamic = smem_bytes(phase_name, head_dim, tile_params, split) if get(phase_name).smem_layout else 0
    return static_smem_bytes(phase_name, head_dim, tile_params, split) + dynamic


def threads_per_block(phase_name: str, tile_params: dict | None = None, head_dim: int = 64, split: bool = False) -> int:
    return get(phase_name).threads(_params(phase_name, tile_params), head_dim, split)


@dataclass(frozen=True)
class Launch:
    head_dim: int
    split: bool
    threads: int
    smem_bytes: int         # dynamic shared memory; static __shared__ arrays are ptxas's to report


def launches(phase_name: str, tile_params: dict | None = None) -> list[Launch]:
    """Every block the phase can launch with these tile parameters: each head dim it declares, on each
    of its paths (the key-split one included)."""
    phase = get(phase_name)
    return [Launch(head_dim, split, threads_per_block(phase_name, tile_params, head_dim, split),
                   smem_bytes(phase_name, head_dim, tile_params, split) if phase.smem_layout else 0)
            for head_dim in phase.head_dims for split in phase.splits]


def smem_needed(phase_name: str, tile_params: dict | None = None) -> int:
    """The most dynamic shared memory any of the phase's launches asks for: what a GPU must allow per block."""
    return max(launch.smem_bytes for launch in launches(phase_name, tile_params))


# --- how many CTAs a small problem gets (chapter 10): arithmetic from the tile parameters -------------

def query_tiles(case, block_m: int) -> int:
    """Query tiles of `block_m` rows over every head of every batch: one CTA each, before any split or cap."""
    return -(-case.seqlen_q // block_m) * case.heads * case.batch


def p07_launch(case, params: dict, sms: int) -> dict:
    """Phase 7's grid for `case` before its persistent cap: the large tiles, or the key split inside a CTA
    when the large-tile grid would fill less than SMALL_PROBLEM_FILL percent of the SMs (the kernel's rule
    with SMALL_PROBLEM_CTAS = -1). Every CTA streams all keys its rows see; the split adds warps, not CTAs
    per query row."""
    large = query_tiles(case, p07_tiles(case.head_dim, params, False)[0])
    split = large < sms * params["SMALL_PROBLEM_FILL"] // 100
    block_m, _, _, warps = p07_tiles(case.head_dim, params, split)
    ctas = query_tiles(case, block_m)
    return {"configuration": "p07 key split (in the CTA)" if split else "p07 large tiles", "rows per CTA": block_m,
            "warps per CTA": warps, "CTAs": ctas, "CTAs per query tile": 1, "keys per CTA": case.sk}


def p10_splits(case, params: dict, sms: int, clusters: bool = True) -> int:
    """The CTAs that split one query tile's keys, as p10's choose_splits picks them: 1 without clusters
    (before sm_90); SPLITS where it is forced; else doubled while the grid stays within one wave
    (WAVE_CTAS_PER_SM per SM), within MAX_SPLITS, dividing the tile's rows, and at least one key tile
    per CTA."""
    if not clusters:
        return 1
    if params["SPLITS"] > 0:
        return params["SPLITS"]
    block_m, block_n = p10_block_m(case.head_dim, params), params["BLOCK_N"]
    items = query_tiles(case, block_m)
    longest = min(case.sk, -(-case.seqlen_q // block_m) * block_m) if case.causal else case.sk
    key_tiles, wave, splits = -(-longest // block_n), sms * params["WAVE_CTAS_PER_SM"], 1
    while (splits * 2 <= params["MAX_SPLITS"] and block_m % (splits * 2) == 0 and items * splits * 2 <= wave
           and splits * 2 <= key_tiles):
        splits *= 2
    return splits


def p10_launch(case, params: dict, sms: int, clusters: bool = True) -> dict:
    """Phase 10's grid for `case`: query tiles x heads x splits CTAs, each with about 1/splits of its query
    tile's key tiles (non-causal: of all keys)."""
    block_m, block_n = p10_block_m(case.head_dim, params), params["BLOCK_N"]
    splits = p10_splits(case, params, sms, clusters)
    ctas = query_tiles(case, block_m) * splits
    key_tiles = -(-case.sk // block_n)
    return {"configuration": f"p10, split over {splits} CTA{'s' if splits > 1 else ''}", "rows per CTA": block_m,
            "warps per CTA": block_m // 16, "CTAs": ctas, "CTAs per query tile": splits,
            "keys per CTA": min(case.sk, -(-key_tiles // splits) * block_n)}


# --- the grid each phase launches, on any GPU: the calculator's CTAs and waves (widgets.phase_calculator) --

@dataclass(frozen=True)
class Grid:
    configuration: str      # the launch path in words
    split: bool             # smem_bytes / threads_per_block's `split`: the phase's key-split path
    kernel: str             # which of the phase's kernels runs ("" where a head dim has one): what registers match
    work_items: int         # what the CTAs compute: query tiles (x key splits), one CTA each unless persistent
    # None: one CTA per work item; "resident": persistent, no more CTAs than are resident at once (the
    # occupancy API's count); "one per SM": persistent, one CTA per SM. persistent_ctas > 0: that many, fixed.
    persistent: str | None = None
    persistent_ctas: int = 0

    def slots(self, gpu: GpuLimits, occ: Occupancy) -> int:
        """CTAs that can run at once, a wave: those resident per SM on every SM, and for a persistent grid
        no more than it launches for a grid of enough work items."""
        resident = occ.blocks_per_sm * gpu.sm_count
        if self.persistent_ctas > 0 and self.persistent:
            return min(self.persistent_ctas, resident)
        return min(gpu.sm_count, resident) if self.persistent == "one per SM" else resident

    def ctas(self, gpu: GpuLimits, occ: Occupancy) -> int:
        """The CTAs the kernel launches on `gpu` when `occ` of them are resident per SM."""
        if not self.persistent:
            return self.work_items
        # the kernel's cap: PERSISTENT_CTAS where given (resident or not), else what it counts as resident
        cap = self.persistent_ctas if self.persistent_ctas > 0 else self.slots(gpu, occ)
        return min(self.work_items, cap)

    def waves(self, gpu: GpuLimits, occ: Occupancy) -> float:
        """Rounds of work items over the CTAs that run at once (a persistent CTA walks one item per round):
        below 1 part of the GPU idles, and just above a whole number the last round runs a few items on an
        otherwise empty GPU."""
        return self.work_items / self.slots(gpu, occ) if occ.fits else float("inf")


def _p01_grid(case, params: dict, gpu: GpuLimits) -> Grid:
    return Grid("one query row per CTA", False, "", query_tiles(case, 1))


def _p02_grid(case, params: dict, gpu: GpuLimits) -> Grid:
    rows = params["NUM_WARPS"]
    return Grid(f"{rows} query rows per CTA, one per warp", False, "", query_tiles(case, rows))


def _tile_grid(case, params: dict, gpu: GpuLimits) -> Grid:
    return Grid(f"{params['BLOCK_M']}-row query tiles", False, "", query_tiles(case, params["BLOCK_M"]))


def _p07_grid(case, params: dict, gpu: GpuLimits) -> Grid:
    launch = p07_launch(case, params, gpu.sm_count)
    split = launch["configuration"] != "p07 large tiles"
    # the key-split configuration keeps one query tile per CTA; the large tiles are persistent (PERSISTENT=1)
    persistent = "resident" if params["PERSISTENT"] and not split else None
    return Grid(f"{launch['configuration']}, {launch['rows per CTA']} rows per CTA", split,
                "key split" if split else "large tiles", launch["CTAs"], persistent, params["PERSISTENT_CTAS"])


def _p08_grid(case, params: dict, gpu: GpuLimits) -> Grid:
    rows = 64 * p08_tiles(case.head_dim, params)[0]
    return Grid(f"{rows} rows per CTA", False, "", query_tiles(case, rows))


def _p09_grid(case, params: dict, gpu: GpuLimits) -> Grid:
    consumers = p09_tiles(case.head_dim, params)[0]
    rows = 64 if params["SPLIT_KEYS"] and consumers > 1 else 64 * consumers
    cluster = params["CLUSTER_KEYS"]   # CTAs per work item
    return Grid(f"{rows}-row work items" + (f", {cluster} CTAs each" if cluster > 1 else "") +
                (", persistent" if params["PERSISTENT"] else ""), False, "", query_tiles(case, rows) * cluster,
                "one per SM" if params["PERSISTENT"] else None, params["PERSISTENT_CTAS"])


def _p10_grid(case, params: dict, gpu: GpuLimits) -> Grid:
    clusters = gpu.cc >= 90
    launch = p10_launch(case, params, gpu.sm_count, clusters)
    config = launch["configuration"] + ("" if clusters else " (no clusters before sm_90)")
    return Grid(config, False, "clustered" if launch["CTAs per query tile"] > 1 else "one CTA per tile",
                launch["CTAs"])


# Phases whose CTAs are not one BLOCK_M-row query tile each; any other phase with BLOCK_M gets _tile_grid.
_GRIDS = {"p01_baseline": _p01_grid, "p02_vectorized": _p02_grid, "p07_registers": _p07_grid, "p08_wgmma": _p08_grid,
          "p09_warpspec": _p09_grid, "p10_splitkv": _p10_grid}


def grid(phase_name: str, case, tile_params: dict | None, gpu: GpuLimits) -> Grid:
    """The grid the phase launches for `case` on `gpu` (tile_params over the registry defaults), by the
    kernel's own host rules: p01's CTA per query row, p02's row per warp, p07_launch's path and its
    persistent cap, p08's warpgroups, p09's work items walked by one CTA per SM, p10_launch's key splits
    (none without clusters)."""
    params = _params(phase_name, tile_params)
    build = _GRIDS.get(phase_name)
    if build is None and "BLOCK_M" not in params:
        raise ValueError(f"{phase_name} has no tile parameters to size its grid from")
    return (build or _tile_grid)(case, params, gpu)


# --- one key tile's work on an H100 SM: a prediction from documented rates ------------------------------

# Per SM per clock on the H100 SXM: dense fp16/bf16 tensor-core FLOPs (989.4 TFLOP/s over 132 SMs at the
# 1.83 GHz boost clock, NVIDIA's datasheet), exp2 results of the special-function units (3.9 TFLOP/s of
# special functions, as FlashAttention-3 counts them) and fp32 results of the CUDA cores.
HOPPER_TENSOR_FLOPS_PER_CYCLE = 4096
HOPPER_EXP2_PER_CYCLE = 16
HOPPER_FP32_PER_CYCLE = 128
SOFTMAX_FP32_OPS_PER_SCORE = 3   # scale-and-subtract (one FFMA), the running maximum, the running sum


def tile_cycles(head_dim: int, block_m: int, block_n: int) -> dict[str, float]:
    """SM clock cycles one CTA's key tile (block_m query rows x block_n keys) takes on an H100 SM if each
    unit ran at its peak, alone: the tensor cores (Q·Kᵀ and P·V, 4·m·n·d FLOPs), the exp2s (one per score)
    and the fp32 arithmetic around them. Units run concurrently; a schedule can at best hide the smaller
    terms under the largest, and a kernel that runs them one after another pays their sum."""
    scores = block_m * block_n
    return {"tensor cores (Q·Kᵀ + P·V)": 4 * scores * head_dim / HOPPER_TENSOR_FLOPS_PER_CYCLE,
            "exp2 (special-function units)": scores / HOPPER_EXP2_PER_CYCLE,
            "fp32 (scale, max, sum)": SOFTMAX_FP32_OPS_PER_SCORE * scores / HOPPER_FP32_PER_CYCLE}
