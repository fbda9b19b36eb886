"""Applying an exploration patch (kernels/explorations/*.patch) to a phase's kernel source.

An exploration instrument (a switch that stops a kernel early, or skips a wait) is kept out of the phase's own
source, where every change would stale the phase's records, and lives as a unified diff against it. The build
applies it to the source text it compiles; the record's kernel hash covers the patched text, so a record goes
stale when the phase's source changes under the patch, and a patch that no longer applies says so at once."""
from __future__ import annotations

import re
from pathlib import Path

_FILE_RE = re.compile(r"^\+\+\+ b/(\S+)", re.MULTILINE)
_HUNK_RE = re.compile(r"^@@ -(\d+)")   # where the hunk starts in the original


class PatchError(ValueError):
    """The patch does not apply to this source: the phase changed since the patch was made."""


def patched_file(patch_text: str) -> str:
    """The one file (relative to the repository) the patch changes."""
    files = _FILE_RE.findall(patch_text)
    if len(files) != 1:
        raise PatchError(f"an exploration patch changes exactly one file; this one names {files or 'none'}")
    return files[0]


def apply(source: str, patch_text: str) -> str:
    """`source` with the patch's hunks applied; every context and removed line must match exactly."""
    lines = source.split("\n")
    out: list[str] = []
    at = 0   # lines of `source` consumed so far
    hunks = re.split(r"^(?=@@ )", patch_text, flags=re.MULTILINE)[1:]
    for hunk in hunks:
        header, *body = hunk.rstrip("\n").split("\n")
        start = int(_HUNK_RE.match(header).group(1)) - 1
        if start < at:
            raise PatchError(f"hunk {header} overlaps the one before it")
        out.extend(lines[at:start])
        at = start
        for line in body:
            if line.startswith("\\"):   # "\ No newline at end of file"
                continue
            kind, text = line[:1], line[1:]
            if kind in (" ", "-"):
                if at >= len(lines) or lines[at] != text:
                    found = lines[at] if at < len(lines) else "past the end"
                    raise PatchError(f"hunk {header}: line {at + 1} is {found!r}, the patch expects {text!r}")
                at += 1
                if kind == " ":
                    out.append(text)
            elif kind == "+":
                out.append(text)
            else:
                raise PatchError(f"hunk {header}: a line starts with {kind!r}")
    out.extend(lines[at:])
    return "\n".join(out)


def patched_source(kernel_file: Path, patch: Path) -> str:
    """The kernel file's text with the patch applied (the patch must be made against that file)."""
    patch_text = patch.read_text()
    target = patched_file(patch_text)
    if not Path(kernel_file).as_posix().endswith(target):
        raise PatchError(f"{patch.name} patches {target}, not {Path(kernel_file).name}")
    return apply(Path(kernel_file).read_text(), patch_text)
