"""The one entry point for every phase: validate tensors in Python, then launch through the
launcher's operator (csrc/launcher.cpp).

Every problem a kernel could trip over is refused here with an error that names it, before anything
reaches the GPU: a bad launch would at best be an opaque error and at worst a sticky CUDA error that
poisons the whole process. The checks run once per input signature (devices, dtypes, shapes,
strides, alignment): a loop calling with the same kind of inputs pays them once.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from . import build, env, launcher
from .phases import Phase, get

_DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1}
_MAX_GRID_YZ = 65535


def check_device(q, k, v) -> None:
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.device.type != "cuda":
            raise ValueError(f"{name} is on {tensor.device}; FlashCore kernels need CUDA tensors "
                             f"(move it with {name}.cuda())")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")


def validate_problem(phase: Phase, q, k, v, causal: bool, gpu: env.GpuInfo) -> None:
    """Everything but the device: dtype, rank, shapes, strides, phase features, arch."""
    if not phase.runs_on(gpu.cc):
        reason = " (it uses instructions that exist on that architecture only)" if phase.arch_specific else ""
        raise RuntimeError(f"{phase.name} needs an {phase.requirement} GPU{reason}; "
                           f"this GPU ({gpu.name}) is sm_{gpu.cc}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() != 4:
            raise ValueError(f"{name} must have rank 4 (batch, heads, seq_len, head_dim); "
                             f"got shape {tuple(tensor.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    dtype = str(q.dtype).removeprefix("torch.")
    if dtype not in phase.dtypes:
        raise TypeError(f"{phase.name} supports dtypes {', '.join(phase.dtypes)}; got {dtype}")
    if not phase.supports_dtype_on(dtype, gpu.cc):
        raise TypeError(f"{dtype} needs compute capability 8.0 or newer; {gpu.name} is {gpu.cc / 10:.1f}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    batch, heads, seqlen_q, head_dim = q.shape
    if (k.shape[0], k.shape[1], k.shape[3]) != (batch, heads, head_dim):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree: batch, heads and "
                         f"head_dim must match (only the sequence length may differ)")
    seqlen_k = k.shape[2]
    if min(batch, heads, seqlen_q, seqlen_k) < 1:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if head_dim not in phase.head_dims:
        raise ValueError(f"{phase.name} supports head_dim {' or '.join(map(str, phase.head_dims))}; "
                         f"got {head_dim}")
    if causal and not phase.causal:
        raise ValueError(f"{phase.name} does not support causal=True")
    if seqlen_q != seqlen_k and not phase.cross_lengths:
        raise ValueError(f"{phase.name} needs equal query and key lengths; got Sq={seqlen_q}, Sk={seqlen_k}")
    if batch > _MAX_GRID_YZ or heads > _MAX_GRID_YZ:
        raise ValueError(f"batch and heads must each be <= {_MAX_GRID_YZ}; got {batch} and {heads}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.stride(3) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous (stride 1), got strides "
                             f"{tensor.stride()}; call {name}.contiguous()")
        if phase.aligned_16b:
            check_alignment_16b(name, tensor)


def check_alignment_16b(name: str, tensor) -> None:
    """16-byte vector loads (and stores) need 16-byte aligned rows: the base address and every stride."""
    elements = 16 // tensor.element_size()
    # .contiguous() fixes the strides but returns a contiguous tensor as it is, base and all: a misaligned base
    # (a view starting mid-row) needs a fresh copy.
    if tensor.data_ptr() % 16:
        found, fix = f"its data starts {tensor.data_ptr() % 16} bytes past a 16-byte boundary", "clone"
    elif any(stride % elements for stride in tensor.stride()[:3]):
        found, fix = f"got strides {tensor.stride()}", "contiguous"
    else:
        return
    raise ValueError(f"{name} must be 16-byte aligned (data_ptr % 16 == 0 and batch/head/row strides "
                     f"multiples of {elements} elements); {found}. "
                     f"Call {name}.{fix}() (or use a phase without vector loads)")


class SharedMemoryError(ValueError):
    """The phase, with these tile sizes and this head dim, needs more shared memory than the GPU has."""


def check_shared_memory(phase: Phase, needed: int, gpu: env.GpuInfo) -> None:
    if needed > gpu.smem_per_block_optin:
        raise SharedMemoryError(
            f"{phase.name} with these tile sizes needs {needed} bytes of shared memory per block; "
            f"{gpu.name} allows {gpu.smem_per_block_optin} (choose smaller tiles)")


def signature(q, k, v, causal, out):
    """Everything validation looks at, as a hashable key; None for inputs that are not all tensors."""
    try:
        key = (q.device, k.device, v.device, q.dtype, k.dtype, v.dtype, q.shape, k.shape, v.shape,
               q.stride(), k.stride(), v.stride(),
               bool(causal), (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16)
        if out is not None:
            key += (out.device, out.dtype, out.shape, out.stride(), out.data_ptr() % 16)
        return key
    except AttributeError:
        return None


def validate(module, phase: Phase, q, k, v, causal: bool, out) -> None:
    """The full checks, with the messages the book shows: once per input signature."""
    check_device(q, k, v)
    gpu = env.gpu(q.device.index)
    validate_problem(phase, q, k, v, causal, gpu)
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device
                            or out.stride(3) != 1):
        raise ValueError("out must match q's shape, dtype and device, with a contiguous last dimension")
    if out is not None and phase.aligned_16b:   # O's rows: p08-p10 store 16 bytes per lane, the others 4
        check_alignment_16b("out", out)
    strides = [*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *q.stride()[:3]]
    sizes = [q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]]
    needed = module.smem_bytes(q.data_ptr(), k.data_ptr(), v.data_ptr(), 0, strides, sizes, 1.0, bool(causal),
                               _DTYPE_CODES[q.dtype])
    check_shared_memory(phase, needed, gpu)


def load(name: str, *, patch: Path | None = None, **tile_params):
    """Compile (or load from cache) a phase for the visible GPU and return its attention function.

        fn = flashcore_nb.load("p01_baseline")
        o = fn(q, k, v)                      # q, k, v: (B, H, S, D) CUDA tensors

    `tile_params` override the phase's -D defaults (e.g. NUM_THREADS=256). `patch`: an exploration patch
    (kernels/explorations/) applied to the phase's source; its EXP_* switches are then tile parameters too."""
    phase = get(name)
    gpu = env.gpu()
    if gpu is None:
        raise RuntimeError("flashcore_nb.load needs a CUDA GPU; without one, notebooks replay the "
                           "recorded results instead")
    unknown = {key for key in set(tile_params) - set(phase.tile_params)
               if patch is None or not key.startswith("EXP_")}
    if unknown:
        raise ValueError(f"{name} has no tile parameter(s) {sorted(unknown)}; "
                         f"it has {sorted(phase.tile_params)}")
    params = {**phase.tile_params_for(gpu.cc), **tile_params}
    built = build.build_extension(name, gpu.cc, params, patch=patch)
    handle = launcher.register(built.module, phase)
    validated = set()   # input signatures already validated in Python

    def attention(q, k, v, causal: bool = False, scale: float | None = None, out=None):
        # Under torch.compile the call is traced straight to the op, whose C++ checks keep the launch safe.
        if not torch.compiler.is_compiling():
            key = signature(q, k, v, causal, out)
            if key is None or key not in validated:
                validate(built.module, phase, q, k, v, causal, out)
                if key is not None:
                    validated.add(key)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        if out is None:
            return torch.ops.flashcore.attention(q, k, v, causal, scale, handle)
        torch.ops.flashcore.attention_out(q, k, v, out, causal, scale, handle)
        return out

    attention.phase = phase
    attention.handle = handle   # for torch.ops.flashcore.* (the launcher's phase handle)
    attention.tile_params = params
    attention.build = built
    return attention
