"""The whole book builds with Sphinx warnings as errors, executing every notebook in replay mode."""
import subprocess
import sys
from pathlib import Path

from flashcore_nb.paths import ROOT


def test_book_builds_without_warnings(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHCORE_MODE", "replay")
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jupyter_book), "build", "--all", "--warningiserror", "--path-output",
                           str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    html = tmp_path / "_build" / "html"
    page = (html / "notebooks" / "01_baseline.html").read_text()
    assert "recorded on NVIDIA H100 80GB HBM3" in page
    assert page.count("<img") >= 3, "chapter 1 should render its figures"
    assert "<details><summary>every case" in page, "the correctness table folds under its summary"
    assert "On Colab: fetch" not in page, "the Colab setup cell runs on Colab, not on the page"
    for chapter in sorted((html / "notebooks").glob("*.html")):
        text = chapter.read_text()
        for leftover in ("output stderr", "compiling the launcher", "Traceback (most recent call last)"):
            assert leftover not in text, f"{chapter.name} shows {leftover!r}: compile progress and stderr stay off the page"
    explorer = (html / "notebooks" / "05_tile64.html").read_text()
    assert "every configuration of the sweep on the H100" in explorer, "the tile explorer's static view"
