"""A small run of every phase for compute-sanitizer: `compute-sanitizer --tool racecheck python
tests/sanitize_target.py`. Exits non-zero when a check fails."""
import sys

import torch

import flashcore_nb
from flashcore_nb.check import check
from flashcore_nb.shapes import Case

CASES = [Case("s17", 1, 2, 17, 64), Case("s40_causal_d128", 1, 2, 40, 128, causal=True),
         Case("sq_lt_sk", 1, 1, 9, 64, seqlen_k=33)]

if __name__ == "__main__":
    names = sys.argv[1:] or list(flashcore_nb.PHASES)
    ok = True
    for name in names:
        fn = flashcore_nb.load(name)
        for case in CASES:
            result = check(fn, case, torch.float16)
            ok &= result.passed
            print(name, case.name, "ok" if result.passed else "FAILED", f"{result.max_abs_err:.2e}")
    sys.exit(0 if ok else 1)
