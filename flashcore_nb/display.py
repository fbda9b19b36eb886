"""What a chapter shows beside the measurements: kernel source and excerpts, the diff from the phase before
(whole files, or one job excerpted from each), a phase's correctness in a line per dtype with the full
table folded under it, and one rung's measurement."""
from __future__ import annotations

import difflib
import html
import re

import pandas as pd
from IPython.display import HTML, Code

from . import tables
from .phases import get

# Whole-line colours of a diff, written inline so that no stylesheet of a book theme recolours them.
DIFF_STYLES = {"-": "background:#ffebe9;color:#82071e", "+": "background:#e6ffec;color:#116329",
               "@": "background:#ddf4ff;color:#0550ae"}
HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def kernel_source(phase_name: str) -> Code:
    return Code(get(phase_name).kernel_file.read_text(), language="cuda")


def excerpt_lines(file: str, first: str, last: str, after: str | None = None) -> tuple[int, list[str]]:
    """(0-based index of the first line, the lines) of kernels/`file` from the line where `first` starts
    (below the line containing `after`, where a file has `first` more than once) through the line where the
    next `last` after it ends. Anchors are text and may span lines ("fence(o);\n    }\n  }"), for a block
    whose last line alone is not unique."""
    from .paths import KERNELS_DIR
    text = (KERNELS_DIR / file).read_text()
    origin = 0
    if after is not None:
        found_after = text.find(after)
        if found_after < 0:
            raise ValueError(f"kernels/{file} has no line containing {after!r}")
        origin = text.find("\n", found_after) + 1
    begin = text.find(first, origin)
    if begin < 0:
        raise ValueError(f"kernels/{file} has no line containing {first!r}" + (f" after {after!r}" if after else ""))
    start = text.count("\n", 0, begin)
    found = text.find(last, text.rfind("\n", 0, begin) + 1)
    if found < 0:
        raise ValueError(f"kernels/{file} has no line containing {last!r} after line {start + 1}")
    end = text.count("\n", 0, found + len(last) - 1)
    return start, text.splitlines()[start:end + 1]


def kernel_excerpt(file: str, first: str, last: str, after: str | None = None) -> Code:
    """The lines of kernels/`file` from the first line containing `first` through the next line containing
    `last` (see excerpt_lines), syntax-highlighted, under a comment that says where they are: a chapter's
    excerpt of what is new stays in step with the file it shows."""
    start, lines = excerpt_lines(file, first, last, after)
    header = f"// kernels/{file}, lines {start + 1}-{start + len(lines)}"
    return Code("\n".join([header, *lines]), language="cuda")


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


def shift_hunk(line: str, old_offset: int, new_offset: int) -> str:
    """A unified diff's "@@ -a,b +c,d @@" line with a and c moved by the offsets; any other line as it is."""
    match = HUNK.match(line)
    if not match:
        return line
    start_old, start_new = int(match[1]) + old_offset, int(match[3]) + new_offset
    return f"@@ -{start_old}{match[2] or ''} +{start_new}{match[4] or ''} @@" + line[match.end():]


def kernel_diff(previous: str, current: str) -> Diff:
    """Unified diff of two phases' kernel files, the lesson of a chapter line by line. The header comments
    are left out (each says in prose what changed, as the chapter does); hunks keep the files' line numbers."""
    a, b = get(previous).kernel_file, get(current).kernel_file
    old, new = a.read_text().splitlines(), b.read_text().splitlines()
    skip_old, skip_new = header_lines(old), header_lines(new)
    lines = difflib.unified_diff(old[skip_old:], new[skip_new:], fromfile=a.name, tofile=b.name, lineterm="")
    return Diff("\n".join(shift_hunk(line, skip_old, skip_new) for line in lines))


def dedent_code(lines: list[str]) -> list[str]:
    """Lines with the indentation of the least indented code line taken off (preprocessor lines, at column
    0 in these kernels, do not count), so that one job nested at different depths in two files compares
    line by line."""
    code = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    depth = min((len(line) - len(line.lstrip(" ")) for line in code), default=0)
    return [line[depth:] if line[:depth].isspace() else line for line in lines]


def excerpt_diff(before: tuple[str, str, str], after: tuple[str, str, str]) -> Diff:
    """The same job in two kernels: the excerpt `before` = (file, first, last) of one phase's kernel
    against the excerpt `after` of the next's (anchors as in excerpt_lines), one hunk with both files'
    line numbers. Two kernels built differently diff whole as noise; one job excerpted from each diffs
    as the lesson. Both excerpts are dedented (dedent_code): a change of nesting depth is not a change."""
    (old_file, *old_anchors), (new_file, *new_anchors) = before, after
    old_start, old = excerpt_lines(old_file, *old_anchors)
    new_start, new = excerpt_lines(new_file, *new_anchors)
    lines = difflib.unified_diff(dedent_code(old), dedent_code(new), lineterm="", n=max(len(old), len(new)),
                                 fromfile=f"{old_file}, lines {old_start + 1}-{old_start + len(old)}",
                                 tofile=f"{new_file}, lines {new_start + 1}-{new_start + len(new)}")
    return Diff("\n".join(shift_hunk(line, old_start, new_start) for line in lines))


def rung(frame: pd.DataFrame | None, number: int) -> HTML:
    """One rung's measurement (tables.rung) under a line that names it, with its ptxas registers and spills;
    where the rungs are not recorded (`frame` None), a line that says so."""
    if frame is None:
        return HTML(f"<p><i>Rung {number} is not measured on this GPU yet: its GPU time appears here once the "
                    f"rungs are recorded (see above).</i></p>")
    first = frame[frame["rung"] == number].iloc[0]
    line = f"<b>Rung {number}: {html.escape(first['variant'])}</b>"
    if first["status"] != "ok":
        return HTML(f"<p>{line}: {html.escape(first['status'])}</p>")
    line += (f": {first['registers']} registers per thread, {first['spill_bytes']} bytes of spills "
             f"(ptxas, the build's worst kernel)")
    table = tables.rung(frame, number).style.format(precision=2).format("{:.1f}", subset=["spread %"])
    table = table.hide(axis="index").to_html()
    return HTML(f"<p>{line}</p>{table}")


def correctness(runs: pd.DataFrame) -> HTML:
    """A phase's checks on the shape suite: one line per dtype (cases passed, outputs left unwritten, the
    largest error as a multiple of SDPA's on the same inputs and where), and tables.correctness folded
    under them."""
    table = tables.correctness(runs)
    lines = []
    for dtype, part in table.groupby("dtype", sort=False):
        failed = part.loc[~part["passed"], "case"].tolist()
        passed = f"all {len(part)} cases pass" if not failed else \
            f"{len(part) - len(failed)} of {len(part)} cases pass (failed: {', '.join(failed)})"
        unwritten = int(part["unwritten"].sum())
        written = "every output written" if unwritten == 0 else f"{unwritten} outputs unwritten"
        worst = part.loc[part["err / sdpa err"].idxmax()]
        lines.append(f"<li><b>{dtype}</b>: {passed}, {written}; the largest error is {worst['err / sdpa err']:.2f}× "
                     f"SDPA's on the same inputs ({worst['case']}: {worst['max_abs_err']:.1e} against "
                     f"{worst['sdpa_max_abs_err']:.1e})</li>")
    full = table.style.format(precision=6).hide(axis="index").to_html()
    return HTML(f"<ul>{''.join(lines)}</ul><details><summary>every case ({len(table)} checks)</summary>{full}</details>")
