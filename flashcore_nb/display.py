"""Showing kernel source in a chapter: a whole phase, or the diff from the phase before it."""
from __future__ import annotations

import difflib
import html
import re

from IPython.display import Code

from .phases import get

# Whole-line colours of a diff, written inline so that no stylesheet of a book theme recolours them.
DIFF_STYLES = {"-": "background:#ffebe9;color:#82071e", "+": "background:#e6ffec;color:#116329",
               "@": "background:#ddf4ff;color:#0550ae"}
HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def kernel_source(phase_name: str) -> Code:
    return Code(get(phase_name).kernel_file.read_text(), language="cuda")


class Diff:
    """A unified diff: removed lines red, added lines green, in Jupyter and on a static page alike;
    the plain text everywhere else."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        lines = []
        for line in self.text.splitlines():
            style = "font-weight:bold" if line.startswith(("--- ", "+++ ")) else DIFF_STYLES.get(line[:1], "")
            lines.append(f'<span style="display:block;{style}">{html.escape(line) or "&nbsp;"}</span>')
        return f'<pre style="font-size:0.8em;line-height:1.35;overflow-x:auto">{"".join(lines)}</pre>'


def header_lines(lines: list[str]) -> int:
    """How many lines a kernel file's header comment takes (its leading // and blank lines)."""
    count = 0
    while count < len(lines) and (lines[count].startswith("//") or not lines[count].strip()):
        count += 1
    return count


def kernel_diff(previous: str, current: str) -> Diff:
    """Unified diff of two phases' kernel files, the lesson of a chapter line by line. The header comments
    are left out (each says in prose what changed, as the chapter does); hunks keep the files' line numbers."""
    a, b = get(previous).kernel_file, get(current).kernel_file
    old, new = a.read_text().splitlines(), b.read_text().splitlines()
    skip_old, skip_new = header_lines(old), header_lines(new)

    def renumber(line: str) -> str:
        match = HUNK.match(line)
        if not match:
            return line
        start_old, start_new = int(match[1]) + skip_old, int(match[3]) + skip_new
        return f"@@ -{start_old}{match[2] or ''} +{start_new}{match[4] or ''} @@" + line[match.end():]

    lines = difflib.unified_diff(old[skip_old:], new[skip_new:], fromfile=a.name, tofile=b.name, lineterm="")
    return Diff("\n".join(renumber(line) for line in lines))
