"""The problems every phase is checked and timed on, declared as data."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    heads: int
    seqlen_q: int
    head_dim: int
    causal: bool = False
    seqlen_k: int | None = None   # None: same as seqlen_q
    magnitude: float = 1.0        # inputs are randn * magnitude

    @property
    def sk(self) -> int:
        return self.seqlen_q if self.seqlen_k is None else self.seqlen_k

    @property
    def shape(self) -> list[int]:
        return [self.batch, self.heads, self.seqlen_q, self.head_dim]

    def flops(self) -> float:
        """4·B·H·Sq·Sk·D (two GEMMs), halved for causal."""
        full = 4.0 * self.batch * self.heads * self.seqlen_q * self.sk * self.head_dim
        return full / 2 if self.causal else full

    def label(self) -> str:
        s = "x".join(map(str, self.shape))
        if self.seqlen_k is not None:
            s += f" (Sk={self.seqlen_k})"
        if self.causal:
            s += " causal"
        if self.magnitude != 1.0:
            s += f" x{self.magnitude:g}"
        return s


# The original project's reference problem, and the same with the causal mask.
MISSION = Case("mission", 1, 8, 512, 64)
MISSION_CAUSAL = Case("mission_causal", 1, 8, 512, 64, causal=True)
# The mission shape at the grid's other head dim (the grid's only D = 128 problems of 512-key rows that fit in half
# a wave of 64-row work items: the held-out shapes showed the rule needs one there).
MISSION_D128 = Case("mission_d128", 1, 8, 512, 128)
MISSION_D128_CAUSAL = Case("mission_d128_causal", 1, 8, 512, 128, causal=True)

# Correctness: the mission shape, the original project's small shapes, edge lengths, D=128,
# causal, Sq != Sk and large magnitudes.
CORRECTNESS = [
    MISSION,
    Case("orig_32", 1, 1, 32, 64),
    Case("orig_64", 1, 2, 64, 64),
    Case("orig_128", 1, 4, 128, 64),
    Case("orig_256_b4", 4, 8, 256, 64),
    Case("orig_1024", 1, 8, 1024, 64),
    Case("s1", 1, 8, 1, 64),
    Case("s17", 2, 3, 17, 64),
    Case("s1000", 1, 8, 1000, 64),
    Case("d128", 1, 8, 512, 128),
    Case("s17_d128", 2, 3, 17, 128),
    MISSION_CAUSAL,
    Case("s1000_causal_d128", 1, 4, 1000, 128, causal=True),
    Case("sq_lt_sk", 1, 8, 100, 64, seqlen_k=300),
    Case("sq_gt_sk_causal", 1, 8, 300, 64, causal=True, seqlen_k=100),
    Case("mission_x20", 1, 8, 512, 64, magnitude=20.0),
]

# Speed: the mission shape and the large shapes of ANCHORS.md.
TIMING = [
    MISSION,
    MISSION_CAUSAL,
    Case("b16h16_s512", 16, 16, 512, 64),
    Case("b4h16_s2048", 4, 16, 2048, 64),
    Case("b4h16_s2048_causal", 4, 16, 2048, 64, causal=True),
    Case("b2h16_s4096_d128", 2, 16, 4096, 128),
]

# Small problems, where the large-tile grid leaves SMs idle: batch, heads and length chosen so that
# 128-row query tiles make 16 to 256 CTAs (where p07's key-split path stops paying).
SMALL = [
    Case(f"b{b}h{h}_s{s}" + ("_d128" if d == 128 else "") + ("_causal" if causal else ""), b, h, s, d, causal=causal)
    for b, h, s, d, causal in [
        (1, 8, 512, 64, False), (2, 8, 512, 64, False), (3, 8, 512, 64, False), (4, 8, 512, 64, False),
        (6, 8, 512, 64, False), (8, 8, 512, 64, False), (1, 8, 512, 64, True), (4, 8, 512, 64, True),
        (1, 8, 512, 128, False), (2, 8, 512, 128, False), (4, 8, 512, 128, False),
        (1, 2, 2048, 64, False), (1, 4, 2048, 64, False), (1, 8, 2048, 64, False),
        (2, 8, 128, 64, False), (4, 8, 128, 64, False), (8, 8, 128, 64, False), (32, 8, 128, 64, False),
    ]
]

# Where flashcore_nb.attention chooses among phases (issue 17's grid): every batch, length, head dim and
# mask below with at most GRID_MAX_TOKENS tokens per call (B·S), 16 heads, plus the mission shapes at both head
# dims. The `grid` command times every candidate phase and SDPA backend on it; the tuning table is its ranking.
GRID_BATCHES = (1, 4, 16)
GRID_HEADS = 16
GRID_SEQLENS = (128, 512, 2048, 8192)
GRID_HEAD_DIMS = (64, 128)
GRID_MAX_TOKENS = 32768   # bounds the largest problem: 4 x 16 x 8192 x 128, about 2 TFLOP per call
GRID = [MISSION, MISSION_CAUSAL, MISSION_D128, MISSION_D128_CAUSAL] + [
    Case(f"b{b}h{GRID_HEADS}_s{s}" + ("_d128" if d == 128 else "") + ("_causal" if causal else ""), b, GRID_HEADS, s, d,
         causal=causal)
    for d in GRID_HEAD_DIMS for causal in (False, True) for b in GRID_BATCHES for s in GRID_SEQLENS
    if b * s <= GRID_MAX_TOKENS
]

# Where each kernel wins, as curves (issue 15 §3; seqlen.py, `python -m flashcore_nb seqlen`): the sequence length
# swept over powers of two, batch x heads fixed. B·H = 16 (B = 1, H = 16, the grid's heads) puts the change of
# regime inside the sweep: on the H100's 132 SMs, 16 heads make 16 query tiles of 128 rows at S = 128 (an eighth
# of a wave: too little work to fill the GPU) and one wave at S ≈ 1k, so from 2k on every kernel is limited by
# its arithmetic, not by idle SMs. It also bounds the cost: the largest case, 1 x 16 x 16384 x 128 without a
# mask, is 2.2 TFLOP, 3-9 ms per call for the fast kernels and about 40 ms for p06 (grid and phase records), and
# the whole sweep (32 cases, 4 phases and 4 baselines each) records in 3-5 minutes, builds included.
SEQLEN_BATCH, SEQLEN_HEADS = 1, 16
SEQLEN_SEQLENS = tuple(2 ** n for n in range(7, 15))   # 128 ... 16384
SEQLEN_HEAD_DIMS = (64, 128)
SEQLEN_SWEEP = [
    Case(f"b{SEQLEN_BATCH}h{SEQLEN_HEADS}_s{s}" + ("_d128" if d == 128 else "") + ("_causal" if causal else ""),
         SEQLEN_BATCH, SEQLEN_HEADS, s, d, causal=causal)
    for d in SEQLEN_HEAD_DIMS for causal in (False, True) for s in SEQLEN_SEQLENS
]

# Long causal rows over 32 heads (issue 16's fourth shape): where the order of phase 9's work items shows in its
# ablation (phases.Phase.ablation_cases), beside the grid's 16 x 16 x 2048 x 128 causal.
LONG_CAUSAL = [Case("b1h32_s8192_d128_causal", 1, 32, 8192, 128, causal=True)]

# Off the grid (heldout.py, `python -m flashcore_nb heldout`): shapes the grid never timed, to see whether the
# tuning table's rule serves the shapes between its cases. Both head dims, both masks, at most GRID_MAX_TOKENS tokens
# per call. Two sets, each chosen, not drawn:
# - HELDOUT, chosen before any was timed, to fall between the grid's points on each of the nearest-case rule's three
#   sizes (B·H, Sq, Sk): heads other than 16 (8 to 40), sequence lengths between the grid's powers of four and
#   ragged ones (1000, 2500), Sq ≠ Sk without a mask, and the 65-255 work items of 128 rows the grid has none of
#   (chapter 9). Timed under that rule, they found its fault, and the wave regimes were added to it (tuning.py).
# - HELDOUT_CHECK, chosen after that change and before it was timed, to check it on shapes it was not made from:
#   four in each wave regime on the H100 (0: at most 66 work items of 64 rows; 1: 67-132; 2: more), some of them
#   next to the regimes' edges, and two with Sq ≠ Sk.
# - HELDOUT_D128, chosen after the mission shapes at D = 128 joined the grid (for two misses of the sets above)
#   and before it was timed: D = 128 in wave regime 0 on the H100 with rows of 256 to 2048 keys, both masks, one
#   with Sq ≠ Sk, where the grid had only 128-key rows before.


def _held(prefix: str, b: int, h: int, s: int, sk: int | None, d: int, causal: bool) -> Case:
    name = f"{prefix}_b{b}h{h}_s{s}" + (f"_k{sk}" if sk else "") + ("_d128" if d == 128 else "")
    return Case(name + ("_causal" if causal else ""), b, h, s, d, causal=causal, seqlen_k=sk)


HELDOUT = [
    _held("held", *shape)
    for shape in [
        (1, 8, 1024, None, 64, False), (1, 8, 256, None, 64, True), (3, 8, 512, None, 64, False),
        (2, 16, 512, None, 64, False), (1, 32, 512, None, 64, True), (3, 16, 512, None, 128, False),
        (1, 12, 768, None, 64, False), (2, 12, 1536, None, 128, True), (4, 16, 1024, None, 64, False),
        (4, 16, 1024, None, 128, True), (8, 16, 256, None, 64, False), (8, 16, 256, None, 128, True),
        (2, 20, 4096, None, 64, False), (1, 16, 3072, None, 128, True), (1, 32, 4096, None, 64, True),
        (1, 16, 6144, None, 128, False), (16, 16, 384, None, 64, True), (12, 16, 1024, None, 64, False),
        (1, 16, 1000, None, 64, True), (2, 16, 2500, None, 128, False), (1, 40, 512, None, 128, False),
        (1, 16, 256, 2048, 64, False), (4, 8, 64, 4096, 128, False), (2, 16, 1024, 256, 64, False),
    ]
]
HELDOUT_CHECK = [
    _held("check", *shape)
    for shape in [
        (1, 4, 1024, None, 64, False), (2, 4, 512, None, 128, True), (1, 6, 640, None, 64, True),
        (4, 4, 256, None, 64, False), (1, 24, 256, None, 64, False), (3, 8, 320, None, 128, True),
        (1, 10, 768, None, 64, True), (2, 6, 640, None, 128, False), (1, 20, 512, None, 64, True),
        (2, 12, 512, None, 64, False), (1, 16, 1536, None, 128, False), (6, 16, 768, None, 64, True),
        (3, 32, 2048, None, 64, False), (8, 16, 2048, None, 128, True), (1, 16, 128, 8192, 64, False),
        (2, 16, 2048, 512, 64, False),
    ]
]

HELDOUT_D128 = [
    _held("third", *shape)
    for shape in [
        (1, 4, 1024, None, 128, False), (1, 6, 640, None, 128, True), (1, 2, 2048, None, 128, True),
        (1, 12, 256, None, 128, False), (1, 8, 384, None, 128, True), (2, 4, 384, 1024, 128, False),
    ]
]

SUITES = {"correctness": CORRECTNESS, "timing": TIMING, "small": SMALL, "grid": GRID, "mission": [MISSION],
          "seqlen": SEQLEN_SWEEP, "long_causal": LONG_CAUSAL, "heldout": HELDOUT, "heldout_check": HELDOUT_CHECK,
          "heldout_d128": HELDOUT_D128}


def select(names: str | None, suite: str = "correctness") -> list[Case]:
    """Cases by comma-separated names (from any suite), or a whole suite."""
    if not names:
        return list(SUITES[suite])
    by_name = {case.name: case for cases in SUITES.values() for case in cases}
    unknown = [n for n in names.split(",") if n not in by_name]
    if unknown:
        raise KeyError(f"unknown case(s) {unknown}; known: {sorted(by_name)}")
    return [by_name[n] for n in names.split(",")]
