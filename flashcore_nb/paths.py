"""Where things live: the repository's folders and its one public URL."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS_DIR = ROOT / "kernels"
RESULTS_DIR = ROOT / "results"
NOTEBOOKS_DIR = ROOT / "notebooks"
# Written by `python -m flashcore_nb figures`, shown by README.md.
README_FIGURE = ROOT / "book" / "_static" / "ladder.png"

# The one repository URL: _config.yml, pyproject.toml, CITATION.cff, README.md and every notebook's
# setup cell use this string, and tests/test_notebooks.py checks that they agree.
REPO_URL = "https://github.com/flashcore-book/flashcore"
