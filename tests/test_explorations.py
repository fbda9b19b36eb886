"""Exploration builds: a patch applied to a phase's source at build time, its records, and their staleness."""
import pytest

from flashcore_nb import build, experiments, explorations, source_patch
from flashcore_nb.phases import get

SOURCE = "a\nb\nc\nd\ne\n"
PATCH = """--- a/kernels/x.cu
+++ b/kernels/x.cu
@@ -2,3 +2,4 @@
 b
-c
+C
+c2
 d
"""


def test_a_patch_applies_hunk_by_hunk():
    assert source_patch.apply(SOURCE, PATCH) == "a\nb\nC\nc2\nd\ne\n"
    assert source_patch.patched_file(PATCH) == "kernels/x.cu"


def test_a_patch_whose_context_moved_is_refused():
    with pytest.raises(source_patch.PatchError, match="line 3 is 'x'"):
        source_patch.apply("a\nb\nx\nd\ne\n", PATCH)
    with pytest.raises(source_patch.PatchError, match="exactly one file"):
        source_patch.patched_file(PATCH + PATCH.replace("x.cu", "y.cu"))


def test_the_patch_applies_to_phase_9_and_only_adds_switches_that_default_to_off():
    phase = get(explorations.PHASE)
    patched = build.kernel_text(phase.kernel_file, build.KERNELS_DIR / explorations.PATCH)
    original = phase.kernel_file.read_text()
    assert patched != original
    for switch in ("EXP_STOP", "EXP_NOWAIT", "EXP_PDL", "EXP_NOSTORE", "EXP_UNEVEN", "EXP_HOLD", "EXP_HALFEXP",
                   "EXP_NOEXP", "EXP_RCP"):
        assert f"#ifndef {switch}\n#define {switch} 0\n#endif" in patched


def test_every_exploration_build_names_a_known_configuration():
    for label, b in explorations.BUILDS.items():
        params = explorations.tile_params(label, 90)
        assert get(explorations.PHASE).refuses(params) is None, label
        assert b.patched == any(key.startswith("EXP_") for key in params), label
        assert not b.timed_only or b.patched, label   # only the patch's switches skip work
    for timed in explorations.SETS.values():
        for _, labels in timed:
            assert set(labels) <= set(explorations.BUILDS)


def test_the_patched_build_compiles_with_every_switch_on():
    params = {**explorations.tile_params("cluster-keys", 90), "EXP_STOP": 2, "EXP_NOWAIT": 2, "EXP_PDL": 3,
              "EXP_NOSTORE": 1, "EXP_UNEVEN": 1, "EXP_HOLD": 1, "EXP_HALFEXP": 1, "EXP_NOEXP": 1, "EXP_RCP": 1}
    stats = build.compile_only(get(explorations.PHASE).kernel_file, 90, params, True,
                               build.KERNELS_DIR / explorations.PATCH)
    assert stats.kernels == 4 and stats.spill_stores == 0


def synthetic_record() -> dict:
    labels = ["cluster-keys", "loads only", explorations.PDL]
    builds = {label: explorations.BUILDS[label].defines | {"CLUSTER_KEYS": 2} for label in labels}
    return experiments.make_record(explorations.RECORD, explorations.PHASE, builds, [{"kind": "timing"}],
                                   build_patches={label: explorations.PATCH for label in labels[1:]})


def test_an_exploration_record_goes_stale_when_phase_9_changes_under_its_patch(kernels_copy):
    record = synthetic_record()
    assert record["builds"]["loads only"]["patch"] == explorations.PATCH
    assert "patch" not in record["builds"]["cluster-keys"]
    assert experiments.stale_builds(record) == []
    source = kernels_copy / "p09_warpspec.cu"
    source.write_text(source.read_text() + "\n// an edit the patch still applies over\n")
    assert experiments.stale_builds(record) == ["cluster-keys", "loads only", explorations.PDL]
    source.write_text(source.read_text().replace("#ifndef PERSISTENT_CTAS", "#ifndef PERSISTENT_CTAS // moved"))
    with pytest.raises(source_patch.PatchError):
        build.kernel_text(source, kernels_copy / explorations.PATCH)
    assert experiments.stale_builds(record) == ["cluster-keys", "loads only", explorations.PDL]


def test_an_exploration_record_goes_stale_when_its_patch_changes(kernels_copy):
    record = synthetic_record()
    patch = kernels_copy / explorations.PATCH
    patch.write_text(patch.read_text().replace("#define EXP_PDL 0", "#define EXP_PDL 1"))
    assert experiments.stale_builds(record) == ["loads only", explorations.PDL]
    patch.unlink()
    assert experiments.stale_builds(record) == ["loads only", explorations.PDL]


RECORD = explorations.load()


def test_the_recorded_explorations_checked_every_correct_build_and_timed_every_set():
    checks = explorations.checks(RECORD)
    checked = [label for label, b in explorations.BUILDS.items() if not b.timed_only]
    assert set(checks["build"]) == set(checked)
    assert checks.loc[~checks["inexact"], "passed"].all()   # an inexact build's checks are recorded, not required
    assert set(checks.loc[checks["kind"] == "chain check", "build"]) >= {explorations.PDL}
    for set_name, timed in explorations.SETS.items():
        frame = explorations.timings(RECORD, set_name)
        for case, labels in timed:
            rows = frame[frame["case"] == case].set_index("build")
            assert set(labels) <= set(rows.index), (set_name, case)
            assert rows.loc[labels[0], "× reference"] == 1.0
            assert (rows["GPU time (µs)"] > 0).all()
    after = explorations.timings(RECORD, "PDL after a copy")
    assert set(after["case"]) == set(explorations.AFTER_A_COPY_CASES)
