"""flashcore_nb.attention: one function for every problem, the phase chosen per GPU and shape.

    o = flashcore_nb.attention(q, k, v, is_causal=True)            # as F.scaled_dot_product_attention
    o = flashcore_nb.attention(q, k, v, phase="p07_registers")     # one phase, forced

As SDPA picks a backend for each call, `attention` picks a candidate: a phase with its default tiles for this
GPU ("p09_warpspec"), or one of the tile configurations a phase offers beside them ("p09_warpspec:192-row",
phases.Variant.candidate):
- with a tuning table for this GPU (tuning.py: the grid recorded on it, or on a GPU of the same compute
  capability), the fastest candidate recorded at the nearest grid case of the problem's wave regime that can run
  the problem;
- otherwise (the fallback), among the phases marked as candidates (phases.Phase.dispatch) that run the problem
  here, or every phase that does where none can, the last in the book's order whose `fallback_waves` hold the
  problem's size on this GPU (the last of them all where none does), with its default tiles.

The choice is made once per input signature (devices, dtypes, shapes, strides, alignment, mask and the
`phase` argument) and kept in a dict, after the full checks of binding.py; each chosen phase is loaded once per
(phase, tile parameters, device). A call is then one dict lookup and one operator call
(torch.ops.flashcore.attention, csrc/launcher.cpp). Under torch.compile the choice is made while tracing, from
the shapes, which it makes static, and baked into the graph; the operator's C++ checks guard the launch."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch

from . import binding, budget, env, tuning
from .phases import PHASES, get

_chosen: dict = {}   # (phase argument, binding.signature) -> (launcher handle, default scale)
_loaded: dict = {}   # (phase, tile parameters, device index) -> binding.load's function
_table_override: tuning.Table | None = None   # set by use_table: replaces the recorded tables


@dataclass(frozen=True)
class Choice:
    phase: str
    tile_params: dict   # the -D defines it is built with (its defaults on this GPU, or a candidate's)
    reason: str
    candidate: str      # its name among the candidates: the phase, or "<phase>:<configuration>"


def configuration(candidate: str, cc: int) -> tuple[str, dict, tuple[int, ...]]:
    """A candidate's phase, its tile parameters on a GPU of compute capability `cc`, and the head dims it is for:
    "p09_warpspec" is the phase with its defaults, "p09_warpspec:192-row" the variant of that candidate name.
    An unknown phase raises KeyError, an unknown configuration ValueError."""
    phase_name, _, config = candidate.partition(":")
    phase = get(phase_name)
    if not config:
        return phase.name, phase.tile_params_for(cc), phase.head_dims
    named = {v.candidate: v for v in phase.candidate_variants}
    if config not in named:
        raise ValueError(f"{phase.name} has no tile configuration {config!r} among its candidates "
                         f"({', '.join(sorted(named)) or 'none'})")
    variant = named[config]
    return phase.name, {**phase.tile_params_for(cc), **variant.defines}, variant.head_dims or phase.head_dims


def can_run(candidate: str, problem: tuning.Problem, gpu: env.GpuInfo) -> bool:
    """Whether the candidate (a phase with its default tiles for this GPU, or one of its configurations) runs the
    problem here: what the phase declares, the head dims the configuration is for, and its shared memory against
    the GPU's limit."""
    phase_name, tile_params, head_dims = configuration(candidate, gpu.cc)
    phase = PHASES[phase_name]
    if not (phase.runs_on(gpu.cc) and phase.supports_dtype_on(problem.dtype, gpu.cc)
            and problem.head_dim in head_dims and (phase.causal or not problem.causal)
            and (phase.cross_lengths or problem.seqlen_q == problem.seqlen_k)):
        return False
    launches = budget.launches(phase_name, tile_params)
    return all(launch.smem_bytes <= gpu.smem_per_block_optin for launch in launches
               if launch.head_dim == problem.head_dim)


def candidates(gpu: env.GpuInfo) -> list[str]:
    """What `attention` chooses among on this GPU, in the book's order, each phase's configurations after it:
    what the grid times."""
    return [name for phase_name, phase in PHASES.items() if phase.dispatch and phase.runs_on(gpu.cc)
            for name in (phase_name, *(f"{phase_name}:{v.candidate}" for v in phase.candidate_variants))]


def fallback(gpu: env.GpuInfo, problem: tuning.Problem) -> Choice | None:
    """The choice without a tuning table (see the module's docstring); None where no phase runs the problem."""
    runnable = [name for name in PHASES if can_run(name, problem, gpu)]
    preferred = [name for name in runnable if PHASES[name].dispatch] or runnable
    if not preferred:
        return None
    waves = problem.waves(gpu.sms)
    suited = [name for name in preferred if PHASES[name].fallback_waves[0] <= waves < PHASES[name].fallback_waves[1]]
    name = (suited or preferred)[-1]
    return Choice(name, PHASES[name].tile_params_for(gpu.cc),
                  f"fallback (no recorded ranking runs it): the last phase that runs it on the {gpu.name} and is "
                  f"meant for {waves:.2f} waves of {tuning.WAVE_TILE_ROWS}-row tiles on its {gpu.sms} SMs", name)


def choose(gpu: env.GpuInfo, problem: tuning.Problem, table: tuning.Table | None) -> Choice | None:
    """The candidate for a problem on a GPU: the table's ranking at the nearest grid case (candidates this version
    no longer has are passed over), else the fallback."""
    entry = tuning.nearest(table, problem, gpu.sms) if table is not None else None
    for name in entry.ranking if entry else ():
        try:
            phase_name, tile_params, _ = configuration(name, gpu.cc)
        except (KeyError, ValueError):   # a candidate this version no longer has
            continue
        if can_run(name, problem, gpu):
            return Choice(phase_name, tile_params,
                          f"the fastest recorded at the nearest grid case of its wave regime, {entry.case}, in the "
                          f"{table.source}", name)
    return fallback(gpu, problem)


def table_for(gpu: env.GpuInfo) -> tuning.Table | None:
    return _table_override or tuning.load(gpu.name, gpu.cc)


def use_table(table: tuning.Table | None) -> None:
    """Choose from `table` on every GPU from now on (None: from the recorded tables again); forgets the
    choices made so far. The grid experiment times `attention` with the table it has just derived."""
    global _table_override
    _table_override = table
    _chosen.clear()


def nominal(gpu: env.GpuInfo) -> str | None:
    """The phase whose checks say why inputs are refused: the last candidate that runs on this GPU, else the
    last phase that does."""
    running = [name for name, phase in PHASES.items() if phase.runs_on(gpu.cc)]
    return ([name for name in running if PHASES[name].dispatch] or running or [None])[-1]


def _nominal_here(gpu: env.GpuInfo) -> str:
    """nominal(gpu), or a clear error where no phase runs on this GPU at all."""
    name = nominal(gpu)
    if name is None:
        raise RuntimeError(f"no FlashCore phase runs on {gpu.name} (sm_{gpu.cc})")
    return name


def _choice(gpu: env.GpuInfo, q_shape, k_shape, dtype, causal: bool, phase: str) -> Choice | None:
    if phase != "auto":
        phase_name, tile_params, _ = configuration(phase, gpu.cc)
        return Choice(phase_name, tile_params, "forced by the caller", phase)
    problem = tuning.Problem.of(q_shape, k_shape, dtype, causal)
    return choose(gpu, problem, table_for(gpu)) if problem else None


def _load(choice: Choice, device_index: int):
    key = (choice.phase, tuple(choice.tile_params.items()), device_index)
    if key not in _loaded:
        with torch.cuda.device(device_index):   # built for that device's architecture
            _loaded[key] = binding.load(choice.phase, **choice.tile_params)
            _loaded[key].candidate = choice.candidate   # one candidate per (phase, tile parameters)
    return _loaded[key]


def chosen(q, k, v, *, is_causal: bool = False, phase: str = "auto"):
    """The loaded phase (binding.load's function, the chosen candidate's name as its `.candidate`) that
    `attention` launches for these inputs, after the full checks, which raise the book's messages for inputs it
    cannot take."""
    binding.check_device(q, k, v)
    gpu = env.gpu(q.device.index)
    choice = _choice(gpu, q.shape, k.shape, q.dtype, bool(is_causal), phase)
    if choice is None:
        binding.validate_problem(PHASES[_nominal_here(gpu)], q, k, v, bool(is_causal), gpu)   # names what is unsupported
        raise binding.SharedMemoryError(f"no FlashCore phase fits these inputs in the shared memory of {gpu.name}")
    binding.validate_problem(PHASES[choice.phase], q, k, v, bool(is_causal), gpu)   # before compiling anything
    fn = _load(choice, q.device.index)
    binding.validate(fn.build.module, fn.phase, q, k, v, bool(is_causal), None)
    return fn


def _static(shape) -> tuple[int, ...]:
    # operator.index specializes a symbolic size to its value under torch.compile (int() would not)
    return tuple(operator.index(n) for n in shape)


@torch.compiler.assume_constant_result
def _traced_handle(device, dtype, q_shape, k_shape, causal: bool, phase: str) -> int:
    """The launcher handle of the choice, at trace time: torch.compile calls this once per graph and bakes
    the integer in. Inputs no phase takes get the nominal phase, whose operator then refuses them."""
    gpu = env.gpu(device.index)
    choice = _choice(gpu, q_shape, k_shape, dtype, causal, phase)
    if choice is None:
        name = _nominal_here(gpu)
        choice = Choice(name, PHASES[name].tile_params_for(gpu.cc), "refused by the operator", name)
    return _load(choice, device.index).handle


def attention(q, k, v, *, is_causal: bool = False, scale: float | None = None, phase: str = "auto"):
    """softmax(q kᵀ · scale) v, the function of F.scaled_dot_product_attention(q, k, v, is_causal=...,
    scale=...): q (B, H, Sq, D), k and v (B, H, Sk, D), fp16 or bf16 CUDA tensors, D 64 or 128; causal is
    top-left aligned; scale defaults to 1/√D. `phase` names one candidate instead of the choice ("auto"): a
    phase, with its default tiles, or "<phase>:<configuration>".
    Forward only."""
    if torch.compiler.is_compiling():
        handle = _traced_handle(q.device, q.dtype, _static(q.shape), _static(k.shape), bool(is_causal), phase)
        default_scale = 1.0 / math.sqrt(operator.index(q.shape[-1]))
    else:
        key = (phase, binding.signature(q, k, v, is_causal, None))
        entry = _chosen.get(key)
        if entry is None:
            entry = _chosen[key] = (chosen(q, k, v, is_causal=is_causal, phase=phase).handle,
                                    1.0 / math.sqrt(q.shape[-1]))
        handle, default_scale = entry
    return torch.ops.flashcore.attention(q, k, v, bool(is_causal), default_scale if scale is None else float(scale),
                                         handle)
