"""The tuning table flashcore_nb.attention reads: per recorded grid case, the candidate phases ranked by GPU
time on one GPU, and the rule that maps any problem to a grid case.

The grid experiment (grid.py) derives the table from its own timings and stores it in its record,
results/<gpu>/experiments/grid.json, so that `attention`, timed later in the same run, used the very table the
record holds. At run time the table comes from the record of this GPU (by its slug), else from a record of a
GPU with the same compute capability, else there is none and dispatch.fallback decides.

The rule for a problem between grid points: among the grid cases with its head dim and mask (and its dtype,
where the grid has it; it is recorded in fp16) and its wave regime (where the grid has one; below), the nearest in
(log2 B·H, log2 Sq, log2 Sk), Euclidean; on a tie, the first in grid order. Its ranking is then tried in order.

The wave regime says which of the small-problem configurations launch at most one wave of CTAs: 0 where two CTAs per
64-row work item fit on the SMs (phase 9's cluster-keys build), 1 where one CTA per 64-row item does (its 64-row
build) and two do not, 2 where neither fits. A case's regime is counted on the SMs of the GPU its table was recorded
on, a problem's on the SMs of the GPU it runs on. Without the regime the nearest case in sizes alone can sit across a
wave boundary from the problem: the held-out shapes (heldout.py) measured that rule choosing the 64-row build at 72 to
256 items of 128 rows, where the defaults were up to 1.35x faster, since the grid has no case between 64 and 256.

Pure Python and JSON: the package imports this without a GPU and without pandas."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .env import gpu_slug
from .paths import GRID_RECORDS_DIR

GRID_RECORD = "grid"   # results/<gpu>/experiments/grid.json
WAVE_TILE_ROWS = 128   # query rows per tile when counting waves: the book's fast phases take 128 per CTA
REGIME_TILE_ROWS = 64  # query rows per work item of the small-problem configurations (Problem.wave_regime)


@dataclass(frozen=True)
class Problem:
    """What the choice looks at: dtype, head dim, mask, and the three sizes of the nearest-grid-case rule."""
    dtype: str
    head_dim: int
    causal: bool
    batch_heads: int
    seqlen_q: int
    seqlen_k: int

    @classmethod
    def of(cls, q_shape, k_shape, dtype, causal: bool) -> Problem | None:
        """From q's and k's shapes and dtype (torch's or its name); None for shapes that are no attention
        problem (the caller's checks then say why)."""
        if len(q_shape) != 4 or len(k_shape) != 4 or min(*q_shape, *k_shape) < 1:
            return None
        batch, heads, seqlen_q, head_dim = q_shape
        return cls(str(dtype).removeprefix("torch."), head_dim, bool(causal), batch * heads, seqlen_q, k_shape[2])

    @classmethod
    def of_case(cls, case, dtype: str = "float16") -> Problem:
        return cls(dtype, case.head_dim, case.causal, case.batch * case.heads, case.seqlen_q, case.sk)

    def waves(self, sms: int) -> float:
        """Query tiles of WAVE_TILE_ROWS rows over the SMs: below 1 the large-tile grid leaves SMs idle."""
        return self.batch_heads * -(-self.seqlen_q // WAVE_TILE_ROWS) / sms

    def wave_regime(self, sms: int) -> int:
        """0, 1 or 2 (the module's docstring): how many CTAs per 64-row work item still fit in one wave."""
        items = self.batch_heads * -(-self.seqlen_q // REGIME_TILE_ROWS)
        return 0 if 2 * items <= sms else 1 if items <= sms else 2


def distance(a: Problem, b: Problem) -> float:
    return math.dist(*([math.log2(p.batch_heads), math.log2(p.seqlen_q), math.log2(p.seqlen_k)] for p in (a, b)))


@dataclass(frozen=True)
class Entry:
    case: str
    problem: Problem
    ranking: tuple[str, ...]   # candidate phases, fastest first


@dataclass(frozen=True)
class Table:
    gpu: str                   # the GPU the grid was recorded on
    cc: int
    source: str                # where it comes from, for the choice's reason
    entries: tuple[Entry, ...]
    sms: int | None = None     # the SMs of the GPU it was recorded on: None, and the rule has no wave regimes


def derive(rows: list[dict], candidates: list[str]) -> dict:
    """The table (as stored in the record) from the grid's rows: per case, the candidates that ran there
    ranked by median GPU time in the race (every method in the same interleaved rounds)."""
    entries = []
    for row in rows:
        timed = {name: row["race"][name]["gpu_us"] for name in candidates if name in row["race"]}
        entries.append({"case": row["case"], "dtype": row["dtype"], "head_dim": row["head_dim"],
                        "causal": row["causal"], "batch_heads": row["batch"] * row["heads"],
                        "seqlen_q": row["seqlen_q"], "seqlen_k": row["seqlen_k"],
                        "ranking": sorted(timed, key=timed.get)})
    return {"candidates": list(candidates), "entries": entries}


def from_json(table: dict, gpu: str, cc: int, source: str, sms: int | None = None) -> Table:
    entries = tuple(Entry(e["case"], Problem(e["dtype"], e["head_dim"], e["causal"], e["batch_heads"], e["seqlen_q"],
                                             e["seqlen_k"]), tuple(e["ranking"]))
                    for e in table["entries"])
    return Table(gpu, cc, source, entries, sms)


def from_record(record: dict) -> Table:
    environment = record["env"]
    source = f"grid record of the {environment['gpu']} ({record['recorded_at'][:10]})"
    return from_json(record["tuning"], environment["gpu"], environment["cc"], source, record["gpu_info"]["sms"])


@lru_cache(maxsize=None)
def load(gpu_name: str, cc: int, root: Path = GRID_RECORDS_DIR) -> Table | None:
    """The table for this GPU: its own grid record, else one of a GPU of the same compute capability (the
    first by slug), else None."""
    own = root / gpu_slug(gpu_name) / "experiments" / f"{GRID_RECORD}.json"
    if own.exists():
        return from_record(json.loads(own.read_text()))
    for path in sorted(root.glob(f"*/experiments/{GRID_RECORD}.json")):
        record = json.loads(path.read_text())
        if record["env"]["cc"] == cc:
            return from_record(record)
    return None


def nearest(table: Table, problem: Problem, sms: int | None = None) -> Entry | None:
    """The grid case whose ranking serves `problem` on a GPU of `sms` SMs (the rule in the module's docstring; no
    wave regimes where `sms` or the table's is None); None where the grid has no case with its head dim and mask."""
    same = [e for e in table.entries if (e.problem.head_dim, e.problem.causal) == (problem.head_dim, problem.causal)]
    same = [e for e in same if e.problem.dtype == problem.dtype] or same
    if sms is not None and table.sms is not None:
        regime = problem.wave_regime(sms)
        same = [e for e in same if e.problem.wave_regime(table.sms) == regime] or same
    return min(same, key=lambda entry: distance(entry.problem, problem), default=None)
