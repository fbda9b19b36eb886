"""Figures drawn from the code rather than from records: p08's step schedule follows its kernel's loop."""
import matplotlib.pyplot as plt
import pytest

from flashcore_nb import display, plots
from flashcore_nb.phases import get

TILES = 4


def in_order(text: str, calls: list[str]) -> bool:
    """Whether each call occurs in `text` after the one before it."""
    position = 0
    for call in calls:
        position = text.find(call, position)
        if position < 0:
            return False
        position += len(call)
    return True


def by_unit(slots, unit):
    return {tile: (start, end) for u, tile, start, end, label in slots if u == unit and label}


@pytest.mark.parametrize("overlap", (False, True))
def test_every_tile_goes_through_each_unit_once_in_the_loops_order(overlap):
    slots, barriers, waits = plots.wgmma_step_schedule(TILES, overlap)
    scores, softmax, values = (by_unit(slots, unit) for unit in ("Q·Kᵀ", "softmax", "P·V"))
    assert sorted(scores) == sorted(softmax) == sorted(values) == list(range(TILES))
    assert len(barriers) == TILES + 1 and barriers == sorted(barriers)
    for tile in range(TILES):
        assert scores[tile][0] == barriers[tile]            # Q·Kᵀ(s) is issued right after step s's barrier
        assert softmax[tile][0] == scores[tile][1]          # ... and waited for before the softmax
        assert values[tile][0] >= barriers[tile + 1]        # P·V(s) runs in step s + 1
        if tile + 1 < TILES:
            assert values[tile][0] >= scores[tile + 1][1]   # behind Q·Kᵀ(s + 1) on the tensor cores
            # the softmax of the next tile runs after P·V(s) (OVERLAP=0) or beside it (OVERLAP=1)
            assert (values[tile][0] < softmax[tile + 1][1]) == overlap
    copies = [(tile, start, label) for unit, tile, start, end, label in slots if unit == "copies"]
    for step, barrier in enumerate(barriers[:-1]):   # step s copies K(s + 1) and V(s) after its barrier
        assert {label for _, start, label in copies if start == barrier} == {f"K{step + 1}", f"V{step}"} - {f"K{TILES}"}
    last_copy_end = {label: end for unit, tile, start, end, label in slots if unit == "copies"}
    assert all(last_copy_end[f"K{t}"] <= barriers[t] for t in range(1, TILES))   # landed by the barrier
    assert [label for unit, _, label in waits if unit == "Q·Kᵀ"] == ["wait<0>"] + ["wait<1>" if overlap else "wait<0>"] * (TILES - 1)


def test_the_schedule_matches_the_kernels_loop():
    """The figure is drawn from the order of these calls in p08's loop: if the kernel changes it, redraw."""
    _, loop = display.excerpt_lines("p08_wgmma.cu", "for (int step = 0; step <= key_tiles",
                                    "rows.output_landed();\n    }\n  }")
    text = "\n".join(loop)
    assert in_order(text, ["cp_async_wait<0>();", "__syncthreads();", "copy_k(step + 1);", "copy_v(step);",
                           "} else if (step < my_tiles) {", "issue_scores(k_tile(step));",
                           "if (OVERLAP) {", "issue_values(v_tile(step - 1));", "wgmma_wait<1>();",
                           "} else {", "wgmma_wait<0>();", "softmax(step, correction);",
                           "if (!OVERLAP) rows.issue_values(v_tile(step - 1));", "wgmma_wait<0>();", "rescale_output(correction);",
                           "pack_probabilities();", "} else if (step == my_tiles) {", "issue_values(v_tile(step - 1));",
                           "wgmma_wait<0>();"])
    assert get("p08_wgmma").tile_params["OVERLAP"] == 0


def test_step_schedule_draws_both_settings_and_marks_the_default():
    params = dict(get("p08_wgmma").tile_params)
    fig = plots.step_schedule(params)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles[0].startswith("OVERLAP = 0 (the default)") and titles[1].startswith("OVERLAP = 1:")
    assert "not a trace" in fig._suptitle.get_text()
    plt.close(fig)
    params["OVERLAP"] = 1
    fig = plots.step_schedule(params)
    assert [ax.get_title(loc="left").split(":")[0] for ax in fig.axes] == ["OVERLAP = 0", "OVERLAP = 1 (the default)"]
    plt.close(fig)
