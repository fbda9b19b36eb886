"""The cluster-occupancy probe: its driver-API structures, the cubins it asks about, and its record."""
import ctypes
import subprocess

import pytest

from flashcore_nb import build, clusters, env, experiments, results
from flashcore_nb.phases import get

OFFSETS_PROGRAM = r"""
#include <cuda.h>
#include <stddef.h>
#include <stdio.h>
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu %zu\n", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),
         sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, sharedMemBytes), offsetof(CUlaunchConfig, hStream),
         offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs));
  return 0;
}
"""


def test_the_launch_structures_match_cuda_h(tmp_path):
    nvcc = env.nvcc_path()
    assert nvcc is not None, "the CPU suite needs nvcc (CUDA_HOME)"
    source, program = tmp_path / "offsets.c", tmp_path / "offsets"
    source.write_text(OFFSETS_PROGRAM)
    subprocess.run([nvcc, "-x", "c", str(source), "-o", str(program)], check=True, capture_output=True)
    expected = [int(n) for n in subprocess.run([str(program)], check=True, capture_output=True,
                                               text=True).stdout.split()]
    config = clusters._LaunchConfig
    assert [ctypes.sizeof(clusters._LaunchAttribute), clusters._LaunchAttribute.value.offset,
            ctypes.sizeof(config), config.shared_bytes.offset, config.stream.offset, config.attrs.offset,
            config.num_attrs.offset] == expected


@pytest.mark.parametrize("label", ["p09 cluster-keys", "p10 defaults"])
def test_each_build_has_one_fp16_entry_point_and_its_cubin_holds_it(label):
    phase_name, _, _, flag = clusters.BUILDS[label]
    phase, params = get(phase_name), clusters.build_params(label, 90)
    stats = build.compile_only(phase.kernel_file, 90, params, phase.arch_specific)
    entry = clusters.entry_point(stats.entry_registers, flag)
    assert "6__half" in entry and phase.kernel_name in entry
    image = build.cubin(phase.kernel_file, 90, params, phase.arch_specific)
    assert image[:4] == b"\x7fELF" and entry.encode() in image


def test_an_entry_point_must_be_found_once():
    with pytest.raises(ValueError, match="expected one entry point"):
        clusters.entry_point({"_Z3fooI6__halfLi64ELb0EEv11FlashParams": 32}, True)


def test_the_recorded_occupancy_covers_every_build_and_size():
    record = experiments.load(clusters.NAME)
    assert experiments.stale_builds(record) == []
    rows = {(r["build"], r["cluster_size"]): r for r in record["rows"]}
    assert set(rows) == {(label, size) for label in clusters.BUILDS for size in clusters.CLUSTER_SIZES}
    for (label, size), row in rows.items():
        assert row["ctas"] == size * row["max_active_clusters"] and row["threads"] > 0 and row["shared_bytes"] > 0
    for label in clusters.BUILDS:   # a larger cluster never fits more CTAs than single CTAs do
        assert all(rows[label, size]["ctas"] <= rows[label, 1]["ctas"] for size in clusters.CLUSTER_SIZES)
    assert results.experiment_path(clusters.NAME).exists()
