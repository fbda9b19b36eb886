import os
import subprocess
import sys

from flashcore_nb.paths import ROOT


def run(*args):
    """The CLI as on a machine with no GPU (any GPU here is hidden from it)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "FLASHCORE_MODE": ""}
    return subprocess.run([sys.executable, "-m", "flashcore_nb", *args], cwd=ROOT, capture_output=True,
                          text=True, env=env)


def test_info_reports_mode_and_phases():
    proc = run("info")
    assert proc.returncode == 0 and "mode: replay" in proc.stdout and "p01_baseline" in proc.stdout


def test_stats_compiles_without_a_gpu():
    proc = run("stats", "--phase", "p01_baseline", "--arch", "80")
    assert proc.returncode == 0, proc.stderr
    assert "sm_80" in proc.stdout and "registers" in proc.stdout


def test_gpu_commands_refuse_clearly_without_a_gpu():
    proc = run("check", "--phase", "p01_baseline")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


def test_help_lists_every_verb():
    proc = run("--help")
    assert proc.returncode == 0
    for verb in ("record", "precision", "sweep", "sanitize", "ablate", "rungs", "profile", "peaks", "drift", "procstate",
                 "accuracy", "grid", "seqlen", "trace", "figures"):
        assert verb in proc.stdout, verb


def test_peaks_needs_a_gpu():
    proc = run("peaks")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


def test_procstate_needs_a_gpu():
    proc = run("procstate")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


def test_accuracy_needs_a_gpu():
    proc = run("accuracy", "--phase", "p07_registers")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


def test_seqlen_needs_a_gpu():
    proc = run("seqlen")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


def test_trace_needs_a_traced_phase_then_a_gpu():
    proc = run("trace", "--phase", "p01_baseline")
    assert proc.returncode == 2 and "trace needs --phase one of ['p09_warpspec']" in proc.stderr
    proc = run("trace", "--phase", "p09_warpspec")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


def test_figures_writes_the_ladder_without_a_gpu(tmp_path):
    from PIL import Image

    from flashcore_nb import results
    out = tmp_path / "ladder.png"
    proc = run("figures", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert Image.open(out).text["Source"] == results.digest(results.recorded_phases()[0])


def test_rungs_names_the_phases_that_have_rungs():
    proc = run("rungs", "--phase", "p01_baseline")
    assert proc.returncode == 2 and "rungs needs --phase one of ['p07_registers']" in proc.stderr


def test_rungs_needs_a_gpu():
    proc = run("rungs", "--phase", "p07_registers")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr
