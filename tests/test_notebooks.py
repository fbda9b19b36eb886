"""Notebooks: committed clean, and each executes top to bottom in replay mode (no GPU)."""
import json
import re

import nbformat
import pytest
from nbclient import NotebookClient

from flashcore_nb.paths import NOTEBOOKS_DIR, REPO_URL, ROOT

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    cells = json.loads(path.read_text())["cells"]
    assert not [c for c in cells if c["cell_type"] == "code" and (c["outputs"] or c["execution_count"])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_executes_in_replay_mode(path, monkeypatch):
    monkeypatch.setenv("FLASHCORE_MODE", "replay")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


def test_one_repository_url_everywhere():
    places = [ROOT / "_config.yml", ROOT / "pyproject.toml", ROOT / "CITATION.cff", ROOT / "README.md",
              ROOT / "book" / "how_to_run.md", *NOTEBOOKS]
    for place in places:
        assert REPO_URL in place.read_text(), f"{place.name} does not use {REPO_URL}"
    urls = {url.removesuffix(".git") for place in places
            for url in re.findall(r"https://github\.com/[\w.-]+/[\w.-]*flashcore[\w.-]*", place.read_text())}
    assert urls == {REPO_URL}, f"repository URLs disagree: {sorted(urls)}"


def test_cells_that_compile_keep_their_progress_off_the_page():
    """Live, these cells compile kernels, and the compile ticker goes to stderr: useful in Jupyter, a
    stderr box on the rendered page (the `remove-stderr` tag drops it there)."""
    compiling = ("measure.phase_runs(", "experiments.precision_runs(")
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and any(call in cell.source for call in compiling):
                assert "remove-stderr" in cell.metadata.get("tags", []), f"{path.name}: {cell.source[:60]}"


def test_every_notebook_starts_with_the_colab_setup_cell():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        setup = next(c for c in nb.cells if c.cell_type == "code")
        assert "google.colab" in setup.source and f"git clone --depth 1 {REPO_URL}" in setup.source


def test_chapter_07_shows_its_rungs_in_short_excerpts_and_folds_the_whole_file():
    """Issue 15: no whole-file dump on the page, an excerpt of at most ~80 lines per rung, and a measurement
    per rung (display.rung) after its excerpts."""
    from flashcore_nb import display
    from flashcore_nb.phases import PHASES
    cells = nbformat.read(NOTEBOOKS_DIR / "07_registers.ipynb", as_version=4).cells
    code = [cell for cell in cells if cell.cell_type == "code"]
    for cell in code:
        if "kernel_source(" in cell.source:
            assert "hide-output" in cell.metadata.get("tags", []), cell.source
    shown, rungs = 0, []
    for cell in code:
        if "display.kernel_excerpt(" in cell.source:
            shown += eval(cell.source, {"display": display}).data.count("\n")   # the excerpt's lines, header included
        elif cell.source.startswith("display.rung("):
            assert 0 < shown <= 80, f"{cell.source}: {shown} lines of excerpts"
            rungs.append(cell.source)
            shown = 0
    assert rungs == [f"display.rung(rungs, {n})" for n in range(1, len(PHASES["p07_registers"].variants_tagged("rung")) + 1)]
