"""The ordered registry of phases: which kernel file, what it supports, its default tile sizes."""
from __future__ import annotations

from dataclasses import dataclass, field

from .paths import KERNELS_DIR


@dataclass(frozen=True)
class Phase:
    name: str                         # pNN_<slug>: the kernel file's stem and the results file's
    title: str
    notebook: str                     # chapter notebook stem in notebooks/
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


_REGISTRY = [
    Phase(
        name="p01_baseline",
        title="Phase 1: the scalar baseline",
        notebook="01_baseline",
        archs=(75, 80, 89, 90),
        min_cc=75,
        tile_params={"NUM_THREADS": 128},
    ),
    Phase(
        name="p02_vectorized",
        title="Phase 2: vectorized loads and warp reductions",
        notebook="02_vectorized",
        archs=(75, 80, 89, 90),
        min_cc=75,
        aligned_16b=True,
        tile_params={"NUM_WARPS": 8},
    ),
    Phase(
        name="p03_wmma",
        title="Phase 3: tensor cores with WMMA, 32x32 tiles",
        notebook="03_wmma",
        archs=(75, 80, 89, 90),
        min_cc=75,
        dtypes=("float16",),
        aligned_16b=True,
    ),
    Phase(
        name="p04_fp32p",
        title="Phase 4: FP32 P and the shared-memory budget",
        notebook="04_fp32p",
        archs=(75, 80, 89, 90),
        min_cc=75,
        dtypes=("float16",),
        aligned_16b=True,
        # P_FP32=0 rounds P to fp16 (phase 3's numerics); PADDING_BUG=1 builds the teaching variant
        # that reproduces the original project's padding bug — wrong on purpose.
        tile_params={"P_FP32": 1, "PADDING_BUG": 0},
    ),
    Phase(
        name="p05_tile64",
        title="Phase 5: 64x64 tiles, buffer reuse, tile sizes as parameters",
        notebook="05_tile64",
        archs=(75, 80, 89, 90),
        min_cc=75,
        dtypes=("float16",),
        aligned_16b=True,
        tile_params={"BLOCK_M": 64, "BLOCK_N": 64, "NUM_WARPS": 8},
    ),
    Phase(
        name="p06_async",
        title="Phase 6: the cp.async pipeline, and compute-sanitizer",
        notebook="06_async",
        archs=(80, 89, 90),
        min_cc=80,                # cp.async
        dtypes=("float16",),
        aligned_16b=True,
        # PLANTED_BUG=1 builds the teaching variant for the sanitizer section — wrong on purpose.
        tile_params={"BLOCK_M": 32, "BLOCK_N": 128, "NUM_WARPS": 8, "STAGES": 2, "PLANTED_BUG": 0},
    ),
    Phase(
        name="p07_registers",
        title="Phase 7: mma.sync, ldmatrix, swizzled shared memory: S and P in registers",
        notebook="07_registers",
        archs=(80, 89, 90),
        min_cc=80,                # cp.async, bf16 mma.sync
        aligned_16b=True,
        # Defaults from the H100 runs of chapter 7. BLOCK_M_D128 / STAGES_D128 are D = 128's own.
        tile_params={"BLOCK_M": 128, "BLOCK_N": 64, "WARP_ROWS": 32, "STAGES": 2,
                     "BLOCK_M_D128": 128, "STAGES_D128": 1,
                     "SPLIT_BLOCK_M": 32, "SPLIT_BLOCK_N": 128, "SPLIT_STAGES": 2, "KV_SPLIT": 4,
                     "SMALL_PROBLEM_CTAS": -1, "Q_IN_REGS_MAX_D": 64,
                     "SWIZZLE": 1, "SEPARATE_MASKED_TILES": 1, "FOLD_LOG2E": 1, "LAZY_RESCALE": 1,
                     "PERSISTENT": 1, "PERSISTENT_CTAS": -1, "OVERLAP_SOFTMAX": 0},
        # Not measured here (no such GPU): sized to fit. sm_89 allows 99 KB per block and 100 KB per SM,
        # so the key-split path takes one stage.
        arch_tile_params={89: {"SPLIT_STAGES": 1}},
        # At D = 128, 32 rows per warp hold 128 O accumulators + 64 scores per lane: ptxas spills a
        # word or three (4 B on sm_90, 12 B on sm_80 and sm_89), and that still measured faster than every
        # spill-free tiling tried (chapter 7).
        spill_budget_bytes=32,
    ),
    Phase(
        name="p08_wgmma",
        title="Phase 8: Hopper's warpgroup MMA (wgmma)",
        notebook="08_wgmma",
        archs=(90,),
        min_cc=90,
        arch_specific=True,       # wgmma.mma_async: sm_90a, Hopper only
        aligned_16b=True,
        # Defaults from the H100 runs of chapter 8: two CTAs of 2 x 64 rows per SM at D = 64, one at D = 128.
        tile_params={"WARPGROUPS": 2, "BLOCK_N": 64, "CTAS_PER_SM": 2,
                     "WARPGROUPS_D128": 2, "BLOCK_N_D128": 128, "CTAS_PER_SM_D128": 1, "OVERLAP": 0},
    ),
]

PHASES: dict[str, Phase] = {phase.name: phase for phase in _REGISTRY}


def get(name: str) -> Phase:
    try:
        return PHASES[name]
    except KeyError:
        raise KeyError(f"unknown phase {name!r}; known phases: {', '.join(PHASES)}") from None
