"""The ordered registry of phases: everything the package knows about a phase, in one entry.

An entry names the kernel file and what it supports, its tile defaults (per GPU where the H100's do
not fit), its shared-memory layout and block size, its variants (ablation, rung, sanitizer and GPU-test
builds), its sweep grid and its kernel's name. The generic modules (budget, experiments, sanitize,
profile, tables, widgets) and the tests iterate over PHASES; none of them names a phase.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .paths import KERNELS_DIR

WARP = 32


# --- shared memory, buffer by buffer --------------------------------------------------------------

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
    # Every padded kernel pads each row by 16 bytes against bank conflicts: kPitch<kCols, T> = kCols + 16 / sizeof(T)
    return cols + 16 // element_bytes


def _tiles(block_m: int, block_n: int, head_dim: int) -> list[Buffer]:
    return [Buffer(name, rows, _pitch(head_dim, 2), 2)
            for name, rows in (("Q tile", block_m), ("K tile", block_n), ("V tile", block_n))]


def _accumulator(block_m: int, head_dim: int) -> Buffer:
    return Buffer("O accumulator (fp32)", block_m, _pitch(head_dim, 4), 4)


# --- variants -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """The phase built with other -D defines (over its defaults). Tags say what the build is for:
    "ablation": a row of the chapter's ablation record, in list order (the label is the record's);
    "precision": a row of chapter 4's precision experiment (the label is the record's);
    "accuracy": a build of the phase's accuracy record, beside the defaults on the same random problems
    (accuracy.py: one suspect of an error larger than SDPA's changed);
    "rung": a step of the chapter's rungs record, in list order (the label is the record's): the kernel
    built up a technique or two at a time, each rung keeping every earlier one's, the last rung the
    defaults themselves ({}; see rungs()); each is timed against the defaults and the rung before it;
    "sanitize": an extra compute-sanitizer target beside the defaults;
    "test": the GPU suite checks it on the whole shape suite (it must be correct);
    "trace": an instrumented build (TRACE=1, kernels/common/trace.cuh) of the phase's trace record (trace.py):
    a measured timeline of one CTA, never a timing.
    A variant with a `candidate` name is also a tile configuration flashcore_nb.attention may choose: the grid
    races it beside the phase's defaults as "<phase>:<candidate>", at `head_dims` (its defines change only
    those; empty: every head dim the phase takes)."""
    label: str
    defines: dict
    tags: frozenset[str]
    candidate: str = ""
    head_dims: tuple[int, ...] = ()


def variant(label: str, defines: dict, *tags: str, candidate: str = "", head_dims: tuple[int, ...] = ()) -> Variant:
    return Variant(label, defines, frozenset(tags), candidate, head_dims)


def rungs(off: dict, *steps: tuple[str, tuple[str, ...]], tested: int = 0) -> tuple[Variant, ...]:
    """A chapter's rungs, tagged "rung": the first builds the phase with every define of `off`; each step
    names the defines it gives back to the phase's defaults, so every rung keeps the techniques of the
    rungs before it. The first `tested` rungs are tagged "test" too."""
    built, remaining = [], dict(off)
    for i, (label, switched_on) in enumerate(steps):
        remaining = {key: value for key, value in remaining.items() if key not in switched_on}
        built.append(variant(label, remaining, "rung", *(("test",) if i < tested else ())))
    return tuple(built)


# --- the phase ------------------------------------------------------------------------------------

Layout = Callable[[int, dict, bool], list[Buffer]]    # (head_dim, tile params, split) -> SharedStorage fields
Threads = Callable[[dict, int, bool], int]           # (tile params, head_dim, split) -> threads per block


@dataclass(frozen=True, kw_only=True)
class Phase:
    name: str                         # pNN_<slug>: the kernel file's stem and the results file's
    title: str
    notebook: str                     # chapter notebook stem in notebooks/
    kernel_name: str                  # the __global__ function: what Nsight Compute's --kernel-name matches
    archs: tuple[int, ...]            # compute capabilities CI compiles for (ptxas stats per arch)
    min_cc: int                       # oldest GPU the kernel runs on
    arch_specific: bool = False       # uses one arch's own instructions (sm_90a: wgmma): runs on `archs` only
    dtypes: tuple[str, ...] = ("float16", "bfloat16")
    head_dims: tuple[int, ...] = (64, 128)
    causal: bool = True               # supports causal masking
    cross_lengths: bool = True        # supports Sq != Sk
    aligned_16b: bool = False         # loads 16 bytes at a time: pointers and strides must allow it
    tile_params: dict = field(default_factory=dict)  # -D defines, overridable at load(); the H100's
    arch_tile_params: dict = field(default_factory=dict)  # compute capability -> defines that differ there
    spill_budget_bytes: int = 0       # local-memory spill ptxas may report for the defaults (said why below)
    threads: Threads                  # threads per block
    smem_layout: Layout | None = None  # its dynamic SharedStorage, field by field; None: static __shared__ only
    # Its static __shared__ arrays, field by field: ptxas counts them, the launch asks for none (None: it has none)
    static_smem: Layout | None = None
    key_split: bool = False           # small problems take a key-split path with its own tiles (split=True)
    # defines under which the host code picks the key-split path for small problems without asking a GPU
    # (by default it compares the grid with the SM count): how a CPU test reads that path's sizes
    split_defines: dict = field(default_factory=dict)
    variants: tuple[Variant, ...] = ()
    sweep_grid: dict | None = None    # define -> values: the recorded tile-size sweep (every combination)
    dispatch: bool = False            # a candidate of flashcore_nb.attention: timed on the grid, ranked by it
    # Where attention takes it on a GPU without a recorded tuning table: problems whose 128-row query
    # tiles (B·H·⌈Sq/128⌉) fill [low, high) waves of one tile per SM (dispatch.fallback).
    fallback_waves: tuple[float, float] = (0.0, math.inf)
    # The timing cases (shapes.py) its Nsight Compute profile covers: a large D = 64 problem and a D = 128 one
    profile_cases: tuple[str, ...] = ("b4h16_s2048", "b2h16_s4096_d128")
    # Cases its ablation times beyond the timing suite (shapes.py): where a switch it ablates shows
    ablation_cases: tuple[str, ...] = ()
    # Why a tile configuration is refused (a wrong result measured and not yet fixed), or None: load()
    # and every experiment build through build_extension, which raises this reason instead of building.
    refuses: Callable[[dict], str | None] = lambda params: None
    # Whether compute-sanitizer's racecheck runs a tile configuration to its end (sanitize.default_targets
    # leaves the others out of racecheck; memcheck and synccheck still run them).
    racecheck_follows: Callable[[dict], bool] = lambda params: True

    @property
    def kernel_file(self):
        return KERNELS_DIR / f"{self.name}.cu"

    def runs_on(self, cc: int) -> bool:
        return cc >= self.min_cc and (not self.arch_specific or cc in self.archs)

    def arch_name(self, cc: int) -> str:
        return f"sm_{cc}a" if self.arch_specific else f"sm_{cc}"

    @property
    def requirement(self) -> str:
        """The GPUs the phase runs on, in words."""
        if self.arch_specific:
            return " or ".join(f"sm_{cc}" for cc in self.archs)
        return f"sm_{self.min_cc} or newer"

    def tile_params_for(self, cc: int) -> dict:
        """The default -D defines on a GPU of compute capability `cc`."""
        return {**self.tile_params, **self.arch_tile_params.get(cc, {})}

    def supports_dtype_on(self, dtype: str, cc: int) -> bool:
        # bf16 arithmetic needs sm_80 (T4 has none)
        return dtype in self.dtypes and (dtype != "bfloat16" or cc >= 80)

    @property
    def splits(self) -> tuple[bool, ...]:
        """The `split` values of its launch paths: the large-problem path, and the key-split one if it has it."""
        return (False, True) if self.key_split else (False,)

    def variants_tagged(self, tag: str) -> dict[str, dict]:
        """label -> defines of the variants with this tag, in registry order."""
        return {v.label: v.defines for v in self.variants if tag in v.tags}

    @property
    def candidate_variants(self) -> tuple[Variant, ...]:
        """Its tile configurations flashcore_nb.attention may choose beside the defaults (Variant.candidate)."""
        return tuple(v for v in self.variants if v.candidate)


# --- per-phase tile arithmetic (the kernels' own, mirrored) ---------------------------------------

def _p01_static_smem(head_dim: int, params: dict, split: bool) -> list[Buffer]:
    # the kernel's static SharedStorage, all fp32: the scaled query row, then one float per thread for
    # the chunk's probabilities and one for the reductions' scratch
    threads = params["NUM_THREADS"]
    return [Buffer("query row (fp32)", 1, head_dim, 4), Buffer("probabilities (fp32)", 1, threads, 4),
            Buffer("reduction scratch (fp32)", 1, threads, 4)]


def _p02_static_smem(head_dim: int, params: dict, split: bool) -> list[Buffer]:
    # one 32-key tile each of K and V (rows padded by 16 bytes), then each warp's query row in fp32
    return [Buffer("K tile", 32, _pitch(head_dim, 2), 2), Buffer("V tile", 32, _pitch(head_dim, 2), 2),
            Buffer("query rows (fp32)", params["NUM_WARPS"], head_dim, 4)]


def _wmma_32x32_layout(head_dim: int, p_planes: tuple[str, ...]) -> list[Buffer]:
    return [*_tiles(32, 32, head_dim), Buffer("S (fp32)", 32, _pitch(32, 4), 4),
            *(Buffer(name, 32, _pitch(32, 2), 2) for name in p_planes), _accumulator(32, head_dim)]


def _p03_layout(head_dim: int, params: dict, split: bool) -> list[Buffer]:
    return _wmma_32x32_layout(head_dim, ("P (fp16)",))


def _p04_layout(head_dim: int, params: dict, split: bool) -> list[Buffer]:
    # with P_FP32=1, P is kept as two fp16 planes, hi (P itself) and lo (the rounding error)
    return _wmma_32x32_layout(head_dim, ("P (fp16)", "P lo (fp16)") if params["P_FP32"] else ("P (fp16)",))


def _p05_layout(head_dim: int, params: dict, split: bool) -> list[Buffer]:
    m, n = params["BLOCK_M"], params["BLOCK_N"]
    # P (fp16) is written over S (fp32) in the same bytes: one buffer with two lives
    return [*_tiles(m, n, head_dim), Buffer("S then P (fp32 / fp16)", m, _pitch(n, 4), 4), _accumulator(m, head_dim)]


def _p06_layout(head_dim: int, params: dict, split: bool) -> list[Buffer]:
    m, n, stages = params["BLOCK_M"], params["BLOCK_N"], params["STAGES"]
    # K and V have one buffer per pipeline stage, and come last (see the kernel's PLANTED_BUG)
    return [Buffer("Q tile", m, _pitch(head_dim, 2), 2), Buffer("S then P (fp32 / fp16)", m, _pitch(n, 4), 4),
            _accumulator(m, head_dim), Buffer("K tiles (x STAGES)", stages * n, _pitch(head_dim, 2), 2),
            Buffer("V tiles (x STAGES)", stages * n, _pitch(head_dim, 2), 2)]


def p07_tiles(head_dim: int, params: dict, split: bool) -> tuple[int, int, int, int]:
    """p07's (BLOCK_M, BLOCK_N, STAGES, warps) for a head dim: the large-problem configuration, or
    the key-split one small problems take (16 rows per warp, KV_SPLIT warps per row group)."""
    if split:
        return (params["SPLIT_BLOCK_M"], params["SPLIT_BLOCK_N"], params["SPLIT_STAGES"],
                params["SPLIT_BLOCK_M"] // 16 * params["KV_SPLIT"])
    wide = head_dim == 128
    m = params["BLOCK_M_D128"] if wide else params["BLOCK_M"]
    return m, params["BLOCK_N"], params["STAGES_D128"] if wide else params["STAGES"], m // params["WARP_ROWS"]


def _p07_layout(head_dim: int, params: dict, split: bool) -> list[Buffer]:
    m, n, stages, _ = p07_tiles(head_dim, params, split)
    # S, P and O live in registers; rows are swizzled instead of padded. One Q buffer per stage:
    # the next query tile's Q is copied while the last key tiles of this one are computed. The
    # key-split merge reuses the K/V buffers (the kernel static_asserts that it fits).
    # With OVERLAP_SOFTMAX the copies run one tile less ahead, and Q needs one buffer fewer.
    q_buffers = stages - 1 if params["OVERLAP_SOFTMAX"] and not split else stages
    return [Buffer("Q tiles (x STAGES)", q_buffers * m, head_dim, 2),
            Buffer("K tiles (x STAGES)", stages * n, head_dim, 2),
            Buffer("V tiles (x STAGES)", stages * n, head_dim, 2)]


def p08_tiles(head_dim: int, params: dict) -> tuple[int, int, int]:
    """p08's (warpgroups, BLOCK_N, CTAs per SM) for a head dim: D = 128 has its own defines."""
    suffix = "_D128" if head_dim == 128 else ""
    return params[f"WARPGROUPS{suffix}"], params[f"BLOCK_N{suffix}"], params[f"CTAS_PER_SM{suffix}"]


def _p08_layout(head_dim: int, params: dict, split: bool) -> list[Buffer]:
    warpgroups, n, _ = p08_tiles(head_dim, params)
    # 64 query rows per warpgroup, two buffers each for K and V, rows swizzled, not padded. The
    # kernel asks for 1 KB more and rounds its base up: wgmma's 128-byte swizzle needs 1024-byte tiles.
    return [Buffer("Q tile", 64 * warpgroups, head_dim, 2), Buffer("K tiles (x 2)", 2 * n, head_dim, 2),
            Buffer("V tiles (x 2)", 2 * n, head_dim, 2), Buffer("alignment slack", 1, 1024, 1)]


def p09_tiles(head_dim: int, params: dict) -> tuple[int, int, int]:
    """p09's (consumer warpgroups, BLOCK_N, stages of the K/V ring) for a head dim: D = 128 has its own defines."""
    suffix = "_D128" if head_dim == 128 else ""
    return params[f"CONSUMERS{suffix}"], params[f"BLOCK_N{suffix}"], params[f"STAGES{suffix}"]


def _p09_sums_in_values(head_dim: int, params: dict) -> bool:
    """Whether P·V's wgmmas take the row sums' ones as their 8 last columns (the kernel's Tiles::kSumsInValues)."""
    return bool(params["SPECULATE"] and params["SUMS_IN_VALUES"] and params["WIDE_WGMMA"] and head_dim == 64)


def _p09_layout(head_dim: int, params: dict, split: bool) -> list[Buffer]:
    consumers, n, stages = p09_tiles(head_dim, params)
    split_keys = params["SPLIT_KEYS"] and consumers > 1
    senders = (params["CLUSTER_KEYS"] - 1) * (1 if split_keys else consumers)
    # 64 query rows per consumer warpgroup (SPLIT_KEYS: 64 in all), a ring of `stages` buffers each for K and V as
    # TMA writes them (128B-swizzled, not padded), with SPECULATE a swizzle atom of ones (B of the row sums'
    # P·ones; SUMS_IN_VALUES at D = 64: 16 rows of them, the rows a k16 slice of P·V reads), with SPLIT_KEYS a
    # slot per consumer but the first for its partial result (O in fp32, two maxima and two sums per thread), then
    # the mbarriers (Q full and empty; K full, V full and empty per stage) and the slot where the work counter hands
    # the consumers their item. With CLUSTER_KEYS an inbox comes before the barriers:
    # a slot per other CTA of the cluster and per warpgroup holding rows of O (one with SPLIT_KEYS), and its two
    # mbarriers. The kernel asks for 1 KB more and rounds its base up to 1024 bytes for the swizzle.
    return [Buffer("Q tile", 64 if split_keys else 64 * consumers, head_dim, 2),
            Buffer(f"K ring (x {stages})", stages * n, head_dim, 2),
            Buffer(f"V ring (x {stages})", stages * n, head_dim, 2),
            *([Buffer("ones for the row sums, P·ones (SPECULATE)", 16 if _p09_sums_in_values(head_dim, params) else 8,
                      64, 2)] if params["SPECULATE"] else []),
            *([Buffer(f"partial results (x {consumers - 1}, SPLIT_KEYS)", (consumers - 1) * 128, head_dim // 2 + 4, 4)]
              if split_keys else []),
            *([Buffer(f"inbox of the cluster's partial results (x {senders}, CLUSTER_KEYS)", senders * 128,
                      head_dim // 2 + 4, 4), Buffer("the inbox's mbarriers", 2, 8, 1)] if senders else []),
            Buffer("mbarriers and the work item", 3 + 3 * stages, 8, 1),
            Buffer("alignment slack", 1, 1024, 1)]


def _p09_refuses(params: dict) -> str | None:
    # The work counter feeds persistent CTAs; a CTA per work item has no next item to ask for (the kernel's
    # static_assert, said before a compile).
    if params["DYNAMIC"] and not params["PERSISTENT"]:
        return ("DYNAMIC=1 or 2 hands persistent CTAs their work items: set PERSISTENT=1, or DYNAMIC=0 with "
                "PERSISTENT=0")
    if params["DYNAMIC"] not in (0, 1, 2):
        return "DYNAMIC: 0 (a fixed round robin), 1 (the work counter always) or 2 (the counter under a causal mask)"
    if params["CLUSTER_KEYS"] not in (1, 2, 4):
        return "CLUSTER_KEYS: 1 (no cluster), 2 or 4 CTAs split a work item's key tiles"
    if params["CLUSTER_KEYS"] > 1 and (not params["OVERLAP"] or params["CARRY_OVER"] or params["DYNAMIC"]):
        return ("CLUSTER_KEYS=2 or 4 splits the overlapped steps' key tiles, keeps an item's last P·V in the item, and "
                "hands a cluster's CTAs the same items in a fixed order: set OVERLAP=1, CARRY_OVER=0 and DYNAMIC=0")
    if params["SPLIT_KEYS"] and (not params["OVERLAP"] or params["CARRY_OVER"]):
        return ("SPLIT_KEYS=1 splits the overlapped steps' key tiles, and keeps an item's last P·V in the item: "
                "set OVERLAP=1 and CARRY_OVER=0")
    for head_dim in (64, 128):
        consumers, _, stages = p09_tiles(head_dim, params)
        if params["SPLIT_KEYS"] and consumers > 1 and stages < consumers + 1:
            suffix = "_D128" if head_dim == 128 else ""
            return (f"SPLIT_KEYS=1 needs STAGES{suffix} >= CONSUMERS{suffix} + 1: a consumer holds its key tile "
                    f"until the next one's Q·Kᵀ is issued, {consumers} tiles further on in the ring")
        # Measured on the H100 (the kernel's static_assert): three consumers splitting the keys with the
        # speculative softmax were 1.17x the tolerance at 1x8x512x128 in bf16 on one seed of four.
        if params["SPLIT_KEYS"] and consumers > 2 and params["SPECULATE"]:
            return ("SPLIT_KEYS=1 with SPECULATE=1 and three consumers missed the accuracy tolerance on the H100 "
                    "(not understood yet): use two consumers, or SPECULATE=0")
    # Measured on the H100: without OVERLAP, 64-key tiles give wrong outputs (max error 0.4 at 1x8x512x64)
    # as soon as a row sees two key tiles, with two consumers or three; one key tile, or 128-key tiles, or
    # OVERLAP=1 are right. D = 128 was not tried, so it is refused there too. The cause, read from the SASS
    # (CUDA 13.0's ptxas): P's A fragments are packed into the very registers that hold Q, which is loaded once
    # per work item, so the second key tile's Q·Kᵀ multiplies P by K. The PTX keeps the two apart, and an empty
    # asm that keeps Q live through every step does not change the allocation: a ptxas miscompile, not fixed here.
    if not params["OVERLAP"] and 64 in (params["BLOCK_N"], params["BLOCK_N_D128"]):
        return ("OVERLAP=0 with 64-key tiles (BLOCK_N or BLOCK_N_D128 = 64) gives wrong results: a known "
                "phase 9 bug, not fixed yet; use OVERLAP=1 or 128-key tiles")
    # Measured on the H100 the same way: without OVERLAP, the wide wgmmas give wrong outputs at D = 128 (max error
    # 0.18-0.5) once a row sees two key tiles, and are right at D = 64. The same miscompile: the two failing builds
    # share a shape, Q·Kᵀ and P·V each one wgmma of the same width per slice (64 and 64 there, 128 and 128 here),
    # and in both the SASS packs P into Q's registers.
    if not params["OVERLAP"] and params["WIDE_WGMMA"]:
        return ("OVERLAP=0 with WIDE_WGMMA=1 gives wrong results at D=128: a known phase 9 bug, not fixed yet; "
                "use OVERLAP=1, or WIDE_WGMMA=0 with OVERLAP=0")
    # the kernel's static_asserts, said before a compile
    if params["SPECULATE"] and not params["OVERLAP"]:
        return "SPECULATE=1 changes the overlapped step's softmax: set OVERLAP=1, or SPECULATE=0 with OVERLAP=0"
    if params["CARRY_OVER"] and not params["OVERLAP"]:
        return ("CARRY_OVER=1 moves the overlapped steps' last P·V into the next work item: set OVERLAP=1, "
                "or CARRY_OVER=0 with OVERLAP=0")
    return None


# Phase 9's CLUSTER_KEYS builds: two CTAs per item on 64-key tiles, a fixed round robin (the CTAs of a cluster take
# the same items, so no work counter).
_CLUSTER_KEYS = {"CLUSTER_KEYS": 2, "DYNAMIC": 0, "BLOCK_N": 64, "STAGES": 4, "BLOCK_N_D128": 64, "STAGES_D128": 3}
# Phase 9 without OVERLAP: what needs it goes too (ping-pong, speculation, carry-over), and the wide wgmmas (refused).
_NO_OVERLAP = {"PINGPONG": 0, "OVERLAP": 0, "SPECULATE": 0, "WIDE_WGMMA": 0, "CARRY_OVER": 0}


def p10_block_m(head_dim: int, params: dict) -> int:
    """p10's query rows per CTA (16 per warp) for a head dim."""
    return params["BLOCK_M_D128"] if head_dim == 128 else params["BLOCK_M"]


def _p10_layout(head_dim: int, params: dict, split: bool) -> list[Buffer]:
    m, n, stages = p10_block_m(head_dim, params), params["BLOCK_N"], params["STAGES"]
    # The inbox, where a cluster's CTAs send each other their partial O rows (padded by 8 floats
    # against bank conflicts), maxima and sums, lies apart from the tiles: a CTA may receive while
    # it still computes.
    return [Buffer("Q tile", m, head_dim, 2), Buffer("K tiles (x STAGES)", stages * n, head_dim, 2),
            Buffer("V tiles (x STAGES)", stages * n, head_dim, 2), Buffer("inbox: partial O (fp32)", m, head_dim + 8, 4),
            Buffer("inbox: row maxima and sums (fp32)", 2, m, 4)]


def _warps_define(params: dict, head_dim: int, split: bool) -> int:
    return params["NUM_WARPS"] * WARP


# --- the registry ---------------------------------------------------------------------------------

_REGISTRY = [
    Phase(
        name="p01_baseline",
        title="Phase 1: the scalar baseline",
        notebook="01_baseline",
        kernel_name="attention_row_kernel",
        archs=(75, 80, 89, 90),
        min_cc=75,
        tile_params={"NUM_THREADS": 128},
        threads=lambda params, head_dim, split: params["NUM_THREADS"],
        static_smem=_p01_static_smem,
    ),
    Phase(
        name="p02_vectorized",
        title="Phase 2: vectorized loads and warp reductions",
        notebook="02_vectorized",
        kernel_name="attention_rows_kernel",
        archs=(75, 80, 89, 90),
        min_cc=75,
        aligned_16b=True,
        tile_params={"NUM_WARPS": 8},
        threads=_warps_define,
        static_smem=_p02_static_smem,
    ),
    Phase(
        name="p03_wmma",
        title="Phase 3: tensor cores with WMMA, 32x32 tiles",
        notebook="03_wmma",
        kernel_name="attention_wmma_kernel",
        archs=(75, 80, 89, 90),
        min_cc=75,
        dtypes=("float16",),
        aligned_16b=True,
        threads=lambda params, head_dim, split: 4 * WARP,
        smem_layout=_p03_layout,
    ),
    Phase(
        name="p04_fp32p",
        title="Phase 4: FP32 P and the shared-memory budget",
        notebook="04_fp32p",
        kernel_name="attention_fp32p_kernel",
        archs=(75, 80, 89, 90),
        min_cc=75,
        dtypes=("float16",),
        aligned_16b=True,
        # P_FP32=0 rounds P to fp16 (phase 3's numerics); PADDING_BUG=1 builds the teaching variant
        # that reproduces the original project's padding bug — wrong on purpose.
        tile_params={"P_FP32": 1, "PADDING_BUG": 0},
        threads=lambda params, head_dim, split: 4 * WARP,
        smem_layout=_p04_layout,
        variants=(
            variant("FP16 P", {"P_FP32": 0, "PADDING_BUG": 0}, "precision", "test"),
            variant("FP32 P", {"P_FP32": 1, "PADDING_BUG": 0}, "precision"),
            variant("padding bug (teaching)", {"P_FP32": 0, "PADDING_BUG": 1}, "precision"),
        ),
    ),
    Phase(
        name="p05_tile64",
        title="Phase 5: 64x64 tiles, buffer reuse, tile sizes as parameters",
        notebook="05_tile64",
        kernel_name="attention_tiled_kernel",
        archs=(75, 80, 89, 90),
        min_cc=75,
        dtypes=("float16",),
        aligned_16b=True,
        tile_params={"BLOCK_M": 64, "BLOCK_N": 64, "NUM_WARPS": 8},
        # One BLOCK_M x BLOCK_N serves both head dims, so on a GPU where 64x64 does not fit D = 128 the
        # default is the configuration of the recorded H100 sweep (p05_tile64_sweep.json) fastest at the
        # mission shape among those that fit D = 128 there. A100 (163 KB per block): 64x64 fits.
        arch_tile_params={
            75: {"BLOCK_M": 32, "BLOCK_N": 32, "NUM_WARPS": 16},   # T4, 64 KB: only 32x32 tiles fit D = 128
            89: {"BLOCK_M": 32, "BLOCK_N": 64, "NUM_WARPS": 16},   # L4, 99 KB: 64x64 needs 101 KB at D = 128
        },
        threads=_warps_define,
        smem_layout=_p05_layout,
        variants=(
            # rows per thread, threads per row and the warp loops each take another shape
            variant("32x32 tiles, 4 warps", {"BLOCK_M": 32, "BLOCK_N": 32, "NUM_WARPS": 4}, "test"),
            variant("128x64 tiles, 8 warps", {"BLOCK_M": 128, "BLOCK_N": 64, "NUM_WARPS": 8}, "test"),
            variant("64x128 tiles, 2 warps", {"BLOCK_M": 64, "BLOCK_N": 128, "NUM_WARPS": 2}, "test"),
            variant("32x64 tiles, 16 warps", {"BLOCK_M": 32, "BLOCK_N": 64, "NUM_WARPS": 16}, "test"),
            # 16 lanes per query row and one: the in-place S -> P hand-over and the warp loops take their other shapes
            variant("32x128 tiles, 16 warps", {"BLOCK_M": 32, "BLOCK_N": 128, "NUM_WARPS": 16}, "sanitize"),
            variant("128x64 tiles, 4 warps", {"BLOCK_M": 128, "BLOCK_N": 64, "NUM_WARPS": 4}, "sanitize"),
        ),
        sweep_grid={"BLOCK_M": [32, 64, 128], "BLOCK_N": [32, 64, 128], "NUM_WARPS": [2, 4, 8, 16]},
    ),
    Phase(
        name="p06_async",
        title="Phase 6: the cp.async pipeline, and compute-sanitizer",
        notebook="06_async",
        kernel_name="attention_async_kernel",
        archs=(80, 89, 90),
        min_cc=80,                # cp.async
        dtypes=("float16",),
        aligned_16b=True,
        # PLANTED_BUG=1 builds the teaching variant for the sanitizer section — wrong on purpose.
        tile_params={"BLOCK_M": 32, "BLOCK_N": 128, "NUM_WARPS": 8, "STAGES": 2, "PLANTED_BUG": 0},
        # As for p05: where the H100's 177.5 KB at D = 128 does not fit, the configuration of the recorded
        # H100 sweep (p06_async_sweep.json) fastest at the mission shape among those that fit D = 128 there.
        # Both have one stage: on the L4 no two-stage configuration of the sweep fits D = 128, and on the
        # A100 the fastest that fits (32x64, 16 warps) was slower.
        arch_tile_params={
            80: {"BLOCK_M": 32, "BLOCK_N": 128, "NUM_WARPS": 16, "STAGES": 1},  # A100, 163 KB
            89: {"BLOCK_M": 32, "BLOCK_N": 64, "NUM_WARPS": 16, "STAGES": 1},   # L4, 99 KB: two stages need 101.5 KB
        },
        threads=_warps_define,
        smem_layout=_p06_layout,
        variants=(
            variant("1 stage", {"STAGES": 1}, "sanitize"),
            variant("32x64 tiles, 16 warps, 3 stages", {"BLOCK_M": 32, "BLOCK_N": 64, "NUM_WARPS": 16, "STAGES": 3},
                    "sanitize"),
        ),
        sweep_grid={"BLOCK_M": [32, 64], "BLOCK_N": [64, 128], "NUM_WARPS": [4, 8, 16], "STAGES": [1, 2, 3]},
    ),
    Phase(
        name="p07_registers",
        title="Phase 7: mma.sync, ldmatrix, swizzled shared memory: S and P in registers",
        notebook="07_registers",
        kernel_name="attention_registers_kernel",
        archs=(80, 89, 90),
        min_cc=80,                # cp.async, bf16 mma.sync
        aligned_16b=True,
        # Defaults from the H100 runs of chapter 7. BLOCK_M_D128 / STAGES_D128 are D = 128's own.
        tile_params={"BLOCK_M": 128, "BLOCK_N": 64, "WARP_ROWS": 32, "STAGES": 2,
                     "BLOCK_M_D128": 128, "STAGES_D128": 1,
                     "SPLIT_BLOCK_M": 32, "SPLIT_BLOCK_N": 128, "SPLIT_STAGES": 2, "KV_SPLIT": 4,
                     "SMALL_PROBLEM_CTAS": -1, "SMALL_PROBLEM_FILL": 50, "Q_IN_REGS_MAX_D": 64,
                     "SWIZZLE": 1, "SEPARATE_MASKED_TILES": 1, "FOLD_LOG2E": 1, "LAZY_RESCALE": 1,
                     "PERSISTENT": 1, "PERSISTENT_CTAS": -1, "OVERLAP_SOFTMAX": 0,
                     "RESCALE_SLACK": 0, "SUM_ROUNDED_P": 0, "EXACT_EXP": 0},
        # Not measured here (no such GPU): sized to fit. sm_89 allows 99 KB per block and 100 KB per SM,
        # so the key-split path takes one stage (144 KB at D = 128 with two).
        arch_tile_params={89: {"SPLIT_STAGES": 1}},
        # At D = 128, 32 rows per warp hold 128 O accumulators + 64 scores per lane: ptxas spills a
        # word or three (4 B on sm_90, 12 B on sm_80 and sm_89), and that still measured faster than every
        # spill-free tiling tried (chapter 7).
        spill_budget_bytes=32,
        threads=lambda params, head_dim, split: p07_tiles(head_dim, params, split)[3] * WARP,
        smem_layout=_p07_layout,
        key_split=True,
        split_defines={"SMALL_PROBLEM_CTAS": 1000},
        dispatch=True,
        # Chapter 7's four large shapes (all take the large tiles), then the mission shape (the key-split path)
        profile_cases=("b16h16_s512", "b4h16_s2048", "b4h16_s2048_causal", "b2h16_s4096_d128", "mission"),
        variants=(
            # Chapter 7's rungs. The first: large tiles on every problem, 16 rows per warp, FlashAttention-2's
            # one-buffer schedule, plain rows, the scale not folded, every tile masked, one CTA per query tile, O
            # rescaled every tile (Q stays in registers at D = 64: all of the state in registers is rung 1's
            # idea). 32 rows per warp comes after rung 3's leaner softmax: on top of rung 2, every tile's mask
            # arithmetic and the unfolded scale leave too few registers for 128 O accumulators at D = 128
            # (ptxas spill stores: 68 bytes on sm_90, 216 on sm_80; on top of rung 3, the defaults' 4 and 12). The
            # GPU suite checks the last two already ("no key-split path" and the defaults).
            *rungs({"SWIZZLE": 0, "WARP_ROWS": 16, "STAGES": 1, "FOLD_LOG2E": 0, "SEPARATE_MASKED_TILES": 0,
                    "PERSISTENT": 0, "LAZY_RESCALE": 0, "SMALL_PROBLEM_CTAS": 0},
                   ("mma.sync, S and P in registers", ()),
                   ("+ swizzled shared memory", ("SWIZZLE",)),
                   ("+ 2-stage cp.async ring, exp2 folding, unmasked interior tiles",
                    ("STAGES", "FOLD_LOG2E", "SEPARATE_MASKED_TILES")),
                   ("+ 32 rows per warp", ("WARP_ROWS",)),
                   ("+ persistent CTAs, lazy rescale", ("PERSISTENT", "LAZY_RESCALE")),
                   ("+ key split for small problems (the defaults)", ("SMALL_PROBLEM_CTAS",)),
                   tested=4),
            # Chapter 7's ablation: each technique changed alone from the defaults. Those also tagged
            # "accuracy", with the ones after them, are the accuracy record's suspects, one at a time.
            variant("defaults", {}, "ablation"),
            variant("no swizzle", {"SWIZZLE": 0}, "ablation"),
            variant("16 rows per warp", {"WARP_ROWS": 16}, "ablation"),
            variant("Q re-read every tile (D=64)", {"Q_IN_REGS_MAX_D": 0}, "ablation"),
            variant("1 stage, FA2 schedule (D=64)", {"STAGES": 1}, "ablation"),
            variant("3 stages (D=64)", {"STAGES": 3}, "ablation"),
            variant("2 stages (D=128)", {"STAGES_D128": 2}, "ablation"),
            variant("256-row tiles (D=128)", {"BLOCK_M_D128": 256}, "ablation"),
            variant("mask every tile", {"SEPARATE_MASKED_TILES": 0}, "ablation"),
            variant("exp, scale not folded", {"FOLD_LOG2E": 0}, "ablation", "accuracy"),
            variant("rescale O every tile", {"LAZY_RESCALE": 0}, "ablation", "accuracy"),
            variant("one CTA per query tile", {"PERSISTENT": 0}, "ablation"),
            variant("32-key tiles", {"BLOCK_N": 32}, "ablation"),
            variant("32-key tiles, softmax beside next Q·Kᵀ",
                    {"BLOCK_N": 32, "STAGES": 3, "STAGES_D128": 3, "OVERLAP_SOFTMAX": 1}, "ablation"),
            # the large-tile path on the small shapes of the suite
            variant("no key-split path", {"SMALL_PROBLEM_CTAS": 0}, "ablation", "test", "accuracy"),
            variant("key split on every problem", {"SMALL_PROBLEM_CTAS": 1 << 30}, "accuracy"),
            variant("row maxima 2^8 lazy (the first default)", {"RESCALE_SLACK": 8}, "ablation", "accuracy"),
            variant("row sums of the rounded P", {"SUM_ROUNDED_P": 1}, "accuracy"),
            variant("exp in double precision, not ex2.approx", {"EXACT_EXP": 1}, "accuracy"),
            # A few persistent CTAs make every CTA cross many query tiles even on small problems: the
            # large-tile path with both pipelines and the overlap; other splits and stage counts; every
            # ablation switch at once (each must change the speed, never the result).
            variant("3 persistent CTAs", {"SMALL_PROBLEM_CTAS": 0, "PERSISTENT_CTAS": 3}, "test"),
            variant("5 persistent CTAs, 1 stage, 256-row 2-stage tiles at D=128",
                    {"SMALL_PROBLEM_CTAS": 0, "PERSISTENT_CTAS": 5, "STAGES": 1, "BLOCK_M_D128": 256,
                     "STAGES_D128": 2}, "test"),
            variant("4 persistent CTAs, 16 rows per warp, 3 stages, Q in registers at D=128",
                    {"SMALL_PROBLEM_CTAS": 0, "PERSISTENT_CTAS": 4, "WARP_ROWS": 16, "STAGES": 3,
                     "Q_IN_REGS_MAX_D": 128}, "test"),
            variant("3 persistent CTAs, 32-key tiles, softmax overlap",
                    {"SMALL_PROBLEM_CTAS": 0, "PERSISTENT_CTAS": 3, "OVERLAP_SOFTMAX": 1, "BLOCK_N": 32, "STAGES": 3,
                     "STAGES_D128": 3}, "test"),
            variant("key split everywhere, 2 ways, 16 rows, 1 stage",
                    {"SMALL_PROBLEM_CTAS": 1 << 30, "KV_SPLIT": 2, "SPLIT_BLOCK_M": 16, "SPLIT_STAGES": 1}, "test"),
            variant("every ablation switch off",
                    {"SWIZZLE": 0, "SEPARATE_MASKED_TILES": 0, "FOLD_LOG2E": 0, "LAZY_RESCALE": 0}, "test"),
            variant("every ablation switch off, large tiles, one CTA per query tile",
                    {"SMALL_PROBLEM_CTAS": 0, "SWIZZLE": 0, "SEPARATE_MASKED_TILES": 0, "FOLD_LOG2E": 0,
                     "LAZY_RESCALE": 0, "PERSISTENT": 0}, "test"),
            # Under the sanitizer (whose small cases otherwise take the key-split path): the large-tile path
            # with both pipelines and the overlap, on one persistent CTA that crosses every query tile.
            variant("large tiles, 1 persistent CTA", {"SMALL_PROBLEM_CTAS": 0, "PERSISTENT_CTAS": 1}, "sanitize"),
            variant("large tiles, 1 persistent CTA, 1 stage, 256-row 2-stage tiles at D=128",
                    {"SMALL_PROBLEM_CTAS": 0, "PERSISTENT_CTAS": 1, "STAGES": 1, "BLOCK_M_D128": 256,
                     "STAGES_D128": 2}, "sanitize"),
            variant("large tiles, 1 persistent CTA, softmax overlap",
                    {"SMALL_PROBLEM_CTAS": 0, "PERSISTENT_CTAS": 1, "OVERLAP_SOFTMAX": 1, "BLOCK_N": 32,
                     "STAGES": 3, "STAGES_D128": 3}, "sanitize"),
        ),
    ),
    Phase(
        name="p08_wgmma",
        title="Phase 8: Hopper's warpgroup MMA (wgmma)",
        notebook="08_wgmma",
        kernel_name="attention_wgmma_kernel",
        archs=(90,),
        min_cc=90,
        arch_specific=True,       # wgmma.mma_async: sm_90a, Hopper only
        aligned_16b=True,
        # Defaults from the H100 runs of chapter 8: two CTAs of 2 x 64 rows per SM at D = 64, one at D = 128.
        tile_params={"WARPGROUPS": 2, "BLOCK_N": 64, "CTAS_PER_SM": 2,
                     "WARPGROUPS_D128": 2, "BLOCK_N_D128": 128, "CTAS_PER_SM_D128": 1, "OVERLAP": 0,
                     "RESCALE_SLACK": 0, "SUM_ROUNDED_P": 0, "EXACT_EXP": 0},
        threads=lambda params, head_dim, split: p08_tiles(head_dim, params)[0] * 4 * WARP,
        smem_layout=_p08_layout,
        dispatch=True,
        # Where the problem fills the GPU, on an sm_90 without a tuning table p09 (later in the book, the
        # same waves) takes these problems; p08 keeps them where the grid ranks it first.
        fallback_waves=(1.0, math.inf),
        variants=(
            # Chapter 8's ablation; the overlap must also be correct and race-free.
            variant("defaults", {}, "ablation"),
            variant("softmax under its own P·V (FA3 overlap)", {"OVERLAP": 1}, "ablation", "test", "sanitize"),
            variant("128-key tiles, one CTA per SM (D=64)", {"BLOCK_N": 128, "CTAS_PER_SM": 1}, "ablation"),
            variant("one warpgroup per CTA", {"WARPGROUPS": 1, "CTAS_PER_SM": 4, "WARPGROUPS_D128": 1,
                                              "BLOCK_N_D128": 64, "CTAS_PER_SM_D128": 2}, "ablation"),
            variant("three warpgroups per CTA (D=64)", {"WARPGROUPS": 3, "CTAS_PER_SM": 1}, "ablation"),
            variant("64-key tiles (D=128)", {"BLOCK_N_D128": 64}, "ablation"),
            # the other tile shapes: one and three warpgroups, wider key tiles, two CTAs per SM at D = 128
            variant("one warpgroup, 128-key tiles; two CTAs per SM at D=128",
                    {"WARPGROUPS": 1, "BLOCK_N": 128, "WARPGROUPS_D128": 1, "BLOCK_N_D128": 64,
                     "CTAS_PER_SM_D128": 2}, "test"),
            variant("three warpgroups, 192-key tiles, overlap",
                    {"WARPGROUPS": 3, "BLOCK_N": 192, "CTAS_PER_SM": 1, "OVERLAP": 1}, "test"),
            variant("256-key tiles; three warpgroups at D=128",
                    {"BLOCK_N": 256, "CTAS_PER_SM": 1, "WARPGROUPS_D128": 3, "BLOCK_N_D128": 64}, "test"),
            variant("three warpgroups, 192-key tiles; one at D=128",
                    {"WARPGROUPS": 3, "BLOCK_N": 192, "CTAS_PER_SM": 1, "WARPGROUPS_D128": 1, "BLOCK_N_D128": 64},
                    "sanitize"),
            # The accuracy record's suspects, one at a time (phase 7's, where p08 has them).
            variant("row maxima 2^8 lazy (the first default)", {"RESCALE_SLACK": 8}, "ablation", "accuracy"),
            variant("row sums of the rounded P", {"SUM_ROUNDED_P": 1}, "accuracy"),
            variant("exp in double precision, not ex2.approx", {"EXACT_EXP": 1}, "accuracy"),
        ),
    ),
    Phase(
        name="p09_warpspec",
        title="Phase 9: TMA, warp specialisation and ping-pong: Hopper's producer/consumer kernel",
        notebook="09_warpspec",
        kernel_name="attention_warpspec_kernel",
        archs=(90,),
        min_cc=90,
        arch_specific=True,       # wgmma.mma_async and setmaxnreg: sm_90a, Hopper only
        aligned_16b=True,         # TMA: 16-byte aligned bases and strides
        # D = 64 keeps three stages of 128-key tiles. D = 128 was sized at two stages (160 KB) from the
        # budget; its ablation then measured a third (225 KB) 12% faster at 2x16x4096x128, the default now.
        # D = 64: two consumer warpgroups, Q in registers (128 query rows per CTA), the first defaults. Three
        # reading Q from shared memory (192 rows) were then measured faster at every large D = 64 shape and
        # became the defaults; with the speculative softmax (SPECULATE) two are faster again (0.92-0.95x the
        # GPU time of three at 4x16x2048x64, causal or not, and 1x16x8192x64), so they are back, and three a
        # candidate of `attention`. D = 128: two, Q in registers.
        # The work order: a counter hands out the items (DYNAMIC), causal heads in groups (CAUSAL_GROUP_MB) that
        # keep K and V in L2 where all heads' would overflow it (16 x 16 x 2048 x 128 causal: 0.61x SDPA default's
        # speed before, the grid's worst; 0.92x with them). The counter only under a causal mask (DYNAMIC=2): without
        # one, a build with no counter code took 0.96x the GPU time of the counter's at 4x16x2048x64 and
        # 1x16x8192x64, and 0.98-1.02x at the other non-causal shapes measured (an exploration run of the change
        # itself, before it was committed as 20121f5).
        # The carry-over (an item's last P·V beside the next item's first Q·Kᵀ) was a default until the wide stores
        # of O: the ablation at 41349ab measured it costing 1.5-5.9% at every shape, so it is off, and a variant.
        # TRACE=1 is the instrumented build of the trace record (the variants tagged "trace"), never timed.
        tile_params={"CONSUMERS": 2, "BLOCK_N": 128, "STAGES": 3,
                     "CONSUMERS_D128": 2, "BLOCK_N_D128": 128, "STAGES_D128": 3,
                     "OVERLAP": 1, "PINGPONG": 1, "PERSISTENT": 1, "PERSISTENT_CTAS": -1,
                     "Q_IN_SHARED": 0, "Q_IN_SHARED_D128": 0, "SNAKE": 1, "CAUSAL_GROUP_MB": 32, "DYNAMIC": 2,
                     "SPECULATE": 1, "SUMS_AFTER_TURN": 1, "WIDE_WGMMA": 1, "CARRY_OVER": 0, "WIDE_STORES": 1, "SPLIT_KEYS": 0,
                     "CLUSTER_KEYS": 1, "SEND_ASYNC": 1, "TRACE": 0, "SUMS_IN_VALUES": 1},
        threads=lambda params, head_dim, split: (1 + p09_tiles(head_dim, params)[0]) * 4 * WARP,
        smem_layout=_p09_layout,
        refuses=_p09_refuses,
        # CLUSTER_KEYS hands a partial result to another CTA of the cluster through an mbarrier in that CTA's shared
        # memory. Under racecheck the waits on that mbarrier never end (--racecheck-deadlock-timeout reports a
        # deadlock in CTA 0 of each cluster), with st.async and with plain remote stores and a release arrival alike;
        # the same builds run correctly under memcheck, synccheck and every test, and phase 10's handoff through the
        # cluster barrier finishes under racecheck.
        racecheck_follows=lambda params: params["CLUSTER_KEYS"] == 1,
        dispatch=True,
        # Where the problem fills the GPU: in the H100 records p09 takes the least GPU time of our phases at
        # every large timing shape, p07 and p10 at the mission shape (a quarter of a wave).
        fallback_waves=(1.0, math.inf),
        # the work order shows at long causal rows (the tail) and where all heads' K and V overflow the L2
        ablation_cases=("b1h32_s8192_d128_causal", "b16h16_s2048_d128_causal"),
        variants=(
            # Chapter 9's ablation: each step of the schedule taken back, and the ring and tiles resized.
            variant("defaults", {}, "ablation"),
            variant("no ping-pong", {"PINGPONG": 0}, "ablation", "test", "sanitize"),
            variant("no speculative softmax", {"SPECULATE": 0}, "ablation", "test", "sanitize"),
            # At D = 64 the row sums ride in P·V's wgmmas (SUMS_IN_VALUES), so neither switch alone takes back
            # the narrow wgmmas there: the turn's row takes back both, the code SUMS_AFTER_TURN was measured on.
            variant("row sums as narrow wgmmas of their own (N = 8)", {"SUMS_IN_VALUES": 0}, "ablation", "test"),
            variant("row sums inside the turn", {"SUMS_IN_VALUES": 0, "SUMS_AFTER_TURN": 0}, "ablation", "test",
                    "sanitize"),
            variant("4-byte stores of O", {"WIDE_STORES": 0}, "ablation", "test", "sanitize"),
            variant("64-column wgmmas (phase 8's)", {"WIDE_WGMMA": 0}, "ablation", "test", "sanitize"),
            variant("carry-over between work items", {"CARRY_OVER": 1}, "ablation", "test", "sanitize"),
            variant("no ping-pong, no overlap", _NO_OVERLAP, "ablation", "test", "sanitize"),
            variant("the work counter without a causal mask too", {"DYNAMIC": 1}, "ablation", "test", "sanitize"),
            variant("one CTA per work item", {"PERSISTENT": 0, "DYNAMIC": 0}, "ablation", "test"),
            variant("all heads at once (no head groups)", {"CAUSAL_GROUP_MB": 0}, "ablation", "test"),
            variant("a fixed round robin, rounds as a snake (no counter)", {"DYNAMIC": 0, "CAUSAL_GROUP_MB": 0},
                    "ablation", "test", "sanitize"),
            variant("a fixed round robin, every round the same way", {"DYNAMIC": 0, "CAUSAL_GROUP_MB": 0, "SNAKE": 0},
                    "ablation", "test"),
            variant("2 stages (D=64)", {"STAGES": 2}, "ablation"),
            variant("2 stages (D=128)", {"STAGES_D128": 2}, "ablation"),
            variant("64-key tiles", {"BLOCK_N": 64, "BLOCK_N_D128": 64}, "ablation", "test"),
            # A candidate of `attention` for short rows at D = 128, made for the steps a work item once ran alone
            # (its first Q·Kᵀ, its last P·V), which weigh half as much over twice the steps. The carry-over took
            # most of those away; in the 6da0228 grid it still wins at 16x16x128x128 (one 128-key tile per item).
            variant("64-key tiles, 4 stages (D=128)", {"BLOCK_N_D128": 64, "STAGES_D128": 4}, "test", "sanitize",
                    candidate="64-key", head_dims=(128,)),
            # The CTA's shape at D = 64. A consumer gets 240 registers beside one other, 160 beside two: with
            # Q in registers three consumers spill on 128-key tiles (80 bytes) but not on 64-key ones.
            # Three reading Q from shared memory (192-row work items) are also a candidate of `attention`.
            variant("three consumers, Q from shared memory (D=64)", {"CONSUMERS": 3, "Q_IN_SHARED": 1}, "ablation",
                    "test", "sanitize", candidate="192-row", head_dims=(64,)),
            variant("two consumers, Q from shared memory (D=64)", {"Q_IN_SHARED": 1}, "ablation"),
            # One consumer, 64 query rows per CTA, at both head dims: twice the CTAs of the defaults, for problems
            # whose 128-row items leave SMs idle (1 x 16 x 512 makes 64 of them on 132 SMs). No ping-pong (no one to
            # take turns with) and no register split (256 threads may each have 255). A candidate of `attention`.
            variant("one consumer (64-row work items)", {"CONSUMERS": 1, "CONSUMERS_D128": 1}, "ablation", "test",
                    "sanitize", candidate="64-row"),
            # Two consumers split a 64-row item's key tiles, and combine their results in shared memory: the chain
            # of steps per item is half as long, but the two warpgroups share one SM's four schedulers (at the
            # mission shape it ties with the 64-row build). 64-key tiles (the ring must hold CONSUMERS + 1 of them,
            # and at D = 128 the partial results need the room). A candidate of `attention`.
            variant("two consumers split a 64-row item's keys (64-key tiles)",
                    {"SPLIT_KEYS": 1, "BLOCK_N": 64, "STAGES": 4, "BLOCK_N_D128": 64, "STAGES_D128": 3}, "test",
                    "sanitize", candidate="split-keys"),
            # Two CTAs of a cluster split a 64-row item's keys, each on its own SM, and CTA 0 combines the two
            # partial results (distributed shared memory). For problems of at most half a wave of 64-row items: the
            # mission shape has 64 of them, 128 CTAs for 132 SMs. 64-key tiles (exploration runs on the H100: 128-key
            # tiles and two consumers per CTA splitting again were no faster at the mission shape); a fixed round robin
            # (the cluster's CTAs must take the same items). A candidate of `attention`.
            variant("two CTAs of a cluster split a 64-row item's keys (64-key tiles)",
                    {**_CLUSTER_KEYS, "CONSUMERS": 1, "CONSUMERS_D128": 1}, "test", "sanitize",
                    candidate="cluster-keys"),
            variant("three consumers, Q in registers, 64-key tiles (D=64)", {"CONSUMERS": 3, "BLOCK_N": 64},
                    "ablation", "test"),
            variant("Q from shared memory (D=128)", {"Q_IN_SHARED_D128": 1}, "ablation", "test", "sanitize"),
            # Three consumers fit D = 128 only on 64-key tiles with Q in shared memory (160 registers each).
            variant("three consumers, 64-key tiles, Q from shared memory (D=128)",
                    {"CONSUMERS_D128": 3, "BLOCK_N_D128": 64, "STAGES_D128": 4, "Q_IN_SHARED_D128": 1}, "ablation"),
            # A few persistent CTAs make every CTA cross many work items: the K/V ring's phases and Q's
            # buffer carry over from one item to the next, under every schedule.
            variant("1 persistent CTA", {"PERSISTENT_CTAS": 1}, "test", "sanitize"),
            variant("3 persistent CTAs, two consumers split the keys, Q from shared memory, no ping-pong",
                    {"PERSISTENT_CTAS": 3, "PINGPONG": 0, "SPLIT_KEYS": 1, "BLOCK_N": 64, "STAGES": 4, "Q_IN_SHARED": 1,
                     "BLOCK_N_D128": 64, "STAGES_D128": 3, "Q_IN_SHARED_D128": 1}, "test", "sanitize"),
            variant("3 persistent CTAs, no ping-pong", {"PERSISTENT_CTAS": 3, "PINGPONG": 0}, "test"),
            # Clusters that take several items each: CTA 0's inbox takes the next item's partial results only once
            # it has read the last ones; two warpgroups per CTA hold rows (128-row items), or one after an in-CTA split.
            variant("4 persistent CTAs in clusters of 2, two consumers split the keys again, Q from shared memory, "
                    "no ping-pong", {**_CLUSTER_KEYS, "PERSISTENT_CTAS": 4, "PINGPONG": 0, "SPLIT_KEYS": 1,
                                     "Q_IN_SHARED": 1, "Q_IN_SHARED_D128": 1}, "test", "sanitize"),
            variant("6 persistent CTAs in clusters of 2, 128-row items", {**_CLUSTER_KEYS, "PERSISTENT_CTAS": 6},
                    "test", "sanitize"),
            # The cluster's first send (chapter 9): plain remote stores, then a release arrival, not st.async.
            variant("two CTAs of a cluster split a 64-row item's keys, sending by plain stores",
                    {**_CLUSTER_KEYS, "CONSUMERS": 1, "CONSUMERS_D128": 1, "SEND_ASYNC": 0}, "test", "sanitize"),
            variant("8 persistent CTAs in clusters of 4, 64-row items",
                    {**_CLUSTER_KEYS, "CLUSTER_KEYS": 4, "PERSISTENT_CTAS": 8, "CONSUMERS": 1, "CONSUMERS_D128": 1},
                    "test"),
            variant("2 persistent CTAs, no overlap, 2 stages", {**_NO_OVERLAP, "PERSISTENT_CTAS": 2, "STAGES": 2},
                    "test", "sanitize"),
            # the other shapes of the ring and the CTA
            variant("two consumers, 192-key tiles, 2 stages; 4 stages of 64-key tiles at D=128",
                    {"CONSUMERS": 2, "Q_IN_SHARED": 0, "BLOCK_N": 192, "STAGES": 2, "BLOCK_N_D128": 64,
                     "STAGES_D128": 4}, "test", "sanitize"),
            # (three at D = 128 spill on 128-key tiles: 160 registers do not hold Q or S, O and P there; without
            # OVERLAP, 64-key tiles are refused: _p09_refuses)
            # The trace record: one CTA's timeline under each schedule (the instrumented build, TRACE=1).
            variant("defaults (TRACE=1)", {"TRACE": 1}, "trace"),
            variant("carry-over (TRACE=1)", {"TRACE": 1, "CARRY_OVER": 1}, "trace"),
            variant("row sums inside the turn (TRACE=1)", {"TRACE": 1, "SUMS_IN_VALUES": 0, "SUMS_AFTER_TURN": 0},
                    "trace"),
            variant("no ping-pong (TRACE=1)", {"TRACE": 1, "PINGPONG": 0}, "trace"),
            variant("no ping-pong, no overlap (TRACE=1)", {**_NO_OVERLAP, "TRACE": 1}, "trace"),
            variant("one consumer, 64-row work items (TRACE=1)", {"TRACE": 1, "CONSUMERS": 1, "CONSUMERS_D128": 1},
                    "trace"),
            variant("two CTAs of a cluster split a 64-row item's keys (TRACE=1)",
                    {"TRACE": 1, **_CLUSTER_KEYS, "CONSUMERS": 1, "CONSUMERS_D128": 1}, "trace"),
        ),
    ),
    Phase(
        name="p10_splitkv",
        title="Phase 10: split-KV, the keys of a query tile split across a cluster",
        notebook="10_splitkv",
        kernel_name="attention_splitkv_kernel",
        archs=(80, 89, 90),
        min_cc=80,                # cp.async, bf16 mma.sync; the split itself needs clusters (sm_90)
        aligned_16b=True,
        # Defaults from the H100 runs of chapter 10: clusters of more than two CTAs measured slower.
        tile_params={"BLOCK_M": 64, "BLOCK_M_D128": 64, "BLOCK_N": 128, "STAGES": 2, "MAX_SPLITS": 2,
                     "SPLITS": -1, "WAVE_CTAS_PER_SM": 1, "WIDE_STORES": 1},
        # Not measured here (no such GPU): sized to fit the A100's 163 KB and the L4's 99 KB per block at D = 128.
        arch_tile_params={80: {"BLOCK_N": 64}, 89: {"BLOCK_N": 32}},
        # A candidate of attention() only through a recorded ranking: before sm_90 (no clusters) it is
        # phase 7's loop without any key split, which the fallback should not pick.
        dispatch=True,
        fallback_waves=(0.0, 0.0),
        # the mission shape is the problem it was written for (the split path); the large ones do not split
        profile_cases=("b4h16_s2048", "b2h16_s4096_d128", "mission"),
        threads=lambda params, head_dim, split: p10_block_m(head_dim, params) // 16 * WARP,
        smem_layout=_p10_layout,
        variants=(
            # Chapter 10's ablation, and every cluster size the heuristic can pick, forced on the whole
            # suite and under the sanitizer.
            variant("defaults", {}, "ablation"),
            variant("split over 2 CTAs", {"SPLITS": 2}, "test", "ablation"),
            variant("split over 4 CTAs", {"SPLITS": 4, "MAX_SPLITS": 4}, "test", "ablation"),
            variant("split over 8 CTAs", {"SPLITS": 8, "MAX_SPLITS": 8}, "test", "sanitize", "ablation"),
            variant("clusters of up to 8 CTAs", {"MAX_SPLITS": 8}, "ablation"),
            variant("no split", {"SPLITS": 1}, "ablation"),
            variant("128-row query tiles (64-key tiles: 128 do not fit D=128)",
                    {"BLOCK_M": 128, "BLOCK_M_D128": 128, "BLOCK_N": 64}, "test", "ablation"),
            variant("64-key tiles, 4 stages", {"BLOCK_N": 64, "STAGES": 4}, "ablation"),
            variant("3 CTAs, 3 stages, 48-row 64-key tiles",
                    {"SPLITS": 3, "MAX_SPLITS": 3, "STAGES": 3, "BLOCK_M": 48, "BLOCK_M_D128": 48, "BLOCK_N": 64},
                    "test", "sanitize"),
            variant("up to two CTAs per SM", {"WAVE_CTAS_PER_SM": 2}, "ablation"),
            variant("4-byte stores of O (phase 7's epilogue)", {"WIDE_STORES": 0}, "ablation", "test"),
        ),
    ),
]

PHASES: dict[str, Phase] = {phase.name: phase for phase in _REGISTRY}


def get(name: str) -> Phase:
    try:
        return PHASES[name]
    except KeyError:
        raise KeyError(f"unknown phase {name!r}; known phases: {', '.join(PHASES)}") from None
