"""A small run of every phase for compute-sanitizer, e.g.

    compute-sanitizer --tool racecheck python tests/sanitize_target.py [phase ...]

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

if __name__ == "__main__":
    names = sys.argv[1:] or list(flashcore_nb.PHASES)
    ok = True
    for name in names:
        fn = flashcore_nb.load(name)
        for case in CASES:
            q, k, v = (torch.randn(*case.shape[:2], s, case.head_dim, dtype=torch.float16)
                       for s in (case.seqlen_q, case.sk, case.sk))
            out = fn(q.cuda(), k.cuda(), v.cuda(), causal=case.causal).cpu()
            err = float((out.double() - attention_fp64(q, k, v, causal=case.causal)).abs().max())
            ok &= err <= TOLERANCE
            print(name, case.name, f"max error {err:.2e}", "ok" if err <= TOLERANCE else "FAILED")
    sys.exit(0 if ok else 1)
