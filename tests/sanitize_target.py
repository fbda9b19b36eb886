"""A small run of every phase for compute-sanitizer, e.g.

    compute-sanitizer --tool racecheck python tests/sanitize_target.py [phase[:NAME=value,...] ...]

Only FlashCore kernels and torch's input generation run on the GPU: the float64 reference runs on the
CPU, so the report speaks about our kernels alone. Exits non-zero when an output is wrong."""
import sys

import torch

import flashcore_nb
from flashcore_nb.reference import attention_fp64
from flashcore_nb.shapes import Case

CASES = [Case("s17", 1, 2, 17, 64), Case("s40_causal_d128", 1, 2, 40, 128, causal=True),
         Case("sq_lt_sk", 1, 1, 9, 64, seqlen_k=33), Case("s150_causal", 1, 1, 150, 64, causal=True)]
TOLERANCE = 2e-3  # fp16 output of values of magnitude ~1

# Beyond each phase's defaults: p05 with 16 lanes per query row and with one, where the in-place
# S -> P hand-over and the warp loops take their other shapes.
EXTRA_TARGETS = ["p05_tile64:BLOCK_M=32,BLOCK_N=128,NUM_WARPS=16", "p05_tile64:BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4"]


def load_target(target: str):
    """'phase' or 'phase:NAME=value,NAME=value' (tile parameters)."""
    name, _, defines = target.partition(":")
    params = dict(item.split("=") for item in defines.split(",")) if defines else {}
    return flashcore_nb.load(name, **{key: int(value) for key, value in params.items()})


if __name__ == "__main__":
    targets = sys.argv[1:] or [*flashcore_nb.PHASES, *EXTRA_TARGETS]
    ok = True
    for target in targets:
        fn = load_target(target)
        for case in CASES:
            q, k, v = (torch.randn(*case.shape[:2], s, case.head_dim, dtype=torch.float16)
                       for s in (case.seqlen_q, case.sk, case.sk))
            out = fn(q.cuda(), k.cuda(), v.cuda(), causal=case.causal).cpu()
            err = float((out.double() - attention_fp64(q, k, v, causal=case.causal)).abs().max())
            ok &= err <= TOLERANCE
            print(target, case.name, f"max error {err:.2e}", "ok" if err <= TOLERANCE else "FAILED")
    sys.exit(0 if ok else 1)
