"""docs/fidelity.md's verdicts (benchmarks/verdicts.py): the rule on hand-computed differences, and the doc's
verdict column recomputed from the stored runs (no training)."""

from __future__ import annotations

import math

import pytest

from tests.scripts import load_script



@pytest.fixture(scope="module")
def verdicts():
    return load_script("benchmarks/verdicts.py", "fidelity_verdicts")


@pytest.mark.parametrize(
    "diffs,margin,level,word,reason",
    [
        ([2.0, 2.0, 2.0], 3.0, False, "reproduced", ""),  # interval 2 ± 0, mean >= half of 3
        ([1.0, 1.0, 1.0], 3.0, False, "direction only", "under half the paper's margin"),
        ([1.0, 1.0, 1.0], None, False, "reproduced", ""),  # a premise without a number: the direction decides
        ([1.0, -1.0, 3.0], None, False, "not reproduced", "interval reaches 0"),  # 1 ± 4.97
        ([-1.0, -2.0, -1.5], 3.0, False, "not reproduced", "reversed: the interval excludes 0 against the paper"),
        ([5.0, 5.0], 3.0, False, "not reproduced", "2 seeds, fewer than 3"),
        ([0.5, -0.5, 0.0], 6.0, True, "reproduced", ""),  # 0 ± 1.24 within ±3
        ([4.0, -4.0, 0.0], 6.0, True, "not reproduced", "interval not within ±3.0"),  # 0 ± 9.9
    ],
)
def test_the_rule_on_hand_computed_differences(verdicts, diffs, margin, level, word, reason):
    # Prepare: per-seed differences, the paper's direction positive
    comparison = verdicts.Comparison("a − b", dict(enumerate(diffs, 1)), margin, level=level)
    # Execute / Assert
    assert verdicts.judge(comparison) == (word, reason)


def test_a_size_shown_only_in_a_figure_caps_the_verdict_and_ratios_halve_on_the_log_scale(verdicts):
    # Prepare: the same steady gain against a figure, and a 2x speed-up against a paper's 2x
    steady = {1: 0.5, 2: 0.5, 3: 0.5}
    twice = {seed: math.log(2.0) for seed in (1, 2, 3)}
    # Execute / Assert
    assert verdicts.judge(verdicts.Comparison("kd", steady, verdicts.UNREAD))[0] == "direction only"
    assert verdicts.judge(verdicts.Comparison("time", twice, math.log(2.0), ratio=True))[0] == "reproduced"
    assert verdicts.describe(verdicts.Comparison("time", twice, math.log(3.0), ratio=True)) == (
        "time: 2.00× (2.00–2.00) (3 seeds; the paper 3.00×)")


def test_a_row_counts_its_closest_setting_and_names_a_better_one_with_its_departures(verdicts):
    # Prepare: at the paper's setting the interval reaches 0; with a departure the gain is steady
    closest = verdicts.Variant((verdicts.Comparison("A − B", {1: 1.0, 2: -1.0, 3: 3.0}, None),))
    departed = verdicts.Variant((verdicts.Comparison("A' − B", {1: 2.0, 2: 2.0, 3: 2.0}, None),), ("a 33× step",))
    row = verdicts.Row("r", (closest, departed))
    # Execute
    text = verdicts.cell(row)
    # Assert
    assert verdicts.row_verdict(row) == "not reproduced"
    assert text == ("**not reproduced**. A − B: +1.0 ± 5.0 (3 seeds; no number in the paper), interval reaches 0."
                    " **reproduced only with departures**: a 33× step. A' − B: +2.0 ± 0.0 (3 seeds; no number in "
                    "the paper).")


def test_writing_replaces_only_the_verdict_cells_and_the_counts_and_refuses_unknown_rows(verdicts):
    # Prepare: a doc with one row and the markers
    row = verdicts.Row("r", (verdicts.Variant((verdicts.Comparison("A − B", {1: 2.0, 2: 2.0, 3: 2.0}, None),)),))
    doc = (f"intro\n{verdicts.BEGIN}\n| row | claim | verdict |\n|---|---|---|\n| `r` | a claim | old words |\n\n"
           f"Counts (generated): old.\n{verdicts.END}\nrest\n")
    # Execute
    written = verdicts.write(doc, [row])
    # Assert
    assert "| `r` | a claim | **reproduced**. A − B: +2.0 ± 0.0 (3 seeds; no number in the paper). |" in written
    assert ("Counts (generated): 1 reproduced (0 of them with departures), 0 direction only (0 of them with "
            "departures), 0 not reproduced (0 better only with departures).") in written
    assert written.startswith("intro\n") and written.endswith(f"{verdicts.END}\nrest\n")
    assert verdicts.write(written, [row]) == written
    with pytest.raises(SystemExit, match="'s' of fidelity.md has no computation"):
        verdicts.write(doc.replace("|\n\n", "|\n| `s` | another | words |\n\n"), [row])
    with pytest.raises(SystemExit, match="missing in fidelity.md: r"):
        verdicts.write(doc.replace("| `r` |", "| `s` |"), [row])


def test_counts_say_how_many_counted_verdicts_carry_departures(verdicts):
    # Prepare: a reproduced row with a departure, one without, and a not-reproduced row whose second variant
    # (with departures) does better
    steady = verdicts.Comparison("A − B", {1: 2.0, 2: 2.0, 3: 2.0}, None)
    noisy = verdicts.Comparison("A − B", {1: 2.0, 2: -2.0, 3: 1.0}, None)
    rows = [verdicts.Row("a", (verdicts.Variant((steady,), ("a departure",)),)),
            verdicts.Row("b", (verdicts.Variant((steady,)),)),
            verdicts.Row("c", (verdicts.Variant((noisy,)), verdicts.Variant((steady,), ("another",))))]
    # Execute
    line = verdicts.counts(rows)
    # Assert
    assert line == ("2 reproduced (1 of them with departures), 0 direction only (0 of them with departures), "
                    "1 not reproduced (1 better only with departures)")


def test_the_docs_verdicts_are_the_ones_the_stored_runs_give(verdicts):
    # Prepare: every row recomputed from benchmarks/*/runs and the KD probes' files
    rows = verdicts.rows()
    text = verdicts.DOC.read_text()
    # Execute
    in_doc = verdicts.doc_cells(text)
    # Assert: the same rows, and each verdict cell (words and figures) as the runs give it
    assert sorted(in_doc) == sorted(r.id for r in rows)
    stale = [r.id for r in rows if in_doc[r.id] != verdicts.cell(r)]
    assert not stale, f"verdicts in docs/fidelity.md differ from the runs' for {stale}: " \
                      "run `python benchmarks/verdicts.py --write`"
    assert f"Counts (generated): {verdicts.counts(rows)}." in text
