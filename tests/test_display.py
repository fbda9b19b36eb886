"""What chapters show beside the measurements: kernel excerpts and diffs, and correctness summaries."""
import pytest

from flashcore_nb import display, measure
from flashcore_nb.paths import KERNELS_DIR
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


def test_excerpt_anchors_are_text_and_may_span_lines():
    lines = get("p08_wgmma").kernel_file.read_text().splitlines()
    start, block = display.excerpt_lines("p08_wgmma.cu", "for (int step = 0; step <= key_tiles",
                                         "rows.output_landed();\n    }\n  }")
    assert block == lines[start:start + len(block)]
    assert block[0].lstrip().startswith("for (int step = 0") and block[-1] == "  }" and block[-2] == "    }"
    # a multi-line anchor ends where its lines follow each other, past the first line holding its start
    assert sum("rows.output_landed();" in line for line in block) == 2
    header = display.kernel_excerpt("p08_wgmma.cu", "const auto softmax = [&]", "  };").data.splitlines()[0]
    first, last = map(int, header.rsplit(" ", 1)[1].split("-"))
    assert lines[first - 1].startswith("  const auto softmax = [&]") and lines[last - 1] == "  };"
    with pytest.raises(ValueError, match="no line containing 'no such line'"):
        display.excerpt_lines("p08_wgmma.cu", "no such line", "};")


def test_dedent_code_takes_off_the_common_indentation_of_code_lines_only():
    assert display.dedent_code(["    a(", "#pragma unroll", "      b);", ""]) == ["a(", "#pragma unroll", "  b);", ""]


def test_excerpt_diff_is_one_hunk_numbered_by_both_files():
    before = ("p07_registers.cu", "// S = Q·Kᵀ for this warp's rows", "    };")
    after = ("common/wgmma_attention.cuh", "// S = Q·Kᵀ for the K tile", "wgmma_commit();\n  }")
    diff = display.excerpt_diff(before, after)
    lines = diff.text.splitlines()
    assert lines[0].startswith("--- p07_registers.cu, lines ")
    assert lines[1].startswith("+++ common/wgmma_attention.cuh, lines ")
    hunks = [line for line in lines if line.startswith("@@")]
    assert len(hunks) == 1
    old_files = {"p07_registers": get("p07_registers").kernel_file.read_text().splitlines(),
                 "p08_wgmma": (KERNELS_DIR / "common" / "wgmma_attention.cuh").read_text().splitlines()}
    match = display.HUNK.match(hunks[0])
    old_no, new_no = int(match[1]), int(match[3])
    for line in lines[3:]:   # every line is the files' own line at the number the hunk gives it
        if line[0] in " -":
            assert old_files["p07_registers"][old_no - 1].strip() == line[1:].strip()
            old_no += 1
        if line[0] in " +":
            assert old_files["p08_wgmma"][new_no - 1].strip() == line[1:].strip()
            new_no += 1
    assert lines[-1] == "+}"          # the method's closing brace; p07's lambda closes with "};"
    assert any(line.startswith("-") and "ldmatrix_x4(b, k_tile" in line for line in lines)   # ldmatrix out,
    assert any(line.startswith("+") and "wgmma_rs<T, 64, 0>" in line for line in lines)   # wgmma in
