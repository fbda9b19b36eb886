"""Where things live: the repository's folders and its one public URL.

In a clone, ROOT is the repository and everything below is there. An installed wheel has no
repository: it carries the kernels inside the package (pyproject.toml maps kernels/ to
flashcore_nb/kernels), and the grid records the dispatcher needs; the folders only the book uses are
not shipped, so RESULTS_DIR, NOTEBOOKS_DIR and README_FIGURE mean something in a clone only.
"""
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
ROOT = PACKAGE_DIR.parent
# The package's own copy first: in site-packages, ROOT/kernels would be whatever else is installed
# under that name.
KERNELS_DIR = PACKAGE_DIR / "kernels" if (PACKAGE_DIR / "kernels").is_dir() else ROOT / "kernels"
RESULTS_DIR = ROOT / "results"
# The grid records flashcore_nb.attention reads its tuning tables from (tuning.py): the wheel carries them in
# the package (pyproject.toml maps results/ to flashcore_nb/grid_records, grid.json files only).
GRID_RECORDS_DIR = PACKAGE_DIR / "grid_records" if (PACKAGE_DIR / "grid_records").is_dir() else RESULTS_DIR
NOTEBOOKS_DIR = ROOT / "notebooks"
# Written by `python -m flashcore_nb figures`, shown by README.md.
README_FIGURE = ROOT / "book" / "_static" / "ladder.png"

# The one repository URL: _config.yml, pyproject.toml, CITATION.cff, README.md and every notebook's
# setup cell use this string, and tests/test_notebooks.py checks that they agree.
REPO_URL = "https://github.com/flashcore-book/flashcore"
