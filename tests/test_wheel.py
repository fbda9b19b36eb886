"""The wheel a reader installs: built from this checkout, installed into a fresh venv and used from a
folder outside the clone, so that nothing can come from the clone by accident."""
import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from flashcore_nb.paths import KERNELS_DIR, REPO_URL, RESULTS_DIR, ROOT

# Runs in the fresh venv: what the installed package sees.
PROBE = textwrap.dedent("""
    import json
    from importlib import metadata

    import flashcore_nb
    from flashcore_nb import build, paths
    from flashcore_nb.phases import PHASES
    from flashcore_nb.tuning import GRID_RECORD

    p01 = PHASES["p01_baseline"]
    try:
        registers, compile_error = build.compile_only(p01.kernel_file, 80, p01.tile_params_for(80)).registers, None
    except build.CompileError as error:
        registers, compile_error = None, str(error)
    print(json.dumps({
        "package": flashcore_nb.__file__,
        "kernels_dir": str(paths.KERNELS_DIR),
        "grid_records_dir": str(paths.GRID_RECORDS_DIR),
        "grid_records": sorted(str(path.relative_to(paths.GRID_RECORDS_DIR))
                               for path in paths.GRID_RECORDS_DIR.glob(f"*/experiments/{GRID_RECORD}.json")),
        "missing": [name for name, phase in PHASES.items() if not phase.kernel_file.is_file()],
        "registers": registers,
        "compile_error": compile_error,
        "version": metadata.version("flashcore-nb"),
        "license": metadata.metadata("flashcore-nb")["License-Expression"],
    }))
""")


def _run(cmd, cwd=None) -> subprocess.CompletedProcess:
    # Without PYTHONPATH, which may point at the clone.
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    proc = subprocess.run([str(part) for part in cmd], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("wheel")
    dist, venv, outside = tmp / "dist", tmp / "venv", tmp / "outside"
    outside.mkdir()
    # The sdist first and the wheel from it, as `python -m build` does: the wheel then holds what a
    # release would, and nothing is built inside the clone, where a stale build/ would leak into it.
    _run([sys.executable, "-c", "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])",
          dist], cwd=ROOT)
    [sdist] = dist.glob("*.tar.gz")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist,
          sdist])
    [wheel] = dist.glob("*.whl")

    _run([sys.executable, "-m", "venv", "--system-site-packages", venv])
    python = venv / "bin" / "python"
    # This interpreter's packages (torch, which may live in .venv rather than the system) for the new
    # venv too: listed in a .pth they come after its own site-packages, and their .pth files (the
    # clone's editable install) are not run.
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (purelib / "test_wheel_parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel])
    return json.loads(_run([python, "-c", PROBE], cwd=outside).stdout)


def test_installed_package_reads_its_own_kernels(installed):
    package = Path(installed["package"]).parent
    assert not package.is_relative_to(ROOT), f"imported the clone: {package}"
    assert Path(installed["kernels_dir"]) == package / "kernels"
    assert installed["missing"] == [], f"no kernel file installed for {installed['missing']}"


def test_wheel_carries_every_kernel_unchanged(installed):
    shipped = Path(installed["kernels_dir"])
    ours = {path.relative_to(KERNELS_DIR).as_posix(): path.read_bytes()
            for path in [*KERNELS_DIR.glob("*.cu"), *KERNELS_DIR.glob("common/*.cuh")]}
    theirs = {path.relative_to(shipped).as_posix(): path.read_bytes() for path in shipped.rglob("*") if path.is_file()}
    assert sorted(theirs) == sorted(ours)
    assert [rel for rel in ours if theirs[rel] != ours[rel]] == []


def test_wheel_carries_the_grid_records_attention_reads(installed):
    """flashcore_nb.attention's tuning tables come from results/<gpu>/experiments/grid.json: every one ships
    unchanged, with the folder's README, and nothing else of results/ does."""
    ours = sorted(str(path.relative_to(RESULTS_DIR)) for path in RESULTS_DIR.glob("*/experiments/grid.json"))
    assert installed["grid_records"] == ours
    shipped = Path(installed["package"]).parent / "grid_records"
    assert Path(installed["grid_records_dir"]) == shipped
    theirs = {str(path.relative_to(shipped)): path.read_bytes() for path in shipped.rglob("*") if path.is_file()}
    assert theirs == {rel: (RESULTS_DIR / rel).read_bytes() for rel in ["README.md", *ours]}


def test_installed_package_compiles_a_kernel(installed):
    assert installed["compile_error"] is None
    assert installed["registers"] > 0


def test_citation_agrees_with_the_wheel(installed):
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert (citation["version"], citation["license"]) == (installed["version"], installed["license"])
    assert citation["repository-code"] == REPO_URL
