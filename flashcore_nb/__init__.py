"""FlashCore: the helper package every chapter notebook imports.

    import flashcore_nb as fc
    o = fc.attention(q, k, v, is_causal=False)   # q, k, v: (B, H, S, D) fp16/bf16 CUDA tensors; the phase
                                                 # chosen for this GPU and shape (dispatch.py)
    fn = fc.load("p01_baseline")      # one phase, compiled (or loaded from cache) for this GPU
    o = fn(q, k, v, causal=False)
"""
from .binding import load
from .dispatch import attention
from .phases import PHASES
from .env import mode

__all__ = ["PHASES", "attention", "load", "mode"]
