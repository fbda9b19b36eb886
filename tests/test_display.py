"""What chapters show beside the measurements: kernel diffs and correctness summaries."""
from flashcore_nb import display, measure
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


def test_correctness_is_a_line_per_dtype_with_the_table_folded_under_it(monkeypatch):
    monkeypatch.setenv("FLASHCORE_MODE", "replay")
    runs = measure.phase_runs("p03_wmma").runs          # replay: the H100 record, fp16 only
    page = display.correctness(runs).data
    summary, _, folded = page.partition("<details>")
    assert summary.count("<li>") == 1 and "float16</b>: all 20 cases pass, every output written" in summary
    assert "1.25× SDPA's on the same inputs (orig_256_b4" in summary
    assert folded.count("<tr>") == len(runs) + 1            # every check, and the header row
    runs.loc[0, "passed"], runs.loc[0, "unwritten"] = False, 3
    assert "19 of 20 cases pass (failed: mission), 3 outputs unwritten" in display.correctness(runs).data


def test_kernel_excerpt_starts_below_after_where_a_line_occurs_twice():
    loop = "for (int tile = 0; tile < work.num_tiles; ++tile, ++step) {"
    first = display.kernel_excerpt("p07_registers.cu", loop, "}").data
    second = display.kernel_excerpt("p07_registers.cu", loop, "}", after="= s_next[mt][j][e];").data
    lines = get("p07_registers").kernel_file.read_text().splitlines()
    starts = [i + 1 for i, line in enumerate(lines) if loop in line]
    assert len(starts) == 2
    assert first.startswith(f"// kernels/p07_registers.cu, lines {starts[0]}-")
    assert second.startswith(f"// kernels/p07_registers.cu, lines {starts[1]}-")
