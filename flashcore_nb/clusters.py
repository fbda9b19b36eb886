"""How many thread-block clusters of a kernel the GPU runs at once, asked of the driver for the kernel as built.

The CTAs of a cluster run at the same time on SMs of one GPC (graphics processing cluster), so a launch of more
clusters than fit at once runs the rest as a second wave, behind the first. cuOccupancyMaxActiveClusters answers
how many fit, for a kernel's registers, threads and shared memory and a cluster size. An extension's kernels are
private to it, so this compiles the same source with the same flags and defines to a cubin (build.cubin), loads
that through the driver API and asks about it.

`python -m flashcore_nb clusters` records results/<gpu>/experiments/cluster_occupancy.json: for the cluster builds
of phases 9 and 10, how many clusters of each size fit at once (chapters 9 and 10)."""
from __future__ import annotations

import ctypes
from pathlib import Path

import pandas as pd

from . import build, dispatch, experiments, results, shapes
from .phases import get

NAME = "cluster_occupancy"
CLUSTER_SIZES = (1, 2, 3, 4, 6, 8, 16)   # 16: a non-portable size, beyond the 8 every sm_90 part guarantees
HEAD_DIM = 64

# label -> (phase, candidate or None for the defaults, defines over it, the kernel's third template argument: phase
# 9's work counter, off without a causal mask; phase 10's clusters, on). The labels are those of the records that
# timed the builds (the exploration record, phase 10's ablation). The cluster size is a launch attribute, so each
# build is asked about every size.
BUILDS = {
    "p09 cluster-keys": ("p09_warpspec", "cluster-keys", {}, False),
    "p09 clusters of four": ("p09_warpspec", "cluster-keys", {"CLUSTER_KEYS": 4}, False),
    "p10 defaults": ("p10_splitkv", None, {}, True),
    "p10 split over 4 CTAs": ("p10_splitkv", None, {"SPLITS": 4, "MAX_SPLITS": 4}, True),
    "p10 split over 8 CTAs": ("p10_splitkv", None, {"SPLITS": 8, "MAX_SPLITS": 8}, True),
}

# the driver API's values (cuda.h)
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4


class _LaunchAttribute(ctypes.Structure):   # CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _LaunchConfig(ctypes.Structure):      # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


def entry_point(entry_registers: dict, flag: bool) -> str:
    """The kernel instantiation `<__half, HEAD_DIM, flag>` among a build's entry points (ptxas's mangled
    names, PtxasStats.entry_registers)."""
    tag = f"I6__halfLi{HEAD_DIM}ELb{int(flag)}EE"
    matches = [name for name in entry_registers if tag in name]
    if len(matches) != 1:
        raise ValueError(f"expected one entry point with {tag}, found {matches}")
    return matches[0]


def _driver():
    driver = ctypes.CDLL("libcuda.so.1")
    for name in ("cuModuleLoadData", "cuModuleGetFunction", "cuFuncSetAttribute", "cuOccupancyMaxActiveClusters",
                 "cuModuleUnload"):
        getattr(driver, name).restype = ctypes.c_int
    return driver


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed with CUresult {result}")


def max_active_clusters(image: bytes, entry: str, threads: int, shared_bytes: int, sizes=CLUSTER_SIZES) -> dict:
    """cluster size -> how many clusters of it fit on the GPU at once, for the kernel `entry` of the cubin `image`
    launched with `threads` per CTA and `shared_bytes` of dynamic shared memory. Needs the CUDA context torch made
    current (any CUDA tensor or call does)."""
    driver = _driver()
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    _check(driver.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
    try:
        _check(driver.cuModuleGetFunction(ctypes.byref(function), module, entry.encode()),
               f"cuModuleGetFunction({entry})")
        _check(driver.cuFuncSetAttribute(function, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes),
               "cuFuncSetAttribute(max dynamic shared memory)")
        _check(driver.cuFuncSetAttribute(function, _CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
               "cuFuncSetAttribute(non-portable cluster size)")
        counts = {}
        for size in sizes:
            attribute = _LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
            attribute.value[:3] = [size, 1, 1]
            config = _LaunchConfig(grid=(ctypes.c_uint * 3)(size, 1, 1), block=(ctypes.c_uint * 3)(threads, 1, 1),
                                   shared_bytes=shared_bytes, attrs=ctypes.pointer(attribute), num_attrs=1)
            count = ctypes.c_int(-1)
            _check(driver.cuOccupancyMaxActiveClusters(ctypes.byref(count), function, ctypes.byref(config)),
                   f"cuOccupancyMaxActiveClusters(cluster of {size})")
            counts[size] = count.value
        return counts
    finally:
        driver.cuModuleUnload(module)


def build_params(label: str, cc: int) -> dict:
    phase, candidate, defines, _ = BUILDS[label]
    return {**dispatch.configuration(f"{phase}:{candidate}" if candidate else phase, cc)[1], **defines}


def run(progress=print) -> list[dict]:
    import torch

    from . import env
    from .binding import load

    cc = env.gpu().cc
    mission = shapes.MISSION
    q = torch.empty(mission.shape, device="cuda", dtype=torch.float16)   # and torch's CUDA context is current
    sizes = [mission.batch, mission.heads, mission.seqlen_q, mission.sk, HEAD_DIM]
    rows = []
    for label, (phase_name, _, _, flag) in BUILDS.items():
        phase, params = get(phase_name), build_params(label, cc)
        fn = load(phase_name, **params)
        # the launch's dynamic shared memory as the extension computes it for fp16 (dtype code 0; the strides play
        # no part in it)
        shared_bytes = fn.build.module.smem_bytes(q.data_ptr(), q.data_ptr(), q.data_ptr(), 0, [0] * 12, sizes, 1.0,
                                                  False, 0)
        threads = phase.threads(params, HEAD_DIM, False)
        image = build.cubin(phase.kernel_file, cc, params, phase.arch_specific)
        entry = entry_point(fn.build.ptxas.entry_registers, flag)
        counts = max_active_clusters(image, entry, threads, shared_bytes)
        rows.extend({"build": label, "cluster_size": size, "max_active_clusters": count, "ctas": size * count,
                     "threads": threads, "shared_bytes": shared_bytes} for size, count in counts.items())
        progress(f"{label}: " + ", ".join(f"{size}: {count}" for size, count in counts.items()))
    return rows


def record() -> Path:
    from . import env

    cc = env.gpu().cc
    builds = {label: build_params(label, cc) for label in BUILDS}
    rows = run()
    return results.write(experiments.make_record(NAME, None, builds, rows,
                                                 build_phases={label: b[0] for label, b in BUILDS.items()}))


# --- reading the record --------------------------------------------------------------------------------------

def load(gpu_slug: str = results.DEFAULT_GPU) -> dict | None:
    """The recorded occupancy, or None where it was never recorded on that GPU."""
    if not results.experiment_path(NAME, gpu_slug).exists():
        return None
    return experiments.load(NAME, gpu_slug)


def table(record: dict, phase: str) -> pd.DataFrame:
    """For one phase's builds ("p09", "p10"): cluster size -> how many clusters of it fit at once, a column per
    build, beside the CTAs those clusters hold in the first build's column."""
    frame = pd.DataFrame([r for r in record["rows"] if r["build"].startswith(phase)])
    fits = frame.pivot(index="cluster_size", columns="build", values="max_active_clusters")
    fits = fits[[label for label in BUILDS if label in fits.columns]]
    fits.insert(0, "CTAs they hold", frame.drop_duplicates("cluster_size").set_index("cluster_size")["ctas"])
    fits.columns.name = None
    return fits.rename_axis("CTAs per cluster")


def fits(record: dict, label: str, size: int) -> int:
    """How many clusters of `size` CTAs of the build `label` fit on the GPU at once."""
    return next(r["max_active_clusters"] for r in record["rows"] if r["build"] == label and r["cluster_size"] == size)
