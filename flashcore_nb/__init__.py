"""FlashCore: the helper package every chapter notebook imports.

    import flashcore_nb as fc
    fn = fc.load("p01_baseline")      # compile (or load from cache) for this GPU
    o = fn(q, k, v, causal=False)     # q, k, v: (B, H, S, D) fp16/bf16 CUDA tensors
"""
from .binding import load
from .phases import PHASES
from .env import mode

__all__ = ["PHASES", "load", "mode"]
