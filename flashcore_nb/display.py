"""Showing kernel source in a chapter: a whole phase, or the diff from the phase before it."""
from __future__ import annotations

import difflib

from IPython.display import Code

from .phases import get


def kernel_source(phase_name: str) -> Code:
    return Code(get(phase_name).kernel_file.read_text(), language="cuda")


def kernel_diff(previous: str, current: str) -> Code:
    """Unified diff of two phases' kernel files: the lesson of a chapter, line by line."""
    a, b = get(previous).kernel_file, get(current).kernel_file
    lines = difflib.unified_diff(a.read_text().splitlines(), b.read_text().splitlines(),
                                 fromfile=a.name, tofile=b.name, lineterm="")
    return Code("\n".join(lines), language="diff")
