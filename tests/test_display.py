"""What chapters show beside the measurements: kernel diffs."""
from flashcore_nb import display
from flashcore_nb.phases import get


def test_kernel_diff_leaves_out_the_header_comments_and_keeps_line_numbers():
    diff = display.kernel_diff("p01_baseline", "p02_vectorized")
    old, new = (get(name).kernel_file.read_text().splitlines() for name in ("p01_baseline", "p02_vectorized"))
    lines = diff.text.splitlines()
    assert lines[:2] == ["--- p01_baseline.cu", "+++ p02_vectorized.cu"]
    assert old[0] not in diff.text and new[0] not in diff.text    # "// Phase N — ..." opens each header
    first = display.HUNK.match(lines[2])
    start_old, start_new = int(first[1]), int(first[3])
    assert start_old > display.header_lines(old) and start_new > display.header_lines(new)
    assert lines[3] == " " + old[start_old - 1] == " " + new[start_new - 1]   # the files' own line numbers


def test_kernel_diff_renders_removed_lines_red_and_added_lines_green():
    diff = display.kernel_diff("p05_tile64", "p06_async")
    page = diff._repr_html_()
    assert page.startswith("<pre") and page.count("<span") == len(diff.text.splitlines())
    assert display.DIFF_STYLES["-"] in page and display.DIFF_STYLES["+"] in page
    assert repr(diff) == diff.text
